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


# -- statuses: many partitions in pipelines ------------------------------------------------


def _same_figures(batch, single):
    """The batch's statuses are the single reads' (retry_after: read a moment earlier, so
    the same or one second more)."""
    assert [s._replace(retry_after=0) for s in batch] == [s._replace(retry_after=0) for s in single]
    assert all(0 <= b.retry_after - s.retry_after <= 1 for b, s in zip(batch, single, strict=True))


@pytest.mark.parametrize("algorithm", ["lua", "fair"])
def test_statuses_in_pipelines_are_the_status_of_each_partition(algorithm, monkeypatch):
    """The admin and the metrics read every live partition's status, one round trip each
    (slow with tens of thousands); statuses() reads them BATCH at a time, with the same
    figures, in the order given, and a pipeline per BATCH."""
    from django_semaphore.engine import inspection
    from tests.support.helpers import count_round_trips, queue_waiters

    monkeypatch.setattr(inspection, "BATCH", 4)
    sem = Semaphore("many-parts", limit=3, timeout=600, algorithm=algorithm)
    held = [sem.acquire(key=f"k{n}") for n in range(9) for _ in range(n % 4)]
    held += [sem.acquire(key="full") for _ in range(3)]
    threads = []
    if algorithm == "lua":
        threads, got = queue_waiters(_Keyed(sem, "full"), 2, wait=30)
    keys = [sem.partition(f"k{n}") for n in range(9)] + [sem.partition("full"), sem.partition("never-used")]
    try:
        sem.statuses(keys)  # the script loaded on every node (a NOSCRIPT costs a round trip more)
        sent = count_round_trips(monkeypatch)
        batch = sem.statuses(keys)
        sent = list(sent)
        single = [sem.status(keys=k) for k in keys]
    finally:
        for lease in held:
            lease.release()
        for thread in threads:
            thread.join()
        for lease in got.values() if threads else ():
            lease.release()
    assert sent == ["PIPELINE"] * 3  # 11 partitions, 4 per pipeline
    _same_figures(batch, single)
    assert [s.in_use for s in batch] == [n % 4 for n in range(9)] + [3, 0]
    assert batch[9].waiting == (2 if algorithm == "lua" else 0)


class _Keyed:
    """``sem`` as queue_waiters drives it, on partition ``key``."""

    def __init__(self, sem, key):
        self.sem, self.key = sem, key

    def acquire(self, wait):
        return self.sem.acquire(key=self.key, wait=wait)

    def status(self):
        return self.sem.status(self.key)


def test_statuses_of_a_total_names_partitions_and_whole():
    from django_semaphore.engine import discovery

    sem = Semaphore("many-total", limit=2, timeout=600, total=5)
    held = [sem.acquire(key=key) for key in ("a", "a", "b", "c")]
    try:
        found = discovery.expand(sem.partitions())
        keys = [*found, found[0].whole]
        batch, single = sem.statuses(keys), [sem.status(keys=k) for k in keys]
    finally:
        for lease in held:
            lease.release()
    _same_figures(batch, single)
    assert sorted(s.in_use for s in batch[:-1]) == [1, 1, 2] and batch[-1].in_use == 4


def test_statuses_load_the_script_where_it_is_missing(backend_redis):
    """After a restart or SCRIPT FLUSH the pipeline's EVALSHAs answer NOSCRIPT: one runs alone
    (loading it on its node), the others are sent again; same figures."""
    sem = Semaphore("many-flushed", limit=2, timeout=600)
    held = [sem.acquire(key=f"k{n}") for n in range(6)]
    keys = [sem.partition(f"k{n}") for n in range(6)]
    try:
        backend_redis.script_flush()
        batch = sem.statuses(keys)
        single = [sem.status(keys=k) for k in keys]
    finally:
        for lease in held:
            lease.release()
    _same_figures(batch, single)
    assert [s.in_use for s in batch] == [1] * 6


def test_statuses_fail_as_status_does(backend_redis):
    from django_semaphore import SemaphoreBackendError

    sem = Semaphore("many-broken", limit=2, timeout=600)
    keys = [sem.partition("ok"), sem.partition("broken")]
    backend_redis.set(keys[1].main[0], "not a semaphore")
    try:
        with pytest.raises(SemaphoreBackendError, match="WRONGTYPE"):
            sem.status(keys=keys[1])
        with pytest.raises(SemaphoreBackendError, match="WRONGTYPE"):
            sem.statuses(keys)
    finally:
        backend_redis.delete(keys[1].main[0])


@pytest.mark.asyncio
async def test_astatuses_are_the_statuses():
    sem = Semaphore("many-async", limit=2, timeout=600)
    held = [await sem.aacquire(key=f"k{n}") for n in range(5)]
    keys = [sem.partition(f"k{n}") for n in range(5)] + [sem.partition("idle")]
    try:
        batch = await sem.astatuses(keys)
        single = [sem.status(keys=k) for k in keys]
    finally:
        for lease in held:
            await lease.arelease()
    _same_figures(batch, single)
    assert [s.in_use for s in batch] == [1] * 5 + [0]
