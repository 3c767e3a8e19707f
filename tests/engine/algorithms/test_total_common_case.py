"""TOTAL's common case at the price of "lua"'s: a partition of a name with TOTAL
whose last acquire was the common case's, with a permit left free in it and in
the name, acquires next with acquire_fast.lua (TOTAL its fifth argument), and
a quiet grant is given back by total_quiet_release.lua, not by the release
script that serves the queue.

* The fast script counts the grant where total_acquire.lua does: the
  partition's permits ("c/<part>") and last grant ("s/<part>") in the holds
  HASH, beside the entry, the record and the fair counter.
* It grants only within the partition's LIMIT and the TOTAL in force, and
  says so before writing anything otherwise: total_acquire.lua then decides.
* The quiet release lowers the partition's count only when it removes the
  holder's entry (a lease purged or force-released meanwhile was counted out
  already), removes the count with its last permit, judges liveness on the
  server's clock, and hands callers that queued meanwhile to serve.lua, which
  shares the permits by the fair-share policy.
"""

import asyncio
import threading
import time
import uuid

import pytest

from django_semaphore import Semaphore
from django_semaphore.backend import connection, scripting
from django_semaphore.engine.algorithms import AcquireRequest
from django_semaphore.engine.algorithms.lua import FAST_ACQUIRE, fast_acquire
from django_semaphore.engine.algorithms.total import QUIET_RELEASE, TotalLua, quiet_total_release
from tests.support.helpers import (
    HOLD_FIRST,
    expire_now,
    lease_keys_state,
    scripts_run,
    server_ms,
    wait_until,
    warm_hold_times,
)


def _sem(limit=3, total=5, timeout=30):
    return Semaphore(f"total-common-{uuid.uuid4().hex[:8]}", limit=limit, total=total, timeout=timeout)


def _holder_with_a_waiter(sem, wait):
    """A quiet holder in partition "alice", and a thread whose acquire in
    partition "bob" (waiting up to ``wait`` s) queues behind it: (holder, thread, [its lease])."""
    warm_hold_times(sem, key="alice")
    holder = sem.acquire(key="alice")
    assert holder._granted.quiet
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(key="bob", wait=wait)))
    waiter.start()
    wait_until(lambda: len(sem.waiters("bob")) == 1, 5, message="bob queued")
    return holder, waiter, got


def _counts(raw_redis, sem, key):
    """The partition's permits and last grant, as the holds HASH keeps them."""
    keys = sem.partition(key)
    held, served = raw_redis.hmget(keys.holds, f"c/{keys.part}", f"s/{keys.part}")
    return (int(held) if held is not None else None), (int(served) if served is not None else None)


def _fast(sem, key, total, permits=1):
    """Run acquire_fast.lua alone for partition ``key`` of ``sem``: the grant, or None."""
    keys = sem.partition(key)
    request = AcquireRequest(f"{keys.part}/{uuid.uuid4().hex}", "{}", sem.config.timeout_ms, permits=permits)
    operation = fast_acquire(keys, sem.config.limit, request, total)
    sent = next(operation)
    assert sent.script is FAST_ACQUIRE
    try:
        operation.send(scripting.execute(connection.get_client(), sent))
    except StopIteration as stop:
        return stop.value
    raise AssertionError("fast_acquire asked for a second request")


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_partition_the_common_case_granted_acquires_next_with_the_fast_script(raw_redis, monkeypatch, twin):
    sem = _sem(limit=4, total=6)
    ran = scripts_run(monkeypatch)

    async def acquire_three():
        if twin == "sync":
            return [sem.acquire(key="alice") for _ in range(3)]
        return [await sem.aacquire(key="alice") for _ in range(3)]

    leases = asyncio.run(acquire_three())
    # New (its HASH did not exist: the full path), then the common case, then the fast script.
    assert ran == ["total_acquire", "total_acquire", "acquire_fast"]
    tokens = [lease.token for lease in leases]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    # Counted where total_acquire.lua counts: the partition's permits and last grant.
    assert _counts(raw_redis, sem, "alice") == (3, leases[-1].token)
    assert int(raw_redis.hget(sem.partition("alice").holds, "#")) == leases[-1].token
    assert sem.available("alice") == 1 and sem.available() == 3
    # Another partition of the name has its own count, and its own first acquire.
    ran.clear()
    bob = sem.acquire(key="bob")
    assert ran == ["total_acquire"]
    assert _counts(raw_redis, sem, "bob") == (1, bob.token)
    assert _counts(raw_redis, sem, "alice")[0] == 3
    for lease in (*leases, bob):
        assert lease.release() is True
    assert _counts(raw_redis, sem, "alice") == (None, None)
    assert sem.available() == 6


@pytest.mark.parametrize("full", ["partition", "total"])
def test_the_fast_script_grants_only_within_the_partitions_limit_and_the_total(raw_redis, full):
    sem = _sem(limit=2, total=3)
    held = [sem.acquire(key="alice")]
    if full == "partition":
        held.append(sem.acquire(key="alice"))
    else:
        held += [sem.acquire(key="bob"), sem.acquire(key="carol")]
    assert all(held)
    keys = sem.partition("alice")
    before = lease_keys_state(raw_redis, keys)
    assert _fast(sem, "alice", 3) is None
    assert lease_keys_state(raw_redis, keys) == before  # nothing written
    assert sem.acquire(key="alice") is None  # total_acquire.lua decides
    for lease in held:
        assert lease.release() is True


def test_the_fast_script_counts_against_the_total_in_force(monkeypatch):
    # TOTAL lowered at runtime (sema_set, the admin): the partition's next
    # acquire still tries the fast script, which gets the TOTAL in force.
    sem = _sem(limit=3, total=3)
    first = sem.acquire(key="alice")  # the full path (a new HASH)
    second = sem.acquire(key="alice")  # the common case, a permit left in both
    sem.override(total=2)
    try:
        wait_until(lambda: sem.effective().total == 2)
        ran = scripts_run(monkeypatch)
        assert sem.acquire(key="alice") is None
        assert ran == ["acquire_fast", "total_acquire"]
    finally:
        sem.clear_override()
    for lease in (first, second):
        assert lease.release() is True


def test_a_grant_that_fills_the_partition_or_the_name_takes_the_partition_off(monkeypatch):
    sem = _sem(limit=3, total=3)
    sem.acquire(key="alice").release()
    ran = scripts_run(monkeypatch)
    first = sem.acquire(key="alice")  # the common case, two permits left
    second = sem.acquire(key="alice")  # fast, one left
    third = sem.acquire(key="alice")  # fast, the last one: the partition goes off
    assert sem.acquire(key="alice") is None  # straight to total_acquire.lua
    assert ran == ["total_acquire", "acquire_fast", "acquire_fast", "total_acquire"]
    for lease in (first, second, third):
        lease.release()
    # The name full while the partition has room (TOTAL 3, LIMIT 3, bob holding 2).
    held = [sem.acquire(key="bob"), sem.acquire(key="bob")]
    ran.clear()
    held.append(sem.acquire(key="alice"))  # the last permit of the name
    assert sem.acquire(key="alice") is None
    assert ran == ["total_acquire", "total_acquire"]
    for lease in held:
        assert lease.release() is True


def test_a_weighted_fast_grant_counts_its_permits_in_the_partition(raw_redis, monkeypatch):
    sem = _sem(limit=5, total=6)
    sem.acquire(key="alice").release()
    sem.acquire(key="alice").release()
    ran = scripts_run(monkeypatch)
    lease = sem.acquire(key="alice", permits=3)
    assert ran == ["acquire_fast"] and lease.permits == 3
    keys = sem.partition("alice")
    assert raw_redis.zcard(keys.timeouts) == 3  # its entry and two members
    assert _counts(raw_redis, sem, "alice") == (3, lease.token)
    assert sem.available("alice") == 2 and sem.available() == 3
    assert sem.acquire(key="alice", permits=3) is None  # the partition's LIMIT 5
    assert lease.release() is True
    assert raw_redis.zcard(keys.timeouts) == 0
    assert _counts(raw_redis, sem, "alice") == (None, None)


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_quiet_lease_is_given_back_by_its_own_script_and_lowers_the_partitions_count(
    raw_redis, monkeypatch, twin
):
    sem = _sem(limit=3, total=5)
    warm_hold_times(sem, key="alice")
    first, second = sem.acquire(key="alice"), sem.acquire(key="alice", permits=2)
    assert first._granted.quiet and second._granted.quiet
    assert _counts(raw_redis, sem, "alice") == (3, second.token)
    ran = scripts_run(monkeypatch)

    def release(lease):
        return lease.release() if twin == "sync" else asyncio.run(lease.arelease())

    assert release(second) is True
    assert ran == ["total_quiet_release"]
    keys = sem.partition("alice")
    assert _counts(raw_redis, sem, "alice") == (1, second.token)  # lowered, not removed
    assert not raw_redis.hexists(keys.holds, second.identifier)
    assert raw_redis.zcard(keys.timeouts) == 1  # first's entry: second's and its member went
    assert release(first) is True
    assert _counts(raw_redis, sem, "alice") == (None, None)  # gone with the last permit
    assert raw_redis.zcard(keys.timeouts) == 0
    assert release(first) is False  # once only
    assert sem.available("alice") == 3 and sem.available() == 5


@pytest.mark.parametrize("gone", ["force-released", "expired and purged"])
def test_a_quiet_release_of_a_lease_counted_out_already_lowers_nothing(raw_redis, gone):
    # The operator's force release (or a purge) gave the lease's permit back:
    # its holder's own release must not give it back again, or the partition
    # would count one permit fewer than its holders hold and admit one more.
    sem = _sem(limit=2, total=5)
    warm_hold_times(sem, key="alice")
    lost, kept = sem.acquire(key="alice"), sem.acquire(key="alice")
    assert lost._granted.quiet
    if gone == "force-released":
        assert sem.force_release(lost.identifier, "alice") is True
    else:
        expire_now(raw_redis, lost.keys.timeouts, lost.identifier)
        assert sem.purge_expired() == 1
    assert _counts(raw_redis, sem, "alice")[0] == 1
    assert lost.release() is False
    assert _counts(raw_redis, sem, "alice")[0] == 1  # kept's permit, still counted
    newcomer = sem.acquire(key="alice")
    assert newcomer is not None
    assert sem.acquire(key="alice") is None  # LIMIT 2: kept and the newcomer
    for lease in (kept, newcomer):
        assert lease.release() is True
    assert _counts(raw_redis, sem, "alice") == (None, None)


def test_a_quiet_release_of_an_expired_lease_says_false_and_gives_the_permit_back(raw_redis):
    sem = _sem(limit=2, total=3, timeout=1)
    warm_hold_times(sem, key="alice")
    lease = sem.acquire(key="alice")
    assert lease._granted.quiet
    wait_until(lambda: server_ms(raw_redis) > lease.expires_ms, 5, message="the lease expired")
    assert raw_redis.zscore(lease.keys.timeouts, lease.identifier) is not None  # not purged yet
    assert lease.release() is False and lease.lost is True
    assert _counts(raw_redis, sem, "alice") == (None, None)
    assert sem.available() == 3


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_quiet_release_serves_the_partitions_that_queued_meanwhile(raw_redis, monkeypatch, twin):
    sem = _sem(limit=1, total=1)
    holder, waiter, got = _holder_with_a_waiter(sem, wait=20)
    ran = scripts_run(monkeypatch)
    started = time.monotonic()
    assert (holder.release() if twin == "sync" else asyncio.run(holder.arelease())) is True
    # The quiet release found the waiters flag; serve.lua granted bob's
    # partition the permit, by the fair-share policy, and pushed the grant.
    assert ran[:2] == ["total_quiet_release", "serve"]
    monkeypatch.undo()
    waiter.join(10)
    (lease,) = got
    assert lease is not None and lease.ticket
    assert time.monotonic() - started < 5  # its recheck would have been the holder's 30 s expiry
    assert _counts(raw_redis, sem, "bob") == (1, lease.token)
    assert _counts(raw_redis, sem, "alice") == (None, None)
    assert int(raw_redis.hget(sem.partition("bob").holds, "%")) % 1024 == HOLD_FIRST + 1  # the hold time
    assert lease.release() is True
    assert sem.status().waiting == 0 and raw_redis.hget(sem.partition("bob").holds, "w") is None


def test_a_release_cut_off_before_serving_leaves_the_permit_to_the_waiter():
    # The process dies after total_quiet_release.lua and before serve.lua: the
    # permit is free, and the waiter of the other partition takes it when it
    # looks again, at the latest when the released lease would have expired.
    sem = _sem(limit=1, total=1, timeout=2)
    holder, waiter, got = _holder_with_a_waiter(sem, wait=10)
    operation = quiet_total_release(holder.keys, 1, 1, holder.identifier, holder._granted)
    request = next(operation)
    assert request.script is QUIET_RELEASE
    reply = scripting.execute(connection.get_client(), request)
    assert reply[1] == 1  # it found the waiters flag: serving would come next
    operation.close()  # ... and the process dies
    holder._done = True
    assert sem.holders() == []
    waiter.join(8)
    (lease,) = got
    assert lease is not None and lease.release() is True


def test_the_quiet_release_touches_only_the_names_lease_keys(raw_redis):
    # Two declared keys, one hash slot: what a cluster node needs.
    sem = _sem()
    warm_hold_times(sem, key="alice")
    lease = sem.acquire(key="alice")
    assert lease._granted.quiet
    operation = TotalLua(lambda: 5).release(lease.keys, 3, lease.identifier, lease._granted)
    request = next(operation)
    assert request.script is QUIET_RELEASE
    assert request.keys == (lease.keys.timeouts, lease.keys.holds)
    with pytest.raises(StopIteration) as done:
        operation.send(scripting.execute(connection.get_client(), request))
    assert done.value.value is True
    lease._done = True
