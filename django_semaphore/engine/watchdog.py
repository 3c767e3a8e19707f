"""The lease watchdog: renew leases while a guarded view (or its stream) runs.

Sync leases are renewed by **one daemon thread per process**
(``django-semaphore-watchdog``, started on first use), a
:class:`~django_semaphore.runtime.scheduler.Scheduler` of its own on which
each lease is a job due about TIMEOUT/3 after its last renewal.  Not the
process's scheduler: a renewal that comes late loses the slot, so it never
waits behind the control poll or a recovery retry stalled on a dead connection.
Async views get an asyncio task per request instead (:class:`AsyncWatch`), so
the event loop never waits on a thread.

A lease handed to another process (``Lease.handoff()``) is dropped from the
schedule at its next due time, without a renewal: its adopter renews it.

A renewal that finds the slot lost is logged; ``Lease.refresh()`` has already
sent ``lease_lost``.  The watchdog never re-acquires a lost slot.  A renewal
that fails because Redis is unreachable is logged and retried sooner, until the
lease would have expired anyway.

A give-back that a garbage-collection finalizer asks for (the response of a
guarded view dropped unclosed, :mod:`django_semaphore.web.streaming`) is made
by the **releaser**, a second daemon thread (``django-semaphore-releaser``):
the finalizer only puts it on a :class:`queue.SimpleQueue` (:func:`release_later`),
whose ``put`` is safe wherever the collector runs (amid a Redis call holding a
lock, on an event loop), and the releaser, blocked on the queue's ``get``,
wakes at once and makes it.  Not on the watchdog thread: waking its
scheduler takes a lock, and a release stalled on a dead connection must not
make a renewal late.

After ``fork()`` the child starts with an empty watchdog and no thread
(:mod:`~django_semaphore.backend.forks`): it never renews (nor releases) the
leases of its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from ..backend import forks
from ..exceptions import SemaphoreBackendError
from ..runtime.scheduler import Scheduler

if TYPE_CHECKING:
    from ..config.validation import SemaphoreConfig

logger = logging.getLogger("django_semaphore")


class Renewable(Protocol):
    """What the watchdog renews: a :class:`~django_semaphore.Lease` (a Protocol, so that
    this module, below the Lease's, needs nothing of it but these)."""

    @property
    def name(self) -> str: ...
    @property
    def token(self) -> int: ...
    @property
    def config(self) -> SemaphoreConfig: ...
    @property
    def expires_ms(self) -> int: ...
    @property
    def released(self) -> bool: ...
    @property
    def lost(self) -> bool: ...
    @property
    def handed_off(self) -> bool: ...
    def refresh(self) -> bool: ...
    async def arefresh(self) -> bool: ...


RETRY_AFTER_ERROR = 0.5  # seconds before a renewal that failed on Redis is retried
THREAD_NAME = "django-semaphore-watchdog"
RELEASER_NAME = "django-semaphore-releaser"


def interval(lease: Renewable) -> float:
    """Seconds between two renewals of ``lease``: a third of its TIMEOUT."""
    return max(0.05, lease.config.timeout / 3.0)


def _log_lost(lease: Renewable) -> None:
    logger.warning(
        "Lease on semaphore %r (token %s) was lost before the view finished; it is not re-acquired.",
        lease.name,
        lease.token,
    )


def _log_failed(lease: Renewable, exc: BaseException) -> None:
    logger.warning("Could not renew the lease on semaphore %r (token %s): %s", lease.name, lease.token, exc)


class Watch:
    """One lease under the sync watchdog; :meth:`stop` before releasing it."""

    __slots__ = ("lease", "lock", "active", "job")

    def __init__(self, lease: Renewable) -> None:
        self.lease = lease
        self.lock = threading.Lock()  # held while the lease is being renewed
        self.active = True
        self.job = _watchdog.scheduler.job("renew", self._renew, retry=RETRY_AFTER_ERROR)

    def stop(self) -> None:
        """Stop renewing; waits for a renewal in flight, so a release cannot cross it."""
        with self.lock:
            self.active = False
        _watchdog.forget(self)

    def _renew(self) -> float | None:
        """One renewal (a job of the watchdog's scheduler): seconds until the next, None to drop it."""
        lease = self.lease
        again = None
        with self.lock:
            # A handed-off lease is refreshed by the process that adopted it.
            if self.active and not lease.released and not lease.handed_off:
                again = _refresh(lease)
        if again is None:
            _watchdog.forget(self)
        return again


def _refresh(lease: Renewable) -> float | None:
    """Renew ``lease``; the seconds until its next renewal, or None to drop it."""
    try:
        if lease.refresh():
            return interval(lease)
        if lease.lost:
            _log_lost(lease)
    except SemaphoreBackendError as exc:
        _log_failed(lease, exc)
        if time.time() * 1000 < lease.expires_ms:
            return min(RETRY_AFTER_ERROR, interval(lease))
    except Exception:  # never drop a lease on a bug: other leases go on being renewed
        logger.exception("Unexpected error renewing the lease on semaphore %r", lease.name)
        return interval(lease)
    return None


class Watchdog:
    """The leases this process renews, each a job of the watchdog's own scheduler."""

    def __init__(self) -> None:
        # Its own scheduler, not the process's: a renewal never waits behind a
        # control poll or a recovery retry stalled on a dead connection.
        self.scheduler = Scheduler(THREAD_NAME)
        self._reset()
        forks.in_child(self._reset)  # the parent's leases belong to the parent

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._watches: set[Watch] = set()

    def watch(self, lease: Renewable) -> Watch:
        """Start renewing ``lease``; returns the :class:`Watch` to stop."""
        watch = Watch(lease)
        with self._lock:
            self._watches.add(watch)
        watch.job.schedule(interval(lease))
        return watch

    def forget(self, watch: Watch) -> None:
        """Drop a stopped ``watch`` from the schedule."""
        watch.job.cancel()
        with self._lock:
            self._watches.discard(watch)

    def scheduled(self) -> int:
        """How many entries the schedule holds, stopped ones included (for tests and debugging)."""
        return self.scheduler.scheduled()

    def count(self) -> int:
        """How many leases this process is renewing now (for tests and debugging)."""
        with self._lock:
            return len(self._watches)

    @property
    def thread(self) -> threading.Thread | None:
        return self.scheduler.thread


_watchdog = Watchdog()


def watchdog() -> Watchdog:
    """The process's :class:`Watchdog`."""
    return _watchdog


def watch(lease: Renewable) -> Watch:
    """Renew a sync-world ``lease`` from the watchdog thread until stopped."""
    return _watchdog.watch(lease)


class Releaser:
    """The thread making the give-backs that finalizers queue (:func:`release_later`)."""

    def __init__(self) -> None:
        self._reset()
        forks.in_child(self._reset)  # the parent's thread is not in the child

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread unless it runs: before anything may be queued, from ordinary
        code (starting a thread takes locks, which a finalizer must not)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run, args=(self._queue,), name=RELEASER_NAME, daemon=True
                )
                thread.start()
                self._thread = thread

    def later(self, give_back: Callable[[], object]) -> None:
        """Queue ``give_back`` for the thread: nothing but ``SimpleQueue.put``, so a
        garbage-collection finalizer may call it."""
        self._queue.put(give_back)

    @staticmethod
    def _run(pending: queue.SimpleQueue[Callable[[], object]]) -> None:
        while True:
            give_back = pending.get()
            try:
                give_back()
            except Exception:  # the next one still gets its turn; the slot expires after TIMEOUT
                logger.exception("Could not give back the slots of a response dropped unclosed")
            del give_back  # a queued guard is not kept alive until the next one comes

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread


_releaser = Releaser()


def releaser() -> Releaser:
    """The process's :class:`Releaser`."""
    return _releaser


def release_later(give_back: Callable[[], object]) -> None:
    """Have the releaser thread call ``give_back`` (safe in a finalizer; see :class:`Releaser`).

    Call :meth:`Releaser.start` (``releaser().start()``) before a finalizer may
    call this."""
    _releaser.later(give_back)


@contextlib.contextmanager
def watching(lease: Renewable) -> Iterator[Watch]:
    """Renew ``lease`` from the watchdog thread for the ``with`` block."""
    handle = watch(lease)
    try:
        yield handle
    finally:
        handle.stop()


@contextlib.asynccontextmanager
async def awatching(*leases: Renewable) -> AsyncIterator[AsyncWatch]:
    """Renew ``leases`` from an asyncio task for the ``async with`` block."""
    handle = AsyncWatch(leases)
    try:
        yield handle
    finally:
        await handle.astop()


class AsyncWatch:
    """An asyncio task renewing the leases of one async request.

    :meth:`astop` (on the loop) or :meth:`stop` (from any thread, e.g. the
    thread in which Django closes the response) ends it; neither lets a
    release cross a renewal in flight, except :meth:`stop` called on the loop
    thread itself, which cannot wait.
    """

    def __init__(self, leases: Iterable[Renewable]) -> None:
        self.leases = list(leases)
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._stopped = False
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._run(), name="django-semaphore-refresh")

    async def _run(self) -> None:
        pending = {lease: time.monotonic() + interval(lease) for lease in self.leases}
        while pending:
            delay = max(0.0, min(pending.values()) - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
                return  # stopped
            except TimeoutError:
                pass
            now = time.monotonic()
            for lease in [lease for lease, due in pending.items() if lease.handed_off]:
                del pending[lease]  # refreshed by the process that adopted it
            for lease in [lease for lease, due in pending.items() if due <= now]:
                with self._lock:
                    if self._stopped:
                        return
                    self._idle.clear()
                try:
                    if await lease.arefresh():
                        pending[lease] = time.monotonic() + interval(lease)
                    else:
                        if lease.lost:
                            _log_lost(lease)
                        del pending[lease]
                except SemaphoreBackendError as exc:
                    _log_failed(lease, exc)
                    if time.time() * 1000 < lease.expires_ms:
                        pending[lease] = time.monotonic() + min(RETRY_AFTER_ERROR, interval(lease))
                    else:
                        del pending[lease]
                finally:
                    self._idle.set()

    def abandon(self) -> None:
        """Stop renewing without locks or waiting (safe from a garbage-collection finalizer)."""
        self._stopped = True
        try:
            self._loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:
            pass

    def _signal(self) -> None:
        with self._lock:
            self._stopped = True
        try:
            self._loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:  # the loop is closed: the task is gone with it
            pass

    def stop(self, timeout: float = 5.0) -> None:
        """Stop renewing, from any thread; waits for a renewal in flight when it can."""
        self._signal()
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if not on_loop:
            self._idle.wait(timeout)

    async def astop(self) -> None:
        """Stop renewing and wait for the task to end (call on the task's loop)."""
        self._signal()
        if not self._task.done():
            await asyncio.wait([self._task])
