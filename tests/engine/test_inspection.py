"""Reading a partition (django_semaphore.inspection): holders, available, purge_expired."""

import datetime
import os
import socket

import pytest

from django_semaphore import Semaphore
from django_semaphore.engine.inspection import Holder
from tests.support.helpers import until, wait_until

# Every contract test runs on a single server and on a Redis Cluster (tests/support/fixtures_redis.py).
pytestmark = pytest.mark.usefixtures("backend")


def test_holders_in_token_order_with_meta_and_times():
    sem = Semaphore("who", limit=3, timeout=20)
    first = sem.acquire(meta={"job": "a"})
    second = sem.acquire(key=None, meta={"job": "b", "n": 2})
    third = sem.acquire()
    holders = sem.holders()
    assert all(isinstance(h, Holder) for h in holders)
    assert [h.identifier for h in holders] == [first.identifier, second.identifier, third.identifier]
    assert [h.token for h in holders] == [first.token, second.token, third.token]
    host, pid = socket.gethostname(), os.getpid()
    assert holders[0].meta == {"host": host, "pid": pid, "job": "a"}
    assert holders[1].meta == {"host": host, "pid": pid, "job": "b", "n": 2}
    assert holders[2].meta == {"host": host, "pid": pid}
    now = datetime.datetime.now(datetime.UTC)
    for holder, lease in zip(holders, [first, second, third], strict=True):
        assert holder.acquired_at.tzinfo is not None and holder.expires_at.tzinfo is not None
        assert holder.expires_at - holder.acquired_at == datetime.timedelta(seconds=20)
        # Server time on this machine: the same clock, give or take load.
        assert abs(holder.acquired_at - now) < datetime.timedelta(seconds=5)
        assert (holder.acquired_at, holder.expires_at) == (lease.acquired_at, lease.expires_at)
    # Release in the middle: order of the rest is kept.
    second.release()
    assert [h.identifier for h in sem.holders()] == [first.identifier, third.identifier]


def test_holders_of_a_partition_carry_the_key():
    sem = Semaphore("who", limit=2, timeout=20)
    lease = sem.acquire(key="user:42", meta={"path": "/x"})
    (holder,) = sem.holders(key="user:42")
    assert holder.identifier == lease.identifier
    assert holder.meta["key"] == "user:42" and holder.meta["path"] == "/x"


def test_available_counts_live_holders():
    sem = Semaphore("avail", limit=3, timeout=30)
    assert sem.available() == 3
    leases = [sem.acquire() for _ in range(3)]
    assert [sem.available(), sem.available(key="other")] == [0, 3]
    leases[0].release()
    assert sem.available() == 1


def test_purge_expired_counts_removed_entries():
    long = Semaphore("purge", limit=5, timeout=60)
    short = Semaphore("purge", limit=5, timeout=0.3)  # same keys, shorter leases
    keeper = long.acquire()
    for key in (None, None, "p1"):
        assert short.acquire(key=key) is not None
    wait_until(lambda: long.available() == 4 and long.available("p1") == 5, message="short leases ending")
    assert long.purge_expired() == 3
    assert long.purge_expired() == 0
    assert [h.identifier for h in long.holders()] == [keeper.identifier]
    assert keeper.refresh() is True


def test_purge_expired_with_nothing_in_redis():
    assert Semaphore("never-used", limit=1).purge_expired() == 0


# -- asyncio ------------------------------------------------------------------


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
