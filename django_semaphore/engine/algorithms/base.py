"""What every algorithm offers the engine: the :class:`Algorithm` Protocol and its outcomes.

The engine (:mod:`~django_semaphore.engine.semaphore`, :mod:`~django_semaphore.engine.semaphore`,
:mod:`~django_semaphore.engine.waiting`, :mod:`~django_semaphore.engine.recovery`,
:mod:`~django_semaphore.engine.inspection`) depends on this Protocol only, never on
one algorithm's class.  Every algorithm is written as generators of Redis
requests (see :mod:`django_semaphore.backend.scripting`) over the same keys
(:class:`~django_semaphore.backend.keys.PartitionKeys`) with the same meaning.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ...backend.keys import PartitionKeys
from ...backend.scripting import Operation


# Outcomes: slotted, not frozen (built once per acquire; see scripting.Script).
@dataclass(slots=True)
class Granted:
    """A slot was granted: its fencing token, and when (ms) it was granted and ends."""

    token: int
    acquired_ms: int
    expires_ms: int
    #: A dry run admitted this caller although enforcing would have refused it.
    over_limit: bool = False
    #: The slot numbers granted, one per permit (SLOTS True; empty otherwise).
    slots: tuple[int, ...] = ()
    #: How many permits were granted.
    permits: int = 1
    #: The caller's queue ticket number (server microseconds when it queued),
    #: when it waited in the queue for this grant; "" when granted at once.
    ticket: str = ""
    #: TOTAL, a dry run: enforcing would have refused this caller with reason
    #: "total" (its partition had room, the name had none).
    over_total: bool = False
    #: The waiters a pushed grant named as likely to be served by this holder's
    #: release ("lua"): the release names their wake-up lists, so that the
    #: grant of the one it serves is pushed by the release script itself.
    successors: tuple[str, ...] = ()
    #: "lua": granted at once while nobody waited and no hold time was wanted
    #: (see :meth:`Lua.release <.lua.Lua.release>`), of at most 8 permits and
    #: no slot numbers: its release is plain commands, not the release script
    #: (with TOTAL, total_quiet_release.lua: see :mod:`.total`).
    quiet: bool = False
    #: "lua", granted by the common case: no permit was left free after it.
    full: bool = False


@dataclass(slots=True)
class Refused:
    """A refusal. ``retry_after_ms`` is what callers are told (Retry-After): for
    "lua", an estimate from recent hold times and the queue ahead, never later
    than the earliest expiry; for the other variants, the earliest expiry."""

    retry_after_ms: float
    #: Waiters ahead of this caller in the queue ("lua"; 0 for the variants).
    ahead: int = 0
    #: A waiter looks again after this long at the latest (a lease expiring or
    #: a woken waiter's claim window ending pushes no wake-up); None: retry_after_ms.
    recheck_ms: float | None = None
    #: The waiter's ticket number, if this acquire queued it ("" otherwise).
    ticket: str = ""
    #: Refused at once because MAX_WAITERS callers already wait ("lua").
    queue_full: bool = False
    #: TOTAL: the partition had room, the name did not (reason "total").
    total: bool = False

    def retry_after(self, timeout: float) -> int:
        """Retry-After in whole seconds for a caller whose TIMEOUT is ``timeout``."""
        return retry_after_seconds(self.retry_after_ms, timeout)


Outcome = Granted | Refused


# Slotted, not frozen, as the outcomes above: one is built per acquire, and a frozen
# dataclass's __init__ (object.__setattr__ per field) costs a tenth of the Python time
# of a whole acquire+release cycle.  Nothing changes one once built.
@dataclass(slots=True)
class AcquireRequest:
    """What one caller asks of :meth:`Algorithm.acquire`: built once per acquire, the
    same for every attempt of a waiting caller (the limit in force and the caller's
    ticket number travel beside it, since they change between attempts)."""

    #: Names the holder (or waiter) in Redis.
    identifier: str
    #: The holder's record: its meta as JSON.
    meta_json: str
    #: The lease asked for (TIMEOUT), in milliseconds.
    timeout_ms: int
    #: Seconds the caller may queue for a slot (0: refused at once).
    wait: float = 0
    #: > 0: a refused caller queues for this long (a waiter; only if the algorithm queues).
    ticket_ms: int = 0
    #: MODE "dry_run": never refuse; a would-be refusal is granted with ``over_limit`` set.
    dry_run: bool = False
    #: How many of the limit the holder counts for ("lua" only).
    permits: int = 1
    #: Higher is served first among the waiters ("lua" only).
    priority: int = 0
    #: MAX_WAITERS: refused at once when that many callers wait ("lua" only).
    max_waiters: int | None = None
    #: SLOTS: give the holder slot numbers ("lua" only).
    slots: bool = False


def retry_after_seconds(retry_ms: float, timeout: float) -> int:
    """Retry-After in whole seconds >= 1 from ``retry_ms`` milliseconds, and at
    most the caller's own TIMEOUT (``timeout`` seconds)."""
    return max(1, min(math.ceil(retry_ms / 1000.0), math.ceil(timeout)))


class Algorithm(Protocol):
    """A semaphore algorithm, as the engine drives it.

    Every method returns an :data:`~django_semaphore.backend.scripting.Operation`: a
    generator of Redis requests that the sync or async driver runs.
    """

    #: The ALGORITHM setting that selects it.
    name: str
    #: True if waiters queue in the partition's FIFO (tickets and wake-up
    #: lists); False: a waiting caller polls, and ``abandon`` does nothing.
    queues: bool
    #: True if it takes ``permits`` > 1, ``priority`` and ``max_waiters`` and
    #: gives slot numbers on request ("lua"); the others take one permit, first
    #: come first served.
    schedules: bool

    def acquire(
        self, keys: PartitionKeys, limit: int, request: AcquireRequest, ticket: str = ""
    ) -> Operation[Outcome]:
        """Take ``request.permits`` slots for ``request.identifier``, or a refusal.

        ``request.ticket_ms`` > 0 queues a refused caller for that long (only if
        :attr:`queues`); ``ticket`` is its ticket number from an earlier refusal.
        ``request.dry_run``: never refuse (MODE "dry_run"); a caller that enforcing
        would have refused is granted with ``over_limit`` set.  ``permits``,
        ``priority``, ``max_waiters`` and ``slots`` (slot numbers for the holder:
        SLOTS) only if :attr:`schedules` (the engine never sends other values to
        the others).
        """
        ...

    def release(
        self,
        keys: PartitionKeys,
        limit: int,
        identifier: str,
        granted: Granted | None = None,
    ) -> Operation[bool]:
        """Give the slot back; True if it was still held.

        ``granted`` (the holder's own grant: None for an operator's
        force-release and the recovery of an unanswered acquire) lets an
        algorithm record the hold time (:attr:`Granted.acquired_ms`), for
        Retry-After estimates, push the grant of the waiter it serves in the
        same script (:attr:`Granted.successors`), and give back a
        :attr:`Granted.quiet` grant with plain commands; the others ignore it.
        """
        ...

    def grant_from(self, payload: Any, permits: int, slots: bool) -> Granted | None:
        """The grant a release pushed to a waiter's wake-up list (direct grant), or
        None when ``payload`` is a bare wake-up (only if :attr:`queues`)."""
        ...

    def refresh(
        self, keys: PartitionKeys, timeout_ms: int, identifier: str, claim_token: int | None = None
    ) -> Operation[float | None]:
        """Extend a live lease by ``timeout_ms``: the new expiry (ms), or None if it was lost.

        ``claim_token``: a waiter's claim (a direct grant it turns into its own
        lease, only if :attr:`queues`): the fencing token its grant gave; None
        as well if the holder's record has another (the grant was an earlier
        one, whose claim ran out), and then nothing changes."""
        ...

    def abandon(self, keys: PartitionKeys, limit: int, identifier: str) -> Operation[None]:
        """A waiter gives up its place in the queue (nothing to do without a queue)."""
        ...

    def clock(self) -> str:
        """The clock this algorithm writes expiries with, for the inspection scripts' ARGV.

        ``""``: the Redis server's (``TIME``); otherwise this client's now in
        milliseconds.  status, holders and purge judge an entry by the clock
        that wrote it.
        """
        ...


def client_ms() -> float:
    """This client's clock in milliseconds, below the millisecond.

    Sub-millisecond, as the seeds' ``time.time()``: whole milliseconds would
    tie acquires made in the same millisecond, and ZRANK orders ties by the
    (random) identifier, letting a newcomer outrank a holder.
    """
    return time.time() * 1000


def as_str(value: Any) -> str:
    """A Redis reply item as text (bytes are decoded)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def as_int(value: Any) -> int:
    """A Redis reply item as an int (bytes are decoded)."""
    return int(value.decode() if isinstance(value, bytes) else value)


def parse_slots(value: Any) -> tuple[int, ...]:
    """Slot numbers from their stored form, ``"3,5"``, where a run of consecutive
    numbers may be given by its ends (``"0-9999,10002"``, for weighted holders); ``""``: none."""
    text = as_str(value) if value is not None else ""
    numbers: list[int] = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit():
            continue
        if dash and high.isdigit():
            numbers.extend(range(int(low), int(high) + 1))
        else:
            numbers.append(int(low))
    return tuple(numbers)


def record(token: int, acquired_ms: int, meta_json: str) -> str:
    """The holds-HASH value of one holder: ``token:acquired_ms:meta json``."""
    return f"{token}:{acquired_ms}:{meta_json}"
