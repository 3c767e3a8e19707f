"""The background scheduler: one daemon thread per process runs the periodic jobs.

The process's jobs run on :func:`scheduler` (thread ``django-semaphore-scheduler``):

* ``control`` (:mod:`~django_semaphore.runtime.control`), every
  ``POLL_INTERVAL`` (half a second) from its start: one pipeline sends the
  adaptive windows, reads the overrides of every prefix in use, flushes the
  stats and the record of ad-hoc semaphores;
* ``recovery`` (:mod:`~django_semaphore.engine.recovery`), while Redis
  requests wait to be retried: at its backoff after a failure, at once when an
  acquire reaches Redis again, a slice of the backlog at a time.

The lease watchdog (:mod:`~django_semaphore.engine.watchdog`) has a scheduler
of its own, the same class (thread ``django-semaphore-watchdog``): a renewal
that comes late loses a slot, so leases are never renewed behind a control
poll or a retry stalled on a dead connection.

A :class:`Job` is a callable returning the seconds until its next run, or
None to wait until it is scheduled again (:meth:`Job.schedule`).
:meth:`Scheduler.every` makes a periodic one.  The thread starts at the first
job scheduled and ends after ``IDLE_EXIT`` seconds without any (it starts again
on demand); in a forked child it is gone and the scheduler starts empty
(:mod:`~django_semaphore.backend.forks`): each owner schedules its jobs again
at its next use.  :meth:`Scheduler.stop` ends it for tests.

A job runs outside the scheduler's lock: scheduling never waits for a job.
A job that raises is logged once per incident (until a run succeeds), then
runs again at its ``retry`` interval; one that runs longer than
``SLOW_AFTER`` seconds is logged once per incident too.  A slow job delays the
jobs due meanwhile (they run as soon as it returns) and never stops them: a
job with much to do (the recovery backlog) does a slice and asks to run again
at once, so that the others due meanwhile run in between.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable

from ..backend import forks

logger = logging.getLogger("django_semaphore.runtime.scheduler")

THREAD_NAME = "django-semaphore-scheduler"
IDLE_EXIT = 30.0  # seconds the thread lingers without any job scheduled before it ends
SLOW_AFTER = 5.0  # a run longer than this is logged (once per incident)
COMPACT_SLACK = 64  # cancelled entries tolerated in the heap beyond as many as are live

__all__ = ["THREAD_NAME", "Job", "Scheduler", "scheduler"]


class Job:
    """Work run by a :class:`Scheduler`: ``run()`` returns the seconds until it
    runs again, or None to wait until :meth:`schedule` is called."""

    __slots__ = ("name", "run", "retry", "_scheduler", "_epoch", "_due", "_seq", "_running", "_cancelled")

    def __init__(
        self, scheduler: Scheduler, name: str, run: Callable[[], float | None], retry: float = 1.0
    ) -> None:
        self.name = name
        self.run = run
        self.retry = retry  # seconds before a run that raised runs again
        self._scheduler = scheduler
        self._epoch = -1  # the scheduler's epoch the state below belongs to
        self._due: float | None = None  # monotonic time of the next run, None when not scheduled
        self._seq = 0  # the heap entry that counts (older ones are stale)
        self._running = False
        self._cancelled = False

    def schedule(self, delay: float = 0.0, sooner: bool = False) -> None:
        """Run ``delay`` seconds from now (``sooner``: only if that is before the run
        already scheduled)."""
        self._scheduler.schedule(self, delay, sooner)

    def cancel(self) -> None:
        """Run no more (a run in progress finishes) until scheduled again."""
        self._scheduler.cancel(self)

    @property
    def active(self) -> bool:
        """True while scheduled or running (read without the lock: a hint); False after
        a fork or :meth:`Scheduler.stop`, whatever it was before."""
        return self._epoch == self._scheduler._epoch and (self._due is not None or self._running)


class Scheduler:
    """A heap of due times and the daemon thread that runs the jobs at those times."""

    def __init__(self, thread_name: str = THREAD_NAME) -> None:
        self.thread_name = thread_name
        self._reset()
        _instances.add(self)

    def _reset(self) -> None:
        # Also the fork reset: the parent's thread did not survive, its jobs belong
        # to the parent, and the lock may have been held at the fork.
        self._epoch = getattr(self, "_epoch", 0) + 1  # what jobs knew of the last one is void
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Job]] = []
        self._live: set[Job] = set()
        self._count = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._failing: set[str] = set()  # jobs whose last run raised (logged once)
        self._slow: set[str] = set()  # jobs whose last run was slow (logged once)

    # -- jobs ----------------------------------------------------------------------

    def job(self, name: str, run: Callable[[], float | None], retry: float = 1.0) -> Job:
        """A job of this scheduler (not scheduled yet)."""
        return Job(self, name, run, retry)

    def every(self, name: str, interval: float, run: Callable[[], object]) -> Job:
        """A periodic job: ``run()`` every ``interval`` seconds from the start of its
        last run (at once after a run longer than that); scheduled at its first
        :meth:`Job.schedule`."""

        def periodic() -> float:
            started = time.monotonic()
            run()
            return max(0.0, interval - (time.monotonic() - started))

        return Job(self, name, periodic, retry=interval)

    def schedule(self, job: Job, delay: float = 0.0, sooner: bool = False) -> None:
        """See :meth:`Job.schedule`."""
        forks.pid()  # a fork that ran no hook: reset first (it resets this scheduler)
        at = time.monotonic() + max(0.0, delay)
        with self._cond:
            self._adopt(job)
            job._cancelled = False
            if sooner and job._due is not None and job._due <= at:
                return
            self._push(job, at)
            self._ensure_thread()

    def cancel(self, job: Job) -> None:
        """See :meth:`Job.cancel`."""
        with self._cond:
            self._adopt(job)
            job._cancelled = True
            job._due = None
            job._seq = next(self._count)  # its heap entry, if any, is stale now
            self._live.discard(job)
            self._compact()

    def _compact(self) -> None:
        # A cancelled (or rescheduled) job's entry stays in the heap until it comes
        # due (removing it from the middle costs O(n)); rebuild the heap once such
        # entries are the majority: amortised O(1) each, at most twice the live ones.
        if len(self._heap) > 2 * len(self._live) + COMPACT_SLACK:
            self._heap = [entry for entry in self._heap if self._valid(entry)]
            heapq.heapify(self._heap)

    def _adopt(self, job: Job) -> None:
        if job._epoch != self._epoch:  # scheduled before a fork or a stop(): start afresh
            job._epoch, job._due, job._running = self._epoch, None, False

    def _push(self, job: Job, at: float) -> None:
        job._due = at
        job._seq = next(self._count)
        self._live.add(job)
        heapq.heappush(self._heap, (at, job._seq, job))
        self._compact()
        self._cond.notify()

    @staticmethod
    def _valid(entry: tuple[float, int, Job]) -> bool:
        return entry[1] == entry[2]._seq and entry[2]._due is not None

    def scheduled(self) -> int:
        """How many entries the heap holds, stale ones included (for tests and debugging)."""
        with self._cond:
            return len(self._heap)

    @property
    def thread(self) -> threading.Thread | None:
        """The running thread, None before the first job, after an idle exit and in a forked child."""
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """Forget every job and end the thread (for tests); the next job starts a new one.

        A job running at the call finishes first (up to ``timeout`` seconds).
        """
        with self._cond:
            thread = self._thread
            self._stopping = True
            self._epoch += 1
            self._heap = []
            self._live = set()
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._cond:
            if self._thread is thread:
                self._thread = None
            self._stopping = False
            if self._heap:  # scheduled while it stopped
                self._ensure_thread()

    # -- the thread ------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def _next(self) -> Job | None:
        """The next job, once due (marked running); None to end the thread."""
        me = threading.current_thread()
        with self._cond:
            while True:
                if self._stopping or self._thread is not me:
                    return None
                while self._heap and not self._valid(self._heap[0]):
                    heapq.heappop(self._heap)
                if not self._heap:
                    if not self._cond.wait(IDLE_EXIT) and not self._heap and not self._stopping:
                        self._thread = None  # idle: end (started again on demand)
                        return None
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay <= 0:
                    job = heapq.heappop(self._heap)[2]
                    job._due = None
                    job._running = True
                    self._live.discard(job)
                    return job
                self._cond.wait(delay)

    def _run(self) -> None:
        while (job := self._next()) is not None:
            again = self._run_job(job)
            with self._cond:
                job._running = False
                if job._cancelled or again is None or self._stopping or job._epoch != self._epoch:
                    continue
                at = time.monotonic() + again
                if job._due is None or at < job._due:  # not scheduled sooner meanwhile
                    self._push(job, at)

    def _run_job(self, job: Job) -> float | None:
        """Run ``job``; the seconds until its next run (None: not before it is scheduled)."""
        started = time.monotonic()
        try:
            again = job.run()
        except Exception:  # never let the thread die: the other jobs depend on it
            if job.name not in self._failing:
                self._failing.add(job.name)
                logger.exception(
                    "django-semaphore: the background job %r failed (retried every %ss)", job.name, job.retry
                )
            return job.retry
        if job.name in self._failing:
            self._failing.discard(job.name)
            logger.warning("django-semaphore: the background job %r runs again", job.name)
        elapsed = time.monotonic() - started
        if elapsed > SLOW_AFTER:
            if job.name not in self._slow:
                self._slow.add(job.name)
                logger.warning(
                    "django-semaphore: the background job %r took %.1fs: the jobs due meanwhile waited",
                    job.name,
                    elapsed,
                )
        else:
            self._slow.discard(job.name)
        return again


_instances: weakref.WeakSet[Scheduler] = weakref.WeakSet()


@forks.in_child
def _reset_every_scheduler() -> None:
    for instance in list(_instances):
        instance._reset()


_scheduler = Scheduler()


def scheduler() -> Scheduler:
    """This process's :class:`Scheduler` (thread ``django-semaphore-scheduler``)."""
    return _scheduler
