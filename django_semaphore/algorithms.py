"""The semaphore algorithms, behind one interface.

Each algorithm offers ``acquire``, ``release`` and ``refresh`` as generators
of Redis requests (see :mod:`django_semaphore.scripting`).  All of them use the
same keys (:class:`~django_semaphore.keys.PartitionKeys`) with the same
meaning, so ``holders()``, ``purge_expired()`` and the admin work whatever
the algorithm:

* ``lua`` (default): one atomic server-side script per operation, server
  clock, fair counter, FIFO waiting queue.
* ``fair_locked``: Redis in Action 6.3.5 — the fair semaphore run under a
  short lock; correct, but several round trips and client clocks.
* ``fair``: Redis in Action 6.3.2 — counter + owner ZSET via pipelines;
  over-admits when two clients interleave their round trips.
* ``basic``: Redis in Action 6.3.1 — one ZSET ranked by client time;
  over-admits under contention and trusts every client's clock.

The seeds score the timeout ZSET by acquire time and purge ``now - timeout``;
here every variant scores it by expiry (``now + timeout``) and purges ``now``,
which ranks the same when all holders share one TIMEOUT and lets the
variants share one layout with the Lua script.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .keys import PartitionKeys
from .scripting import LuaScript, Operation, Pipe, Script, Sleep

ACQUIRE = LuaScript("acquire")
RELEASE = LuaScript("release")
REFRESH = LuaScript("refresh")
ABANDON = LuaScript("abandon")
STATUS = LuaScript("status")
HOLDERS = LuaScript("holders")
PURGE = LuaScript("purge")
UNLOCK = LuaScript("unlock")

LOCK_ACQUIRE_TIMEOUT = 0.01  # seconds, as the seeds' acquire_semaphore_with_lock
LOCK_TIMEOUT_MS = 1000


# Outcomes: slotted, not frozen (built once per acquire; see scripting.Script).
@dataclass(slots=True)
class Granted:
    token: int
    acquired_ms: int
    expires_ms: int


@dataclass(slots=True)
class Refused:
    retry_after_ms: float
    ahead: int = 0


Outcome = Granted | Refused


def _int(value: Any) -> int:
    return int(value.decode() if isinstance(value, bytes) else value)


def record(token: int, acquired_ms: int, meta_json: str) -> str:
    """The holds-HASH value of one holder."""
    return f"{token}:{acquired_ms}:{meta_json}"


class Lua:
    """The default: one atomic script per operation, on the server's clock."""

    name = "lua"
    queues = True

    @staticmethod
    def acquire(
        keys: PartitionKeys, limit: int, timeout_ms: int, identifier: str, meta_json: str, ticket_ms: int = 0
    ) -> Operation[Outcome]:
        reply = yield Script(
            ACQUIRE,
            keys.main,
            (limit, timeout_ms, identifier, meta_json, ticket_ms, keys.wake_prefix),
        )
        if reply[0] == 1:
            return Granted(_int(reply[1]), reply[2], reply[3])
        return Refused(reply[1], reply[2])

    @staticmethod
    def release(keys: PartitionKeys, limit: int, identifier: str) -> Operation[bool]:
        reply: int = yield Script(RELEASE, keys.main, (identifier, limit, keys.wake_prefix))
        return reply == 1

    @staticmethod
    def refresh(keys: PartitionKeys, timeout_ms: int, identifier: str) -> Operation[Any]:
        reply = yield Script(REFRESH, keys.main, (identifier, timeout_ms))
        return reply or None

    @staticmethod
    def abandon(keys: PartitionKeys, limit: int, identifier: str) -> Operation[None]:
        yield Script(ABANDON, keys.main, (identifier, limit, keys.wake_prefix))


def _client_ms() -> float:
    # Sub-millisecond, as the seeds' time.time(): whole milliseconds would tie
    # acquires made in the same millisecond, and ZRANK orders ties by the
    # (random) identifier, letting a newcomer outrank a holder.
    return time.time() * 1000


def _keep_alive(keys: PartitionKeys, ttl_ms: float) -> tuple[tuple[Any, ...], ...]:
    return tuple(("PEXPIRE", k, ttl_ms) for k in (keys.timeouts, keys.owners, keys.holds))


def _retry_ms(first: Any, now: float, timeout_ms: int) -> float:
    """Milliseconds until the earliest lease in a ZRANGE ... WITHSCORES reply ends."""
    if first:
        return max(1, int(float(first[0][1] if isinstance(first[0], (list, tuple)) else first[1])) - now)
    return timeout_ms


class Basic:
    """Redis in Action 6.3.1: rank in a ZSET of client timestamps."""

    name = "basic"
    queues = False

    @staticmethod
    def acquire(
        keys: PartitionKeys, limit: int, timeout_ms: int, identifier: str, meta_json: str, ticket_ms: int = 0
    ) -> Operation[Outcome]:
        now = _client_ms()
        reply = yield Pipe(
            (
                ("ZREMRANGEBYSCORE", keys.timeouts, "-inf", now),
                ("ZADD", keys.timeouts, now + timeout_ms, identifier),
                ("ZRANK", keys.timeouts, identifier),
                ("HSETNX", keys.holds, "#", int(now * 1000)),
                ("HINCRBY", keys.holds, "#", 1),
                ("ZRANGE", keys.timeouts, 0, 0, "WITHSCORES"),
            )
        )
        rank, token = reply[2], reply[4]
        if rank is not None and rank < limit:
            yield Pipe(
                (
                    ("ZADD", keys.owners, token, identifier),
                    ("HSET", keys.holds, identifier, record(token, int(now), meta_json)),
                )
                + _keep_alive(keys, timeout_ms + 1000)
            )
            return Granted(token, int(now), int(now + timeout_ms))
        yield Pipe((("ZREM", keys.timeouts, identifier),) + _keep_alive(keys, timeout_ms + 1000))
        return Refused(_retry_ms(reply[5], now, timeout_ms))

    @staticmethod
    def release(keys: PartitionKeys, limit: int, identifier: str) -> Operation[bool]:
        now = _client_ms()
        reply = yield Pipe(
            (
                ("ZSCORE", keys.timeouts, identifier),
                ("ZREM", keys.timeouts, identifier),
                ("ZREM", keys.owners, identifier),
                ("HDEL", keys.holds, identifier),
            )
        )
        return reply[0] is not None and float(reply[0]) > now

    @staticmethod
    def refresh(keys: PartitionKeys, timeout_ms: int, identifier: str) -> Operation[float | None]:
        # 6.3.3's refresh, with the lost-slot test made explicit: it reads the
        # expiry first instead of re-adding the entry and then removing it.
        now = _client_ms()
        reply = yield Pipe((("ZSCORE", keys.timeouts, identifier),), transaction=False)
        if reply[0] is None or float(reply[0]) <= now:
            yield Pipe(
                (
                    ("ZREM", keys.timeouts, identifier),
                    ("ZREM", keys.owners, identifier),
                    ("HDEL", keys.holds, identifier),
                )
            )
            return None
        expires = now + timeout_ms
        yield Pipe(
            (("ZADD", keys.timeouts, "XX", expires, identifier),) + _keep_alive(keys, timeout_ms + 1000)
        )
        return expires

    abandon: Any = None


class Fair(Basic):
    """Redis in Action 6.3.2: a counter ranks clients in the owner ZSET."""

    name = "fair"

    @staticmethod
    def acquire(
        keys: PartitionKeys, limit: int, timeout_ms: int, identifier: str, meta_json: str, ticket_ms: int = 0
    ) -> Operation[Outcome]:
        now = _client_ms()
        reply = yield Pipe(
            (
                ("ZREMRANGEBYSCORE", keys.timeouts, "-inf", now),
                ("ZINTERSTORE", keys.owners, 2, keys.owners, keys.timeouts, "WEIGHTS", 1, 0),
                ("HSETNX", keys.holds, "#", int(now * 1000)),
                ("HINCRBY", keys.holds, "#", 1),
            )
        )
        token = reply[-1]
        reply = yield Pipe(
            (
                ("ZADD", keys.timeouts, now + timeout_ms, identifier),
                ("ZADD", keys.owners, token, identifier),
                ("ZRANK", keys.owners, identifier),
                ("ZRANGE", keys.timeouts, 0, 0, "WITHSCORES"),
            )
        )
        if reply[2] is not None and reply[2] < limit:
            yield Pipe(
                (("HSET", keys.holds, identifier, record(token, int(now), meta_json)),)
                + _keep_alive(keys, timeout_ms + 1000)
            )
            return Granted(token, int(now), int(now + timeout_ms))
        yield Pipe(
            (("ZREM", keys.timeouts, identifier), ("ZREM", keys.owners, identifier))
            + _keep_alive(keys, timeout_ms + 1000)
        )
        return Refused(_retry_ms(reply[3], now, timeout_ms))


class FairLocked(Fair):
    """Redis in Action 6.3.5: the fair semaphore under a short lock."""

    name = "fair_locked"

    @staticmethod
    def acquire(
        keys: PartitionKeys, limit: int, timeout_ms: int, identifier: str, meta_json: str, ticket_ms: int = 0
    ) -> Operation[Outcome]:
        deadline = time.monotonic() + LOCK_ACQUIRE_TIMEOUT
        while True:
            reply = yield Pipe(
                (("SET", keys.lock, identifier, "NX", "PX", LOCK_TIMEOUT_MS),), transaction=False
            )
            if reply[0]:
                break
            if time.monotonic() >= deadline:
                return Refused(min(timeout_ms, 1000))
            yield Sleep(0.001)
        # No try/finally: a generator must not yield while being closed. If
        # Redis fails in between, the lock expires after LOCK_TIMEOUT_MS.
        outcome = yield from Fair.acquire(keys, limit, timeout_ms, identifier, meta_json)
        yield Script(UNLOCK, (keys.lock,), (identifier,))
        return outcome


ALGORITHMS: dict[str, type[Lua] | type[Basic]] = {a.name: a for a in (Lua, FairLocked, Fair, Basic)}


def status(keys: PartitionKeys) -> Operation[tuple[int, ...]]:
    """Figures of one partition: (now_ms, live, waiting, earliest expiry ms or -1)."""
    reply = yield Script(STATUS, keys.main, ())
    return tuple(reply)


def holders(keys: PartitionKeys) -> Operation[tuple[int, list[tuple[Any, Any, Any]]]]:
    """Raw live holders in token order: (now_ms, [(identifier, expires_ms, record), ...])."""
    reply = yield Script(HOLDERS, keys.main, ())
    rows = [(reply[i], reply[i + 1], reply[i + 2]) for i in range(1, len(reply), 3)]
    return reply[0], rows


def purge(keys: PartitionKeys, dry_run: bool = False) -> Operation[int]:
    """Remove (or with dry_run count) expired entries of one partition."""
    reply: int = yield Script(PURGE, keys.main, ("1" if dry_run else "0",))
    return reply
