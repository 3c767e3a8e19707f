"""Semaphore (django_semaphore.core): the limit, hold and ahold, configured and ad-hoc
semaphores, and the asyncio twin of every method that talks to Redis."""

import pytest

from django_semaphore import Semaphore, SemaphoreFull, semaphores
from django_semaphore.lease import Lease
from tests.helpers import until

ALGORITHMS = ["lua", "fair_locked", "fair", "basic"]


# Every contract test runs on a single server and on a Redis Cluster (tests/fixtures_redis.py).
pytestmark = pytest.mark.usefixtures("backend")


# -- the limit ----------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_limit_is_enforced(algorithm):
    sem = Semaphore("limited", limit=3, timeout=30, algorithm=algorithm)
    leases = [sem.acquire() for _ in range(3)]
    assert all(isinstance(lease, Lease) for lease in leases)
    assert sem.acquire() is None
    assert sem.available() == 0
    assert len(sem.holders()) == 3
    assert leases[1].release() is True
    assert sem.available() == 1
    again = sem.acquire()
    assert again is not None
    assert sem.acquire() is None
    for lease in [leases[0], leases[2], again]:
        assert lease.release() is True
    assert sem.available() == 3
    assert sem.holders() == []


def test_configured_semaphore_uses_settings():
    sem = semaphores["reports"]  # LIMIT 2, TIMEOUT 5 in tests/settings.py
    assert (sem.name, sem.limit, sem.timeout) == ("reports", 2, 5)
    a, b = sem.acquire(), sem.acquire()
    assert a and b
    assert sem.acquire() is None
    assert a.release() and b.release()


def test_hold_releases_and_raises_semaphore_full():
    sem = Semaphore("held", limit=1, timeout=30)
    with sem.hold(meta={"job": 1}) as lease:
        assert isinstance(lease, Lease)
        assert sem.available() == 0
        with pytest.raises(SemaphoreFull) as info, sem.hold():
            pass  # pragma: no cover - never entered
        assert info.value.name == "held"
        assert 25 <= info.value.retry_after <= 30  # the holder's remaining lease
    assert lease.released
    assert sem.available() == 1


def test_hold_releases_when_the_block_raises():
    sem = Semaphore("held", limit=1, timeout=30)
    with pytest.raises(ZeroDivisionError), sem.hold():
        1 / 0  # noqa: B018
    assert sem.available() == 1


def test_retry_after_is_capped_at_timeout():
    Semaphore("capped", limit=1, timeout=60).acquire()
    # A caller whose TIMEOUT is shorter than the holder's lease waits at most its TIMEOUT.
    with pytest.raises(SemaphoreFull) as info, Semaphore("capped", limit=1, timeout=2).hold():
        pass  # pragma: no cover
    assert info.value.retry_after == 2
    with pytest.raises(SemaphoreFull) as info, Semaphore("capped", limit=1, timeout=0.2).hold():
        pass  # pragma: no cover
    assert info.value.retry_after == 1  # whole seconds, at least 1


def test_partitions_are_independent():
    sem = Semaphore("parted", limit=1, timeout=30)
    a = sem.acquire(key="alice")
    assert sem.acquire(key="alice") is None
    b = sem.acquire(key="bob")
    c = sem.acquire()  # key=None is a partition of its own
    d = sem.acquire(key="")  # and so is the empty string
    assert a and b and c and d
    assert sem.available("alice") == 0 and sem.available("carol") == 1
    assert [h.identifier for h in sem.holders(key="bob")] == [b.identifier]
    assert [h.identifier for h in sem.holders()] == [c.identifier]
    assert [h.identifier for h in sem.holders(key="")] == [d.identifier]


def test_wait_must_not_be_negative():
    with pytest.raises(ValueError):
        Semaphore("w", limit=1).acquire(wait=-1)


def test_ad_hoc_semaphore_validates_its_arguments():
    with pytest.raises(ValueError, match="LIMIT"):
        Semaphore("bad", limit=0)
    with pytest.raises(ValueError, match="TIMEOUT"):
        Semaphore("bad", limit=1, timeout=0)
    with pytest.raises(ValueError, match="ALGORITHM"):
        Semaphore("bad", limit=1, algorithm="magic")


# -- asyncio ------------------------------------------------------------------


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
