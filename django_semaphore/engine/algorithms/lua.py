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
"""

from __future__ import annotations

from typing import Any

from ...backend.keys import PartitionKeys
from ...backend.scripting import LuaScript, Operation, Script
from .base import AcquireRequest, Granted, Outcome, Refused, as_int, as_str, parse_slots

ACQUIRE = LuaScript("acquire")
RELEASE = LuaScript("release")
REFRESH = LuaScript("refresh")
ABANDON = LuaScript("abandon")
WAKE = LuaScript("wake")


class Lua:
    """Fair (a counter ranks holders), a waiting queue served by priority then
    arrival, weighted permits, slot numbers on request, server clock (``TIME``)."""

    name = "lua"
    queues = True
    schedules = True

    def acquire(
        self, keys: PartitionKeys, limit: int, request: AcquireRequest, ticket: str = ""
    ) -> Operation[Outcome]:
        """Take ``request.permits`` slots, or a refusal; ``request.ticket_ms`` > 0
        queues the caller (a waiter) by ``priority`` then arrival, ``ticket`` is its
        ticket number from an earlier refusal, ``max_waiters`` refuses it at once
        instead when that many wait.  ``dry_run`` admits over the limit, with the
        over-limit marker in the same reply (one round trip, as always).
        ``slots``: give the holder slot numbers (SLOTS); without them the slot
        bitmap is never touched."""
        script_keys, args = acquire_call(keys, limit, request, ticket)
        max_waiters = request.max_waiters
        if request.permits != 1 or request.priority != 0 or max_waiters is not None or request.slots:
            # The script's defaults otherwise: fewer arguments to send and parse.
            args += (
                request.permits,
                request.priority,
                "" if max_waiters is None else max_waiters,
                "1" if request.slots else "",
            )
        reply = yield Script(ACQUIRE, script_keys, args)
        if reply[0] == 1:
            numbers = parse_slots(reply[5]) if request.slots else ()
            return Granted(as_int(reply[1]), reply[2], reply[3], reply[4] == 1, numbers, request.permits)
        yield from wake(keys, reply, 6)
        return Refused(reply[1], reply[2], reply[3], as_str(reply[4]), reply[5] == 1)

    def release(
        self,
        keys: PartitionKeys,
        limit: int,
        identifier: str,
        acquired_ms: int | None = None,
        successors: tuple[str, ...] = (),
    ) -> Operation[bool]:
        """Give the slot back; True if it was still held. ``acquired_ms`` (server
        time of the grant) records the hold time, for Retry-After estimates.
        ``successors``: the waiters the grant named as likely next; if this
        release serves one, its grant is pushed by the release script itself
        (one round trip, not two)."""
        lists = tuple(map(keys.wake, successors))
        args = (identifier, limit, "" if acquired_ms is None else acquired_ms, *successors)
        reply = yield Script(RELEASE, keys.main + lists, args)
        yield from wake(keys, reply, 1)
        return bool(reply[0] == 1)

    def grant_from(self, payload: Any, permits: int, slots: bool) -> Granted | None:
        """The grant a release pushed to a waiter (see :func:`parse_grant`)."""
        return parse_grant(payload, permits, slots)

    def refresh(self, keys: PartitionKeys, timeout_ms: int, identifier: str) -> Operation[float | None]:
        """Extend a live lease: the new expiry (ms), or None if the slot was lost."""
        reply = yield Script(REFRESH, keys.main, (identifier, timeout_ms))
        return reply or None

    def abandon(self, keys: PartitionKeys, limit: int, identifier: str) -> Operation[None]:
        """A waiter gives up its ticket (and passes a free slot on)."""
        reply = yield Script(ABANDON, keys.main + (keys.wake(identifier),), (identifier, limit))
        yield from wake(keys, reply, 1)

    def clock(self) -> str:
        """``""``: expiries are written on the server's clock."""
        return ""


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
