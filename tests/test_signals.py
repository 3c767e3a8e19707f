"""Signals sent by django-semaphore (django_semaphore.signals): ``acquired``, ``refused``,
``released`` and ``lease_lost``, with ``sender=Semaphore`` and the documented keywords,
against the real Redis (``backend_failed`` is the driver's: tests/backend/test_scripting.py)."""

import pytest

from django_semaphore import Semaphore, signals
from tests.support.helpers import names_of, wait_until

# Every test runs on a single server and on a Redis Cluster (tests/support/fixtures_redis.py).
pytestmark = pytest.mark.usefixtures("backend")


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


@pytest.fixture
def senders():
    """(signal name, sender) of every semaphore signal sent during the test."""
    seen = []
    receivers = {}
    for name in ("acquired", "refused", "released", "lease_lost"):

        def receiver(sender, _name=name, **kwargs):
            seen.append((_name, sender))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    yield seen
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_every_signal_is_sent_by_the_semaphore_class(senders):
    sem = Semaphore("senders", limit=1, timeout=30)
    lease = sem.acquire()
    assert sem.acquire() is None
    assert lease.release() is True
    assert senders == [("acquired", Semaphore), ("refused", Semaphore), ("released", Semaphore)]


def test_acquired_and_refused_carry_the_documented_keywords(received):
    sem = Semaphore("keywords", limit=1, timeout=30)
    lease = sem.acquire(key="k")
    assert sem.acquire(key="k", wait=0.2) is None
    (acquired,) = names_of(received, "acquired")
    assert acquired["semaphore"] == sem and acquired["lease"] is lease
    assert 0 <= acquired["waited"] < 5
    (refused,) = names_of(received, "refused")
    assert refused["semaphore"] == sem and refused["key"] == "k"
    assert 1 <= refused["retry_after"] <= 30
    assert 0.2 <= refused["waited"] < 5  # it queued for its WAIT before it was refused
    assert lease.release() is True


def test_a_lost_lease_sends_lease_lost_once_then_released_not_held(received):
    sem = Semaphore("lost", limit=1, timeout=0.3)
    lease = sem.acquire()
    wait_until(lambda: sem.available() == 1, message="lease expiry")
    assert lease.refresh() is False
    assert lease.refresh() is False
    assert lease.release() is False
    assert [kwargs["lease"] for kwargs in names_of(received, "lease_lost")] == [lease]
    (released,) = names_of(received, "released")
    assert released["lease"] is lease and released["held"] is False
