"""The default algorithm, "lua": one atomic script per operation, on the server's clock.

Every key a script touches is passed in KEYS.  Permits that come free while
callers wait are granted to the first of them by the script that freed them
(direct grant: a release, an abandon, or an acquire that finds free permits
nobody took), in queue order; the grants are pushed to those waiters' lists
by a second script (``wake.lua``), to which the operation passes their keys:
one more round trip, only when there are waiters.  Except for one: each grant
names the waiters its holder's release is likely to serve (with equal holds,
the one LIMIT places behind it; with LIMIT > 1 the ones next to it too), and
the holder's release passes their lists, so a release that serves one pushes
its grant itself.  A waiter's grant is a
claim lease of half a second, which its first refresh turns into its own.

An acquire pays only for the common case when that is all it needs: where
this process's last acquire of the partition was granted by the common case
(room, nobody waiting) with a permit left free, it runs ``acquire_fast.lua``
(:func:`fast_acquire`), the common case alone with the two keys and four
arguments it uses, which writes nothing and says so when anything is unusual;
``acquire.lua`` then decides, in a second round trip.

A release pays for a script only when it has something to decide: a lease
the common case granted while nobody waited and no hold time was wanted
(:attr:`~.base.Granted.quiet`), without slot numbers, is given back with plain
commands in one round trip (:func:`quiet_release`), which cost Redis a
fraction of a script's calls.  (A holder of n permits, n up to 8, is n
members of the timeouts ZSET: its entry, and ``id#2`` ... ``id#n`` of score
+inf that leave with it, so its release is plain commands too; a larger
weight is counted in the holds HASH, whose count only a script may lower,
and the acquire never calls its grant quiet.)
"""

from __future__ import annotations

from typing import Any

from ...backend.keys import PartitionKeys
from ...backend.scripting import LuaScript, Operation, Pipe, Script
from .base import AcquireRequest, Granted, Outcome, Refused, as_int, as_str, parse_slots

ACQUIRE = LuaScript("acquire")
FAST_ACQUIRE = LuaScript("acquire_fast")
RELEASE = LuaScript("release")
REFRESH = LuaScript("refresh")
ABANDON = LuaScript("abandon")
WAKE = LuaScript("wake")
SERVE = LuaScript("serve")


class Lua:
    """Fair (a counter ranks holders), a waiting queue served by priority then
    arrival, weighted permits, slot numbers on request, server clock (``TIME``)."""

    name = "lua"
    queues = True
    schedules = True

    def __init__(self) -> None:
        # The partitions (by timeouts key) whose last acquire here was granted
        # by the common case and left a permit free: the next one tries
        # acquire_fast.lua first.  Any other outcome takes a partition off, so
        # that its acquires go straight to acquire.lua, not through a round
        # trip that would only say the common case does not hold (callers
        # wait, the permits are taken); a partition seen for the first time
        # goes there too (its HASH may be gone: acquire_fast.lua would say
        # so).  Bounded: forgotten all at once.
        self._fast: dict[str, None] = {}

    def acquire(
        self, keys: PartitionKeys, limit: int, request: AcquireRequest, ticket: str = ""
    ) -> Operation[Outcome]:
        """Take ``request.permits`` slots, or a refusal; ``request.ticket_ms`` > 0
        queues the caller (a waiter) by ``priority`` then arrival, ``ticket`` is its
        ticket number from an earlier refusal, ``max_waiters`` refuses it at once
        instead when that many wait.  ``dry_run`` admits over the limit, with the
        over-limit marker in the same reply (no round trip of its own).
        ``slots``: give the holder slot numbers (SLOTS); without them the slot
        bitmap is never touched.  A partition in :attr:`_fast` tries
        :func:`fast_acquire` first, and runs acquire.lua only if that says the
        common case does not hold."""
        timeouts = keys.main[0]
        fast = self._fast
        if timeouts in fast and not ticket and not request.slots and request.permits <= MEMBERS_MAX:
            granted = yield from fast_acquire(keys, limit, request)
            if granted is not None:
                if granted.full:
                    fast.pop(timeouts, None)
                return granted
        script_keys, args = acquire_call(keys, limit, request, ticket)
        max_waiters = request.max_waiters
        # Up to the last one that differs from the script's default: each
        # argument costs Redis a string to make and Lua one to read.
        options = (
            request.permits,
            request.priority,
            "" if max_waiters is None else max_waiters,
            "1" if request.slots else "",
        )
        used = len(options)
        while used and options[used - 1] == _DEFAULTS[used - 1]:
            used -= 1
        reply = yield Script(ACQUIRE, script_keys, args + options[:used])
        # Granted by the common case: eight values (a wake-up tail is odd).
        common = reply[0] == 1 and len(reply) == 8
        self._next_fast(timeouts, common and reply[7] == 0)  # a permit is left free
        if reply[0] == 1:
            if not common:
                # Waiters ahead whose permits were free too, granted first.
                yield from wake(keys, reply, 6)
            numbers = parse_slots(reply[5]) if request.slots else ()
            granted = Granted(as_int(reply[1]), reply[2], reply[3], reply[4] == 1, numbers, request.permits)
            granted.quiet = common and reply[6] == 1
            return granted
        yield from wake(keys, reply, 6)
        return Refused(reply[1], reply[2], reply[3], as_str(reply[4]), reply[5] == 1)

    def _next_fast(self, partition: str, fast: bool) -> None:
        """Whether the next acquire of ``partition`` (a key of :attr:`_fast`)
        tries the common case's script first."""
        if not fast:
            self._fast.pop(partition, None)
            return
        if len(self._fast) >= FAST_MAX:
            self._fast.clear()
        self._fast[partition] = None

    def release(
        self,
        keys: PartitionKeys,
        limit: int,
        identifier: str,
        granted: Granted | None = None,
    ) -> Operation[bool]:
        """Give the slot back; True if it was still held.  ``granted``: the holder's
        grant.  Its ``acquired_ms`` (server time) records the hold time, for
        Retry-After estimates.  Its ``successors``: the waiters it named as likely
        next; if this release serves one, its grant is pushed by the release
        script itself (one round trip, not two).  A ``quiet`` grant is given back
        with plain commands (:func:`quiet_release`)."""
        if granted is not None and granted.quiet:
            held: bool = yield from quiet_release(keys, limit, identifier, granted)
            return held
        successors = granted.successors if granted is not None else ()
        acquired: Any = granted.acquired_ms if granted is not None else ""
        lists = tuple(map(keys.wake, successors))
        args = (identifier, limit, acquired, *successors)
        reply = yield Script(RELEASE, keys.main + lists, args)
        yield from wake(keys, reply, 1)
        return bool(reply[0] == 1)

    def grant_from(self, payload: Any, permits: int, slots: bool) -> Granted | None:
        """The grant a release pushed to a waiter (see :func:`parse_grant`)."""
        return parse_grant(payload, permits, slots)

    def refresh(
        self, keys: PartitionKeys, timeout_ms: int, identifier: str, claim_token: int | None = None
    ) -> Operation[float | None]:
        """Extend a live lease: the new expiry (ms), or None if the slot was lost
        (or, for a claim, the grant is not the lease's: see :meth:`Algorithm.refresh`)."""
        args: tuple[Any, ...] = (identifier, timeout_ms)
        if claim_token is not None:
            args += (claim_token,)
        reply = yield Script(REFRESH, keys.main, args)
        return reply or None

    def abandon(self, keys: PartitionKeys, limit: int, identifier: str) -> Operation[None]:
        """A waiter gives up its ticket (and passes a free slot on)."""
        reply = yield Script(ABANDON, keys.main + (keys.wake(identifier),), (identifier, limit))
        yield from wake(keys, reply, 1)

    def clock(self) -> str:
        """``""``: expiries are written on the server's clock."""
        return ""


#: A holder of up to this many permits keeps them as timeouts members (as
#: _lib.lua's MEMBERS_MAX): the most acquire_fast.lua grants.
MEMBERS_MAX = 8
#: The most partitions :attr:`Lua._fast` remembers.
FAST_MAX = 1024

#: The values acquire.lua takes for its last four arguments when they are left out.
_DEFAULTS: tuple[object, ...] = (1, 0, "", "")


def acquire_call(
    keys: PartitionKeys, limit: int, request: AcquireRequest, ticket: str
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The KEYS and the first ARGV (up to the dry-run flag) that acquire.lua and
    total_acquire.lua both take: a waiter's call adds its wake-up list."""
    ticket_ms = request.ticket_ms
    script_keys = keys.main + (keys.wake(request.identifier),) if ticket_ms else keys.main
    args = (
        limit,
        request.timeout_ms,
        request.identifier,
        request.meta_json,
        ticket_ms,
        ticket,
        "1" if request.dry_run else "",
    )
    return script_keys, args


def fast_acquire(
    keys: PartitionKeys, limit: int, request: AcquireRequest, total: int | None = None
) -> Operation[Granted | None]:
    """The common case's grant (acquire_fast.lua), or None when it does not hold:
    the caller then runs acquire.lua.  For a request of at most
    :data:`MEMBERS_MAX` permits, without slot numbers or a ticket.  ``total``:
    the TOTAL in force, for a partition of a name with TOTAL (``limit`` is the
    partition's; the caller runs total_acquire.lua when it says no)."""
    main = keys.main
    # (A weighted request's permits travel as the record's tag, before the meta.)
    tail = request.meta_json if request.permits == 1 else f"m{request.permits}{request.meta_json}"
    args: tuple[Any, ...] = (limit, request.timeout_ms, request.identifier, tail)
    if total is not None:
        args += (total,)
    reply = yield Script(FAST_ACQUIRE, (main[0], main[2]), args)
    if not reply:
        return None
    token, acquired, quiet, full = as_str(reply).split(":")
    acquired_ms = int(acquired)
    granted = Granted(int(token), acquired_ms, acquired_ms + request.timeout_ms, False, (), request.permits)
    granted.quiet = quiet == "1"
    granted.full = full == "1"
    return granted


def quiet_release(keys: PartitionKeys, limit: int, identifier: str, granted: Granted) -> Operation[bool]:
    """Give back a quiet lease's permits (no slot numbers) with plain commands
    in one round trip: True if it was still live.  ``granted``: its grant.

    What a release script would decide, this decides from the replies, in an
    order that keeps the script's guarantees without its atomicity:

    * the server's ``TIME`` and the lease's expiry (``ZSCORE``), read before
      it is removed, say whether it was still live, on the server's clock;
    * the entry goes (``ZREM``, with the members of a weighted holder's other
      permits) before its record (``HDEL``): the permits are free from the
      ``ZREM`` on (acquires count the members), and a record
      left a moment without its entry is neither counted nor listed (the
      admin's holder list starts from the entries);
    * the waiters flag is read after the entry went: a waiter that queued
      before that had set it, so a release that finds it unset leaves nobody
      waiting for this permit (a later caller finds the permit free), and
      one that finds it set serves the queue with :data:`SERVE` (the
      release script's second half), which also records this hold time.

    Every command only reads or deletes, so none creates a key without a TTL.
    A process that dies between the two round trips leaves the permit free
    with waiters queued: they take it when they look again, at the latest
    when this lease would have expired (as if it had died holding it).
    """
    timeouts, holds = keys.timeouts, keys.holds
    permits = granted.permits
    members = [identifier]
    if permits > 1:
        members += [f"{identifier}#{k}" for k in range(2, permits + 1)]
    reply = yield Pipe(
        (
            ("TIME",),
            ("ZSCORE", timeouts, identifier),
            ("ZREM", timeouts, *members),
            ("HDEL", holds, identifier),
            ("HGET", holds, "w"),
        ),
        transaction=False,
        unparsed=True,
    )
    # int() and float() take the replies as bytes, str or numbers alike; a
    # missing score is None (or False, from a cluster's script).
    clock, expiry = reply[0], reply[1]
    now = int(clock[0]) * 1000 + int(clock[1]) // 1000
    live = bool(reply[2] and expiry and float(expiry) > now)
    if reply[4]:  # callers queued while it was held
        served = yield Script(SERVE, keys.main, (limit, now - granted.acquired_ms if live else ""))
        yield from wake(keys, served, 1)
    return live


def wake(keys: PartitionKeys, reply: Any, start: int) -> Operation[None]:
    """Push the grants a script made to waiters (direct grant): ``reply[start]``
    is the TTL of the wake-up lists, then each waiter's identifier and grant."""
    if len(reply) > start + 1:
        granted = reply[start + 1 :]
        lists = tuple(keys.wake(as_str(identifier)) for identifier in granted[0::2])
        yield Script(WAKE, lists, (reply[start], *granted[1::2]))


def parse_grant(payload: Any, permits: int, slots: bool) -> Granted | None:
    """The grant a release pushed to a waiter's wake-up list
    (``token:acquired_ms:expires_ms:slots:successor``; TOTAL's have no
    successor), or None for anything else."""
    parts = as_str(payload).split(":", 4)
    if len(parts) < 4 or not parts[0].isdigit():
        return None
    numbers = parse_slots(parts[3]) if slots else ()
    granted = Granted(int(parts[0]), int(parts[1]), int(parts[2]), False, numbers, permits)
    if len(parts) == 5 and parts[4]:
        granted.successors = tuple(parts[4].split(","))
    return granted
