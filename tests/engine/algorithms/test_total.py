"""TOTAL: LIMIT per partition and TOTAL across the partitions of a name, with
freed permits shared fairly between the waiting partitions (engine.algorithms.total)."""

import threading
import time
import uuid

import pytest

from django_semaphore import Semaphore, SemaphoreFull
from django_semaphore.backend import connection
from django_semaphore.backend.scripting import run
from django_semaphore.engine.algorithms import AcquireRequest, Refused, algorithm_for
from django_semaphore.engine.waiting import TICKET_MS
from tests.support.helpers import expire_now, wait_until


def _sem(limit=2, total=3, **options):
    return Semaphore(f"total-{uuid.uuid4().hex[:8]}", limit=limit, total=total, **options)


def test_limit_per_partition_and_total_across_partitions():
    sem = _sem(limit=2, total=3)
    a1, a2 = sem.acquire(key="a"), sem.acquire(key="a")
    assert a1 and a2
    assert sem.acquire(key="a") is None  # the partition is full
    b1 = sem.acquire(key="b")
    assert b1 is not None
    assert sem.available() == 0
    assert sem.available("b") == 0  # the partition has room, the total has none
    with pytest.raises(SemaphoreFull) as full, sem.hold(key="c"):
        pass
    assert full.value.reason == "total"
    with pytest.raises(SemaphoreFull) as full, sem.hold(key="a"):
        pass
    assert full.value.reason == "full"
    assert a1.release()
    assert sem.available() == 1
    assert sem.available("a") == 1
    c1 = sem.acquire(key="c")
    assert c1 is not None
    assert [h.identifier for h in sem.holders("c")] == [c1.identifier]
    assert len(sem.holders()) == 3
    assert {keys.key_digest for keys in sem.partitions()} == {sem.partition(k).part for k in ("a", "b", "c")}
    for lease in (a2, b1, c1):
        assert lease.release()
    assert sem.available() == 3


def test_weighted_permits_count_by_weight():
    sem = _sem(limit=3, total=4)
    big = sem.acquire(key="a", permits=3)
    assert big is not None
    assert sem.acquire(key="b", permits=2) is None
    small = sem.acquire(key="b")
    assert small is not None
    assert sem.available() == 0
    assert big.release()
    assert sem.acquire(key="b", permits=2) is not None


def test_a_freed_permit_goes_to_the_partition_served_least_recently():
    sem = _sem(limit=1, total=1, wait=30)
    first = sem.acquire(key="flood")
    order = []
    lock = threading.Lock()

    def waiter(key, label):
        lease = sem.acquire(key=key, wait=30)
        with lock:
            order.append(label)
        time.sleep(0.01)
        lease.release()

    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=waiter, args=("flood", f"flood{i}")))
        threads[-1].start()
        wait_until(lambda n=i + 1: len(sem.waiters()) == n)
    for key in ("x", "y"):
        threads.append(threading.Thread(target=waiter, args=(key, key)))
        threads[-1].start()
        queued = len(threads)
        wait_until(lambda n=queued: len(sem.waiters()) == n)
    first.release()
    for thread in threads:
        thread.join(30)
    # flood was served last: x and y first (in arrival order), then flood's, one at a time
    assert order[:2] == ["x", "y"], order
    assert order[2:] == ["flood0", "flood1", "flood2"], order


def test_a_partition_at_its_limit_blocks_nobody():
    sem = _sem(limit=1, total=3, wait=30)
    a = sem.acquire(key="a")
    got = []
    t = threading.Thread(target=lambda: got.append(sem.acquire(key="a", wait=30)))
    t.start()
    wait_until(lambda: len(sem.waiters("a")) == 1)
    b = sem.acquire(key="b")  # a's waiter waits for a's LIMIT, not for the total
    assert b is not None
    a.release()
    t.join(10)
    assert got and got[0] is not None
    got[0].release()
    b.release()


def test_override_total_at_runtime():
    sem = _sem(limit=2, total=2)
    assert sem.effective().total == 2
    sem.override(total=1)
    assert sem.effective(fresh=True).total == 1
    wait_until(lambda: sem.effective().total == 1)
    lease = sem.acquire(key="a")
    assert sem.acquire(key="b") is None
    lease.release()
    sem.clear_override()


def test_every_key_of_a_total_name_has_a_ttl(raw_redis):
    sem = _sem(limit=1, total=1, wait=30)
    held = sem.acquire(key="a")
    got = []
    t = threading.Thread(target=lambda: got.append(sem.acquire(key="b", wait=30)))
    t.start()
    wait_until(lambda: len(sem.waiters()) == 1)
    pattern = sem.partition("a").base.replace("{", "[{]").replace("}", "[}]") + "*"
    found = list(raw_redis.scan_iter(match=pattern))
    assert {key.decode().rsplit(":", 1)[1] for key in found} >= {"t", "h", "q", "d", "m", "o"}
    for key in found:
        assert raw_redis.pttl(key) > 0, key
    held.release()
    t.join(10)
    got[0].release()
    for key in raw_redis.scan_iter(match=pattern):
        assert raw_redis.pttl(key) > 0, key


def test_the_holders_zset_a_release_re_creates_for_a_waiter_keeps_a_ttl(raw_redis):
    # The last holder's release empties the name's timeouts ZSET (Redis deletes
    # it), then grants the waiter of another partition its claim, which creates
    # the ZSET again: it must get a TTL, or it lives for ever with the claim
    # of a waiter that died before it came.
    sem = _sem(limit=1, total=1, timeout=30)
    a, b = sem.partition("a"), sem.partition("b")
    held = sem.acquire(key="a")
    request = AcquireRequest(f"{b.part}/dead-waiter", "{}", 30_000, ticket_ms=TICKET_MS)
    assert isinstance(run(connection.get_client(), algorithm_for(sem.config).acquire(b, 1, request)), Refused)
    assert held.release() is True
    assert raw_redis.zscore(a.timeouts, request.identifier) is not None  # its claim
    assert raw_redis.pttl(a.timeouts) > 0


def test_max_waiters_counts_per_partition():
    sem = _sem(limit=1, total=1, wait=30, max_waiters=1)
    held = sem.acquire(key="a")
    results = []
    threads = [
        threading.Thread(target=lambda k=k: results.append(sem.acquire(key=k, wait=30))) for k in ("a", "b")
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(sem.waiters()) == 2)  # one waiter in each partition: both may wait
    with pytest.raises(SemaphoreFull) as full, sem.hold(key="a", wait=5):
        pass
    assert full.value.reason == "queue_full"
    held.release()
    for thread in threads:
        thread.join(10)
        held = results[-1]
        held.release()


def test_dry_run_grants_and_counts_would_be_total_refusals():
    from django_semaphore import signals

    sem = _sem(limit=2, total=1, mode="dry_run")
    seen = []

    def receiver(sender, **kwargs):
        seen.append((kwargs["retry_after"].reason, kwargs["dry_run"]))

    signals.refused.connect(receiver)
    try:
        first = sem.acquire(key="a")
        second = sem.acquire(key="b")
        third = sem.acquire(key="b")
    finally:
        signals.refused.disconnect(receiver)
    assert not first.over_limit
    assert second.over_limit and third.over_limit
    assert seen == [("total", True), ("total", True)]
    assert sem.status().in_use == 3  # holders recorded as usual


def test_a_total_override_of_0_refuses_with_reason_total():
    sem = _sem(limit=2, total=2)
    sem.override(total=0)
    try:
        with pytest.raises(SemaphoreFull) as full, sem.hold(key="a"):
            pass
        assert full.value.reason == "total"
    finally:
        sem.clear_override()
    assert sem.acquire(key="a") is not None


def test_an_expired_holder_gives_its_partition_and_the_total_back(raw_redis):
    sem = _sem(limit=1, total=2)
    lease = sem.acquire(key="a", permits=1)
    expire_now(raw_redis, lease.keys.timeouts, lease.identifier)
    assert sem.purge_expired() == 1
    assert sem.available("a") == 1 and sem.available() == 2
    assert not lease.release()


def test_refreshing_a_lease_purged_before_gives_its_partition_nothing_back_twice(raw_redis):
    # The purge gave the expired lease's permit back; its holder's refresh
    # (the watchdog's, say) finds it gone and must not give it back again:
    # the partition's count would fall below its holders and admit one more.
    sem = _sem(limit=2, total=5)
    lost, kept = sem.acquire(key="a"), sem.acquire(key="a")
    expire_now(raw_redis, lost.keys.timeouts, lost.identifier)
    assert sem.purge_expired() == 1
    assert lost.refresh() is False
    assert sem.available("a") == 1 and sem.available() == 4
    assert sem.acquire(key="a") is not None
    assert sem.acquire(key="a") is None  # LIMIT 2: kept and the newcomer hold the partition
    assert kept.release()


def test_a_handed_off_lease_of_an_ad_hoc_total_semaphore_is_released_by_its_adopter():
    from django_semaphore import Lease

    sem = _sem(limit=1, total=1)
    lease = sem.acquire(key="a")
    adopted = Lease.adopt(lease.handoff())
    assert adopted.keys.part == sem.partition("a").part
    assert sem.acquire(key="b") is None
    assert adopted.refresh()
    assert adopted.semaphore.config.total == 1
    assert adopted.release()
    assert sem.available("a") == 1 and sem.available("b") == 1  # the partition's count too
    assert sem.acquire(key="b") is not None


@pytest.mark.asyncio
async def test_async_waiters_share_the_total():
    import asyncio

    sem = _sem(limit=2, total=1, wait=30)
    first = await sem.aacquire(key="a")
    task_a = asyncio.create_task(sem.aacquire(key="a", wait=30))
    for _ in range(200):
        if len(await sem.awaiters()) == 1:
            break
        await asyncio.sleep(0.01)
    task_b = asyncio.create_task(sem.aacquire(key="b", wait=30))
    for _ in range(200):
        if len(await sem.awaiters()) == 2:
            break
        await asyncio.sleep(0.01)
    assert await first.arelease()
    # b was never served, a was: b goes first although a's waiter came earlier
    granted_b = await asyncio.wait_for(task_b, 10)
    assert not task_a.done()
    assert await sem.aavailable() == 0
    assert await granted_b.arelease()
    granted_a = await asyncio.wait_for(task_a, 10)
    assert await granted_a.arelease()


def test_total_with_slots_is_refused():
    with pytest.raises(ValueError, match="TOTAL and SLOTS"):
        Semaphore("total-slots", limit=2, total=4, slots=True)
