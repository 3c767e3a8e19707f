"""Recent statistics (django_semaphore.stats): refusals, would-be refusals and hold
times recorded per process, flushed by the control poller, read cluster-wide."""

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from django_semaphore import Semaphore, semaphores
from django_semaphore.backend import connection
from django_semaphore.backend.keys import stats_keys
from django_semaphore.runtime import control, stats
from tests.support.helpers import count_round_trips, wait_until


def settled(name, now=None, samples=None):
    """stats.recent() once this process's records have reached Redis: flush() returns
    when they have, those the poller's thread was sending at that moment included."""
    stats.flush()
    recent = stats.recent(name, now=now)
    assert samples is None or recent.samples == samples, recent
    return recent


def test_a_flush_returns_once_the_counts_a_poll_is_sending_are_in(raw_redis, key_prefix):
    stats.record_refusal("inflight")
    stats.record_hold("inflight", 0.25)
    raw_redis.client_pause(500, all=False)  # writes wait half a second; reads go on
    try:
        poll = threading.Thread(target=control.cache().tick)  # takes the counts, sends them
        poll.start()
        wait_until(lambda: not stats._pending, interval=0.001, message="the poll took the counts")
        stats.flush()  # nothing left to send here: it waits for that poll
        assert stats.recent("inflight")[:2] == (1, 0) and stats.recent("inflight").samples == 1
    finally:
        raw_redis.client_unpause()
    poll.join(10)


CHILD = textwrap.dedent(
    """
    import sys
    import django
    django.setup()
    from django_semaphore import semaphores
    sem = semaphores["reports"]
    assert sem.acquire() is None and sem.acquire() is None   # two refusals (the parent holds both slots)
    print("refused", flush=True)
    sys.stdin.readline()   # stay alive until the parent has read the stats: the poller flushes them
    """
)


def test_refusals_are_counted_across_processes(subprocess_env):
    sem = semaphores["reports"]
    held = [sem.acquire(), sem.acquire()]
    assert all(held)
    assert sem.acquire() is None  # one refusal here
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        env=subprocess_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "refused", child.stderr.read()
        sem.override(mode="dry_run")
        assert sem.acquire().over_limit  # one would-be refusal here
        recent = wait_until(
            lambda: (r := stats.recent(sem)).refused == 3 and r.dry_run_refused == 1 and r,
            timeout=10,
            message="both processes' refusals flushed",
        )
        assert recent.refused == 3 and recent.dry_run_refused == 1
    finally:
        child.stdin.close()
        child.wait(10)


def test_hold_times_p50_and_p95(raw_redis, key_prefix):
    now = time.time()
    for seconds in range(1, 101):  # 1..100 seconds
        stats.record_hold("holds", float(seconds), now=now)
    recent = settled("holds", now, samples=100)
    assert recent.hold_p50 == 50.0 and recent.hold_p95 == 95.0
    _, holds_key = stats_keys(key_prefix, "holds")
    assert 0 < raw_redis.pttl(holds_key) <= stats.TTL_MS


def test_released_leases_give_hold_times():
    sem = Semaphore("timed", limit=2, timeout=5)
    lease = sem.acquire()
    time.sleep(0.05)  # the hold being measured (not a wait for an event)
    lease.release()
    sem.acquire().release()
    lost = sem.acquire()
    sem.force_release(lost.identifier)
    assert lost.release() is False  # a lost lease gives no hold time
    recent = settled(sem, samples=2)
    assert recent.hold_p95 >= 0.05 and recent.hold_p50 < recent.hold_p95


def test_the_window_is_five_minutes(raw_redis, key_prefix):
    now = time.time()
    for age in (400, 301, 290, 100, 0):
        stats.record_refusal("win", now=now - age)
        stats.record_refusal("win", dry_run=True, now=now - age)
        stats.record_hold("win", float(age), now=now - age)
    recent = settled("win", now, samples=3)
    assert (recent.refused, recent.dry_run_refused, recent.samples) == (3, 3, 3)
    assert stats.recent("win", now=now + 200) == (1, 1, 0.0, 0.0, 1)  # only the newest left
    assert stats.recent("win", now=now + 400) == (0, 0, None, None, 0)
    count_key, _ = stats_keys(key_prefix, "win")
    assert 0 < raw_redis.pttl(count_key) <= stats.TTL_MS


def test_old_buckets_are_pruned(raw_redis, key_prefix):
    now = time.time()
    stats.record_refusal("prune", now=now - 500)
    stats.flush()
    stats.record_refusal("prune", now=now)
    stats.flush()
    count_key, _ = stats_keys(key_prefix, "prune")
    assert raw_redis.hkeys(count_key) == [f"r:{stats.bucket_of(now)}".encode()]


def test_the_hold_list_is_bounded(raw_redis, key_prefix):
    for _ in range(3):
        for n in range(150):
            stats.record_hold("bounded", n / 1000)
        stats.flush()
    _, holds_key = stats_keys(key_prefix, "bounded")
    assert raw_redis.llen(holds_key) == stats.HOLD_SAMPLES


def test_a_flush_sends_the_newest_hold_times(raw_redis, key_prefix):
    """More hold times between two flushes than the LIST keeps: the newest go, in order
    (a failed flush's, put back, come before the ones recorded since)."""
    now = time.time()
    for n in range(3 * stats.HOLD_SAMPLES + 7):
        stats.record_hold("newest", n / 1000, now=now)
    taken = stats.drain()
    stats.record_hold("newest", 9.0, now=now)
    taken.restore()  # as a failed flush does
    stats.flush()
    _, holds_key = stats_keys(key_prefix, "newest")
    sent = [float(item.split(b":")[1]) for item in raw_redis.lrange(holds_key, 0, -1)]
    newest = [n / 1000 for n in range(3 * stats.HOLD_SAMPLES + 7)][-(stats.HOLD_SAMPLES - 1) :] + [9.0]
    assert sent == newest[::-1]  # LPUSH: the newest first


@pytest.fixture
def main_thread_commands(monkeypatch):
    """The round trips the main thread makes (the scheduler's thread is left out)."""
    return count_round_trips(monkeypatch)


def test_no_redis_command_for_stats_on_the_acquire_path(main_thread_commands):
    sem = Semaphore("quiet", limit=1, timeout=5)
    sem.acquire().release()  # the overrides are read once
    main_thread_commands.clear()
    lease = sem.acquire()
    assert sem.acquire() is None  # a refusal: counted in memory
    lease.release()  # a hold time: kept in memory
    sem.override(mode="dry_run")
    main_thread_commands.clear()
    a, b = sem.acquire(), sem.acquire()  # a would-be refusal
    assert b.over_limit
    a.release()
    b.release()
    assert main_thread_commands == ["EVALSHA"] * 4  # two acquires, two releases: no stats command
    # The poller's thread flushes them.
    wait_until(lambda: stats.recent(sem).samples == 4, message="hold times flushed by the poller")
    assert stats.recent(sem)[:2] == (1, 1)


def test_a_failed_flush_keeps_the_counts(monkeypatch):
    stats.record_refusal("kept")

    class Broken:
        def pipeline(self, transaction=True):
            raise ConnectionError("down")

    monkeypatch.setattr(connection, "get_client", lambda: Broken())
    control.cache().tick()  # fails: the counts go back
    monkeypatch.undo()
    wait_until(lambda: stats.recent("kept").refused == 1, message="flushed at a later tick")


@pytest.mark.asyncio
async def test_arecent():
    stats.record_refusal("async-stats", dry_run=True)
    stats.flush()
    deadline = time.monotonic() + 5  # the poller's thread may be sending it right now
    while (await stats.arecent("async-stats")).dry_run_refused != 1:
        assert time.monotonic() < deadline, "not flushed"
        await asyncio.sleep(0.02)


def test_recent_on_every_backend(backend):
    now = time.time()
    stats.record_refusal("everywhere", now=now)
    stats.record_hold("everywhere", 0.5, now=now)
    control.cache().tick()  # the poller's pipeline, on a single server or a cluster
    assert settled("everywhere", now) == (1, 0, 0.5, 0.5, 1)
