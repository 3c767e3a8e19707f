"""The background scheduler: one thread runs every job at its time, started lazily,
ended by stop() and when idle; a failing or slow job is logged once per incident
and never stops the others."""

import logging
import threading
import time

import pytest

from django_semaphore import Semaphore
from django_semaphore.runtime import control, scheduler
from django_semaphore.runtime.scheduler import Scheduler
from tests.support.helpers import wait_until


@pytest.fixture
def sched():
    box = Scheduler("test-scheduler")
    yield box
    box.stop()


def threads(name):
    return [t for t in threading.enumerate() if t.name == name]


def test_the_thread_starts_at_the_first_job_and_runs_them_all(sched):
    runs = []
    jobs = [sched.every(f"p{i}", 0.05, lambda i=i: runs.append(i)) for i in range(5)]
    assert sched.thread is None and threads("test-scheduler") == []  # lazily
    for job in jobs:
        job.schedule()
    wait_until(lambda: all(runs.count(i) >= 3 for i in range(5)), timeout=5, message="every job ran 3 times")
    assert len(threads("test-scheduler")) == 1


def test_a_periodic_job_keeps_its_interval(sched):
    times = []
    sched.every("tick", 0.1, lambda: times.append(time.monotonic())).schedule()
    wait_until(lambda: len(times) >= 6, timeout=5)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    print(f"SCHEDULER gaps of a 0.1 s job: {[round(g, 3) for g in gaps]}")
    assert all(gap >= 0.095 for gap in gaps)
    assert sorted(gaps)[len(gaps) // 2] < 0.2  # the median, on a loaded machine


def test_a_job_runs_when_scheduled_and_returns_when_it_is_next_due(sched):
    runs = []

    def once():
        runs.append(time.monotonic())
        return 0.1 if len(runs) == 1 else None  # twice, then waits to be scheduled

    job = sched.job("once", once)
    started = time.monotonic()
    job.schedule(0.1)
    wait_until(lambda: len(runs) == 2, timeout=5)
    assert runs[0] - started >= 0.095 and runs[1] - runs[0] >= 0.095
    time.sleep(0.3)
    assert len(runs) == 2 and not job.active
    job.schedule()
    wait_until(lambda: len(runs) == 3, timeout=5)


def test_sooner_only_moves_a_run_earlier(sched):
    runs = []
    job = sched.job("sooner", lambda: runs.append(time.monotonic()))
    started = time.monotonic()
    job.schedule(10)
    job.schedule(0.05, sooner=True)
    job.schedule(10, sooner=True)  # later than the run scheduled: no change
    wait_until(lambda: runs, timeout=5)
    assert runs[0] - started < 5


def test_a_cancelled_job_does_not_run_and_cancelled_entries_do_not_pile_up(sched):
    runs = []
    keeper = sched.every("keeper", 0.05, lambda: None)
    keeper.schedule()
    for _ in range(10_000):
        job = sched.job("short", lambda: runs.append(1))
        job.schedule(60)
        job.cancel()
    assert sched.scheduled() <= 100
    cancelled = sched.job("cancelled", lambda: runs.append(1))
    cancelled.schedule(0.05)
    cancelled.cancel()
    time.sleep(0.2)
    assert runs == []


def test_a_job_cancelled_while_it_runs_is_not_scheduled_again(sched):
    started, go = threading.Event(), threading.Event()
    runs = []

    def slow():
        runs.append(1)
        started.set()
        go.wait(5)
        return 0.0

    job = sched.job("slow", slow)
    job.schedule()
    assert started.wait(5)
    job.cancel()
    go.set()
    time.sleep(0.2)
    assert runs == [1] and not job.active


def test_a_failing_job_is_logged_once_per_incident_and_the_others_run(sched, caplog):
    failing = {"on": True}
    runs = []

    def bad():
        if failing["on"]:
            raise RuntimeError("boom")

    sched.job("bad", bad, retry=0.02).schedule()
    sched.every("good", 0.02, lambda: runs.append(1)).schedule()
    with caplog.at_level(logging.WARNING, logger="django_semaphore.runtime.scheduler"):
        wait_until(lambda: len(runs) >= 20, timeout=5)  # the bad job failed ~20 times meanwhile
        failing["on"] = False
        wait_until(lambda: any("runs again" in r.getMessage() for r in caplog.records), timeout=5)
    lines = [r.getMessage() for r in caplog.records if "'bad'" in r.getMessage()]
    assert len(lines) == 2 and "failed" in lines[0] and "runs again" in lines[1]


def test_a_slow_job_delays_the_others_but_never_stops_them(sched, caplog, monkeypatch):
    monkeypatch.setattr(scheduler, "SLOW_AFTER", 0.05)
    runs = []

    def slow():
        time.sleep(0.1)
        return 0.0

    sched.job("slow", slow).schedule()
    sched.every("quick", 0.01, lambda: runs.append(1)).schedule()
    with caplog.at_level(logging.WARNING, logger="django_semaphore.runtime.scheduler"):
        wait_until(lambda: len(runs) >= 5, timeout=5, message="the quick job ran between the slow runs")
    lines = [r.getMessage() for r in caplog.records if "'slow'" in r.getMessage()]
    assert len(lines) == 1 and "took" in lines[0]  # once for the incident, not per run


def test_stop_ends_the_thread_and_the_next_job_starts_another(sched):
    runs = []
    sched.every("p", 0.02, lambda: runs.append(1)).schedule()
    wait_until(lambda: runs, timeout=5)
    first = sched.thread
    sched.stop()
    assert sched.thread is None and not first.is_alive()
    count = len(runs)
    time.sleep(0.1)
    assert len(runs) == count  # the job was forgotten with the thread
    job = sched.job("again", lambda: runs.append(2))
    job.schedule()
    wait_until(lambda: 2 in runs, timeout=5)
    assert sched.thread is not first and sched.thread.is_alive()


def test_the_idle_thread_ends_and_starts_again_on_demand(sched, monkeypatch):
    monkeypatch.setattr(scheduler, "IDLE_EXIT", 0.1)
    runs = []
    sched.job("one", lambda: runs.append(1)).schedule()
    wait_until(lambda: runs, timeout=5)
    wait_until(lambda: sched.thread is None, timeout=5, message="the idle thread ended")
    sched.job("two", lambda: runs.append(2)).schedule()
    wait_until(lambda: 2 in runs, timeout=5)


def test_the_control_poll_is_a_job_of_the_process_scheduler():
    sem = Semaphore("sched-control", limit=1, timeout=5)
    assert sem.acquire().release() is True
    cache = control.cache()
    ticks = cache.ticks
    wait_until(lambda: cache.ticks >= ticks + 2, timeout=5, message="two polls")
    thread = scheduler.scheduler().thread
    assert thread is not None and thread.name == scheduler.THREAD_NAME and thread.is_alive()
    # One thread for the process's periodic jobs: no poller of its own any more.
    assert [t.name for t in threading.enumerate() if t.name.startswith("django-semaphore-")].count(
        scheduler.THREAD_NAME
    ) == 1
    assert not threads("django-semaphore-control") and not threads("django-semaphore-recovery")
