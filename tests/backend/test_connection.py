"""SEMAPHORE_REDIS (django_semaphore.connection), backend errors, restarts, round trips."""

import asyncio
import contextlib
import time

import pytest
import redis
import redis.asyncio
from django_redis import get_redis_connection

from django_semaphore import Semaphore, SemaphoreBackendError, SemaphoreError
from django_semaphore.backend import connection
from django_semaphore.runtime import scheduler
from tests.support.servers import RedisServer, free_port


@pytest.fixture
def own_server(settings):
    """A throwaway redis-server of this test's own, used through a URL dict.

    Its KEYS command is renamed away: the app must never call it.
    """
    server = RedisServer(args=("--rename-command", "KEYS", "KEYS-is-never-used")).start()
    settings.SEMAPHORE_REDIS = {"URL": server.url}
    yield server
    server.cleanup()


@pytest.fixture
def closed_port():
    return free_port()  # nothing listens there


# -- SEMAPHORE_REDIS ----------------------------------------------------------


def test_alias_reuses_the_django_redis_client(settings):
    settings.SEMAPHORE_REDIS = "default"
    assert connection.get_client() is get_redis_connection("default")
    lease = Semaphore("alias", limit=1).acquire()
    assert get_redis_connection("default").exists(lease.semaphore.partition().timeouts)


def test_url_dict(settings, redis_url, raw_redis):
    settings.SEMAPHORE_REDIS = {"URL": redis_url}
    client = connection.get_client()
    assert client is not get_redis_connection("default")
    assert connection.get_client() is client  # one client per process, not per call
    lease = Semaphore("url", limit=1).acquire()
    assert raw_redis.exists(lease.semaphore.partition().holds)


def test_url_selects_the_database(settings, own_server):
    settings.SEMAPHORE_REDIS = {"URL": own_server.url[: -len("/0")] + "/3"}
    sem = Semaphore("db", limit=1)
    sem.acquire()
    db3 = redis.Redis(port=own_server.port, db=3)
    db0 = redis.Redis(port=own_server.port, db=0)
    assert db3.exists(sem.partition().timeouts) and not db0.exists(sem.partition().timeouts)
    db3.close()
    db0.close()


def test_setting_change_takes_effect_at_the_next_call(settings, own_server, raw_redis):
    sem = Semaphore("switch", limit=1)
    sem.acquire()
    own = redis.Redis.from_url(own_server.url)
    assert own.exists(sem.partition().timeouts)
    assert not raw_redis.exists(sem.partition().timeouts)
    settings.SEMAPHORE_REDIS = "default"
    assert sem.available() == 1  # the session server: nothing held there
    own.close()


@pytest.mark.asyncio
async def test_async_client_talks_to_the_same_server(settings, own_server):
    sem = Semaphore("async-url", limit=1)
    lease = sem.acquire()
    assert await sem.aacquire() is None
    assert [h.identifier for h in await sem.aholders()] == [lease.identifier]


# -- unreachable servers ---------------------------------------------------------------


def _assert_backend_error(info, port, started):
    assert time.monotonic() - started < 5
    error = info.value
    assert isinstance(error, SemaphoreError)
    assert not isinstance(error, redis.RedisError)
    assert f"127.0.0.1:{port}" in str(error)
    assert error.server == f"127.0.0.1:{port}"


@pytest.mark.parametrize(
    "call",
    [
        lambda sem: sem.acquire(),
        lambda sem: sem.acquire(wait=1),
        lambda sem: sem.holders(),
        lambda sem: sem.available(),
        lambda sem: sem.purge_expired(),
    ],
    ids=["acquire", "acquire-wait", "holders", "available", "purge_expired"],
)
def test_unreachable_url_raises_backend_error(settings, closed_port, call):
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{closed_port}/0"}
    started = time.monotonic()
    with pytest.raises(SemaphoreBackendError) as info:
        call(Semaphore("down", limit=1))
    _assert_backend_error(info, closed_port, started)


def test_unreachable_alias_raises_backend_error(settings, closed_port):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{closed_port}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        }
    }
    settings.SEMAPHORE_REDIS = "default"
    started = time.monotonic()
    with pytest.raises(SemaphoreBackendError) as info:
        Semaphore("down", limit=1).acquire()
    _assert_backend_error(info, closed_port, started)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "call",
    [
        lambda sem: sem.aacquire(),
        lambda sem: sem.aholders(),
        lambda sem: sem.aavailable(),
        lambda sem: sem.apurge_expired(),
    ],
    ids=["aacquire", "aholders", "aavailable", "apurge_expired"],
)
async def test_unreachable_async_raises_backend_error(settings, closed_port, call):
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{closed_port}/0"}
    started = time.monotonic()
    with pytest.raises(SemaphoreBackendError) as info:
        await call(Semaphore("down", limit=1))
    _assert_backend_error(info, closed_port, started)


def test_lease_calls_after_the_server_died(own_server):
    lease = Semaphore("dying", limit=1).acquire()
    own_server.stop()
    for call in (lease.refresh, lease.release):
        started = time.monotonic()
        with pytest.raises(SemaphoreBackendError) as info:
            call()
        _assert_backend_error(info, own_server.port, started)


# -- restarts ---------------------------------------------------------------------------


@pytest.mark.slow
def test_restart_next_call_succeeds_and_old_lease_is_lost(own_server):
    sem = Semaphore("restarted", limit=1, timeout=30)
    old = sem.acquire()
    assert sem.acquire() is None
    own_server.restart()  # every key and script is gone; pooled connections are stale
    new = sem.acquire()
    assert new is not None
    assert new.token > old.token  # the counter is re-seeded from server time
    assert old.refresh() is False
    assert old.release() is False
    assert [h.identifier for h in sem.holders()] == [new.identifier]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_restart_async(own_server):
    sem = Semaphore("arestarted", limit=1, timeout=30)
    old = await sem.aacquire()
    own_server.restart()
    new = await sem.aacquire()
    assert new is not None and new.token > old.token
    assert await old.arefresh() is False
    assert await old.arelease() is False


@pytest.mark.slow
def test_restart_through_the_django_redis_alias(settings, own_server):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": own_server.url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        }
    }
    settings.SEMAPHORE_REDIS = "default"
    sem = Semaphore("arestarted", limit=1, timeout=30)
    old = sem.acquire()
    own_server.restart()
    assert sem.acquire() is not None
    assert old.release() is False


# -- round trips, and never KEYS -------------------------------------------------------


@contextlib.contextmanager
def monitoring(server):
    """The list of commands sent to ``server`` in the block, as MONITOR saw them.

    Commands run by scripts are left out: the list shows the round trips.  So
    are the process's background jobs (the runtime overrides, the stats flush,
    the ad-hoc semaphores' record: on the scheduler's timer, not part of any
    operation) and
    connection handshakes (a connection opened while the poller used the other).
    """
    marker = f"end-{time.monotonic_ns()}"
    sent = []
    watcher, other = redis.Redis(port=server.port), redis.Redis(port=server.port)
    other.ping()  # its connection handshake happens before MONITOR starts
    with watcher, other, watcher.monitor() as monitor:
        yield sent
        other.echo(marker)
        while True:
            command = monitor.next_command()
            if command["command"] == f"ECHO {marker}":
                break
            text = command["command"]
            name = text.split(" ", 1)[0].upper()
            if command["client_type"] == "lua" or name in ("HELLO", "CLIENT"):
                continue
            if ":control" in text or ":stats:" in text or ":adhoc" in text:
                continue
            sent.append(name)


def test_one_round_trip_per_operation(own_server):
    sem = Semaphore("trips", limit=1, timeout=30)
    warm = sem.acquire()  # connect and load the scripts first: no part of an operation
    warm.refresh()
    warm.release()
    with monitoring(own_server) as sent:
        lease = sem.acquire()
    assert lease is not None and sent == ["EVALSHA"]
    with monitoring(own_server) as sent:
        assert sem.acquire() is None  # refused: one round trip too
    assert sent == ["EVALSHA"]
    with monitoring(own_server) as sent:
        assert lease.refresh() is True
    assert sent == ["EVALSHA"]
    with monitoring(own_server) as sent:
        assert lease.release() is True
    assert sent == ["EVALSHA"]
    redis.Redis(port=own_server.port).script_flush()
    with monitoring(own_server) as sent:
        assert sem.acquire() is not None
    assert sent == ["EVALSHA", "EVAL"]  # NOSCRIPT, then the source once
    with monitoring(own_server) as sent:
        assert sem.acquire() is None
    assert sent == ["EVALSHA"]  # loaded again


@pytest.mark.asyncio
async def test_one_round_trip_per_async_operation(own_server):
    sem = Semaphore("atrips", limit=1, timeout=30)
    warm = await sem.aacquire()
    await warm.arefresh()
    await warm.arelease()
    with monitoring(own_server) as sent:
        lease = await sem.aacquire()
    assert lease is not None and sent == ["EVALSHA"]
    with monitoring(own_server) as sent:
        assert await lease.arefresh() is True
    assert sent == ["EVALSHA"]
    with monitoring(own_server) as sent:
        assert await lease.arelease() is True
    assert sent == ["EVALSHA"]


def test_no_operation_calls_keys(own_server):
    # KEYS is renamed away on this server: any call to it would fail.
    for algorithm in ["lua", "fair_locked", "fair", "basic"]:
        sem = Semaphore("nokeys-" + algorithm, limit=1, timeout=30, algorithm=algorithm)
        leases = []
        for key in [None, "k"]:
            leases.append(sem.acquire(key=key))
            assert sem.acquire(key=key, wait=0.05) is None
            assert len(sem.holders(key=key)) == 1
            assert sem.available(key=key) == 0
            assert leases[-1].refresh() is True
        assert len(sem.partitions()) == 2
        assert sem.purge_expired() == 0
        assert all(lease.release() for lease in leases)
    with pytest.raises(redis.ResponseError):
        redis.Redis(port=own_server.port).keys("*")


# -- Redis Cluster down ----------------------------------------------------------------
#
# redis-py's cluster client raises RedisClusterException ("Redis Cluster cannot be
# connected. Please provide at least one reachable node") when no node answers, and that
# is no RedisError: it must still come out as SemaphoreBackendError (a 503, fail open).


def _cluster_calls():
    return [
        lambda sem: sem.acquire(),
        lambda sem: sem.acquire(wait=1),
        lambda sem: sem.holders(),
        lambda sem: sem.available(),
        lambda sem: sem.purge_expired(),
    ]


def test_an_unreachable_cluster_raises_backend_error(settings, closed_port):
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{closed_port}/0", "CLUSTER": True}
    for call in _cluster_calls():
        started = time.monotonic()
        with pytest.raises(SemaphoreBackendError) as info:
            call(Semaphore("cluster-down", limit=1))
        assert time.monotonic() - started < 5
        assert f"127.0.0.1:{closed_port}" in str(info.value)
        assert info.value.server == f"cluster 127.0.0.1:{closed_port}"


@pytest.mark.asyncio
async def test_an_unreachable_cluster_raises_backend_error_async(settings, closed_port):
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{closed_port}/0", "CLUSTER": True}
    for call in (
        lambda sem: sem.aacquire(),
        lambda sem: sem.aholders(),
        lambda sem: sem.aavailable(),
        lambda sem: sem.apurge_expired(),
    ):
        started = time.monotonic()
        with pytest.raises(SemaphoreBackendError) as info:
            await call(Semaphore("cluster-down", limit=1))
        assert time.monotonic() - started < 5
        assert f"127.0.0.1:{closed_port}" in str(info.value)
        # Named even though the client never reached a node (it connects at its first command).
        assert info.value.server == f"cluster 127.0.0.1:{closed_port}"


@pytest.mark.slow
def test_a_cluster_that_went_down_raises_backend_error(settings):
    import asyncio

    from tests.support.servers import RedisClusterServers

    with RedisClusterServers(primaries=3) as cluster:
        settings.SEMAPHORE_REDIS = {"URL": cluster.url, "CLUSTER": True}
        sem = Semaphore("cluster-died", limit=5)
        loop = asyncio.new_event_loop()
        try:
            assert sem.acquire() is not None  # the clients exist and know the nodes
            assert loop.run_until_complete(sem.aacquire()) is not None
            cluster.stop()
            for call in _cluster_calls():
                with pytest.raises(SemaphoreBackendError):
                    call(sem)
            for acall in (sem.aacquire, sem.aholders, sem.aavailable, sem.apurge_expired):
                with pytest.raises(SemaphoreBackendError):
                    loop.run_until_complete(acall())
        finally:
            for client in connection._async_clients.values():
                loop.run_until_complete(client.aclose())
            # As asyncio.run() does: the loop finalizes the client's closer before it closes
            # (dropped after, its aclose() would be scheduled on a loop that never runs it).
            loop.run_until_complete(loop.shutdown_asyncgens())
            connection.reset()
            loop.close()


# -- a read timeout shorter than a waiter's block ------------------------------------------


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
@pytest.mark.asyncio
async def test_an_async_waiter_on_a_cluster_blocks_within_a_short_socket_timeout(settings, backend):
    # A waiter blocks on BLPOP for up to a second at a time, less than the client's read
    # timeout: an asyncio cluster client's timeout was not found, and BLPOP outlived it.
    settings.SEMAPHORE_REDIS = {**settings.SEMAPHORE_REDIS, "OPTIONS": {"socket_timeout": 0.4}}
    sem = Semaphore("short-read-timeout", limit=1, timeout=30)
    held = await sem.aacquire()
    started = time.monotonic()
    assert await sem.aacquire(wait=1.5) is None  # waited, then refused: no TimeoutError
    assert time.monotonic() - started >= 1.4
    assert connection.socket_timeout(connection.get_async_client()) == 0.4
    assert await held.arelease()


# -- fork --------------------------------------------------------------------------------


def test_a_child_forked_while_a_thread_makes_the_client_makes_its_own(settings):
    # A cluster's client connects while it is made, under the module's lock: here on a
    # node that accepts and never answers, for a second.  A process forked meanwhile
    # (gunicorn --preload, Celery prefork, with a thread warming up) inherits the lock
    # held, by a thread it does not have.
    import os
    import socket
    import threading

    from tests.support.helpers import wait_until

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        settings.SEMAPHORE_REDIS = {"URL": url, "CLUSTER": True, "OPTIONS": {"socket_timeout": 1}}

        def make():
            with contextlib.suppress(SemaphoreBackendError):
                connection.get_client()

        thread = threading.Thread(target=make)
        thread.start()
        wait_until(connection._lock.locked, timeout=5, message="the thread making the client")
        pid = os.fork()
        if pid == 0:  # the child: its first call fails as the parent's did, and does not hang
            code = 1
            try:
                connection.get_client()
            except SemaphoreBackendError:
                code = 0
            finally:
                os._exit(code)
        thread.join()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                return
            time.sleep(0.05)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the connection lock its parent's thread held")


# -- one asyncio client per event loop, and none for a loop that is gone ------------------------


def test_an_event_loop_per_call_leaves_no_client_behind(own_server):
    # asyncio.run() and asgiref's async_to_sync() (a sync view or a Celery task calling
    # the async API) make a new event loop per call.  The client of each loop held its
    # loop, which the weak key alone never let go: a client and its connections per call.
    import asyncio
    import gc
    import warnings

    sem = Semaphore("loop-per-call", limit=1, timeout=30)

    async def cycle():
        lease = await sem.aacquire()
        assert lease is not None and await lease.arelease()

    server = redis.Redis(port=own_server.port)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the dead loops' sockets, closed by the GC
        for _ in range(30):
            asyncio.run(cycle())
        gc.collect()
        assert len(connection._async_clients) <= 1
        assert server.info("clients")["connected_clients"] <= 3  # ours, and the last loop's
    server.close()


# -- the asyncio twin of a django-redis client -------------------------------------------------


@pytest.mark.asyncio
async def test_the_async_client_of_an_alias_authenticates_as_the_sync_one(settings, own_server):
    # redis-py's way to authenticate with rotating credentials (a cloud's IAM or Entra
    # token) is a credential_provider in the pool's arguments, not a password.
    from redis.credentials import UsernamePasswordCredentialProvider

    admin = redis.Redis(port=own_server.port)
    admin.execute_command("ACL", "SETUSER", "app", "on", ">app-secret", "~*", "&*", "+@all")
    admin.config_set("requirepass", "admin-secret")  # no one gets in without credentials now
    admin.close()
    provider = UsernamePasswordCredentialProvider("app", "app-secret")
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": own_server.url,
            "OPTIONS": {"SOCKET_TIMEOUT": 2, "CONNECTION_POOL_KWARGS": {"credential_provider": provider}},
        }
    }
    settings.SEMAPHORE_REDIS = "default"
    sem = Semaphore("credentials", limit=2, timeout=30)
    lease = sem.acquire()
    assert lease is not None
    other = await sem.aacquire()
    assert other is not None
    assert await other.arelease() and lease.release()


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_the_client_of_an_event_loop_is_closed_when_the_loop_shuts_down(settings, backend, caplog):
    # Left to the garbage collector, an asyncio cluster client of a finished loop logs
    # 'Unclosed RedisCluster client' (and one line per node) at ERROR through the next
    # loop's exception handler: an error report per asyncio.run() / async_to_sync() call.
    import asyncio
    import gc
    import logging
    import warnings

    sem = Semaphore("loop-closes-client", limit=1, timeout=30)

    async def cycle():
        gc.collect()  # the previous loops' garbage, collected while this one runs
        lease = await sem.aacquire()
        assert lease is not None and await lease.arelease()

    with warnings.catch_warnings(), caplog.at_level(logging.ERROR, logger="asyncio"):
        warnings.simplefilter("ignore", ResourceWarning)
        for _ in range(4):
            asyncio.run(cycle())
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


# -- the alias's connection bound, on the asyncio client too ------------------------------------


def _bounded_alias(settings, server, **options):
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": server.url,
            "OPTIONS": {"SOCKET_TIMEOUT": 2, **options},
        }
    }
    settings.SEMAPHORE_REDIS = "default"


async def _three_waiters(sem):
    """Three callers waiting at once on a semaphore held full: each holds a connection
    while it blocks.  What each got: None (refused after its wait) or the exception."""
    return await asyncio.gather(*(sem.aacquire(wait=1) for _ in range(3)), return_exceptions=True)


@pytest.mark.asyncio
async def test_the_async_client_of_an_alias_keeps_its_max_connections(settings, own_server):
    # The asyncio twin of a django-redis client had redis-py's own bound (100) whatever
    # the alias said: the sync client stopped at 2 connections and the async one did not.
    _bounded_alias(settings, own_server, CONNECTION_POOL_KWARGS={"max_connections": 2})
    assert connection.get_client().connection_pool.max_connections == 2
    sem = Semaphore("async-bound", limit=1, timeout=30)
    held = await sem.aacquire()
    assert connection.get_async_client().connection_pool.max_connections == 2
    outcomes = await _three_waiters(sem)
    # Two connections for three blocking callers: one of them is told so, as a sync caller would be.
    errors = [o for o in outcomes if isinstance(o, SemaphoreBackendError)]
    assert len(errors) == 1 and "Too many connections" in str(errors[0]), outcomes
    assert [o for o in outcomes if not isinstance(o, SemaphoreBackendError)] == [None, None]
    assert await held.arelease()


@pytest.mark.asyncio
async def test_the_async_client_of_a_blocking_pool_alias_waits_for_a_connection(settings, own_server):
    _bounded_alias(
        settings,
        own_server,
        CONNECTION_POOL_CLASS="redis.BlockingConnectionPool",
        CONNECTION_POOL_KWARGS={"max_connections": 2, "timeout": 10},
    )
    sem = Semaphore("async-blocking-bound", limit=1, timeout=30)
    held = await sem.aacquire()
    pool = connection.get_async_client().connection_pool
    assert isinstance(pool, redis.asyncio.BlockingConnectionPool)
    assert (pool.max_connections, pool.timeout) == (2, 10)
    # The third caller waits for a connection instead of failing: all three wait, and are refused.
    assert await _three_waiters(sem) == [None, None, None]
    assert await held.arelease()


# -- a Sentinel that accepts connections and never answers --------------------------------------


@pytest.fixture
def silent_sentinel():
    """A TCP server on loopback that accepts every connection and never writes a byte:
    a sentinel that hangs.  Yields (port, the connections it accepted)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted = []

    def accept():
        with contextlib.suppress(OSError):  # the listener closed: the test is over
            while True:
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1], accepted
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close alone would not)
    listener.close()
    for conn in list(accepted):
        conn.close()  # a client still reading sees the connection closed, and gives up
    thread.join(5)


@pytest.fixture
def jobs_held(monkeypatch):
    """The process's timer jobs (the overrides' poll, the stats flush, the ad-hoc
    semaphores' record) are queued but not run during the test: they talk to
    SEMAPHORE_REDIS too, so a test that counts a caller's connections counts only
    the caller's.  What was queued meanwhile is dropped at the end (its server is gone)."""
    timer = scheduler.scheduler()
    timer.stop()
    monkeypatch.setattr(scheduler.Scheduler, "_ensure_thread", lambda self: None)
    yield
    monkeypatch.undo()
    timer.stop()


def _silent_sentinel_alias(settings, port, sentinel_kwargs=None):
    options = {
        "CLIENT_CLASS": "django_redis.client.SentinelClient",
        "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
        "SENTINELS": [("127.0.0.1", port)],
        "SOCKET_CONNECT_TIMEOUT": 1,
        "SOCKET_TIMEOUT": 2,
    }
    if sentinel_kwargs is not None:
        options["SENTINEL_KWARGS"] = sentinel_kwargs
    # A service name of its own: django-redis keeps its pools per URL for the process.
    service = f"silent-{port}"
    settings.CACHES = {
        **settings.CACHES,
        "sentinel": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{service}/0",
            "OPTIONS": options,
        },
    }
    settings.SEMAPHORE_REDIS = "sentinel"


def _fails_within(call, bound):
    """Run ``call`` in a thread: the SemaphoreBackendError it raised and the seconds it took.
    Fails if it has not finished within ``bound`` seconds (the thread is left to the fixture's
    closing of the connections)."""
    import threading

    outcome = {}

    def target():
        started = time.monotonic()
        try:
            call()
        except SemaphoreBackendError as exc:
            outcome["error"] = exc
        finally:
            outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"still waiting on the sentinel after {bound}s"
    assert "error" in outcome, outcome
    return outcome["error"], outcome["seconds"]


SILENT_SENTINEL_KWARGS = {
    # django-redis passes the alias's socket options to the sentinels (redis-py did retry
    # ten times: a call failed after about 26 s, eleven connections).
    "alias options": None,
    # SENTINEL_KWARGS without timeouts: redis-py waited forever.
    "SENTINEL_KWARGS without timeouts": {"socket_keepalive": True},
}


@pytest.mark.parametrize(
    "sentinel_kwargs", list(SILENT_SENTINEL_KWARGS.values()), ids=list(SILENT_SENTINEL_KWARGS)
)
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_sentinel_that_never_answers_fails_a_call_within_the_socket_timeout(
    settings, silent_sentinel, jobs_held, sentinel_kwargs, flavour
):
    import asyncio

    port, accepted = silent_sentinel
    _silent_sentinel_alias(settings, port, sentinel_kwargs)
    sem = Semaphore("silent-sentinel", limit=1, timeout=5)

    def call():
        if flavour == "sync":
            sem.acquire()
        else:
            asyncio.run(sem.aacquire())

    error, seconds = _fails_within(call, 10)
    print(f"SILENT SENTINEL {flavour}: {seconds:.2f}s, {len(accepted)} connection(s)")
    assert "No master found" in str(error)
    # The one question to the sentinel timed out once (SOCKET_TIMEOUT 2) and was not asked again.
    assert len(accepted) == 1
    assert seconds < 10  # 26 s before (about 2 s now)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_sentinel_kwargs_that_choose_a_retry_are_kept(settings, silent_sentinel, jobs_held, flavour):
    # A redis.retry.Retry, as SENTINEL_KWARGS take it: the asyncio client's connections to
    # the sentinels retry as it says too (given as it is, they would never retry).
    import asyncio

    from redis.backoff import NoBackoff
    from redis.retry import Retry

    port, accepted = silent_sentinel
    retry = Retry(NoBackoff(), 2, supported_errors=(redis.TimeoutError,))
    _silent_sentinel_alias(settings, port, {"socket_timeout": 0.5, "retry": retry})
    sem = Semaphore("silent-retry", limit=1)
    call = sem.acquire if flavour == "sync" else lambda: asyncio.run(sem.aacquire())
    error, seconds = _fails_within(call, 10)
    assert "No master found" in str(error)
    assert len(accepted) == 3  # asked, then asked again twice: the retry SENTINEL_KWARGS chose
