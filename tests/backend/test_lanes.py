"""Lanes: the hot scripts run on connections kept between calls, with every reply going
to the caller that asked for it, through restarts, timeouts, threads and forks."""

import asyncio
import os
import select
import threading

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
from redis._parsers import _RESP2Parser

from django_semaphore import Semaphore
from django_semaphore.backend import connection, lanes
from tests.support.servers import RedisServer

# Returns its argument: a reply that names its caller.
ECHO = "return ARGV[1]"
# Busy for ARGV[1] ms, then returns ARGV[2]: longer than a short socket timeout.
SLOW = (
    "local t = redis.call('TIME') local until_ms = t[1] * 1000 + t[2] / 1000 + tonumber(ARGV[1]) "
    "repeat t = redis.call('TIME') until t[1] * 1000 + t[2] / 1000 >= until_ms "
    "return ARGV[2]"
)


@pytest.fixture
def server():
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def client(server):
    client = redis.Redis(port=server.port, socket_timeout=5)
    client.script_load(ECHO)
    yield client
    client.close()


def _sha(client, source):
    return client.script_load(source)


def _connections(client):
    """The server's count of open client connections, the asking one left out."""
    return int(client.info("clients")["connected_clients"]) - 1


def test_one_caller_keeps_one_connection(client, server):
    lane = lanes.lane(client)
    assert lane is lanes.lane(client)
    sha = _sha(client, ECHO)
    observer = redis.Redis(port=server.port)
    for i in range(50):
        assert lane.evalsha(sha, (), (f"call {i}",)) == f"call {i}".encode()
    # One connection for fifty calls: borrowed once, not lent and taken back each time.
    assert _connections(observer) == 1
    observer.close()


def test_replies_go_to_their_callers_across_threads(client):
    lane = lanes.lane(client)
    sha = _sha(client, ECHO)
    wrong = []
    barrier = threading.Barrier(16)

    def caller(n):
        barrier.wait()
        for i in range(200):
            want = f"{n}:{i}".encode()
            got = lane.evalsha(sha, (), (want,))
            if got != want:
                wrong.append((want, got))

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert len(lane._idle) <= lanes.IDLE  # the others went back to the pool


def test_a_small_pool_keeps_most_of_its_connections_for_others(server):
    # A django-redis cache may share the pool: a burst of acquires must not leave it short.
    client = redis.Redis(
        connection_pool=redis.BlockingConnectionPool(port=server.port, max_connections=16, timeout=1)
    )
    lane = lanes.lane(client)
    sha = _sha(client, ECHO)
    barrier = threading.Barrier(12)

    def caller():
        barrier.wait()
        for _ in range(50):
            lane.evalsha(sha, (), ("x",))

    threads = [threading.Thread(target=caller) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lane._idle) <= 2  # an eighth of 16
    # The rest are the pool's again: 14 callers can borrow at once, none waits.
    held = [client.connection_pool.get_connection() for _ in range(14)]
    for borrowed in held:
        client.connection_pool.release(borrowed)
    client.close()


def test_a_restarted_server_is_reconnected_before_the_call(server):
    # redis-py's default for a client given a pool: no retry.  A kept connection
    # the server closed must not cost the call.
    client = redis.Redis(connection_pool=redis.ConnectionPool(port=server.port))
    sha = _sha(client, ECHO)
    lane = lanes.lane(client)
    assert lane.evalsha(sha, (), ("before",)) == b"before"
    server.restart()
    client.script_load(ECHO)
    assert lane.evalsha(sha, (), ("after",)) == b"after"
    client.close()


@pytest.mark.parametrize("parser", ["hiredis", "python"])
def test_a_kept_connection_the_server_closed_is_opened_again_every_time(server, parser):
    # No retry (redis-py's default for a client given a pool): only the check before the
    # send saves the call.  Three times over: the check follows the connection's new socket.
    options = {} if parser == "hiredis" else {"parser_class": _RESP2Parser}
    client = redis.Redis(connection_pool=redis.ConnectionPool(port=server.port, **options))
    observer = redis.Redis(port=server.port)
    lane = lanes.lane(client)
    for _ in range(3):
        kept = lane.command(("CLIENT", "ID"))
        assert lane.command(("CLIENT", "ID")) == kept  # kept between calls, not opened again
        assert observer.client_kill_filter(_id=kept) == 1  # closed before the reply: loopback
        again = lane.command(("CLIENT", "ID"))
        assert again != kept
        assert lane.command(("CLIENT", "ID")) == again
    observer.close()
    client.close()


@pytest.mark.parametrize("parser", ["hiredis", "python"])
def test_a_reply_nobody_asked_for_is_never_read_by_the_next_caller(server, parser):
    options = {} if parser == "hiredis" else {"parser_class": _RESP2Parser}
    client = redis.Redis(connection_pool=redis.ConnectionPool(port=server.port, **options))
    sha = _sha(client, ECHO)
    lane = lanes.lane(client)
    assert lane.evalsha(sha, (), ("first",)) == b"first"
    [(kept, _)] = lane._idle
    for i in range(3):
        kept._sock.sendall(b"PING\r\n")  # a reply on its way to nobody
        assert select.select([kept._sock], [], [], 5)[0], "the stray reply did not arrive"
        assert lane.evalsha(sha, (), (f"mine {i}",)) == f"mine {i}".encode()
        [(kept, _)] = lane._idle
    client.close()


def test_a_reply_left_unread_is_never_read_by_the_next_caller(server):
    client = redis.Redis(port=server.port, socket_timeout=0.2, retry=None)
    slow, echo = _sha(client, SLOW), _sha(client, ECHO)
    lane = lanes.lane(client)
    with pytest.raises(redis.TimeoutError):
        lane.evalsha(slow, (), (600, "late reply"))
    patient = redis.Redis(port=server.port)
    assert patient.ping()  # answered once the slow script is done
    patient.close()
    # The late reply arrives on the connection given up on, not on the next caller's.
    assert lane.evalsha(echo, (), ("mine",)) == b"mine"
    assert lane.evalsha(echo, (), ("mine again",)) == b"mine again"
    client.close()


def test_an_error_reply_leaves_the_connection_usable(client):
    lane = lanes.lane(client)
    with pytest.raises(redis.exceptions.NoScriptError):
        lane.evalsha("0" * 40, (), ())
    client.set("lane-text", "x")
    with pytest.raises(redis.ResponseError, match="not an integer"):
        lane.evalsha(_sha(client, "return redis.call('INCR', KEYS[1])"), ("lane-text",), ())
    assert lane.evalsha(_sha(client, ECHO), (), ("clean",)) == b"clean"


def test_replies_are_decoded_as_the_client_asks(server):
    for decode in (False, True):
        client = redis.Redis(port=server.port, decode_responses=decode)
        sha = _sha(client, "return {ARGV[1], tonumber(ARGV[2]), {ARGV[1]}}")
        args = ("é", 7)
        assert lanes.lane(client).evalsha(sha, (), args) == client.evalsha(sha, 0, *args)
        client.close()


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_commands_are_packed_as_redis_py_packs_them(server, encoding):
    client = redis.Redis(port=server.port, encoding=encoding)
    pool = client.connection_pool
    command = ("EVALSHA", "ab" * 20, 2, "k1", "ké", 1.5, -3, 10**20, b"\xff", "é")
    borrowed = pool.get_connection()
    packed = b"".join(lanes._packer(pool)(command))
    assert packed == b"".join(borrowed.pack_command(*command))
    pool.release(borrowed)
    client.close()


def test_clients_a_lane_cannot_serve_go_through_redis_py(server, cluster_client):
    single = redis.Redis(port=server.port, single_connection_client=True)
    assert lanes.lane(single) is None
    assert lanes.lane(cluster_client) is None
    assert lanes.lane(redis.asyncio.Redis(port=server.port)) is None
    assert lanes.async_lane(redis.Redis(port=server.port)) is None
    assert lanes.async_lane(redis.asyncio.Redis(port=server.port, single_connection_client=True)) is None
    sentinel = redis.asyncio.sentinel.Sentinel([("127.0.0.1", server.port)])
    assert lanes.async_lane(sentinel.master_for("svc")) is None
    single.close()


def test_a_forked_child_never_uses_its_parents_connections(client):
    sha = _sha(client, ECHO)
    lane = lanes.lane(client)
    assert lane.evalsha(sha, (), ("parent",)) == b"parent"  # a connection kept idle
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        ok = all(lane.evalsha(sha, (), (f"child {i}",)) == f"child {i}".encode() for i in range(200))
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    # Meanwhile the parent keeps using its connection: a shared socket would mix the replies.
    replies = [lane.evalsha(sha, (), (f"parent {i}",)) for i in range(200)]
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.waitpid(child, 0)
    assert replies == [f"parent {i}".encode() for i in range(200)]
    assert lane.evalsha(sha, (), ("after",)) == b"after"


def test_semaphore_scripts_run_on_the_lane(settings, server):
    settings.SEMAPHORE_REDIS = {"URL": server.url}
    sem = Semaphore("laned", limit=2, timeout=30)
    lease = sem.acquire()
    assert lease is not None
    client = connection.get_client()
    assert lanes.lane(client)._idle  # the acquire's connection, kept
    assert lease.refresh() and lease.release()
    # A flushed script cache: the lane's NOSCRIPT falls back to EVAL, which loads it again.
    client.script_flush()
    again = sem.acquire()
    assert again is not None and again.release()
    connection.reset()


def test_a_blocking_command_runs_on_the_lane_and_reads_as_redis_py(server):
    for decode in (False, True):
        client = redis.Redis(port=server.port, decode_responses=decode, socket_timeout=5)
        lane = lanes.lane(client)
        client.rpush("lane-list", "é", "é")
        assert lane.command(("BLPOP", "lane-list", 1)) == list(client.blpop("lane-list", 1))
        assert client.llen("lane-list") == 0  # one each
        assert lane.command(("BLPOP", "lane-list", 0.01)) is None  # timed out: nothing popped
        client.close()


def test_a_waiters_wait_runs_on_the_lane(settings, server, monkeypatch):
    """A waiter's BLPOP on its wake-up list goes out on the lane, as its scripts do:
    through redis-py it costs the waiter more than twice the CPU."""
    settings.SEMAPHORE_REDIS = {"URL": server.url}
    sem = Semaphore("lane-wait", limit=1, timeout=30)
    sem.acquire().release()  # scripts loaded, connections open
    sent = []
    execute_command = redis.Redis.execute_command

    def watched(self, *args, **options):
        sent.append(args[0])
        return execute_command(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", watched)
    holder = sem.acquire()
    threading.Timer(0.1, holder.release).start()
    lease = sem.acquire(wait=10)
    assert lease is not None and lease.ticket  # queued, then granted by the release
    assert "BLPOP" not in sent, sent
    assert lease.refresh() and lease.release()
    connection.reset()


# -- the asyncio twin --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_callers_keep_their_connections_and_get_their_replies(server):
    client = redis.asyncio.Redis(port=server.port)
    sha = await client.script_load(ECHO)
    lane = lanes.async_lane(client)
    assert lane is lanes.async_lane(client)
    for i in range(50):
        assert await lane.evalsha(sha, (), (f"call {i}",)) == f"call {i}".encode()
    observer = redis.Redis(port=server.port)
    assert _connections(observer) == 1  # one connection for fifty calls

    async def caller(n):
        return [await lane.evalsha(sha, (), (f"{n}:{i}",)) for i in range(50)]

    replies = await asyncio.gather(*(caller(n) for n in range(20)))
    assert replies == [[f"{n}:{i}".encode() for i in range(50)] for n in range(20)]
    assert len(lane._idle) <= lanes.IDLE
    observer.close()
    await client.aclose()


@pytest.mark.asyncio
async def test_a_cancelled_async_call_leaves_no_reply_for_the_next_caller(server):
    client = redis.asyncio.Redis(port=server.port)
    slow, echo = await client.script_load(SLOW), await client.script_load(ECHO)
    lane = lanes.async_lane(client)
    assert await lane.evalsha(echo, (), ("warm",)) == b"warm"  # a connection kept idle
    call = asyncio.ensure_future(lane.evalsha(slow, (), (300, "late reply")))
    await asyncio.sleep(0.05)  # written, waiting for the reply
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    patient = redis.Redis(port=server.port)
    assert patient.ping()  # answered once the slow script is done
    patient.close()
    assert await lane.evalsha(echo, (), ("mine",)) == b"mine"
    assert await lane.evalsha(echo, (), ("mine again",)) == b"mine again"
    await client.aclose()


@pytest.mark.asyncio
async def test_an_async_lane_reconnects_after_a_restart(server):
    client = redis.asyncio.Redis(connection_pool=redis.asyncio.ConnectionPool(port=server.port))
    sha = await client.script_load(ECHO)
    lane = lanes.async_lane(client)
    assert await lane.evalsha(sha, (), ("before",)) == b"before"
    server.restart()
    await client.script_load(ECHO)
    assert await lane.evalsha(sha, (), ("after",)) == b"after"
    await client.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
async def test_async_commands_are_packed_as_redis_py_packs_them(server, encoding):
    client = redis.asyncio.Redis(port=server.port, encoding=encoding)
    pool = client.connection_pool
    command = ("EVALSHA", "ab" * 20, 2, "k1", "ké", 1.5, -3, 10**20, b"\xff", "é")
    borrowed = await pool.get_connection()
    packed = b"".join(lanes._packer(pool)(command))
    assert packed == b"".join(borrowed.pack_command(*command))
    await pool.release(borrowed)
    await client.aclose()


@pytest.mark.asyncio
async def test_async_semaphore_scripts_run_on_the_lane(settings, server):
    settings.SEMAPHORE_REDIS = {"URL": server.url}
    sem = Semaphore("alaned", limit=2, timeout=30)
    lease = await sem.aacquire()
    assert lease is not None
    client = connection.get_async_client()
    assert lanes.async_lane(client)._idle
    assert await lease.arefresh() and await lease.arelease()
    await client.script_flush()
    again = await sem.aacquire()
    assert again is not None and await again.arelease()
    connection.reset()


@pytest.mark.asyncio
async def test_an_async_waiters_wait_runs_on_the_lane(settings, server, monkeypatch):
    settings.SEMAPHORE_REDIS = {"URL": server.url}
    sem = Semaphore("alane-wait", limit=1, timeout=30)
    await (await sem.aacquire()).arelease()
    sent = []
    execute_command = redis.asyncio.Redis.execute_command

    async def watched(self, *args, **options):
        sent.append(args[0])
        return await execute_command(self, *args, **options)

    monkeypatch.setattr(redis.asyncio.Redis, "execute_command", watched)
    holder = await sem.aacquire()
    asyncio.get_running_loop().call_later(0.1, lambda: asyncio.ensure_future(holder.arelease()))
    lease = await sem.aacquire(wait=10)
    assert lease is not None and lease.ticket
    assert "BLPOP" not in sent, sent
    assert await lease.arefresh() and await lease.arelease()
    client = redis.asyncio.Redis(port=server.port)
    await client.rpush("alane-list", "x")
    assert await lanes.async_lane(client).command(("BLPOP", "alane-list", 1)) == [b"alane-list", b"x"]
    await client.aclose()
    connection.reset()


# -- pipelines: a quiet release's plain commands, one write, every reply read -------------


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
def test_a_pipeline_reads_every_reply_even_after_an_error(server, protocol, decode):
    client = redis.Redis(port=server.port, protocol=protocol, decode_responses=decode)
    lane = lanes.lane(client)
    client.set("text", "v")
    client.zadd("z", {"m": 1.5})
    commands = (
        ("ZSCORE", "z", "m"),
        ("HGET", "text", "f"),
        ("ZSCORE", "z", "gone"),
        ("TIME",),
        ("GET", "text"),
    )
    replies = lane.pipeline(commands, raise_on_error=False)
    assert len(replies) == 5
    assert float(replies[0]) == 1.5  # b"1.5" (RESP2) or 1.5 (RESP3)
    assert isinstance(replies[1], redis.ResponseError) and "WRONGTYPE" in str(replies[1])
    assert replies[2] is None and len(replies[3]) == 2 and int(replies[3][0]) > 0
    assert replies[4] == ("v" if decode else b"v")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        lane.pipeline(commands)
    # Every reply was read: the connection answers the next caller with its own.
    assert lane.pipeline((("GET", "text"), ("ZSCORE", "z", "m"))) == (
        ["v", 1.5]
        if decode and protocol == 3
        else ["v", "1.5"]
        if decode
        else [b"v", 1.5 if protocol == 3 else b"1.5"]
    )
    assert len(lane._idle) == 1
    client.close()


def test_a_pipeline_whose_replies_arrive_apart_reads_them_all(server):
    # A reply larger than one socket read (64 KiB) is not whole in the reader
    # after the first: it and the rest are read from the socket as redis-py
    # reads one.
    client = redis.Redis(port=server.port)
    lane = lanes.lane(client)
    big = b"x" * 300_000
    client.set("big", big)
    replies = lane.pipeline((("PING",), ("GET", "big"), ("PING",), ("STRLEN", "big")))
    assert replies == [b"PONG", big, b"PONG", 300_000]
    assert lane.pipeline((("PING",),)) == [b"PONG"]
    client.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("protocol", [2, 3])
async def test_an_async_pipeline_reads_every_reply_even_after_an_error(server, protocol):
    client = redis.asyncio.Redis(port=server.port, protocol=protocol)
    lane = lanes.async_lane(client)
    big = b"x" * 300_000  # more than one read: the replies after it come from the socket
    await client.set("text", "v")
    await client.set("big", big)
    commands = (("HGET", "text", "f"), ("GET", "text"), ("GET", "big"), ("STRLEN", "big"))
    replies = await lane.pipeline(commands, raise_on_error=False)
    assert isinstance(replies[0], redis.ResponseError) and replies[1:] == [b"v", big, 300_000]
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        await lane.pipeline(commands)
    assert await lane.pipeline((("GET", "text"),)) == [b"v"]
    await client.aclose()


def test_a_pool_of_one_connection_is_shared_with_the_cache(settings, server):
    # One connection per process (a single-threaded worker under a managed Redis's
    # client limit), taken in turns by the django-redis cache, the semaphores and the
    # background poller (a blocking pool: a caller waits for it): the lane must not keep it.
    from django.core.cache import caches

    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            # A URL of this test's own: django-redis keeps its pools per URL.
            "LOCATION": f"redis://127.0.0.1:{server.port}/2",
            "OPTIONS": {
                "CONNECTION_POOL_CLASS": "redis.BlockingConnectionPool",
                "CONNECTION_POOL_KWARGS": {"max_connections": 1, "timeout": 2},
            },
        }
    }
    settings.SEMAPHORE_REDIS = "default"
    cache = caches["default"]
    try:
        cache.set("before", 1)
        sem = Semaphore("one-connection", limit=2, timeout=30)
        lease = sem.acquire()  # NOSCRIPT, then EVAL: the server has no script yet
        assert lease is not None
        assert cache.get("before") == 1  # the cache still gets the connection
        assert sem.acquire() is not None
        assert lease.release() is True
        cache.set("after", 2)
        assert cache.get("after") == 2
    finally:
        connection.reset()
