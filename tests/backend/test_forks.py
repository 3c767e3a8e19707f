"""Fork safety, one way: resets run in a forked child in registration order, a fork
that ran no hook is caught by pid(), and a child forked from a busy process starts
with its own scheduler, watchdog, recovery, cache, windows and counts, while the
parent goes on unaffected."""

import json
import os
import threading

import pytest

from django_semaphore import Semaphore
from django_semaphore.backend import forks
from django_semaphore.engine import recovery, watchdog
from django_semaphore.runtime import adaptive, control, stats
from django_semaphore.runtime.scheduler import scheduler
from tests.support.helpers import wait_until

_seen = []  # what the callbacks registered below did, in this process


def _first():
    _seen.append("first")


def _second():
    _seen.append("second")


forks.in_child(_first)
forks.in_child(_second)


def in_child(report):
    """Fork; run ``report()`` in the child and return what it returned (JSON through a pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read)
            os.write(write, json.dumps(report()).encode())
        except BaseException as exc:
            os.write(write, json.dumps({"error": repr(exc)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        result = json.loads(pipe.read() or "null")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def test_the_callbacks_run_in_the_child_in_registration_order():
    _seen.clear()
    parent = (forks.pid(), forks.generation())
    child = in_child(
        lambda: {"seen": _seen, "pid": forks.pid(), "real": os.getpid(), "gen": forks.generation()}
    )
    assert child["seen"] == ["first", "second"]
    assert child["pid"] == child["real"] != parent[0]
    assert child["gen"] == parent[1] + 1
    assert _seen == [] and (forks.pid(), forks.generation()) == parent  # the parent ran none


def test_a_fork_without_the_hook_is_caught_at_the_next_check():
    def report():
        _seen.clear()
        generation = forks.generation()
        forks._pid = -1  # as if forked again at the C level (no Python hook ran): uWSGI's fork
        state = {
            "pid": forks.pid() == os.getpid(),
            "seen": list(_seen),
            "gen": forks.generation() - generation,
        }
        _seen.clear()
        state["again"] = [forks.pid() == os.getpid(), list(_seen)]  # once
        return state

    assert in_child(report) == {"pid": True, "seen": ["first", "second"], "gen": 1, "again": [True, []]}


def test_a_failing_callback_does_not_stop_the_others(caplog):
    def broken():
        raise RuntimeError("broken reset")

    forks.in_child(broken)
    forks.in_child(_second)
    try:
        _seen.clear()
        child = in_child(lambda: list(_seen))
        assert child == ["first", "second", "second"]
    finally:
        forks._callbacks.remove(broken)
        forks._callbacks.remove(_second)


def _hold_the_windows_and_counts(config, prefix):
    """Record a hold and a refusal, then hold the locks so that the poll cannot send
    them before the fork; returns the locks held (release them after the fork)."""
    for _ in range(50):
        stats.record_hold(config.name, 0.05, prefix=prefix)
        stats.record_refusal(config.name, prefix=prefix)
        locks = (adaptive._lock, stats._lock)
        for lock in locks:
            lock.acquire()
        if adaptive._windows and stats._pending:
            return locks
        for lock in reversed(locks):
            lock.release()
    pytest.fail("the poll kept sending the samples before they could be seen")


def test_a_forked_child_owns_nothing_of_its_parent(key_prefix):
    sem = Semaphore("fork-all", limit=2, timeout=3, adaptive={"MIN": 1, "MAX": 4})
    lease = sem.acquire()
    assert lease is not None
    control.cached(sem.config)  # the poll runs, the adaptive semaphore is watched
    cache = control.cache()
    wait_until(lambda: cache.state(key_prefix) is not None, timeout=5, message="the prefix read")
    parent_thread = scheduler().thread
    assert parent_thread is not None and parent_thread.is_alive()
    recovery.remember_acquire(sem.config, sem.partition(), "fork-all-ghost")  # retried in 0.2 s
    with watchdog.watching(lease):
        locks = _hold_the_windows_and_counts(sem.config, key_prefix)
        try:

            def report():
                state = {
                    "scheduler_thread": scheduler().thread is None,
                    "watches": watchdog.watchdog().count(),
                    "watchdog_thread": watchdog.watchdog().thread is None,
                    "recovery": recovery.recovery().pending(),
                    "prefix_known": cache.state(key_prefix) is not None,
                    "ticks": cache.ticks,
                    "windows": len(adaptive.drain().taken),
                    "counts": len(stats.drain().taken),
                    "refresh": lease.refresh(),
                    "release": lease.release(),
                }
                # The child's own background: its first use schedules the poll on a new thread.
                mine = sem.acquire()
                state["acquired"] = mine is not None and mine.release()
                wait_until(lambda: cache.ticks >= 1, timeout=5, message="the child's poll")
                thread = scheduler().thread
                state["new_thread"] = thread is not None and thread is not parent_thread and thread.is_alive()
                return state

            child = in_child(report)
        finally:
            parents = (len(adaptive._windows), len(stats._pending))
            for lock in reversed(locks):
                lock.release()
        assert child == {
            "scheduler_thread": True,
            "watches": 0,
            "watchdog_thread": True,
            "recovery": 0,
            "prefix_known": False,
            "ticks": 0,
            "windows": 0,
            "counts": 0,
            "refresh": False,
            "release": False,
            "acquired": True,
            "new_thread": True,
        }
        # The parent is unaffected: its samples and counts, its threads, its lease.
        assert parents[0] >= 1 and parents[1] >= 1
        assert scheduler().thread is parent_thread and parent_thread.is_alive()
        assert watchdog.watchdog().count() >= 1 and watchdog.watchdog().thread.is_alive()
        wait_until(lambda: recovery.recovery().idle(), timeout=10, message="the parent's retry")
        assert cache.state(key_prefix) is not None
        assert lease.refresh() is True
    assert [h.identifier for h in sem.holders()] == [lease.identifier]
    assert lease.release() is True


def test_a_lock_held_at_the_fork_is_not_held_in_the_child():
    with stats._lock, adaptive._lock:
        child = in_child(lambda: [stats._lock.acquire(timeout=1), adaptive._lock.acquire(timeout=1)])
    assert child == [True, True]
    assert threading.main_thread().is_alive()
