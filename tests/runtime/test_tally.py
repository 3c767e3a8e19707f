"""The tally (django_semaphore.runtime.tally): this process's counts of grants,
refusals, releases and waits, kept by the engine while the metrics count."""

import threading
import uuid

import pytest

from django_semaphore import Semaphore, signals
from django_semaphore.runtime import tally

pytestmark = pytest.mark.usefixtures("backend")


def counts(name):
    found = [row for row in tally.rows() if row.name == name]
    return found[0] if found else None


@pytest.fixture
def sem():
    return Semaphore(f"tally-{uuid.uuid4().hex[:8]}", limit=1, timeout=5)


def test_the_engine_counts_grants_refusals_releases_and_waits(sem, monkeypatch):
    monkeypatch.setattr(tally, "counting", True)
    lease = sem.acquire()
    assert sem.acquire(wait=0.06) is None  # queued 60 ms, then refused
    assert sem.acquire() is None  # refused at once
    lease.release()
    lost = sem.acquire()
    sem.force_release(lost.identifier)
    assert lost.release() is False  # a lost lease's release still counts once
    assert lost.release() is False
    row = counts(sem.name)
    assert (row.acquired, row.refused, row.released) == (2, 2, 2)
    assert row.owner is sem
    assert sum(row.acquired_waits) == 2 and sum(row.refused_waits) == 2
    # The refusal that waited at least 60 ms is in a bucket above 50 ms, the one at once
    # below it (not necessarily in the first, up to 1 ms: a loaded machine's round trip
    # to a cluster took longer once).
    assert sum(row.refused_waits[tally.WAIT_BUCKETS.index(0.1) :]) == 1, row
    assert sum(row.refused_waits[: tally.WAIT_BUCKETS.index(0.1)]) == 1, row
    assert 0.06 <= row.refused_sum < 1


def test_a_dry_run_admission_is_a_grant_not_a_refusal(monkeypatch):
    monkeypatch.setattr(tally, "counting", True)
    sem = Semaphore(f"tally-{uuid.uuid4().hex[:8]}", limit=1, timeout=5, mode="dry_run")
    held = [sem.acquire(), sem.acquire()]
    assert held[1].over_limit
    row = counts(sem.name)
    assert (row.acquired, row.refused) == (2, 0)
    for lease in held:
        lease.release()


def test_nothing_is_counted_while_the_tally_is_off(sem, monkeypatch):
    monkeypatch.setattr(tally, "counting", False)
    sem.acquire().release()
    assert counts(sem.name) is None


def test_the_metrics_count_with_the_tally_and_leave_the_hot_signals_without_receivers():
    """What makes a cycle's metrics cost about a microsecond: no receiver of theirs
    on ``acquired`` or ``released`` (each send to one cost more than the tally)."""
    assert tally.counting
    for signal in (signals.acquired, signals.released):
        assert not [r for r in signal.receivers if "django_semaphore.metrics" in str(r[0][0])]


def test_threads_lose_no_count(sem):
    def count():
        for _ in range(2000):
            tally.acquired(sem.name, sem, 0.0)
            tally.released(sem.name, sem)

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    row = counts(sem.name)
    assert (row.acquired, row.released, row.acquired_waits[0]) == (16000, 16000, 16000)


def test_names_beyond_the_bound_share_one_row(monkeypatch):
    monkeypatch.setattr(tally, "_counts", {})
    monkeypatch.setattr(tally, "MAX_NAMES", 2)
    for name in ("a", "b", "c", "d"):
        tally.acquired(name, name, 0.002)
    rows = {row.name: row for row in tally.rows()}
    assert set(rows) == {"a", "b", None}
    assert rows[None].acquired == 2 and rows[None].owner is None
    assert rows[None].acquired_waits[1] == 2  # 2 ms: the bucket up to 5 ms
