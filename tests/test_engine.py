"""The engine against a real Redis: limits, leases, tokens, holders, waiting."""

import datetime
import os
import socket
import threading
import time

import pytest

from django_semaphore import Semaphore, SemaphoreFull, semaphores, signals
from django_semaphore.inspection import Holder
from django_semaphore.lease import Lease

from .helpers import wait_until

ALGORITHMS = ["lua", "fair_locked", "fair", "basic"]

# Every contract test runs on a single server and on a Redis Cluster (tests/fixtures_redis.py).
pytestmark = pytest.mark.usefixtures("backend")


@pytest.fixture
def received():
    """Record every django-semaphore signal sent during the test."""
    seen = []
    receivers = {}
    for name in ("acquired", "refused", "released", "lease_lost"):

        def receiver(sender, _name=name, **kwargs):
            seen.append((_name, kwargs))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    yield seen
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def names_of(seen, name):
    return [kwargs for signal, kwargs in seen if signal == name]


def expired(sem, key=None, timeout=10.0):
    """Wait until every lease of ``sem`` (partition ``key``) has run out."""
    wait_until(lambda: sem.available(key) == sem.limit, timeout, message="lease expiry")


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


# -- release and refresh -------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_release_and_refresh_return_values(algorithm):
    sem = Semaphore("rr", limit=2, timeout=30, algorithm=algorithm)
    lease = sem.acquire()
    assert lease.refresh() is True
    assert lease.release() is True
    assert lease.release() is False  # twice
    assert lease.refresh() is False  # after release: never re-acquires
    assert sem.holders() == []
    assert sem.available() == 2


def test_refresh_extends_the_lease():
    sem = Semaphore("ext", limit=1, timeout=30)
    lease = sem.acquire()
    before = sem.holders()[0].expires_at
    time.sleep(0.05)  # let the server clock move on
    assert lease.refresh() is True
    after = sem.holders()[0].expires_at
    assert after > before
    assert lease.expires_at == after


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_lease_expires_and_is_not_reacquired(algorithm, received):
    sem = Semaphore("expiry", limit=2, timeout=0.4, algorithm=algorithm)
    lease = sem.acquire()
    other = sem.acquire()
    assert sem.available() == 0
    expired(sem)
    assert sem.holders() == []
    assert lease.refresh() is False
    assert lease.lost
    # The lost refresh did not take the slot back.
    assert sem.holders() == [] and sem.available() == 2
    assert lease.release() is False
    assert other.release() is False
    assert sem.available() == 2
    lost = names_of(received, "lease_lost")
    assert [k["lease"] for k in lost] == [lease, other]  # once per lease


def test_expired_slot_goes_to_the_next_caller(received):
    sem = Semaphore("steal", limit=1, timeout=0.4)
    first = sem.acquire()
    expired(sem)
    second = sem.acquire()
    assert second is not None
    assert first.refresh() is False
    assert first.release() is False
    assert [h.identifier for h in sem.holders()] == [second.identifier]
    assert second.refresh() is True
    assert len(names_of(received, "lease_lost")) == 1


def test_signals(received):
    sem = Semaphore("signalled", limit=1, timeout=30)
    lease = sem.acquire(meta={"n": 1})
    assert sem.acquire() is None
    lease.release()
    lease.release()
    acquired = names_of(received, "acquired")
    assert [k["lease"] for k in acquired] == [lease]
    refused = names_of(received, "refused")
    assert len(refused) == 1 and refused[0]["semaphore"] == sem and 1 <= refused[0]["retry_after"] <= 30
    released = names_of(received, "released")
    assert len(released) == 1 and released[0]["held"] is True
    assert names_of(received, "lease_lost") == []


# -- tokens ----------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_tokens_strictly_increase(algorithm):
    sem = Semaphore("tokens", limit=2, timeout=30, algorithm=algorithm)
    tokens = []
    for _ in range(20):
        lease = sem.acquire()
        tokens.append(lease.token)
        lease.release()
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(set(tokens))


def test_tokens_increase_after_the_keys_were_deleted(raw_redis):
    sem = Semaphore("idle", limit=2, timeout=30)
    lease = sem.acquire()
    old = lease.token
    lease.release()
    keys = sem.partition()
    raw_redis.delete(keys.timeouts, keys.owners, keys.holds)
    assert sem.acquire().token > old


@pytest.mark.slow
def test_tokens_increase_after_the_keys_expired(prefix_keys):
    sem = Semaphore("idle", limit=2, timeout=0.3)
    old = max(sem.acquire().token, sem.acquire().token)
    # Nobody uses the partition: its keys disappear by themselves
    # (API: within 2 x TIMEOUT + 10 s).
    wait_until(lambda: prefix_keys() == [], timeout=2 * 0.3 + 10, message="keys expiring")
    assert sem.acquire().token > old


@pytest.mark.parametrize("seed", [2**53 + 5, 2**53 + 6, 2**62])
def test_tokens_are_exact_beyond_2_53(raw_redis, seed):
    sem = Semaphore("big", limit=3, timeout=30)
    sem.acquire().release()  # creates the counter
    raw_redis.hset(sem.partition().holds, "#", seed)
    leases = [sem.acquire() for _ in range(3)]
    assert [lease.token for lease in leases] == [seed + 1, seed + 2, seed + 3]
    holders = sem.holders()
    assert [h.token for h in holders] == [seed + 1, seed + 2, seed + 3]
    assert [h.identifier for h in holders] == [lease.identifier for lease in leases]


# -- holders, available, purge_expired -------------------------------------------------


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


# -- waiting -------------------------------------------------------------------------


def _in_thread(func, *args, **kwargs):
    result = {}

    def target():
        result["value"] = func(*args, **kwargs)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def test_waiting_gives_up_after_wait_seconds():
    sem = Semaphore("queue", limit=1, timeout=30)
    holder = sem.acquire()
    started = time.monotonic()
    assert sem.acquire(wait=0.3) is None
    assert 0.3 <= time.monotonic() - started < 5
    assert sem.status().waiting == 0  # the ticket was given back
    holder.release()
    assert sem.acquire(wait=0.3) is not None


def test_waiters_are_served_first_come_first_served():
    sem = Semaphore("queue", limit=1, timeout=30)
    holder = sem.acquire()
    first, first_result = _in_thread(sem.acquire, wait=20, meta={"w": 1})
    wait_until(lambda: sem.status().waiting == 1, message="first waiter queued")
    second, second_result = _in_thread(sem.acquire, wait=20, meta={"w": 2})
    wait_until(lambda: sem.status().waiting == 2, message="second waiter queued")
    assert holder.release() is True
    first.join(10)
    assert first_result["value"] is not None
    assert second.is_alive() and sem.holders()[0].meta["w"] == 1
    assert first_result["value"].release() is True
    second.join(10)
    assert second_result["value"] is not None
    assert second_result["value"].token > first_result["value"].token
    second_result["value"].release()


def test_a_newcomer_cannot_overtake_a_queued_waiter():
    sem = Semaphore("queue", limit=1, timeout=30)
    holder = sem.acquire()
    waiter, result = _in_thread(sem.acquire, wait=20)
    wait_until(lambda: sem.status().waiting == 1, message="waiter queued")
    assert holder.release() is True
    # The slot is free (or already taken by the waiter): either way not ours.
    assert sem.acquire() is None
    waiter.join(10)
    assert result["value"] is not None
    assert [h.identifier for h in sem.holders()] == [result["value"].identifier]


def test_a_waiter_gets_a_slot_whose_lease_expired():
    sem = Semaphore("queue", limit=1, timeout=0.5)
    sem.acquire()  # never released
    lease = sem.acquire(wait=10)
    assert lease is not None
    assert lease.waited < 10


@pytest.mark.parametrize("algorithm", ["fair_locked", "fair", "basic"])
def test_polling_variants_wait_too(algorithm):
    sem = Semaphore("poll", limit=1, timeout=30, algorithm=algorithm)
    holder = sem.acquire()
    thread, result = _in_thread(sem.acquire, wait=20)
    time.sleep(0.1)  # most likely the waiter polls while full; either way it must get the slot
    holder.release()
    thread.join(10)
    assert result["value"] is not None


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
