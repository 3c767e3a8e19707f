"""Semaphore (django_semaphore.core): the limit, hold and ahold, configured and ad-hoc
semaphores, and the asyncio twin of every method that talks to Redis."""

import math
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

from django_semaphore import Semaphore, SemaphoreFull, semaphores
from django_semaphore.backend import connection
from django_semaphore.config.validation import MAX_TIMEOUT
from django_semaphore.engine.semaphore import Lease
from tests.support.helpers import HOSTILE_LIMITS, until, wait_until

ALGORITHMS = ["lua", "fair_locked", "fair", "basic"]


# Every contract test runs on a single server and on a Redis Cluster (tests/support/fixtures_redis.py).
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
    sem = semaphores["reports"]  # LIMIT 2, TIMEOUT 5 in tests/support/settings.py
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


HOSTILE_WAITS = (10**400, 10**5000, math.inf, math.nan, MAX_TIMEOUT + 1, Fraction(1, 3), True, "1")


@pytest.mark.parametrize("wait", HOSTILE_WAITS, ids=lambda w: type(w).__name__)
def test_a_wait_that_is_not_a_bounded_number_is_a_value_error(wait):
    # 10**400 and Fraction used to pass, then raise OverflowError / TypeError in the wait loop;
    # NaN and True were taken as waits.
    sem = Semaphore("w", limit=1)
    assert sem.acquire()  # full: a caller would queue
    with pytest.raises(ValueError, match="31,536,000"):
        sem.acquire(wait=wait)
    with pytest.raises(ValueError, match="31,536,000"):
        sem.guard(wait=wait)
    with pytest.raises(ValueError, match="WAIT"):
        Semaphore("w2", limit=1, wait=wait)
    assert sem.acquire(wait=0) is None and sem.acquire(wait=0.0) is None  # the bounds' own


def test_ad_hoc_semaphore_validates_its_arguments():
    with pytest.raises(ValueError, match="LIMIT"):
        Semaphore("bad", limit=0)
    with pytest.raises(ValueError, match="TIMEOUT"):
        Semaphore("bad", limit=1, timeout=0)
    with pytest.raises(ValueError, match="ALGORITHM"):
        Semaphore("bad", limit=1, algorithm="magic")


@pytest.mark.parametrize("limit", HOSTILE_LIMITS, ids=lambda value: repr(value)[:24])
def test_an_ad_hoc_limit_or_adaptive_bound_above_a_million_is_a_value_error(limit):
    with pytest.raises(ValueError, match="1,000,000"):
        Semaphore("bad", limit=limit)
    for bounds in ({"MIN": 1, "MAX": limit}, {"MIN": limit, "MAX": 2}):
        with pytest.raises(ValueError, match="ADAPTIVE"):
            Semaphore("bad", limit=2, adaptive=bounds)


def test_an_ad_hoc_limit_of_a_million_works():
    sem = Semaphore("million", limit=10**6, timeout=5)
    lease = sem.acquire(permits=3)
    assert lease is not None and sem.available() == 10**6 - 3
    assert lease.release() is True and sem.available() == 10**6
    assert Semaphore("wide", limit=10**6, adaptive={"MIN": 1, "MAX": 10**6}).effective().limit == 10**6


@pytest.mark.parametrize("timeout", [math.inf, 1e300, 10**15, MAX_TIMEOUT + 0.001, -math.inf, math.nan, 0])
def test_an_ad_hoc_timeout_outside_its_range_is_a_value_error(timeout):
    # An infinite TIMEOUT used to be taken, and then every acquire failed with an
    # OverflowError (a 500 in a view); 10**15 s with Redis's "out of range" (a 503).
    with pytest.raises(ValueError, match="365 days"):
        Semaphore("bad", limit=1, timeout=timeout)


@pytest.mark.parametrize(
    ("algorithm", "options"),
    [(algorithm, {}) for algorithm in ALGORITHMS]
    + [(algorithm, {"key": "alice"}) for algorithm in ALGORITHMS]
    + [("lua", {"permits": 2})],  # (permits belong to "lua")
    ids=lambda value: value if isinstance(value, str) else ",".join(value) or "plain",
)
def test_the_longest_timeout_gives_leases_of_a_year(algorithm, options):
    sem = Semaphore(f"year-{algorithm}", limit=4, timeout=MAX_TIMEOUT, algorithm=algorithm)
    # The first acquire of a partition and the next (lua: the common case's own script).
    leases = [sem.acquire(**options), sem.acquire(**options)]
    for lease in leases:
        assert lease is not None
        assert lease.expires_ms - lease.acquired_ms == MAX_TIMEOUT * 1000
        assert lease.refresh() is True
    timeouts = sem.partition(options.get("key")).main[0]
    assert connection.get_client().pttl(timeouts) > MAX_TIMEOUT * 1000  # the keys outlive the leases
    assert [h.identifier for h in sem.holders(options.get("key"))] == [lease.identifier for lease in leases]
    for lease in leases:
        assert lease.release() is True
    assert sem.available(options.get("key")) == 4


def test_the_longest_timeout_works_with_a_total_and_waiters():
    sem = Semaphore("year-total", limit=1, timeout=MAX_TIMEOUT, total=2)
    held = sem.acquire(key="alice")
    assert held is not None and held.expires_ms - held.acquired_ms == MAX_TIMEOUT * 1000
    with ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(sem.acquire, key="alice", wait=10)
        wait_until(lambda: len(sem.waiters(key="alice")) == 1)
        assert held.release() is True
        lease = waiter.result(timeout=10)
    # (Granted by the release: its claim became a lease of a year at its first refresh.)
    assert lease is not None
    assert MAX_TIMEOUT * 1000 <= lease.expires_ms - lease.acquired_ms < MAX_TIMEOUT * 1000 + 5000
    assert lease.release() is True


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


# -- scheduling: permits, slots, priority, MAX_WAITERS ("lua") ---------------------------


def test_permits_take_that_many_distinct_slots_below_the_limit():
    sem = Semaphore("gpus", limit=4, timeout=30, slots=True)
    two = sem.acquire(permits=2)
    assert two is not None and two.permits == 2 and two.slots == (0, 1)
    other = sem.acquire(permits=2)
    assert other is not None and other.slots == (2, 3)
    assert sem.available() == 0
    assert sem.acquire() is None  # 4 of 4 permits held
    held = sem.holders()
    assert [(h.identifier, h.permits, h.slots) for h in held] == [
        (two.identifier, 2, (0, 1)),
        (other.identifier, 2, (2, 3)),
    ]
    assert two.release() is True
    assert sem.available() == 2
    one = sem.acquire()
    assert one is not None and one.permits == 1 and one.slots == (0,)  # the lowest free slot
    assert sem.acquire(permits=2) is None  # 1 free
    assert sem.available() == 1
    for lease in (other, one):
        assert lease.release() is True
    assert sem.available() == 4


@pytest.mark.parametrize("permits", [0, -1, 5, True, 1.0, "2", None])
def test_permits_outside_one_to_limit_raise_value_error(permits):
    sem = Semaphore("bounds", limit=4, timeout=30)
    with pytest.raises(ValueError, match="permits"):
        sem.acquire(permits=permits)
    with pytest.raises(ValueError, match="priority"):
        sem.acquire(priority="high")
    with pytest.raises(ValueError, match="9,007,199,254,740,991"):
        sem.acquire(priority=2**53)
    assert sem.holders() == []


@pytest.mark.parametrize("algorithm", ["fair_locked", "fair", "basic"])
def test_the_seed_variants_refuse_scheduling_options(algorithm):
    for option in ({"permits": 2}, {"priority": 1}, {"max_waiters": 3}):
        with pytest.raises(ValueError, match="does not support"):
            Semaphore("seed", limit=2, algorithm=algorithm, **option)
    sem = Semaphore("seed", limit=2, algorithm=algorithm)
    with pytest.raises(ValueError, match="'lua'"):
        sem.acquire(permits=2)
    with pytest.raises(ValueError, match="'lua'"):
        sem.acquire(priority=3)
    lease = sem.acquire(permits=1, priority=0)
    assert lease is not None and lease.permits == 1 and lease.slots == ()
    assert [(h.permits, h.slots) for h in sem.holders()] == [(1, ())]
    assert lease.release() is True


def test_expired_permits_and_slots_come_back_when_purged():
    short = Semaphore("expiring", limit=4, timeout=0.3, slots=True)
    lost = short.acquire(permits=3)
    assert lost is not None and lost.slots == (0, 1, 2)
    assert short.acquire(permits=2) is None
    start = time.monotonic()
    while short.available() < 4:  # the server's clock decides; available() skips expired leases
        assert time.monotonic() - start < 5, "the lease never expired"
        time.sleep(0.02)
    everything = short.acquire(permits=4)  # purges the expired holder: its slots are free again
    assert everything is not None and everything.slots == (0, 1, 2, 3)
    assert lost.release() is False and lost.lost
    assert everything.release() is True


def test_lowering_the_limit_evicts_nobody_and_new_slots_stay_below_it():
    sem = Semaphore("reports-slots", limit=2, timeout=30, slots=True)
    sem.override(limit=4)
    try:
        until_applied(sem, 4)
        low = sem.acquire(permits=2)
        high = sem.acquire(permits=2)
        assert low is not None and high is not None and high.slots == (2, 3)
        sem.override(limit=2)
        until_applied(sem, 2)
        assert sem.available() == 0  # 4 held, limit 2: nobody evicted
        assert high.refresh() is True and low.refresh() is True
        assert low.release() is True
        assert sem.available() == 0  # still 2 held (slots 2 and 3, above the new limit, stay theirs)
        assert sem.acquire() is None
        with pytest.raises(ValueError, match="from 1 to 2"):
            sem.acquire(permits=3)  # against the limit in force
        assert high.release() is True
        again = sem.acquire(permits=2)
        assert again is not None and again.slots == (0, 1)  # in range(limit in force)
        assert again.release() is True
    finally:
        sem.clear_override()


def until_applied(sem, limit):
    deadline = time.monotonic() + 5
    while sem.effective().limit != limit:
        assert time.monotonic() < deadline, "the override was not applied"
        time.sleep(0.02)


def test_dry_run_marks_permits_that_would_not_fit():
    sem = Semaphore("dry-permits", limit=3, timeout=30, mode="dry_run", slots=True)
    first = sem.acquire(permits=2)
    assert first is not None and not first.over_limit
    second = sem.acquire(permits=2)  # 4 > 3: admitted, marked
    assert second is not None and second.over_limit and len(set(first.slots + second.slots)) == 4
    third = sem.acquire(permits=1)  # still over
    assert third is not None and third.over_limit
    for lease in (first, second, third):
        assert lease.release() is True
    fits = sem.acquire(permits=3)
    assert fits is not None and not fits.over_limit
    assert fits.release() is True


def test_max_waiters_refuses_a_caller_that_would_wait_at_once():
    sem = Semaphore("capped", limit=1, timeout=30, max_waiters=1)
    holder = sem.acquire()
    assert holder is not None
    pool = ThreadPoolExecutor(1)
    try:
        waiter = pool.submit(sem.acquire, wait=10)
        wait_until(lambda: len(sem.waiters()) == 1, message="one waiter queued")
        started = time.monotonic()
        lease, refused = sem.try_acquire(wait=10)
        assert lease is None and refused.reason == "queue_full"
        assert time.monotonic() - started < 2  # at once, not after WAIT
        lease, full = sem.try_acquire(wait=0)  # wait 0: never queues, "full"
        assert lease is None and full.reason == "full"
        with pytest.raises(SemaphoreFull) as info:
            sem.hold(wait=10).__enter__()
        assert info.value.reason == "queue_full"
        assert holder.release() is True
        served = waiter.result(timeout=10)
        assert served is not None
        assert served.release() is True
    finally:
        pool.shutdown()


def test_max_waiters_zero_never_queues():
    sem = Semaphore("no-queue", limit=1, timeout=30, max_waiters=0)
    holder = sem.acquire()
    lease, retry_after = sem.try_acquire(wait=10)
    assert lease is None and retry_after.reason == "queue_full"
    assert sem.waiters() == []
    assert holder.release() is True


def test_waiters_are_served_by_priority_then_arrival_and_show_it():
    sem = Semaphore("prioritised", limit=1, timeout=30)
    holder = sem.acquire()
    order = []
    pool = ThreadPoolExecutor(3)

    def wait_for(tag, priority, permits=1):
        lease = sem.acquire(wait=20, priority=priority, permits=permits, meta={"tag": tag})
        order.append(tag)
        assert lease is not None
        lease.release()

    try:
        futures = []
        for count, (tag, priority) in enumerate([("low", 0), ("high", 5), ("low2", 0)], 1):
            futures.append(pool.submit(wait_for, tag, priority))
            wait_until(lambda count=count: len(sem.waiters()) == count, message=f"{tag} queued")
        waiters = sem.waiters()
        assert [(w.meta["tag"], w.priority, w.permits) for w in waiters] == [
            ("high", 5, 1),
            ("low", 0, 1),
            ("low2", 0, 1),
        ]
        assert holder.release() is True
        for future in futures:
            future.result(timeout=20)
        assert order == ["high", "low", "low2"]
    finally:
        pool.shutdown()


def test_a_large_request_blocks_the_waiters_behind_it():
    sem = Semaphore("no-starvation", limit=3, timeout=30, slots=True)
    big_holder, small_holder = sem.acquire(permits=2), sem.acquire(permits=1)
    pool = ThreadPoolExecutor(2)
    try:
        big = pool.submit(sem.acquire, wait=20, permits=3)
        wait_until(lambda: len(sem.waiters()) == 1, message="the large request queued")
        small = pool.submit(sem.acquire, wait=20, permits=1)
        wait_until(lambda: len(sem.waiters()) == 2, message="the small request queued")
        assert [w.permits for w in sem.waiters()] == [3, 1]
        assert small_holder.release() is True  # 1 free: the small one fits, but the large one is first
        assert sem.acquire(permits=1) is None  # nor does a newcomer of the same priority get it
        assert [w.permits for w in sem.waiters()] == [3, 1]
        assert not small.done()
        assert big_holder.release() is True  # 3 free: the large one
        big_lease = big.result(timeout=10)
        assert big_lease is not None and big_lease.slots == (0, 1, 2)
        assert big_lease.release() is True
        small_lease = small.result(timeout=10)
        assert small_lease is not None and small_lease.release() is True
    finally:
        pool.shutdown()


@pytest.mark.asyncio
async def test_async_twins_take_permits_and_priority():
    sem = Semaphore("async-permits", limit=3, timeout=30, slots=True)
    lease = await sem.aacquire(permits=2, priority=4)
    assert lease is not None and lease.slots == (0, 1)
    assert await sem.aavailable() == 1
    async with sem.ahold(permits=1) as other:
        assert other.slots == (2,)
        assert await sem.aavailable() == 0
    assert [(h.permits, h.slots) for h in await sem.aholders()] == [(2, (0, 1))]
    assert await lease.arelease() is True
    assert await sem.aavailable() == 3


def test_a_limit_lowered_below_the_permits_asked_refuses_instead_of_raising():
    """An operator lowers the limit in an incident: a view taking 2 permits is
    refused ("full", at once, without queueing), not turned into a 500 by a
    ValueError; once the limit is back, the same call is granted."""
    sem = Semaphore("reports-slots", limit=2, timeout=30, slots=True)
    sem.override(limit=1)
    try:
        until_applied(sem, 1)
        started = time.monotonic()
        lease, retry_after = sem.try_acquire(permits=2, wait=5)
        assert lease is None and retry_after.reason == "full"
        assert time.monotonic() - started < 1  # refused at once: it could never fit by waiting
        assert sem.waiters() == []
        with pytest.raises(SemaphoreFull) as info, sem.hold(permits=2):
            pass
        assert info.value.reason == "full"
        with pytest.raises(ValueError, match="permits"):
            sem.acquire(permits=3)  # above LIMIT: a programming error
    finally:
        sem.clear_override()
    until_applied(sem, 2)
    lease = sem.acquire(permits=2)
    assert lease is not None and lease.slots == (0, 1)
    assert lease.release() is True


# -- try_acquire and atry_acquire: one flow, two drivers ------------------------------------------


def _interrupt_at_the_wait(monkeypatch, error):
    """Make the next wait for a slot (a waiter's BLPOP, a seed variant's poll) raise ``error``
    in both drivers, as an interrupt (sync) or a cancellation (async) arriving there."""
    from django_semaphore.backend import scripting

    execute, aexecute = scripting.execute, scripting.aexecute

    def waits(request):
        return type(request) is scripting.Sleep or (
            type(request) is scripting.Command and request.args[0] == "BLPOP"
        )

    def interrupted(client, request):
        if waits(request):
            raise error()
        return execute(client, request)

    async def ainterrupted(client, request):
        if waits(request):
            raise error()
        return await aexecute(client, request)

    monkeypatch.setattr(scripting, "execute", interrupted)
    monkeypatch.setattr(scripting, "aexecute", ainterrupted)


async def _acquire_scenario(twin, algorithm, monkeypatch):
    """One twin's run of the scenario below: what it saw."""
    import asyncio
    import threading

    sem = Semaphore(f"twins-{algorithm}-{twin}", limit=2, timeout=30, algorithm=algorithm)
    dry = Semaphore(f"twins-dry-{algorithm}-{twin}", limit=1, timeout=30, algorithm=algorithm, mode="dry_run")

    async def take(semaphore=sem, **kwargs):
        if twin == "sync":
            return semaphore.try_acquire(**kwargs)
        return await semaphore.atry_acquire(**kwargs)

    def outcome(result, started, least=0.0):
        """What a call gave; with ``least``, whether it lasted that long (a lower bound
        the scenario guarantees, so no machine's load can flip it). A call that should
        not wait is judged by its reason ("full"), never by a clock."""
        lease, retry_after = result
        lasted = time.monotonic() - started >= least if least else None
        if lease is None:
            return ("refused", retry_after.reason, retry_after >= 1, lasted)
        return ("granted", lease.permits, lease.over_limit, lasted)

    log = []
    first = (await take())[0]
    second = (await take(meta={"who": "second"}))[0]
    log.append(("two granted", first is not None, second is not None, second.token > first.token))
    log.append(outcome(await take(), time.monotonic()))  # full: refused at once
    started = time.monotonic()
    log.append(outcome(await take(wait=0.3), started, least=0.3))  # full: refused after waiting
    started = time.monotonic()
    threading.Timer(0.2, first.release).start()
    third_result = await take(wait=10)  # granted while waiting, by the release 0.2 s in
    log.append(outcome(third_result, started, least=0.2))
    third = third_result[0]
    held = await take(dry)
    log.append(outcome(await take(dry), time.monotonic()))  # a would-be refusal, admitted
    for lease in (held[0], (await take(dry))[0]):
        lease.release()
    for bad in ({"wait": -1}, {"permits": 3}, {"permits": 0}, {"priority": "high"}):
        with pytest.raises(ValueError):
            await take(**bad)
    error = KeyboardInterrupt if twin == "sync" else asyncio.CancelledError
    with monkeypatch.context() as patch:
        _interrupt_at_the_wait(patch, error)
        with pytest.raises(error):
            await take(wait=10)
    # The interrupted waiter left neither a ticket nor a slot.
    holders = sorted(h.token for h in sem.holders())
    assert holders == sorted([second.token, third.token])
    log.append(("after the interrupt", sem.status().waiting, len(holders)))
    log.append(("released", second.release(), third.release(), sem.available()))
    return log


@pytest.mark.asyncio
@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_try_acquire_and_atry_acquire_go_through_the_same_scenario_alike(algorithm, monkeypatch):
    """The same scenario through each twin: granted at once, refused at once, refused after
    waiting, granted while waiting, a dry run, bad arguments, and interrupted (sync) or
    cancelled (async) while waiting; the same outcomes, and nothing left behind."""

    seen = {twin: await _acquire_scenario(twin, algorithm, monkeypatch) for twin in ("sync", "async")}
    assert seen["sync"] == seen["async"]
    assert seen["sync"] == [
        ("two granted", True, True, True),
        ("refused", "full", True, None),
        ("refused", "timeout", True, True),
        ("granted", 1, False, True),
        ("granted", 1, True, None),
        ("after the interrupt", 0, 2),
        ("released", True, True, 2),
    ]


# -- the config_changed signal ------------------------------------------------------------


def test_a_raising_config_changed_receiver_is_logged_and_the_override_returns(caplog):
    """override() wrote the change, then sent config_changed with send(): a receiver that
    raised made override() raise although the change was in force everywhere."""
    from django_semaphore import signals

    sem = Semaphore("signalled", limit=3, timeout=10)
    seen = []

    def announce(sender, semaphore, limit, **kwargs):
        seen.append(limit)
        raise RuntimeError("the chat webhook is down")

    def after(sender, limit, **kwargs):
        seen.append(("after", limit))

    signals.config_changed.connect(announce, weak=False)
    signals.config_changed.connect(after, weak=False)
    try:
        with caplog.at_level("ERROR", logger="django_semaphore"):
            assert sem.override(limit=1).limit == 1
            assert sem.effective(fresh=True).limit == 1
            assert sem.clear_override().limit == 3
    finally:
        signals.config_changed.disconnect(announce)
        signals.config_changed.disconnect(after)
    assert seen == [1, ("after", 1), 3, ("after", 3)]  # the others still hear of it
    errors = [r for r in caplog.records if r.name == "django_semaphore" and r.levelname == "ERROR"]
    assert len(errors) == 2  # once per change
    assert "announce" in errors[0].getMessage() and "'signalled'" in errors[0].getMessage()
    assert errors[0].exc_info[0] is RuntimeError


@pytest.mark.asyncio
async def test_a_raising_config_changed_receiver_does_not_fail_aoverride(caplog):
    from django_semaphore import signals

    sem = Semaphore("signalled-async", limit=3, timeout=10)

    def announce(sender, **kwargs):
        raise RuntimeError("down")

    signals.config_changed.connect(announce, weak=False)
    try:
        with caplog.at_level("ERROR", logger="django_semaphore"):
            assert (await sem.aoverride(mode="dry_run")).mode == "dry_run"
            assert (await sem.aclear_override()).mode == "enforce"
    finally:
        signals.config_changed.disconnect(announce)
    # (Django's send_robust logs it on "django.dispatch" too, without the semaphore.)
    assert len([r for r in caplog.records if r.name == "django_semaphore" and r.levelname == "ERROR"]) == 2
