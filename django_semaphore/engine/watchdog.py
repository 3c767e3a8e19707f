"""The lease watchdog: renew leases while a guarded view (or its stream) runs.

Sync leases are renewed by **one daemon thread per process** (started on first
use), which sleeps until the next lease is due — about TIMEOUT/3 after its last
renewal — and renews it.  Async views get an asyncio task per request instead
(:class:`AsyncWatch`), so the event loop never waits on a thread.

A lease handed to another process (``Lease.handoff()``) is dropped from the
schedule at its next due time, without a renewal: its adopter renews it.

A renewal that finds the slot lost is logged; ``Lease.refresh()`` has already
sent ``lease_lost``.  The watchdog never re-acquires a lost slot.  A renewal
that fails because Redis is unreachable is logged and retried sooner, until the
lease would have expired anyway.

After ``fork()`` the child starts with an empty watchdog and no thread: it
never renews (nor releases) the leases of its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from ..exceptions import SemaphoreBackendError

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
COMPACT_SLACK = 64  # stopped watches tolerated in the schedule beyond as many as are live


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

    __slots__ = ("lease", "due", "lock", "active")

    def __init__(self, lease: Renewable, due: float) -> None:
        self.lease = lease
        self.due = due
        self.lock = threading.Lock()  # held while the lease is being renewed
        self.active = True

    def stop(self) -> None:
        """Stop renewing; waits for a renewal in flight, so a release cannot cross it."""
        with self.lock:
            self.active = False
        _watchdog.forget(self)


class Watchdog:
    """The per-process renewal thread and its schedule (a heap of due times)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Watch]] = []
        self._count = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._watches: set[Watch] = set()

    def watch(self, lease: Renewable) -> Watch:
        """Start renewing ``lease``; returns the :class:`Watch` to stop."""
        watch = Watch(lease, time.monotonic() + interval(lease))
        with self._cond:
            self._watches.add(watch)
            heapq.heappush(self._heap, (watch.due, next(self._count), watch))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="django-semaphore-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return watch

    def forget(self, watch: Watch) -> None:
        """Drop a stopped ``watch`` from the schedule."""
        with self._cond:
            self._watches.discard(watch)
            # A stopped watch stays in the heap until it comes due (removing it
            # from the middle of a heap costs O(n)); behind a lease that is due
            # sooner, stopped short watches would pile up for TIMEOUT/3.  Rebuild
            # the heap once they are the majority: amortised O(1) per stop, and
            # the heap never holds more than twice the live watches (+ slack).
            if len(self._heap) > 2 * len(self._watches) + COMPACT_SLACK:
                self._heap = [entry for entry in self._heap if entry[2] in self._watches]
                heapq.heapify(self._heap)

    def scheduled(self) -> int:
        """How many entries the schedule holds, stopped ones included (for tests and debugging)."""
        with self._cond:
            return len(self._heap)

    def count(self) -> int:
        """How many leases this process is renewing now (for tests and debugging)."""
        with self._cond:
            return len(self._watches)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _next_due(self) -> Watch | None:
        """Pop the next due watch, sleeping until it is due; None to exit."""
        with self._cond:
            while True:
                while self._heap and self._heap[0][2] not in self._watches:
                    heapq.heappop(self._heap)
                if not self._heap:
                    # Idle: linger a little, then let the thread end (it restarts on demand).
                    if not self._cond.wait(timeout=30.0) and not self._heap:
                        self._thread = None
                        return None
                    continue
                due = self._heap[0][0]
                delay = due - time.monotonic()
                if delay <= 0:
                    return heapq.heappop(self._heap)[2]
                self._cond.wait(timeout=delay)

    def _run(self) -> None:
        while True:
            watch = self._next_due()
            if watch is None:
                return
            self._renew(watch)

    def _renew(self, watch: Watch) -> None:
        lease = watch.lease
        again = None
        with watch.lock:
            # A handed-off lease is refreshed by the process that adopted it.
            if watch.active and not lease.released and not lease.handed_off:
                again = self._refresh(lease)
        with self._cond:
            if again is not None and watch.active and watch in self._watches:
                watch.due = again
                heapq.heappush(self._heap, (again, next(self._count), watch))
            else:
                self._watches.discard(watch)

    @staticmethod
    def _refresh(lease: Renewable) -> float | None:
        """Renew ``lease``; the monotonic time of its next renewal, or None to drop it."""
        try:
            if lease.refresh():
                return time.monotonic() + interval(lease)
            if lease.lost:
                _log_lost(lease)
        except SemaphoreBackendError as exc:
            _log_failed(lease, exc)
            if time.time() * 1000 < lease.expires_ms:
                return time.monotonic() + min(RETRY_AFTER_ERROR, interval(lease))
        except Exception:  # never let the thread die: other leases depend on it
            logger.exception("Unexpected error renewing the lease on semaphore %r", lease.name)
            return time.monotonic() + interval(lease)
        return None

    def _after_fork_in_child(self) -> None:
        # The parent's leases belong to the parent: forget them, and the thread
        # (which did not survive the fork) with them.
        self._reset()


_watchdog = Watchdog()
os.register_at_fork(after_in_child=_watchdog._after_fork_in_child)


def watchdog() -> Watchdog:
    """The process's :class:`Watchdog`."""
    return _watchdog


def watch(lease: Renewable) -> Watch:
    """Renew a sync-world ``lease`` from the watchdog thread until stopped."""
    return _watchdog.watch(lease)


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
