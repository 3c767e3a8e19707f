"""The Redis clients: a django-redis alias, a URL, or a cluster.

One sync client per process (redis-py clients are thread-safe and pool their
connections), one asyncio client per event loop (asyncio connections belong
to the loop that opened them).  Both caches are dropped when a SEMAPHORE_*
setting or CACHES changes (``setting_changed``), so the next call checks the
settings again and talks to the server they name.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any, cast
from urllib.parse import urlsplit

import redis
import redis.asyncio
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry

from .. import signals
from ..config import settings
from ..exceptions import SemaphoreBackendError
from . import forks

#: What a failing Redis raises: redis-py's errors, and a cluster client's
#: RedisClusterException, which is no RedisError ("Redis Cluster cannot be
#: connected" when no node answers, when the client is made or later).
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException)

# Short enough that an unreachable server fails in seconds; a stale pooled
# connection (after a Redis restart) is retried once on a fresh one.
DEFAULT_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": 1.0,
    "socket_timeout": 2.0,
    "health_check_interval": 0,
}

_lock = threading.Lock()
_sync_client: Any = None
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
# Per loop, the async generator that closes its client (see _close_with_loop).
_closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

_ASYNC_KWARGS = (
    "host",
    "port",
    "db",
    "username",
    "password",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "client_name",
    "encoding",
    "encoding_errors",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
    "ssl_ca_data",
    "ssl_ca_path",
    "ssl_check_hostname",
    "ssl_ciphers",
    "ssl_min_version",
    "ssl_password",
    # Rotating credentials (a cloud's IAM or Entra tokens) instead of a password.
    "credential_provider",
)


def reset() -> None:
    """Forget the cached clients (settings changed, or after fork in tests)."""
    global _sync_client
    with _lock:
        _sync_client = None
        _async_clients.clear()
        _closers.clear()  # each running loop closes its client (the finalizer hook)


@forks.in_child
def _new_lock() -> None:
    # A thread of the parent may have held it at the fork (making a cluster's
    # client, which connects): in the child nobody would ever release it.
    global _lock
    _lock = threading.Lock()


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    # Any SEMAPHORE_* setting, not only SEMAPHORE_REDIS: a client is built only
    # after settings.check_global() passed, and so it stays true of the current settings.
    if setting in settings.DEFAULTS or setting == "CACHES":
        reset()


def _url_options(value: dict[str, Any], retry_class: Any = Retry) -> dict[str, Any]:
    options = {**DEFAULT_OPTIONS, **value.get("OPTIONS", {})}
    # An asyncio client needs redis.asyncio's Retry: given the sync one it
    # silently never retries, and the first call after a restart fails.
    # Only a dropped connection is retried (a stale pooled one after a
    # restart fails at once); a timeout is not, so an unresponsive server
    # fails the call within one socket timeout, not two.
    options.setdefault("retry", retry_class(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)))
    return options


# The arguments by which SENTINEL_KWARGS chooses how the connections to the sentinels retry.
_RETRY_KWARGS = ("retry", "retry_on_error", "retry_on_timeout")
_TIMEOUT_KWARGS = ("socket_timeout", "socket_connect_timeout")


def _sentinel_defaults(given: dict[str, Any], pool: Any, retry_class: Any = Retry) -> dict[str, Any]:
    """What the app adds to ``given``, the arguments of the connections to the sentinels
    of a Sentinel ``pool`` (SENTINEL_KWARGS; without it, the alias's socket options, as
    redis-py takes them), so that a sentinel that accepts connections and never answers
    fails a call within one socket timeout: the alias's socket timeouts where ``given``
    sets none (redis-py would wait forever), and, where it chooses no retry, one retry of
    a dropped connection and none of a timeout, as :data:`DEFAULT_OPTIONS` do.  redis-py's
    own default retries ten times: such a sentinel failed a call after 26 s, not 2."""
    defaults: dict[str, Any] = {
        name: pool.connection_kwargs[name]
        for name in _TIMEOUT_KWARGS
        if given.get(name) is None and pool.connection_kwargs.get(name) is not None
    }
    if not any(name in given for name in _RETRY_KWARGS):
        defaults["retry"] = retry_class(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    return defaults


def _bound_sentinels(client: Any) -> Any:
    """``client``, a django-redis alias's, with :func:`_sentinel_defaults` applied to its
    Sentinel's connections (shared with the alias's cache) if it follows one."""
    pool = client.connection_pool
    manager = getattr(pool, "sentinel_manager", None)
    if manager is None:
        return client
    defaults = _sentinel_defaults(manager.sentinel_kwargs, pool)
    retry = defaults.pop("retry", None)
    for sentinel in manager.sentinels:
        # For the connections opened from now on (one the alias's cache opened already
        # keeps its timeouts); a retry reaches those too.
        sentinel.connection_pool.connection_kwargs.update(defaults)
        if retry is not None:
            sentinel.set_retry(retry)
    return client


def _build_sync(value: str | dict[str, Any]) -> Any:
    if isinstance(value, str):
        from django_redis import get_redis_connection

        return _bound_sentinels(get_redis_connection(value))
    options = _url_options(value)
    if value.get("CLUSTER"):
        options.pop("health_check_interval", None)
        return redis.cluster.RedisCluster.from_url(value["URL"], **options)
    return redis.Redis.from_url(value["URL"], **options)


def get_client() -> Any:
    """The sync redis-py client for SEMAPHORE_REDIS (cached per process).

    A cluster's client connects when it is made: a cluster that does not
    answer raises :class:`~django_semaphore.SemaphoreBackendError` here, and
    the next call tries again."""
    global _sync_client
    client = _sync_client
    if client is None:
        settings.check_global()
        value = settings.setting("SEMAPHORE_REDIS")
        failure: Exception | None = None
        with _lock:
            if _sync_client is None:
                try:
                    _sync_client = _build_sync(value)
                except REDIS_ERRORS as exc:
                    failure = exc
            client = _sync_client
        if failure is not None:  # raised outside the lock: a backend_failed receiver may call here
            raise backend_error(None, failure, configured_server(value)) from failure
    return client


def _async_from_sync(sync_client: Any) -> Any:
    """An asyncio client speaking to the same server as a django-redis client."""
    pool = sync_client.connection_pool
    manager = getattr(pool, "sentinel_manager", None)
    if manager is not None:
        from redis.asyncio.sentinel import Sentinel

        sentinels = [
            (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in manager.sentinels
        ]
        kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in _ASYNC_KWARGS}
        for k in ("host", "port"):
            kwargs.pop(k, None)
        given = dict(manager.sentinel_kwargs)
        chosen = given.get("retry")
        if isinstance(chosen, Retry):  # SENTINEL_KWARGS' own: an asyncio connection would never retry with it
            errors = cast("tuple[type[RedisError], ...]", chosen._supported_errors)  # as they were given
            given["retry"] = AsyncRetry(chosen._backoff, chosen.get_retries(), errors)
        sentinel_kwargs = {**given, **_sentinel_defaults(given, pool, AsyncRetry)}
        # Typed from redis-py 8.2 on, untyped before: called through a typed name either way.
        sentinel_class: Callable[..., Any] = Sentinel
        sentinel = sentinel_class(sentinels, sentinel_kwargs=sentinel_kwargs, **kwargs)
        return sentinel.master_for(pool.service_name, max_connections=pool.max_connections)
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in _ASYNC_KWARGS}
    if "path" in pool.connection_kwargs:
        kwargs["unix_socket_path"] = pool.connection_kwargs["path"]
    if issubclass(pool.connection_class, redis.SSLConnection):
        kwargs["ssl"] = True
    kwargs["retry"] = AsyncRetry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    # The alias's bound (CONNECTION_POOL_KWARGS' max_connections), as its sync pool has it.
    client = redis.asyncio.Redis(**kwargs, max_connections=pool.max_connections)
    if isinstance(pool, redis.BlockingConnectionPool):
        # CONNECTION_POOL_CLASS "redis.BlockingConnectionPool": a caller beyond the bound
        # waits for a connection (at most the pool's timeout), not fails at once.  The
        # client above only worked out the connections' class and arguments.
        plain = client.connection_pool
        blocking = redis.asyncio.BlockingConnectionPool(
            connection_class=plain.connection_class,
            max_connections=pool.max_connections,
            timeout=pool.timeout,
            **plain.connection_kwargs,
        )
        client = redis.asyncio.Redis(connection_pool=blocking)
        client.auto_close_connection_pool = True  # closed with the client, as its own pool would be
    return client


def _build_async(value: str | dict[str, Any]) -> Any:
    if isinstance(value, str):
        return _async_from_sync(get_client())
    options = _url_options(value, AsyncRetry)
    if value.get("CLUSTER"):
        options.pop("health_check_interval", None)
        return redis.asyncio.cluster.RedisCluster.from_url(value["URL"], **options)
    return redis.asyncio.Redis.from_url(value["URL"], **options)


def get_async_client() -> Any:
    """The asyncio client for SEMAPHORE_REDIS on the running event loop."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        settings.check_global()
        client = _build_async(settings.setting("SEMAPHORE_REDIS"))
        with _lock:
            # asyncio.run() and async_to_sync() make a loop per call.  A client holds
            # its loop (its connections' streams do), so a weak key alone never lets
            # a closed loop's client go: dropped here (closed already if the loop
            # shut down its async generators, else by the garbage collector).
            for closed in [other for other in _async_clients if other.is_closed()]:
                del _async_clients[closed]
                _closers.pop(closed, None)
            _async_clients[loop] = client
            _closers[loop] = _close_with_loop(client)
    return client


async def _closing(client: Any) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()


def _close_with_loop(client: Any) -> AsyncGenerator[None, None]:
    """An async generator, started on the running loop, that closes ``client`` when the
    loop finalizes it: at ``loop.shutdown_asyncgens()``, which asyncio.run() (and so
    async_to_sync()) calls before closing the loop, or once it is dropped while the loop
    runs.  Left to the garbage collector, a cluster client of a finished loop logs
    'Unclosed RedisCluster client' at ERROR through the next loop's exception handler."""
    closer = _closing(client)
    # Its first step runs to the yield at once, and the loop's first-iteration hook
    # tracks it from then on.
    with contextlib.suppress(StopIteration):
        closer.asend(None).send(None)
    return closer


def is_cluster(client: Any) -> bool:
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


def follows_sentinel(client: Any) -> bool:
    """Whether ``client`` asks Redis Sentinel for its primary at each new connection (a
    django-redis Sentinel alias's, sync or asyncio): a failover moves it to the new one."""
    return getattr(getattr(client, "connection_pool", None), "sentinel_manager", None) is not None


def server_name(client: Any) -> str:
    """A short description of the server a client talks to, for error messages."""
    try:
        if is_cluster(client):
            nodes = client.get_nodes() if hasattr(client, "get_nodes") else []
            if not nodes:  # none known yet: an asyncio client connects at its first command
                nodes = list(client.nodes_manager.startup_nodes.values())
            return "cluster " + ",".join(f"{n.host}:{n.port}" for n in nodes[:3])
        kwargs = client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix:{kwargs['path']}"
        if "unix_socket_path" in kwargs:
            return f"unix:{kwargs['unix_socket_path']}"
        service = getattr(client.connection_pool, "service_name", None)
        if service:
            return f"sentinel service {service}"
        return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    except Exception:
        return "redis"


def configured_server(value: str | dict[str, Any]) -> str:
    """What :func:`server_name` would say of the client SEMAPHORE_REDIS = ``value`` names,
    from the configuration alone: for an error raised before there is a client, and for
    a label that must not change with a cluster's topology (the metrics')."""
    if isinstance(value, str):
        return f"cache alias {value!r}"
    try:
        url = urlsplit(value["URL"])
        if url.scheme == "unix":
            return f"unix:{url.path}"
        where = f"{url.hostname or 'localhost'}:{url.port or 6379}"
    except (KeyError, TypeError, ValueError):
        return "redis"
    return f"cluster {where}" if value.get("CLUSTER") else where


def backend_error(client: Any, exc: BaseException, server: str | None = None) -> SemaphoreBackendError:
    """The SemaphoreBackendError for a Redis failure ``exc``; sends ``backend_failed``.

    Every Redis call of the app fails through here (the drivers of
    :mod:`.scripting`, the making of a client, partition discovery's SCAN), so
    the signal is sent once per failure.  Its sender is
    :class:`~django_semaphore.SemaphoreBackendError`: the failure is seen below
    any one semaphore, and the driver must not depend on the engine above it.
    ``server``: the server's description, when there is no ``client`` to ask.
    """
    server = server or server_name(client)
    error = SemaphoreBackendError(f"Redis at {server} failed: {type(exc).__name__}: {exc}", server=server)
    signals.backend_failed.send_robust(sender=SemaphoreBackendError, error=error, server=server)
    return error


def socket_timeout(client: Any) -> float | None:
    """The client's read timeout in seconds, or None if it has none."""
    try:
        if isinstance(client, redis.asyncio.cluster.RedisCluster):
            # Its nodes take their connections' options from the client's own.
            kwargs = client.connection_kwargs
        elif is_cluster(client):
            kwargs = client.get_default_node().redis_connection.connection_pool.connection_kwargs
        else:
            kwargs = client.connection_pool.connection_kwargs
        timeout: float | None = kwargs.get("socket_timeout")
        return timeout
    except Exception:
        return None


def scan_iter(client: Any, match: str, kind: str | None = None, count: int = 1000) -> Iterator[bytes]:
    """SCAN on every primary (cluster) or on the one server; never KEYS.
    ``kind``: keys of that type only (SCAN's TYPE, e.g. "zset")."""
    if is_cluster(client):
        for node in client.get_primaries():
            yield from node.redis_connection.scan_iter(match=match, count=count, _type=kind)
        return
    yield from client.scan_iter(match=match, count=count, _type=kind)


async def ascan_iter(
    client: Any, match: str, kind: str | None = None, count: int = 1000
) -> AsyncIterator[bytes]:
    """The asyncio twin of :func:`scan_iter`."""
    # On a cluster, redis-py sends SCAN to every primary and follows each cursor;
    # a cluster that no node answers for raises RedisClusterException, no RedisError.
    try:
        async for key in client.scan_iter(match=match, count=count, _type=kind):
            yield key
    except RedisClusterException as exc:
        raise backend_error(client, exc) from exc
