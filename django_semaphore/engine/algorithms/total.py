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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...backend.keys import PartitionKeys
from ...backend.scripting import LuaScript, Operation, Script
from .base import AcquireRequest, Granted, Outcome, Refused, as_int, as_str, parse_slots
from .lua import ABANDON, Lua, acquire_call, wake

ACQUIRE = LuaScript("total_acquire")
RELEASE = LuaScript("total_release")

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


class TotalLua(Lua):
    """ "lua" with TOTAL: ``total_of()`` gives the TOTAL in force at each call."""

    def __init__(self, total_of: Callable[[], int]) -> None:
        super().__init__()
        self.total_of = total_of

    def acquire(
        self, keys: PartitionKeys, limit: int, request: AcquireRequest, ticket: str = ""
    ) -> Operation[Outcome]:
        """As :meth:`Lua.acquire <.lua.Lua.acquire>`, under TOTAL as well
        (``request.identifier`` starts with the partition: ``part/``)."""
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
        if reply[0] == 1:
            yield from wake(keys, reply, 6)
            numbers = parse_slots(reply[5]) if request.slots else ()
            granted = Granted(as_int(reply[1]), reply[2], reply[3], reply[4] != 0, numbers, request.permits)
            granted.over_total = reply[4] == 2
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
        waiters of every partition, by the fair-share policy."""
        args = (identifier, limit, "" if granted is None else granted.acquired_ms, self.total_of())
        reply = yield Script(RELEASE, keys.main, args)
        yield from wake(keys, reply, 1)
        return bool(reply[0] == 1)

    def abandon(self, keys: PartitionKeys, limit: int, identifier: str) -> Operation[None]:
        """A waiter gives up its ticket (and passes free permits on, by the policy)."""
        args: tuple[Any, ...] = (identifier, limit, self.total_of())
        reply = yield Script(ABANDON, keys.main + (keys.wake(identifier),), args)
        yield from wake(keys, reply, 1)
