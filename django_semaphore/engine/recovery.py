"""Recovery of Redis requests whose answer was lost.

When Redis fails a call (a :class:`~django_semaphore.SemaphoreBackendError`:
timeout, refused or dropped connection), the request may or may not have run,
and may still run later: a hung Redis executes the commands it had buffered
once it resumes.  Two kinds of work are remembered here and finished later:

* an **unanswered acquire** (:func:`remember_acquire`): its script may have
  granted a slot (or queued a ticket) that nobody would give back before
  TIMEOUT.  It is undone (released, ticket dropped): see :func:`forget`.
* a **failed release** (:func:`remember_release`): the slot would stay taken
  until TIMEOUT.  It is sent again.

The ``recovery`` job of the process's background scheduler
(:mod:`~django_semaphore.runtime.scheduler`, thread
``django-semaphore-scheduler``; scheduled when work is remembered) retries
the remembered work until Redis answers, waiting ``BACKOFF_MIN`` seconds
after a failure, doubling up to ``BACKOFF_MAX`` while Redis keeps failing:
the slots come back within a couple of seconds of Redis answering again, from
the process that took them, without any call by the application.  It takes
the entries one at a time, releases first, for at most ``SLICE`` seconds a
turn (then it runs again at once, after the scheduler's other jobs due
meanwhile).  Below, "the thread" is that job.

An acquire that reaches Redis wakes the thread at once (:func:`kick`).  If it
was refused, it first finishes a little of its own partition's work inline
(:func:`give_back_partition`: at most ``INLINE_MAX`` entries, stopping at the
first that frees a slot, and a wait of at most ``IN_FLIGHT_WAIT`` for the
thread's answer on an entry of that partition), and tries once more if a slot
of its partition was given back meanwhile.  Its latency stays bounded; the
rest of the backlog is the thread's.

A release that went unanswered may have run after all (Redis ran the buffered
command), so the retry may find the slot gone: the owner is told "not held"
(``on_answer(False)``), which the engine does not report as a lost lease.

Memory is bounded: at most ``MAX`` entries of each kind, the oldest dropped.
A failed release is moot once its slot has expired (TIMEOUT + 1 s after the
failure) and is then dropped.  An unanswered acquire is kept until Redis
answers, however late: a buffered acquire runs when Redis resumes, and the
lease it grants lasts TIMEOUT from then.  Best effort: a buffered acquire that
Redis runs after it was undone is not seen.

After ``fork()`` the child starts empty, without the thread
(:mod:`~django_semaphore.backend.forks`): the parent's thread finishes the
parent's work, and the child never releases its parent's
slots.  A change of SEMAPHORE_REDIS, CACHES or SEMAPHORE_KEY_PREFIX forgets
everything remembered (it concerned another server or key space).

Of the engine it imports only the algorithms (:mod:`.semaphore`, whose leases it
settles, imports it): what it needs of a lease arrives as arguments.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..backend import connection, forks
from ..backend.keys import PartitionKeys
from ..backend.scripting import Client, Flow, Operation, WaitFor, adrive, arun, drive, run
from ..exceptions import SemaphoreBackendError
from ..runtime import control
from ..runtime.scheduler import Scheduler, scheduler
from .algorithms import algorithm_for

if TYPE_CHECKING:
    from ..config.validation import SemaphoreConfig

logger = logging.getLogger("django_semaphore")

MAX = 1000  # entries of each kind (acquires, releases); beyond, the oldest is dropped
INLINE_MAX = 10  # remembered entries of its partition a refused acquire finishes itself
IN_FLIGHT_WAIT = 0.5  # seconds it waits for the thread's answer on an entry of its partition
BACKOFF_MIN = 0.2  # seconds from a failure to the first retry
BACKOFF_MAX = 2.0  # the longest pause between two retries while Redis keeps failing
MOOT_AFTER = 1.0  # a failed release is dropped TIMEOUT + this many seconds after it failed
SLICE = 0.2  # seconds of work a turn of the job does before the scheduler's other jobs due

THREAD_NAME = scheduler().thread_name  # the thread the retries run on


def forget(config: SemaphoreConfig, keys: PartitionKeys, identifier: str) -> Operation[bool]:
    """Undo an acquire whose answer was lost: release a slot it may hold, drop
    its ticket; True if it held a slot."""
    algorithm = algorithm_for(config)
    limit = control.cached(config).limit  # the limit in force decides whom to wake
    held = yield from algorithm.release(keys, limit, identifier)
    yield from algorithm.abandon(keys, limit, identifier)  # a no-op without a queue
    return held


class Entry:
    """One piece of remembered work: undo an acquire, or send a release again."""

    __slots__ = ("config", "keys", "identifier", "moot_at", "on_answer")

    def __init__(
        self,
        config: SemaphoreConfig,
        keys: PartitionKeys,
        identifier: str,
        moot_at: float | None = None,
        on_answer: Callable[[bool], object] | None = None,
    ) -> None:
        self.config = config
        self.keys = keys
        self.identifier = identifier
        self.moot_at = moot_at  # monotonic time after which the work is pointless (releases)
        self.on_answer = on_answer  # called with Redis's answer (releases)

    @property
    def is_release(self) -> bool:
        return self.on_answer is not None

    def operation(self) -> Operation[bool]:
        """The Redis operation that finishes this work; True if a slot was held."""
        if self.is_release:
            limit = control.cached(self.config).limit
            return algorithm_for(self.config).release(self.keys, limit, self.identifier)
        return forget(self.config, self.keys, self.identifier)


class Recovery:
    """The remembered work of this process and the scheduler job that finishes it
    (without a ``scheduler``: the tables alone, for tests)."""

    def __init__(self, scheduler: Scheduler | None = None) -> None:
        self._scheduler = scheduler
        self._job = None if scheduler is None else scheduler.job("recovery", self._turn)
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._acquires: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self._releases: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self._in_flight: Entry | None = None  # the entry the thread is working on
        self._backoff = BACKOFF_MIN
        self._generation = 0  # bumped by clear(): work taken before it is not put back
        # Slots given back, numbered, and the number of the last one per
        # partition: a refused acquire learns whether the thread freed a slot
        # of its partition while it was being refused (bounded like the tables).
        self._freed_count = 0
        self._freed: collections.OrderedDict[str, int] = collections.OrderedDict()

    # -- remembering -------------------------------------------------------------

    def __bool__(self) -> bool:
        # Read without the lock: a hint, checked by every acquire.
        return bool(self._acquires or self._releases or self._in_flight)

    def remember_acquire(self, config: SemaphoreConfig, keys: PartitionKeys, identifier: str) -> None:
        """Remember an acquire that failed on a backend error: undo it once Redis answers."""
        self._add(Entry(config, keys, identifier))

    def remember_release(
        self,
        config: SemaphoreConfig,
        keys: PartitionKeys,
        identifier: str,
        on_answer: Callable[[bool], object],
    ) -> None:
        """Remember a release that failed on a backend error: send it again until
        Redis answers (then call ``on_answer(held)``) or the slot has expired
        (then ``on_answer(False)``)."""
        moot_at = time.monotonic() + config.timeout + MOOT_AFTER
        self._add(Entry(config, keys, identifier, moot_at, on_answer))

    def _table(self, entry: Entry) -> collections.OrderedDict[str, Entry]:
        return self._releases if entry.is_release else self._acquires

    def _add(self, entry: Entry) -> None:
        with self._cond:
            first = not self
            table = self._table(entry)
            table[entry.identifier] = entry
            while len(table) > MAX:
                table.popitem(last=False)
            self._cond.notify_all()
        if self._job is not None and (first or not self._job.active):
            self._job.schedule(BACKOFF_MIN, sooner=True)  # Redis just failed: not at once

    def drop_release(self, identifier: str) -> None:
        """Forget a remembered release (the caller got it answered itself)."""
        with self._cond:
            self._releases.pop(identifier, None)

    def kick(self) -> None:
        """Redis answers again: retry now, not after the backoff."""
        with self._cond:
            self._backoff = BACKOFF_MIN
            work = bool(self._acquires or self._releases)
        if work and self._job is not None:
            self._job.schedule(0.0, sooner=True)

    def pending(self) -> int:
        """How many entries wait, in flight included (for tests and debugging)."""
        with self._cond:
            return len(self._acquires) + len(self._releases) + (self._in_flight is not None)

    def idle(self) -> bool:
        """True when nothing waits and no retry is running (for tests)."""
        with self._cond:
            return not self

    def clear(self) -> None:
        """Forget everything remembered (the server or key prefix changed)."""
        with self._cond:
            self._acquires.clear()
            self._releases.clear()
            self._generation += 1

    @property
    def thread(self) -> threading.Thread | None:
        """The scheduler's thread the retries run on (None before it starts, and in a forked child)."""
        return None if self._scheduler is None else self._scheduler.thread

    def put_back(self, entries: list[Entry], generation: int, ahead: bool = True) -> None:
        """Return work that could not be done (unless cleared since), ahead of
        the rest or, with ``ahead=False``, behind it."""
        with self._cond:
            if entries and generation == self._generation:
                for entry in reversed(entries) if ahead else entries:
                    table = self._table(entry)
                    table[entry.identifier] = entry
                    table.move_to_end(entry.identifier, last=not ahead)
                for table in (self._acquires, self._releases):
                    while len(table) > MAX:
                        table.popitem(last=False)
            self._cond.notify_all()

    def _finished(self, entry: Entry, held: bool) -> None:
        """Redis answered ``entry`` (or it became moot): count a freed slot, tell its owner."""
        with self._cond:
            if held:
                self._freed_count += 1
                self._freed[entry.keys.base] = self._freed_count
                self._freed.move_to_end(entry.keys.base)
                while len(self._freed) > MAX:
                    self._freed.popitem(last=False)
        if entry.on_answer is not None:
            try:
                entry.on_answer(held)
            except Exception:  # a signal receiver failed: recovery goes on
                logger.exception("Error while completing a release on semaphore keys %s", entry.keys.base)

    # -- inline, by an acquire that reached Redis and was refused ---------------------

    def freed_mark(self) -> int:
        """A mark to pass to :meth:`freed_since` (read without the lock)."""
        return self._freed_count

    def claim_partition(self, keys: PartitionKeys, limit: int = INLINE_MAX) -> tuple[list[Entry], int]:
        """Take out the oldest ``limit`` entries of partition ``keys``, releases
        first (with the generation, for :meth:`put_back`)."""
        base = keys.base
        found: list[Entry] = []
        with self._cond:
            for table in (self._releases, self._acquires):
                for entry in table.values():
                    if len(found) >= limit:
                        break
                    if entry.keys.base == base:
                        found.append(entry)
                for entry in found:
                    table.pop(entry.identifier, None)
            return found, self._generation

    def busy_with(self, keys: PartitionKeys) -> bool:
        """True while the thread works on an entry of partition ``keys``."""
        entry = self._in_flight
        return entry is not None and entry.keys.base == keys.base

    def freed_since(self, keys: PartitionKeys, mark: int, wait: float = 0.0) -> bool:
        """True if a slot of partition ``keys`` was given back after ``mark``,
        first waiting up to ``wait`` seconds for the thread's answer on an
        entry of that partition that it is working on."""
        deadline = time.monotonic() + wait
        with self._cond:
            while self.busy_with(keys):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._freed.get(keys.base, 0) > mark

    # -- the thread: the scheduler's recovery job ----------------------------------------

    def _next(self, generation: int) -> Entry | None:
        """Take out the oldest entry (releases first); None when nothing is left
        or the tables were cleared since ``generation``.

        One at a time, not the whole backlog: an acquire can still claim the
        entries of its own partition while the thread works through the rest.
        """
        with self._cond:
            self._in_flight = None
            self._cond.notify_all()  # an acquire may wait for the entry just finished
            table = self._releases or self._acquires
            if not table or generation != self._generation:
                return None
            self._in_flight = table.popitem(last=False)[1]
            return self._in_flight

    def _turn(self) -> float | None:
        """One turn of the recovery job: work for up to SLICE seconds; the seconds
        until the next turn (None when nothing is left)."""
        if not (self._acquires or self._releases):
            return None
        failed = True
        try:
            failed = self._work(time.monotonic() + SLICE)
        except Exception:  # the job owns every process-wide retry: log, and back off
            logger.exception("Unexpected error while retrying Redis requests left unanswered")
        with self._cond:
            self._in_flight = None
            self._cond.notify_all()
            if failed:
                delay, self._backoff = self._backoff, min(self._backoff * 2, BACKOFF_MAX)
                return delay
            self._backoff = BACKOFF_MIN
            return 0.0 if self._acquires or self._releases else None

    def _work(self, until: float) -> bool:
        """Work through the tables until they are empty or it is ``until`` (False),
        or Redis fails (True).

        Ends early (False) when the tables are cleared: the next round takes
        the client of the new settings.
        """
        with self._cond:
            generation = self._generation
        client = connection.get_client()
        done = {"releases": 0, "acquires": 0, "slots": 0}
        try:
            while time.monotonic() < until and (entry := self._next(generation)) is not None:
                if entry.moot_at is not None and time.monotonic() > entry.moot_at:
                    self._finished(entry, False)  # the slot has expired by now
                    continue
                try:
                    held = run(client, entry.operation())
                except SemaphoreBackendError as exc:
                    # Behind the rest: on a cluster with one node down, the
                    # next round starts with other entries, not this one.
                    self.put_back([entry], generation, ahead=False)
                    logger.debug("Redis still fails (%s); %d requests to retry", exc, self.pending())
                    return True
                except Exception:  # not Redis failing: retrying would fail the same way
                    logger.exception("Could not retry a request on keys %s; dropped", entry.keys.base)
                    continue
                done["releases" if entry.is_release else "acquires"] += 1
                done["slots"] += held
                self._finished(entry, held)
        finally:
            if done["releases"] or done["acquires"]:
                logger.info(
                    "Redis answers again: %(releases)d failed releases sent, "
                    "%(acquires)d unanswered acquires undone, %(slots)d slots given back.",
                    done,
                )
        return False


_recovery = Recovery(scheduler())
# The parent's work belongs to the parent (its thread goes on there); the lock
# may have been held at the fork.
forks.in_child(_recovery._reset)


@receiver(setting_changed)
def _forget_other_servers(*, setting: str, **kwargs: Any) -> None:
    # Entries about another server or key prefix are of no use any more.
    if setting in ("SEMAPHORE_REDIS", "CACHES", "SEMAPHORE_KEY_PREFIX"):
        _recovery.clear()


def recovery() -> Recovery:
    """The process's :class:`Recovery`."""
    return _recovery


def pending() -> bool:
    """True if some work waits or is in flight (cheap: every acquire asks)."""
    return bool(_recovery)


def freed_mark() -> int:
    """Take before an acquire; pass to :func:`give_back_partition` (cheap)."""
    return _recovery.freed_mark()


def remember_acquire(config: SemaphoreConfig, keys: PartitionKeys, identifier: str) -> None:
    """An acquire failed on a backend error: undo whatever it did once Redis answers."""
    _recovery.remember_acquire(config, keys, identifier)


def remember_release(
    config: SemaphoreConfig, keys: PartitionKeys, identifier: str, on_answer: Callable[[bool], object]
) -> None:
    """A release failed on a backend error: send it again in the background."""
    _recovery.remember_release(config, keys, identifier, on_answer)


def drop_release(identifier: str) -> None:
    """The caller's own retry of a release was answered: no background retry."""
    _recovery.drop_release(identifier)


def kick() -> None:
    """Redis answered a call: retry the remembered work now."""
    _recovery.kick()


def giving_back(keys: PartitionKeys, mark: int) -> Flow[bool]:
    """For an acquire of partition ``keys`` that reached Redis and was refused:
    True if a slot of that partition has been given back since ``mark`` (see
    :func:`freed_mark`), so that trying once more is worth it.  A flow
    (:data:`~django_semaphore.backend.scripting.Flow`): :func:`give_back_partition`
    and :func:`agive_back_partition` carry it out, and the acquire's own flow
    runs it inline.

    Inline, it finishes this process's remembered work on that partition (the
    oldest, at most INLINE_MAX entries, stopping at the first that frees a
    slot), and waits up to IN_FLIGHT_WAIT for the thread's answer on an entry
    of it that the thread is working on: it is woken by that answer, sync
    (blocking on the thread's condition) and async alike (the async driver waits
    for the condition in a worker thread, never blocking the event loop).  The
    rest of the backlog is the thread's.
    """
    entries, generation = _recovery.claim_partition(keys)
    for index, entry in enumerate(entries):
        if entry.moot_at is not None and time.monotonic() > entry.moot_at:
            _recovery._finished(entry, False)
            continue
        try:
            held = yield entry.operation()
        except BaseException as exc:  # cancelled too: the thread does the rest
            _recovery.put_back(entries[index:], generation)
            if isinstance(exc, SemaphoreBackendError):
                return False
            raise
        _recovery._finished(entry, held)
        if held:
            _recovery.put_back(entries[index + 1 :], generation)
            return True
    yield WaitFor(_recovery._cond, lambda: not _recovery.busy_with(keys), IN_FLIGHT_WAIT)
    return _recovery.freed_since(keys, mark)


def give_back_partition(client: Client, keys: PartitionKeys, mark: int) -> bool:
    """:func:`giving_back`, on the sync ``client``."""
    return drive(client, giving_back(keys, mark))


async def agive_back_partition(client: Client, keys: PartitionKeys, mark: int) -> bool:
    """:func:`giving_back`, on the asyncio ``client`` (it never blocks the loop)."""
    return await adrive(client, giving_back(keys, mark))


def forget_now(client: Client, config: SemaphoreConfig, keys: PartitionKeys, identifier: str) -> None:
    """Undo an interrupted acquire now; if that fails too, the thread does it."""
    try:
        run(client, forget(config, keys, identifier))
    except Exception:
        remember_acquire(config, keys, identifier)
    except BaseException:
        remember_acquire(config, keys, identifier)
        raise


async def aforget_now(client: Client, config: SemaphoreConfig, keys: PartitionKeys, identifier: str) -> None:
    """The asyncio twin of :func:`forget_now`."""
    try:
        await arun(client, forget(config, keys, identifier))
    except Exception:
        remember_acquire(config, keys, identifier)
    except BaseException:  # cancelled again
        remember_acquire(config, keys, identifier)
        raise
