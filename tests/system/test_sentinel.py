"""The engine behind Redis Sentinel, through django-redis's Sentinel client.

One primary, one replica and one sentinel on loopback; SEMAPHORE_REDIS names
a django-redis alias using ``django_redis.client.SentinelClient`` with
``django_redis.pool.SentinelConnectionFactory``.  The failover test forces
``SENTINEL FAILOVER`` under load and measures what a failover costs: moments
with more than LIMIT holders and leases lost.  Replication is asynchronous,
so a grant acknowledged by the old primary just before the switch may never
reach the new one; the test asserts that every such loss is reported to its
holder (release/refresh -> False), and that the engine follows the new
primary without a restart.
"""

import asyncio
import json
import os
import random
import threading
import time

import pytest
import redis

from django_semaphore import Semaphore, SemaphoreBackendError, signals
from django_semaphore.backend import connection
from tests.support.fixtures_redis import sentinel_service
from tests.support.helpers import wait_until
from tests.support.servers import RedisSentinelServers

LIMIT = 3


def sentinel_cache(servers):
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://{servers.service}/0",
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
            "SENTINELS": servers.sentinels,
            "SOCKET_CONNECT_TIMEOUT": 1,
            "SOCKET_TIMEOUT": 2,
        },
    }


@pytest.fixture
def sentinel_alias(redis_sentinel, settings):
    settings.CACHES = {**settings.CACHES, "sentinel": sentinel_cache(redis_sentinel)}
    settings.SEMAPHORE_REDIS = "sentinel"
    yield redis_sentinel
    connection.reset()


def _port_of(client):
    return client.connection_pool.get_master_address()[1]


def test_operations_through_sentinel(sentinel_alias):
    sem = Semaphore("sentinel-ops", limit=2, timeout=5)
    a, b = sem.acquire(), sem.acquire()
    assert a and b and sem.acquire() is None
    assert a.refresh() is True
    assert [h.identifier for h in sem.holders()] == [a.identifier, b.identifier]
    assert a.release() and b.release()
    assert _port_of(connection.get_client()) == sentinel_alias.primary.port


@pytest.mark.asyncio
async def test_async_operations_through_sentinel(sentinel_alias):
    sem = Semaphore("sentinel-aops", limit=1, timeout=5)
    lease = await sem.aacquire()
    assert lease and await sem.aacquire() is None
    assert await lease.arefresh() is True
    assert await lease.arelease() is True
    client = connection.get_async_client()
    assert type(client).__module__.startswith("redis.asyncio")


@pytest.mark.asyncio
async def test_the_async_client_keeps_the_alias_max_connections(redis_sentinel, settings):
    cache = sentinel_cache(redis_sentinel)
    cache["OPTIONS"]["CONNECTION_POOL_KWARGS"] = {"max_connections": 3}
    settings.CACHES = {**settings.CACHES, "sentinel": cache}
    settings.SEMAPHORE_REDIS = "sentinel"
    try:
        assert connection.get_client().connection_pool.max_connections == 3
        lease = await Semaphore("sentinel-abound", limit=1, timeout=5).aacquire()
        assert lease and await lease.arelease()
        assert connection.get_async_client().connection_pool.max_connections == 3
    finally:
        connection.reset()


def _sweep(intervals):
    """(greatest number of overlapping intervals, number of moments above LIMIT)."""
    events = sorted([(s, 1) for s, e, *_ in intervals] + [(e, -1) for s, e, *_ in intervals])
    # At equal times, ends sort before starts (-1 < 1): touching intervals do not overlap.
    count = peak = above = 0
    for _, delta in events:
        count += delta
        peak = max(peak, count)
        if delta == 1 and count > LIMIT:
            above += 1
    return peak, above


REPLICATION = {
    # Redis's default: the primary acknowledges writes before any replica has them.
    "async": (),
    # The primary refuses writes unless a replica acknowledged within 1 s.
    "min-replicas": ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"),
}


@pytest.fixture(params=list(REPLICATION))
def loaded_sentinel(request, settings):
    with RedisSentinelServers(service=sentinel_service(), server_args=REPLICATION[request.param]) as servers:
        settings.CACHES = {**settings.CACHES, "sentinel": sentinel_cache(servers)}
        settings.SEMAPHORE_REDIS = "sentinel"
        yield request.param, servers
        connection.reset()


@pytest.mark.slow
def test_failover_under_load(loaded_sentinel, settings):
    """SENTINEL FAILOVER while 8 threads contend for LIMIT 3; measure the cost."""
    replication, sentinel_alias = loaded_sentinel
    sem = Semaphore("sentinel-load", limit=LIMIT, timeout=5)
    stop = threading.Event()
    intervals, errors, lost_signals = [], [], []
    lock = threading.Lock()

    def on_lost(lease, **kwargs):
        with lock:
            lost_signals.append(lease.identifier)

    signals.lease_lost.connect(on_lost, dispatch_uid="test_failover_under_load")

    def worker(seed):
        rnd = random.Random(seed)
        while not stop.is_set():
            try:
                lease = sem.acquire()
            except SemaphoreBackendError as exc:
                with lock:
                    errors.append((time.monotonic(), str(exc)))
                time.sleep(0.02)
                continue
            if lease is None:
                time.sleep(rnd.uniform(0, 0.005))
                continue
            started = time.monotonic()
            time.sleep(rnd.uniform(0.001, 0.015))
            ended = time.monotonic()
            try:
                held = lease.release()
            except SemaphoreBackendError as exc:
                with lock:
                    errors.append((time.monotonic(), str(exc)))
                held = None  # unknown: Redis unreachable at release
            with lock:
                intervals.append((started, ended, held, lease.token))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(intervals) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        old_primary = sentinel_alias.master_address()
        failover_started = time.monotonic()
        new_primary = sentinel_alias.failover()
        promoted = time.monotonic()
        before = len(intervals)
        deadline = time.monotonic() + 60
        while len(intervals) < before + 300 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        signals.lease_lost.disconnect(dispatch_uid="test_failover_under_load")

    assert new_primary != old_primary
    after = [i for i in intervals if i[1] >= failover_started]
    peak, above = _sweep(intervals)
    peak_after, above_after = _sweep(after)
    lost = sum(1 for i in intervals if i[2] is False)
    unknown = sum(1 for i in intervals if i[2] is None)
    tokens = [i[3] for i in intervals]
    errors_after = [e for e in errors if e[0] > promoted + 1.0]
    starts = sorted(i[0] for i in intervals)
    longest_gap = max((b - a for a, b in zip(starts, starts[1:], strict=False)), default=0.0)
    figures = {
        "replication": replication,
        "holds": len(intervals),
        "holds_after_failover_started": len(after),
        "peak_holders": peak,
        "moments_above_limit": above,
        "moments_above_limit_after_promotion": above_after,
        "leases_lost": lost,
        "releases_failed_unreachable": unknown,
        "lease_lost_signals": len(lost_signals),
        "tokens_granted_twice": len(tokens) - len(set(tokens)),
        "backend_errors_during_switch": len(errors) - len(errors_after),
        "backend_errors_after_switch": len(errors_after),
        "failover_seconds": round(promoted - failover_started, 2),
        "longest_seconds_without_a_grant": round(longest_gap, 2),
    }
    print("SENTINEL FAILOVER FIGURES", json.dumps(figures))
    _record(figures)
    # The engine follows the promotion: work went on, on the new primary.
    assert len(intervals) - before >= 300
    assert _port_of(connection.get_client()) == new_primary[1]
    if replication == "async":
        assert not errors_after, errors_after[:3]
    # Every lease the failover lost was reported to its holder.
    assert len(lost_signals) >= lost
    # More than LIMIT at once is only possible if grants were lost in the switch.
    if above:
        assert lost + unknown > 0
    assert peak <= LIMIT + lost + unknown


def _record(figures):
    path = os.environ.get("SEMAPHORE_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"sentinel_failover": figures}) + "\n")


def test_async_client_follows_failover(sentinel_alias):
    sem = Semaphore("sentinel-afollow", limit=1, timeout=5)

    async def cycle():
        lease = await sem.aacquire()
        assert lease is not None
        assert await lease.arelease()

    async def main():
        await cycle()
        await asyncio.to_thread(sentinel_alias.failover)
        deadline = time.monotonic() + 10
        while True:
            try:
                await cycle()
                return
            except SemaphoreBackendError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    asyncio.run(main())
    new = sentinel_alias.master_address()
    assert redis.Redis(port=new[1]).info("replication")["role"] == "master"


class _Waiter:
    """A caller of ``sem.acquire(wait=...)`` (or of ``aacquire`` in an event loop of its own)
    in a thread: what it got, a lease or the SemaphoreBackendError."""

    def __init__(self, sem, flavour, wait):
        self.outcome = {}

        def run():
            try:
                if flavour == "sync":
                    self.outcome["lease"] = sem.acquire(wait=wait)
                else:
                    self.outcome["lease"] = asyncio.run(sem.aacquire(wait=wait))
            except SemaphoreBackendError as exc:
                self.outcome["error"] = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "still waiting"
        assert "error" not in self.outcome, self.outcome["error"]
        return self.outcome["lease"]


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_waiter_keeps_its_place_through_a_failover(sentinel_alias, flavour):
    """Two callers queue on a held semaphore; the primary fails over while they wait.

    The failover drops their connections (a blocked BLPOP included): they reconnect to the
    new primary and wait on, within their WAIT.  Replication may not have carried the
    first one's queue entry (here it is deleted from the new primary to make sure): it
    comes back to its place, ahead of the second, and is served first."""
    sem = Semaphore("sentinel-waiters", limit=1, timeout=60)
    keys = sem.partition()
    holder = sem.acquire()
    old = redis.Redis(port=sentinel_alias.primary.port)
    first = _Waiter(sem, flavour, wait=40)
    [member] = wait_until(lambda: old.zrange(keys.queue, 0, -1), message="the first waiter queued")
    second = _Waiter(sem, flavour, wait=40)
    wait_until(lambda: old.zcard(keys.queue) == 2, message="the second waiter queued")

    new = redis.Redis(port=sentinel_alias.failover()[1])
    # The first waiter's entry as if replication had not carried it.
    identifier = member.decode().split(":", 2)[2]
    new.zrem(keys.queue, member)
    new.zrem(keys.queue_deadlines, member)
    new.hdel(keys.waiters, identifier, "@" + identifier)
    # It comes back with its ticket: the same member, ahead of the second.
    wait_until(
        lambda: new.zrange(keys.queue, 0, -1)[:1] == [member] and new.zcard(keys.queue) == 2,
        message="the first waiter back at its place on the new primary",
        state=lambda: (new.zrange(keys.queue, 0, -1), member, first.outcome, second.outcome),
    )
    assert first.thread.is_alive() and second.thread.is_alive()  # waiting on, neither failed

    holder.release()  # True, or False if the failover lost the holder's lease: the slot is free either way
    lease = first.result(30)
    assert lease is not None
    assert [h.identifier for h in sem.holders()] == [lease.identifier]  # one holder: no double grant
    assert second.thread.is_alive()
    assert lease.release()
    other = second.result(30)
    assert other is not None and other.release()
    assert _port_of(connection.get_client()) == new.connection_pool.connection_kwargs["port"]
    old.close()
    new.close()
