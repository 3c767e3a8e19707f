"""TOTAL: "lua" for a semaphore whose partitions share TOTAL permits between them.

All partitions of such a name keep one set of keys (one hash slot), so that
one script sees the whole name: the acquire admits a caller only when its
partition has room under LIMIT, the name has room under TOTAL and no waiter
it must not overtake waits; a release grants the freed permits to the
waiters directly (``grant_total`` in ``_lib.lua``): higher priority first,
then round robin between the partitions (the one served least recently
first), then first come, first served within a partition; a partition at its
own LIMIT is skipped.  The common acquire and release make as many Redis
calls as "lua"'s: the partition's count travels in the holds HASH with the
rest.

The common case costs what "lua"'s does, but for that count: a partition
whose last acquire here was the common case's, with a permit left free in it
and in the name, acquires next with ``acquire_fast.lua`` (two keys, TOTAL its
fifth argument), and a quiet grant is given back by
``total_quiet_release.lua`` (two keys, two arguments), not by the release
script that serves the queue: a script, not plain commands, because only the
release that removes the holder's entry may lower the partition's count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...backend.keys import PartitionKeys
from ...backend.scripting import LuaScript, Operation, Script
from .base import AcquireRequest, Granted, Outcome, Refused, as_int, as_str, parse_slots
from .lua import ABANDON, MEMBERS_MAX, SERVE, Lua, acquire_call, fast_acquire, wake

ACQUIRE = LuaScript("total_acquire")
RELEASE = LuaScript("total_release")
QUIET_RELEASE = LuaScript("total_quiet_release")

#: Priorities are encoded as MAX_PRIORITY - priority in 17 digits: a higher
#: priority sorts first in the lexical order of the queue.
PRIORITY_OFFSET = 2**53
PRIORITY_DIGITS = 17


def encode_priority(priority: int) -> str:
    """``priority`` (an int between -2**53 and 2**53) as the queue's 17 digits, lower for a
    higher priority."""
    return str(PRIORITY_OFFSET - priority).zfill(PRIORITY_DIGITS)


def decode_priority(text: str) -> int:
    """The priority :func:`encode_priority` gave ``text``."""
    return PRIORITY_OFFSET - int(text)


def partition_of(identifier: str) -> str:
    """The partition (key hash) of a TOTAL holder's or waiter's identifier ("" for another)."""
    part, slash, _ = identifier.partition("/")
    return part if slash else ""


#: :attr:`Lua._fast <.lua.Lua._fast>` of every :class:`TotalLua`, by
#: partition ("<timeouts key>/<part>").
_FAST: dict[str, None] = {}


class TotalLua(Lua):
    """ "lua" with TOTAL: ``total_of()`` gives the TOTAL in force at each call."""

    def __init__(self, total_of: Callable[[], int]) -> None:
        super().__init__()
        self.total_of = total_of
        # algorithm_for() makes one per call: the partitions the common case
        # granted are remembered in one map for them all.
        self._fast = _FAST

    def acquire(
        self, keys: PartitionKeys, limit: int, request: AcquireRequest, ticket: str = ""
    ) -> Operation[Outcome]:
        """As :meth:`Lua.acquire <.lua.Lua.acquire>`, under TOTAL as well
        (``request.identifier`` starts with the partition: ``part/``)."""
        # The partitions of a name share their keys: each one's own entry in _fast.
        partition = f"{keys.main[0]}/{keys.part}"
        if (
            keys.part
            and partition in self._fast
            and not ticket
            and not request.slots
            and request.permits <= MEMBERS_MAX
        ):
            fast = yield from fast_acquire(keys, limit, request, self.total_of())
            if fast is not None:
                if fast.full:
                    self._next_fast(partition, False)
                return fast
        script_keys, args = acquire_call(keys, limit, request, ticket)
        max_waiters = request.max_waiters
        args += (
            request.permits,
            encode_priority(request.priority),
            "" if max_waiters is None else max_waiters,
            "1" if request.slots else "",
            self.total_of(),
        )
        reply = yield Script(ACQUIRE, script_keys, args)
        # Granted by the common case: eight values (a wake-up tail is odd).
        common = reply[0] == 1 and len(reply) == 8
        self._next_fast(partition, common and reply[7] == 0)  # a permit left free
        if reply[0] == 1:
            if not common:
                yield from wake(keys, reply, 6)
            numbers = parse_slots(reply[5]) if request.slots else ()
            granted = Granted(as_int(reply[1]), reply[2], reply[3], reply[4] != 0, numbers, request.permits)
            granted.over_total = reply[4] == 2
            granted.quiet = common and reply[6] == 1
            return granted
        yield from wake(keys, reply, 7)
        return Refused(reply[1], reply[2], reply[3], as_str(reply[4]), reply[5] == 1, reply[6] == 1)

    def release(
        self,
        keys: PartitionKeys,
        limit: int,
        identifier: str,
        granted: Granted | None = None,
    ) -> Operation[bool]:
        """As :meth:`Lua.release <.lua.Lua.release>`: the freed permits go to the
        waiters of every partition, by the fair-share policy.  A ``quiet`` grant
        is given back by :func:`quiet_total_release`."""
        if granted is not None and granted.quiet:
            held: bool = yield from quiet_total_release(keys, limit, self.total_of(), identifier, granted)
            return held
        args = (identifier, limit, "" if granted is None else granted.acquired_ms, self.total_of())
        reply = yield Script(RELEASE, keys.main, args)
        yield from wake(keys, reply, 1)
        return bool(reply[0] == 1)

    def abandon(self, keys: PartitionKeys, limit: int, identifier: str) -> Operation[None]:
        """A waiter gives up its ticket (and passes free permits on, by the policy)."""
        args: tuple[Any, ...] = (identifier, limit, self.total_of())
        reply = yield Script(ABANDON, keys.main + (keys.wake(identifier),), args)
        yield from wake(keys, reply, 1)


def quiet_total_release(
    keys: PartitionKeys, limit: int, total: int, identifier: str, granted: Granted
) -> Operation[bool]:
    """Give back a quiet lease of a name with TOTAL (total_quiet_release.lua):
    True if it was still live.  ``granted``: its grant.  Callers that queued
    while it was held are served by serve.lua, by the fair-share policy (a
    second round trip, only then), which records this hold time too."""
    main = keys.main
    reply = yield Script(QUIET_RELEASE, (main[0], main[2]), (identifier, granted.permits))
    live: bool = reply[0] == 1
    if reply[1] == 1:
        served = yield Script(SERVE, main, (limit, reply[2] - granted.acquired_ms if live else "", total))
        yield from wake(keys, served, 1)
    return live
