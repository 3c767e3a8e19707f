"""The Redis in Action variants ("basic", "fair", "fair_locked"): TTLs and refresh.

* Processes may disagree on TIMEOUT (a rolling deploy that changes it): a
  write from a short-TIMEOUT process must never shorten the TTL of keys that
  a longer holder's entries live in, or the keys vanish with the holder in
  them and the semaphore over-admits.
* Every write that may create a key sets that key's TTL in the same MULTI:
  an acquire interrupted between two round trips (KeyboardInterrupt, a
  dropped connection) leaves no key without a TTL.
* A refresh checks and writes in one MULTI: it never reports success for a
  slot that was lost between two of its round trips.

The operations are generators of Redis requests; the tests drive them by
hand (``drive``) to stop or interleave them at an exact round trip.
"""

import time

import pytest

from django_semaphore import Semaphore
from django_semaphore.backend import connection
from django_semaphore.backend.keys import STATS, adhoc_key
from django_semaphore.backend.scripting import Sleep, execute
from django_semaphore.engine.algorithms import ALGORITHMS, AcquireRequest
from django_semaphore.runtime import stats
from tests.support.helpers import wait_until

SEEDS = ["basic", "fair", "fair_locked"]


def client_ms():
    """This process's clock in ms: the clock the seed variants write their expiries with."""
    return time.time() * 1000


def partition_names(keys):
    """The keys of a partition the seed variants write (the lock only for fair_locked)."""
    return [keys.timeouts, keys.owners, keys.holds, keys.lock]


def ttls(raw_redis, keys):
    """PTTL of every existing key of the partition (-1: no TTL)."""
    found = {name: raw_redis.pttl(name) for name in partition_names(keys)}
    return {name.rsplit(":", 1)[-1]: ttl for name, ttl in found.items() if ttl != -2}


def drive(client, operation, stop_after=None, before_next=None):
    """Run ``operation`` on ``client``, one request at a time.

    ``stop_after``: close the generator after that many Redis round trips (as
    an interrupt between two round trips would); returns None then.
    ``before_next(n)``: called after the n-th round trip, before the next.
    Returns (result, round trips made).
    """
    trips = 0
    reply = None
    try:
        request = next(operation)
        while True:
            if type(request) is not Sleep:
                if stop_after is not None and trips >= stop_after:
                    operation.close()
                    return None, trips
                reply = execute(client, request)
                trips += 1
                if before_next:
                    before_next(trips)
            else:
                reply = execute(client, request)
            request = operation.send(reply)
    except StopIteration as done:
        return done.value, trips


def acquire_op(sem, key, identifier="interrupted"):
    config = sem.config
    keys = sem.partition(key)
    return ALGORITHMS[config.algorithm].acquire(
        keys, config.limit, AcquireRequest(identifier, "{}", config.timeout_ms)
    )


# -- processes that disagree on TIMEOUT ------------------------------------------------------


@pytest.mark.parametrize("algorithm", SEEDS)
def test_a_shorter_timeout_never_shortens_the_keys_of_a_longer_holder(raw_redis, algorithm, capsys):
    """A 30 s holder, then a process with TIMEOUT 0.2 s writes to the same partition.

    Before the fix every seed write ran PEXPIRE timeout + 1 s: the short
    process set the keys' TTL to 1.2 s, the keys vanished with the holder in
    them, and the short process then got the slot of a LIMIT 1 semaphore
    while the holder still held it.
    """
    long = Semaphore("two-timeouts", limit=1, timeout=30, algorithm=algorithm)
    short = Semaphore("two-timeouts", limit=1, timeout=0.2, algorithm=algorithm)
    keys = long.partition()
    holder = long.acquire()
    assert holder is not None

    intruder = short.acquire()  # refused ("basic": see the test below)
    written = time.monotonic()
    need_ms = holder.expires_ms - client_ms() + 1000  # the holder's lease, plus the 1 s margin
    after_short = ttls(raw_redis, keys)
    shortened = {k: ttl for k, ttl in after_short.items() if k != "l" and ttl < need_ms - 100}

    # Until the TTL the short process would have set (1.2 s) has run out, twice over.
    wait_until(lambda: time.monotonic() - written > 2.5, timeout=10, message="old TTL run out")
    if intruder:
        intruder.release()
    later = short.acquire()
    survived = ttls(raw_redis, keys)
    still_held = holder.refresh()
    with capsys.disabled():
        print(
            f"\n{algorithm}: holder needs {need_ms:.0f} ms; TTLs after the short write {after_short}; "
            f"2.5 s later {survived}; short process admitted while held: "
            f"{[bool(intruder), bool(later)]}; holder's refresh: {still_held}"
        )
    assert not shortened, f"a TIMEOUT 0.2 s write shortened {shortened} below the holder's {need_ms:.0f} ms"
    assert {"t", "o", "h"} <= set(survived), f"keys vanished with the holder in them: {survived}"
    assert still_held is True
    if algorithm != "basic":
        assert intruder is None and later is None
    if later:
        later.release()
    assert [h.identifier for h in long.holders()] == [holder.identifier]
    assert holder.release() is True


def test_basic_ranks_a_shorter_timeout_ahead_of_a_longer_holder():
    """Documented weakness of "basic", as the seed's ranking by client time.

    "basic" ranks by the timeout ZSET, scored by expiry (now + TIMEOUT): with
    one TIMEOUT that is the order of arrival, as in the seed; with two, a
    newcomer whose lease ends before the holder's ranks ahead of it and is
    admitted (the seed itself, scoring by acquire time and purging
    ``now - TIMEOUT``, would evict the longer holder instead).  The holder
    keeps its slot; "fair" and "fair_locked" rank by a counter and refuse.
    """
    long = Semaphore("basic-two-timeouts", limit=1, timeout=30, algorithm="basic")
    short = Semaphore("basic-two-timeouts", limit=1, timeout=5, algorithm="basic")
    holder = long.acquire()
    intruder = short.acquire()
    assert intruder is not None  # over-admitted: two holders of a LIMIT 1 semaphore
    assert holder.refresh() is True
    assert {h.identifier for h in long.holders()} == {holder.identifier, intruder.identifier}
    assert intruder.release() and holder.release()


# -- no key without a TTL, whatever round trip an acquire stops at ---------------------------


@pytest.mark.parametrize("algorithm", SEEDS)
@pytest.mark.parametrize("full", [False, True], ids=["free", "full"])
def test_an_acquire_interrupted_between_round_trips_leaves_no_key_without_ttl(raw_redis, algorithm, full):
    sem = Semaphore("interrupted", limit=1, timeout=20, algorithm=algorithm)
    client = connection.get_client()
    # How many round trips a whole acquire makes (on a partition of its own).
    if full:
        assert sem.acquire(key="probe") is not None
    _, total = drive(client, acquire_op(sem, "probe", "probe-op"))
    assert total >= 2
    bad = {}
    for stop in range(1, total):
        key = f"stop-{stop}"
        if full:
            assert sem.acquire(key=key) is not None
        result, trips = drive(client, acquire_op(sem, key), stop_after=stop)
        assert result is None and trips == stop
        found = ttls(raw_redis, sem.partition(key))
        assert found, "the acquire wrote keys"
        without = [name for name, ttl in found.items() if ttl < 0]
        if without:
            bad[stop] = found
    assert not bad, f"keys without a TTL (PTTL -1) after stopping at round trip n of {total}: {bad}"


@pytest.mark.parametrize("algorithm", SEEDS)
def test_a_finished_acquire_leaves_only_keys_with_a_ttl(raw_redis, key_prefix, algorithm):
    sem = Semaphore("finished", limit=1, timeout=20, algorithm=algorithm)
    lease = sem.acquire()
    assert sem.acquire() is None
    assert lease.refresh() is True
    stats.flush()  # (the poller may flush the refusal's count here: make it always)
    # Not the per-name stats keys (they count the refusal above, flushed by the
    # control poller at any moment): they have a TTL too, but other suffixes.
    # Nor the registry of ad-hoc semaphores (no partition: tests/test_adhoc.py has its TTL).
    counts = f"{key_prefix}:{STATS}:".encode()
    registry = adhoc_key(key_prefix).encode()
    names = [
        name
        for name in raw_redis.scan_iter(match=key_prefix + ":*")
        if not name.startswith(counts) and name != registry
    ]
    assert names
    found = {name: raw_redis.pttl(name) for name in names}
    assert all(ttl > 0 for ttl in found.values()), found
    # The scratch key "fair" ranks in never outlives its MULTI.
    assert {name.decode().rsplit(":", 1)[-1] for name in names} <= {"t", "o", "h"}


# -- refresh: check and write in one step ------------------------------------------------------


@pytest.mark.parametrize("algorithm", SEEDS)
def test_a_refresh_never_reports_success_for_a_slot_lost_between_its_round_trips(algorithm, capsys):
    """The lease runs out, and another process takes the slot, after the refresh's first round trip.

    Before the fix the refresh read the expiry in one round trip (still
    live) and wrote it in the next (ZADD XX, a no-op on the purged entry),
    then reported success: two processes held a LIMIT 1 semaphore.
    """
    lease_s = 2.4
    sem = Semaphore("refresh-race", limit=1, timeout=lease_s, algorithm=algorithm)
    lease = sem.acquire()
    assert lease is not None
    client = connection.get_client()
    # Refresh halfway through the lease, so a refresh that did extend it
    # leaves lease_s / 2 s between the old expiry and the new one.
    wait_until(lambda: client_ms() >= lease.acquired_ms + lease_s * 500, message="halfway")
    other = {}

    def meanwhile(trip):
        if trip == 1:
            # After the refresh's first round trip: wait out the lease as it
            # was before the refresh, then another process tries to acquire.
            wait_until(lambda: client_ms() > lease.expires_ms + 5, message="old expiry passed")
            other["lease"] = sem.acquire()
            other["at"] = client_ms()

    op = ALGORITHMS[algorithm].refresh(lease.keys, sem.config.timeout_ms, lease.identifier)
    result, trips = drive(client, op, before_next=meanwhile)
    taken = other["lease"] is not None
    with capsys.disabled():
        print(
            f"\n{algorithm}: refresh made {trips} round trips and returned {result!r}; "
            f"another process acquired {other['at'] - lease.expires_ms:.0f} ms after the old expiry: {taken}"
        )
    assert not (result and taken), "the refresh reported success while another process held the slot" + (
        " (after the refreshed lease had ended too: the machine stalled)"
        if result and other["at"] > result
        else ""
    )
    if result:
        # Success means the slot was extended: the other process was refused.
        assert result > lease.expires_ms
        assert [h.identifier for h in sem.holders()] == [lease.identifier]


@pytest.mark.parametrize("algorithm", SEEDS)
def test_a_refresh_of_an_expired_lease_does_not_revive_it(raw_redis, algorithm):
    sem = Semaphore("refresh-expired", limit=1, timeout=0.2, algorithm=algorithm)
    lease = sem.acquire()
    wait_until(lambda: client_ms() > lease.expires_ms + 5, message="lease expired")
    assert lease.refresh() is False
    keys = lease.keys
    assert raw_redis.zscore(keys.timeouts, lease.identifier) is None
    assert raw_redis.zscore(keys.owners, lease.identifier) is None
    assert raw_redis.hget(keys.holds, lease.identifier) is None
    other = sem.acquire()
    assert other is not None and other.token > lease.token


@pytest.mark.parametrize("algorithm", SEEDS)
def test_expired_entries_leave_no_records_behind(raw_redis, algorithm):
    """An acquire that purges expired holders removes their owner entries and records too."""
    sem = Semaphore("records", limit=3, timeout=0.2, algorithm=algorithm)
    crashed = [sem.acquire(), sem.acquire()]
    wait_until(lambda: client_ms() > max(c.expires_ms for c in crashed) + 5, message="leases expired")
    fresh = Semaphore("records", limit=3, timeout=20, algorithm=algorithm).acquire()
    keys = fresh.keys
    assert [m.decode() for m in raw_redis.zrange(keys.owners, 0, -1)] == [fresh.identifier]
    assert sorted(f.decode() for f in raw_redis.hkeys(keys.holds)) == sorted(["#", fresh.identifier])


@pytest.mark.parametrize("algorithm", ["fair", "fair_locked"])
def test_fair_ranks_only_live_owners(raw_redis, algorithm):
    """An owner entry without a lease (left by an interrupted operation) takes no slot."""
    sem = Semaphore("orphans", limit=1, timeout=20, algorithm=algorithm)
    keys = sem.partition()
    raw_redis.zadd(keys.owners, {"orphan": 1})
    raw_redis.pexpire(keys.owners, 20_000)
    lease = sem.acquire()
    assert lease is not None
    assert sem.acquire() is None
    assert [h.identifier for h in sem.holders()] == [lease.identifier]


# -- the Algorithm Protocol --------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", SEEDS)
def test_a_seed_abandon_is_an_operation_that_sends_nothing(algorithm):
    keys = Semaphore("abandon", limit=1, algorithm=algorithm).partition()
    assert drive(connection.get_client(), ALGORITHMS[algorithm].abandon(keys, 1, "waiter")) == (None, 0)


@pytest.mark.parametrize("algorithm", SEEDS)
def test_seeds_judge_their_entries_by_the_client_clock(algorithm):
    before = client_ms()
    now = float(ALGORITHMS[algorithm].clock())
    assert before <= now <= client_ms()
    assert ALGORITHMS["lua"].clock() == ""  # the server's TIME
