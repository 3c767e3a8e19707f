"""The lease watchdog: one thread for all sync leases, asyncio tasks for async
ones, stops on release, logs lost leases without re-acquiring, fork-safe."""

import asyncio
import logging
import os
import threading
import time
import tracemalloc
import weakref

import pytest

from django_semaphore import Semaphore, signals
from django_semaphore.engine import watchdog
from tests.support.helpers import wait_until


def watchdog_threads():
    return [t for t in threading.enumerate() if t.name == "django-semaphore-watchdog"]


@pytest.fixture
def lost_events():
    seen = []

    def on_lost(sender, lease, **kwargs):
        seen.append(lease)

    signals.lease_lost.connect(on_lost)
    yield seen
    signals.lease_lost.disconnect(on_lost)


def test_one_thread_renews_many_leases():
    sem = Semaphore("wd-many", limit=10, timeout=1.5)
    leases = [sem.acquire() for _ in range(10)]
    first_expiry = {lease: lease.expires_ms for lease in leases}
    watches = [watchdog.watch(lease) for lease in leases]
    assert len(watchdog_threads()) == 1
    assert watchdog.watchdog().count() >= 10
    # renewed at ~TIMEOUT/3: every lease outlives its first expiry
    wait_until(lambda: all(lease.expires_ms > first_expiry[lease] for lease in leases), timeout=10)
    time.sleep(1.6)  # longer than TIMEOUT: unrenewed leases would be gone now
    assert len(sem.holders()) == 10
    assert len(watchdog_threads()) == 1
    for watch, lease in zip(watches, leases, strict=True):
        watch.stop()
        assert lease.release() is True
    assert sem.available() == 10


def test_stops_when_released():
    sem = Semaphore("wd-stop", limit=1, timeout=0.3)
    lease = sem.acquire()
    with watchdog.watching(lease):
        wait_until(lambda: lease.expires_ms > lease.acquired_ms + 300, timeout=10)
    lease.release()
    expires = lease.expires_ms
    time.sleep(0.3)
    assert lease.expires_ms == expires and not lease.lost
    assert sem.available() == 1


def test_lost_lease_is_logged_and_never_reacquired(caplog, lost_events):
    sem = Semaphore("wd-lost", limit=1, timeout=0.6)
    lease = sem.acquire()
    with caplog.at_level(logging.WARNING, logger="django_semaphore"), watchdog.watching(lease):
        assert sem.force_release(lease.identifier) is True
        wait_until(lambda: lease.lost, timeout=10, message="lease seen lost")
        time.sleep(0.5)  # the watchdog keeps running: it must not take the slot again
        assert sem.holders() == []
    assert lost_events == [lease]  # sent once, by Lease.refresh
    lines = [r.getMessage() for r in caplog.records if r.name == "django_semaphore"]
    assert len(lines) == 1 and "was lost" in lines[0]


def test_release_racing_a_renewal_is_not_a_loss(lost_events):
    # Stopping waits for a renewal in flight, so a release never crosses one.
    sem = Semaphore("wd-race", limit=1, timeout=0.3)
    really_expired = []
    for i in range(40):
        lease = sem.acquire()
        watch = watchdog.watch(lease)
        time.sleep(0.09 + (i % 5) * 0.005)  # around the first renewal, at TIMEOUT/3
        watch.stop()
        if not lease.release():  # a stalled machine can let it expire for real
            really_expired.append(lease)
    assert lost_events == really_expired
    assert len(really_expired) < 10


@pytest.mark.asyncio
async def test_async_watch_renews_and_stops(lost_events):
    sem = Semaphore("wd-async", limit=1, timeout=1.0)
    lease = await sem.aacquire()
    threads_before = threading.active_count()
    async with watchdog.awatching(lease):
        await asyncio.sleep(2.5)  # 2.5 x TIMEOUT
        assert [h.identifier for h in await sem.aholders()] == [lease.identifier]
        assert threading.active_count() == threads_before  # a task, not a thread
    assert await lease.arelease() is True
    assert lost_events == []


@pytest.mark.asyncio
async def test_async_watch_stopped_from_another_thread():
    sem = Semaphore("wd-async-thread", limit=1, timeout=1.0)
    lease = await sem.aacquire()
    watch = watchdog.AsyncWatch([lease])
    await asyncio.sleep(0.4)
    # Django closes ASGI responses in a thread: stop() from there waits for the task
    await asyncio.get_running_loop().run_in_executor(None, watch.stop)
    await asyncio.wait_for(watch._task, 5)
    assert await lease.arelease() is True


@pytest.mark.asyncio
async def test_async_lost_lease(caplog, lost_events):
    sem = Semaphore("wd-async-lost", limit=1, timeout=0.3)
    lease = await sem.aacquire()
    with caplog.at_level(logging.WARNING, logger="django_semaphore"):
        async with watchdog.awatching(lease):
            sem.force_release(lease.identifier)
            for _ in range(500):
                if lease.lost:
                    break
                await asyncio.sleep(0.02)
    assert lease.lost and lost_events == [lease]
    assert any("was lost" in r.getMessage() for r in caplog.records)


def test_fork_child_never_touches_the_parents_leases():
    sem = Semaphore("wd-fork", limit=1, timeout=1.5)
    lease = sem.acquire()
    with watchdog.watching(lease):
        report = _in_a_forked_child(lambda: (watchdog.watchdog().count(), watchdog.watchdog().thread is None))
        assert report == "(0, True)"
        time.sleep(1.6)  # the parent still renews its lease
        assert [h.identifier for h in sem.holders()] == [lease.identifier]
    assert lease.release() is True


def test_stopped_watches_do_not_pile_up_behind_a_long_lease():
    """Issue 11 item 10: short watches stopped while a long lease is watched.

    The long lease (TIMEOUT 3 s, renewed every second) stays at the head of
    the watchdog's schedule; each short watch (TIMEOUT 60 s) would come due
    only after 20 s, so a stopped one used to stay in the heap until then.
    """
    long_lease = Semaphore("wd-long", limit=1, timeout=3).acquire()
    short_lease = Semaphore("wd-short", limit=1, timeout=60).acquire()
    dog = watchdog.watchdog()
    with watchdog.watching(long_lease):
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(20_000):
                watchdog.watch(short_lease).stop()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        scheduled = dog.scheduled()
        print(f"WATCHDOG after 20,000 short watches: heap {scheduled} entries, memory {grown / 1e6:+.2f} MB")
        assert scheduled <= 100  # the long lease, and at most a few stopped entries between rebuilds
        assert grown < 1_000_000
        assert dog.count() == 1
    assert long_lease.release() is True and short_lease.release() is True


# -- the releaser: give-backs queued by finalizers ------------------------------------------------


class _Dropped:
    """Stands for a response: its finalizer queues a give-back, as web.streaming's does."""


def test_a_give_back_queued_by_a_finalizer_runs_on_the_releaser_thread_at_once():
    sem = Semaphore("wd-releaser", limit=1, timeout=30)
    lease = sem.acquire()
    ran_on = []

    def give_back():
        ran_on.append(threading.current_thread().name)
        lease.release()

    watchdog.releaser().start()
    dropped = _Dropped()
    weakref.finalize(dropped, watchdog.release_later, give_back)
    del dropped  # collected now: the finalizer only queues
    wait_until(lambda: lease.released, timeout=5, message="the give-back made")
    assert ran_on == [watchdog.RELEASER_NAME] and sem.available() == 1
    assert [t.name for t in threading.enumerate()].count(watchdog.RELEASER_NAME) == 1


def test_a_give_back_that_raises_is_logged_and_the_next_one_runs(caplog):
    watchdog.releaser().start()
    done = threading.Event()

    def broken():
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="django_semaphore"):
        watchdog.release_later(broken)
        watchdog.release_later(done.set)
        assert done.wait(5)
    assert any("dropped unclosed" in r.getMessage() for r in caplog.records)


def test_fork_child_starts_without_the_releaser_thread():
    watchdog.releaser().start()
    assert _in_a_forked_child(lambda: watchdog.releaser().thread is None) == "True"


def _in_a_forked_child(look):
    """The repr of what ``look()`` returns in a forked child (which leaves at once)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, repr(look()).encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    report = os.read(read, 100).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0
    return report
