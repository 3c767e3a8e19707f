"""Lease (django_semaphore.lease): release and refresh, expiry and loss, fencing tokens."""

import time

import pytest

from django_semaphore import Semaphore
from django_semaphore.backend.keys import adhoc_key
from django_semaphore.config import settings as conf
from tests.support.helpers import names_of, wait_until

ALGORITHMS = ["lua", "fair_locked", "fair", "basic"]


# Every contract test runs on a single server and on a Redis Cluster (tests/support/fixtures_redis.py).
pytestmark = pytest.mark.usefixtures("backend")


def expired(sem, key=None, timeout=10.0):
    """Wait until every lease of ``sem`` (partition ``key``) has run out."""
    wait_until(lambda: sem.available(key) == sem.limit, timeout, message="lease expiry")


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
    # (API: within 2 x TIMEOUT + 10 s; the registry of ad-hoc semaphores is no partition).
    registry = adhoc_key(conf.setting("SEMAPHORE_KEY_PREFIX"))
    wait_until(lambda: set(prefix_keys()) <= {registry}, timeout=2 * 0.3 + 10, message="keys expiring")
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
