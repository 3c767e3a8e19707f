"""The asyncio twins share the scripts and keys of the sync API."""

import asyncio
import datetime
import os

import pytest

from django_semaphore import Semaphore, SemaphoreFull, semaphores
from django_semaphore.inspection import Holder
from django_semaphore.lease import Lease

ALGORITHMS = ["lua", "fair_locked", "fair", "basic"]

# Every contract test runs on a single server and on a Redis Cluster (tests/fixtures_redis.py).
pytestmark = pytest.mark.usefixtures("backend")


async def until(predicate, timeout=10.0, message="condition"):
    """Await ``predicate()`` (a coroutine function) becoming true."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() >= deadline:
            raise AssertionError(f"{message} not reached within {timeout}s")
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_async_limit_release_refresh(algorithm):
    sem = Semaphore("alimit", limit=2, timeout=30, algorithm=algorithm)
    a, b = await sem.aacquire(), await sem.aacquire()
    assert isinstance(a, Lease) and isinstance(b, Lease)
    assert b.token > a.token
    assert await sem.aacquire() is None
    assert await sem.aavailable() == 0
    assert await a.arefresh() is True
    assert await a.arelease() is True
    assert await a.arelease() is False
    assert await a.arefresh() is False
    assert await sem.aavailable() == 1
    assert [h.identifier for h in await sem.aholders()] == [b.identifier]
    assert await b.arelease() is True


@pytest.mark.asyncio
async def test_async_and_sync_see_the_same_semaphore():
    sem = semaphores["reports"]
    a = await sem.aacquire()
    b = sem.acquire()
    assert sem.acquire() is None and await sem.aacquire() is None
    assert [h.identifier for h in await sem.aholders()] == [h.identifier for h in sem.holders()]
    assert b.release() is True
    assert await sem.aavailable() == 1
    assert await a.arelease() is True


@pytest.mark.asyncio
async def test_ahold():
    sem = Semaphore("ahold", limit=1, timeout=30)
    async with sem.ahold(meta={"task": "x"}) as lease:
        assert (await sem.aholders())[0].meta["task"] == "x"
        with pytest.raises(SemaphoreFull) as info:
            async with sem.ahold():
                pass  # pragma: no cover
        assert info.value.name == "ahold" and 1 <= info.value.retry_after <= 30
    assert lease.released
    assert await sem.aavailable() == 1


@pytest.mark.asyncio
async def test_ahold_releases_when_the_block_raises():
    sem = Semaphore("ahold", limit=1, timeout=30)
    with pytest.raises(KeyError):
        async with sem.ahold():
            raise KeyError("boom")
    assert await sem.aavailable() == 1


@pytest.mark.asyncio
async def test_aholders_meta_and_times():
    sem = Semaphore("aholders", limit=3, timeout=15)
    first = await sem.aacquire(meta={"n": 1})
    second = await sem.aacquire(key="k", meta={"n": 2})
    (holder,) = await sem.aholders()
    assert isinstance(holder, Holder)
    assert (holder.identifier, holder.token) == (first.identifier, first.token)
    assert holder.meta["n"] == 1 and holder.meta["pid"] == os.getpid()
    assert holder.expires_at - holder.acquired_at == datetime.timedelta(seconds=15)
    assert holder.acquired_at.tzinfo is not None
    (keyed,) = await sem.aholders(key="k")
    assert keyed.identifier == second.identifier and keyed.meta["key"] == "k"


@pytest.mark.asyncio
async def test_async_expiry_and_apurge_expired():
    sem = Semaphore("apurge", limit=3, timeout=0.3)
    lease = await sem.aacquire()
    await sem.aacquire(key="other")

    async def all_free():
        return await sem.aavailable() == 3 and await sem.aavailable("other") == 3

    await until(all_free, message="lease expiry")
    assert await sem.aholders() == []
    assert await sem.apurge_expired() == 2
    assert await sem.apurge_expired() == 0
    assert await lease.arefresh() is False
    assert await sem.aavailable() == 3


@pytest.mark.asyncio
async def test_async_waiter_is_woken_by_a_release():
    sem = Semaphore("await", limit=1, timeout=30)
    holder = await sem.aacquire()
    waiter = asyncio.create_task(sem.aacquire(wait=20))

    async def queued():
        return await asyncio.to_thread(lambda: sem.status().waiting) == 1

    await until(queued, message="waiter queued")
    assert not waiter.done()
    assert await holder.arelease() is True
    lease = await asyncio.wait_for(waiter, 10)
    assert lease is not None and lease.token > holder.token
    assert await lease.arelease() is True


@pytest.mark.asyncio
async def test_async_wait_times_out_without_blocking_the_loop():
    sem = Semaphore("await", limit=1, timeout=30)
    await sem.aacquire()
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        assert await sem.aacquire(wait=0.5) is None
    finally:
        task.cancel()
    assert ticks >= 3  # the loop kept running while we waited


@pytest.mark.asyncio
async def test_a_cancelled_waiter_does_not_hold_up_the_queue():
    sem = Semaphore("acancel", limit=1, timeout=30)
    holder = await sem.aacquire()
    waiter = asyncio.create_task(sem.aacquire(wait=20))

    async def queued():
        return await asyncio.to_thread(lambda: sem.status().waiting) == 1

    await until(queued, message="waiter queued")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # The cancelled waiter took its ticket back on the way out: the queue is
    # empty at once, not when the abandoned ticket would have expired.
    assert await asyncio.to_thread(lambda: sem.status().waiting) == 0
    assert await holder.arelease() is True
    assert await sem.aacquire() is not None


# -- the twins: every Semaphore method that talks to Redis has an ``a`` twin ------------


def _figures(status):
    """A PartitionStatus without retry_after (it counts down between two reads)."""
    return (status.key_hash, status.limit, status.in_use, status.waiting)


@pytest.mark.asyncio
@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_every_twin_gives_the_sync_answer(algorithm):
    sem = Semaphore("twins", limit=2, timeout=30, algorithm=algorithm)
    short = Semaphore("twins", limit=2, timeout=0.2, algorithm=algorithm)  # the same keys
    first = await sem.aacquire(key="k1", meta={"n": 1})
    await sem.aacquire(key="k1", meta={"n": 2})
    await sem.aacquire(key="k2")
    assert short.acquire() is not None  # unpartitioned, expiring at once: for purge to find

    async def expired():
        return await sem.aavailable() == 2

    await until(expired, message="the short lease's expiry")

    partitions = sem.partitions()
    apartitions = await sem.apartitions()
    assert sorted(k.base for k in apartitions) == sorted(k.base for k in partitions)
    assert {k.base for k in partitions} == {sem.partition(k).base for k in ("k1", "k2", None)}
    for keys in partitions:
        assert await sem.aholders(keys=keys) == sem.holders(keys=keys)
        async_status, sync_status = await sem.astatus(keys=keys), sem.status(keys=keys)
        assert _figures(async_status) == _figures(sync_status)
        assert abs(async_status.retry_after - sync_status.retry_after) <= 1
    assert (
        _figures(await sem.astatus("k1"))
        == _figures(sem.status("k1"))
        == (
            sem.partition("k1").key_digest,
            2,
            2,
            0,
        )
    )
    assert await sem.aavailable("k1") == sem.available("k1") == 0
    assert await sem.aavailable("k2") == sem.available("k2") == 1
    assert await sem.apurge_expired(dry_run=True) == sem.purge_expired(dry_run=True) == 1

    keys = sem.partition("k1")
    assert await sem.aforce_release(first.identifier, "k1") is True
    assert await sem.aforce_release(first.identifier, keys=keys) is False
    assert sem.force_release(first.identifier, "k1") is False
    assert [h.meta["n"] for h in await sem.aholders("k1")] == [h.meta["n"] for h in sem.holders("k1")] == [2]
    assert await first.arelease() is False  # force-released: the lease finds its slot gone
    assert await sem.apurge_expired() == 1 and sem.purge_expired() == 0


@pytest.mark.asyncio
async def test_apartitions_of_a_semaphore_without_keys():
    sem = Semaphore("twins-empty", limit=1)
    assert await sem.apartitions() == sem.partitions() == []
    assert await sem.apurge_expired() == sem.purge_expired() == 0
