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
variants share one layout with the Lua script.  (With two TIMEOUTs in use,
during a rolling deploy that changes it, "basic" ranks a newcomer whose lease
ends first ahead of a longer holder and admits it; the seed, purging
``now - timeout``, would evict the longer holder instead.  "fair" and
"fair_locked" rank by the counter and are not affected.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .keys import RANKS, PartitionKeys
from .scripting import LuaScript, Operation, Pipe, Script, Sleep

ACQUIRE = LuaScript("acquire")
RELEASE = LuaScript("release")
REFRESH = LuaScript("refresh")
ABANDON = LuaScript("abandon")
STATUS = LuaScript("status")
HOLDERS = LuaScript("holders")
PURGE = LuaScript("purge")
UNLOCK = LuaScript("unlock")
WAKE = LuaScript("wake")

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
    """A refusal. ``retry_after_ms`` is what callers are told (Retry-After): for
    "lua", an estimate from recent hold times and the queue ahead, never later
    than the earliest expiry; for the other variants, the earliest expiry."""

    retry_after_ms: float
    ahead: int = 0
    #: A waiter looks again after this long at the latest (a lease expiring or
    #: a woken waiter's claim window ending pushes no wake-up); None: retry_after_ms.
    recheck_ms: float | None = None
    #: The waiter's ticket number, if this acquire queued it ("" otherwise).
    ticket: str = ""


Outcome = Granted | Refused


def _int(value: Any) -> int:
    return int(value.decode() if isinstance(value, bytes) else value)


def record(token: int, acquired_ms: int, meta_json: str) -> str:
    """The holds-HASH value of one holder."""
    return f"{token}:{acquired_ms}:{meta_json}"


class Lua:
    """The default: one atomic script per operation, on the server's clock.

    Every key a script touches is passed in KEYS. The wake-ups a script
    decides on (the waiters a free slot goes to) are pushed to those waiters'
    lists by a second script (``wake.lua``), to which the operation passes
    their keys: one more round trip, only when there are waiters to wake.
    """

    name = "lua"
    queues = True

    @staticmethod
    def acquire(
        keys: PartitionKeys,
        limit: int,
        timeout_ms: int,
        identifier: str,
        meta_json: str,
        ticket_ms: int = 0,
        ticket: str = "",
    ) -> Operation[Outcome]:
        """Take a slot, or a refusal; ``ticket_ms`` > 0 queues the caller (a
        waiter), ``ticket`` is its ticket number from an earlier refusal."""
        script_keys = keys.main + (keys.wake(identifier),) if ticket_ms else keys.main
        reply = yield Script(
            ACQUIRE, script_keys, (limit, timeout_ms, identifier, meta_json, ticket_ms, ticket)
        )
        if reply[0] == 1:
            return Granted(_int(reply[1]), reply[2], reply[3])
        yield from _wake(keys, reply, 5)
        return Refused(reply[1], reply[2], reply[3], _str(reply[4]))

    @staticmethod
    def release(
        keys: PartitionKeys, limit: int, identifier: str, acquired_ms: int | None = None
    ) -> Operation[bool]:
        """Give the slot back; True if it was still held. ``acquired_ms`` (server
        time of the grant) records the hold time, for Retry-After estimates."""
        reply = yield Script(
            RELEASE, keys.main, (identifier, limit, "" if acquired_ms is None else acquired_ms)
        )
        yield from _wake(keys, reply, 1)
        return bool(reply[0] == 1)

    @staticmethod
    def refresh(keys: PartitionKeys, timeout_ms: int, identifier: str) -> Operation[Any]:
        """Extend a live lease: the new expiry (ms), or None if the slot was lost."""
        reply = yield Script(REFRESH, keys.main, (identifier, timeout_ms))
        return reply or None

    @staticmethod
    def abandon(keys: PartitionKeys, limit: int, identifier: str) -> Operation[None]:
        """A waiter gives up its ticket (and passes a free slot on)."""
        reply = yield Script(ABANDON, keys.main + (keys.wake(identifier),), (identifier, limit))
        yield from _wake(keys, reply, 1)


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _wake(keys: PartitionKeys, reply: Any, start: int) -> Operation[None]:
    """Push the wake-ups a script asked for: ``reply[start]`` is the TTL of the
    wake-up lists, the identifiers follow."""
    if len(reply) > start + 1:
        lists = tuple(keys.wake(_str(identifier)) for identifier in reply[start + 1 :])
        yield Script(WAKE, lists, (reply[start],))


def _client_ms() -> float:
    # Sub-millisecond, as the seeds' time.time(): whole milliseconds would tie
    # acquires made in the same millisecond, and ZRANK orders ties by the
    # (random) identifier, letting a newcomer outrank a holder.
    return time.time() * 1000


#: Most expired identifiers one seed operation reads back to remove their
#: owner entries and records; more are left to purge (sema_cleanup).
EXPIRED_BATCH = 1000


def _keep_alive(ttl_ms: int, *names: str) -> tuple[tuple[Any, ...], ...]:
    """Give each key a TTL of at least ``ttl_ms``, never a shorter one than it has.

    ``PEXPIRE NX`` sets a TTL on a key that has none (just created), then
    ``PEXPIRE GT`` only lengthens one: processes may disagree on TIMEOUT (a
    rolling deploy that changes it), and an unconditional PEXPIRE from a
    short-TIMEOUT process would shorten the TTL a longer holder's entries
    rely on, so that the keys vanished with the holder in them.  Always sent
    in the same MULTI as the write that may create the key: no interruption
    between two round trips leaves a key without a TTL.
    """
    commands: list[tuple[Any, ...]] = []
    for name in names:
        commands.append(("PEXPIRE", name, ttl_ms, "NX"))
        commands.append(("PEXPIRE", name, ttl_ms, "GT"))
    return tuple(commands)


def _expired(keys: PartitionKeys, now: float) -> tuple[tuple[Any, ...], ...]:
    """Read back, then remove, the timeout entries that ended at or before ``now``."""
    return (
        ("ZRANGEBYSCORE", keys.timeouts, "-inf", now, "LIMIT", 0, EXPIRED_BATCH),
        ("ZREMRANGEBYSCORE", keys.timeouts, "-inf", now),
    )


def _forget_ids(keys: PartitionKeys, identifiers: Any) -> tuple[tuple[Any, ...], ...]:
    """Remove the owner entries and records of ``identifiers`` (entries gone from the timeout ZSET)."""
    if not identifiers:
        return ()
    return (("ZREM", keys.owners, *identifiers), ("HDEL", keys.holds, *identifiers))


def _retry_ms(first: Any, now: float, timeout_ms: int) -> float:
    """Milliseconds until the earliest lease in a ZRANGE ... WITHSCORES reply ends."""
    if first:
        return max(1, int(float(first[0][1] if isinstance(first[0], (list, tuple)) else first[1])) - now)
    return timeout_ms


class Basic:
    """Redis in Action 6.3.1: rank in a ZSET of client timestamps.

    Expiries are written and judged on the client's clock, as in the seed.
    Every write that may create a key sets its TTL in the same MULTI, and
    only ever lengthens a TTL (see :func:`_keep_alive`).
    """

    name = "basic"
    queues = False
    client_clock = True

    @staticmethod
    def acquire(
        keys: PartitionKeys, limit: int, timeout_ms: int, identifier: str, meta_json: str, ticket_ms: int = 0
    ) -> Operation[Outcome]:
        now = _client_ms()
        ttl = timeout_ms + 1000
        reply = yield Pipe(
            _expired(keys, now)
            + (
                ("ZADD", keys.timeouts, now + timeout_ms, identifier),
                ("ZRANK", keys.timeouts, identifier),
                ("HSETNX", keys.holds, "#", int(now * 1000)),
                ("HINCRBY", keys.holds, "#", 1),
                ("ZRANGE", keys.timeouts, 0, 0, "WITHSCORES"),
            )
            + _keep_alive(ttl, keys.timeouts, keys.holds)
        )
        expired, rank, token = reply[0], reply[3], reply[5]
        if rank is not None and rank < limit:
            yield Pipe(
                _forget_ids(keys, expired)
                + (
                    ("ZADD", keys.owners, token, identifier),
                    ("HSET", keys.holds, identifier, record(token, int(now), meta_json)),
                )
                + _keep_alive(ttl, keys.owners, keys.holds)
            )
            return Granted(token, int(now), int(now + timeout_ms))
        yield Pipe((("ZREM", keys.timeouts, identifier),) + _forget_ids(keys, expired))
        return Refused(_retry_ms(reply[6], now, timeout_ms))

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
        """Extend the lease, or report it lost: the check and the write are one MULTI.

        Expired entries (the caller's own included) are removed first, so
        ``ZADD XX`` extends the entry only if it was still live, and the
        ZSCORE after it says which happened: a refresh never reports success
        for a slot lost before it, and never revives an expired entry.  A
        second round trip removes what expired from the owner ZSET and the
        records (cleaning only: the answer is already decided).
        """
        now = _client_ms()
        expires = now + timeout_ms
        reply = yield Pipe(
            _expired(keys, now)
            + (
                ("ZADD", keys.timeouts, "XX", expires, identifier),
                ("ZSCORE", keys.timeouts, identifier),
            )
            + _keep_alive(timeout_ms + 1000, keys.timeouts, keys.owners, keys.holds)
        )
        held = reply[3] is not None
        gone = list(reply[0]) if held else [*reply[0], identifier]
        if gone:
            yield Pipe(_forget_ids(keys, gone))
        return expires if held else None

    abandon: Any = None


class Fair(Basic):
    """Redis in Action 6.3.2: a counter ranks clients in the owner ZSET.

    The seed prunes the owner ZSET with ``ZINTERSTORE owners owners
    timeouts``, which re-creates the key without a TTL (and would drop a
    longer holder's TTL to this process's); here the intersection goes to a
    scratch ZSET, ranked in and deleted within the same MULTI, and expired
    identifiers are removed from the owner ZSET one by one.
    """

    name = "fair"

    @staticmethod
    def acquire(
        keys: PartitionKeys, limit: int, timeout_ms: int, identifier: str, meta_json: str, ticket_ms: int = 0
    ) -> Operation[Outcome]:
        now = _client_ms()
        ttl = timeout_ms + 1000
        reply = yield Pipe(
            _expired(keys, now)
            + (
                ("HSETNX", keys.holds, "#", int(now * 1000)),
                ("HINCRBY", keys.holds, "#", 1),
            )
            + _keep_alive(ttl, keys.holds)
        )
        expired, token = reply[0], reply[3]
        forget = _forget_ids(keys, expired)
        ranks = keys.base + RANKS
        reply = yield Pipe(
            forget
            + (
                ("ZADD", keys.timeouts, now + timeout_ms, identifier),
                ("ZADD", keys.owners, token, identifier),
                ("ZINTERSTORE", ranks, 2, keys.owners, keys.timeouts, "WEIGHTS", 1, 0),
                ("ZRANK", ranks, identifier),
                ("DEL", ranks),
                ("ZRANGE", keys.timeouts, 0, 0, "WITHSCORES"),
            )
            + _keep_alive(ttl, keys.timeouts, keys.owners)
        )
        rank, first = reply[len(forget) + 3], reply[len(forget) + 5]
        if rank is not None and rank < limit:
            yield Pipe(
                (("HSET", keys.holds, identifier, record(token, int(now), meta_json)),)
                + _keep_alive(ttl, keys.holds)
            )
            return Granted(token, int(now), int(now + timeout_ms))
        yield Pipe((("ZREM", keys.timeouts, identifier), ("ZREM", keys.owners, identifier)))
        return Refused(_retry_ms(first, now, timeout_ms))


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


# -- inspection: status, holders, purge ---------------------------------------------------
#
# One clock: an entry is judged by the clock that wrote it.  "lua" writes
# expiries on the server's clock, so its scripts read TIME; the seed variants
# write them on the client's clock, so the client's now is passed in (the
# scripts' optional ARGV).  For a semaphore whose algorithm is unknown (no
# longer in SEMAPHORES), purge takes the earlier of the two clocks: an entry is
# removed only once it has ended on both, so whoever wrote it, no live holder is
# evicted as long as the clocks of the app servers agree with each other.


def _clock(algorithm: str | None) -> tuple[str, str]:
    """(client now, "1" to take the earlier of it and the server's) for the scripts' ARGV.

    ``("", "")``: the server's clock ("lua", the default); ``(ms, "")``: the
    client's (a seed variant); ``(ms, "1")``: an unknown algorithm.
    """
    known = ALGORITHMS.get(algorithm) if algorithm is not None else None
    if known is not None and not getattr(known, "client_clock", False):
        return "", ""
    return f"{_client_ms():.3f}", "" if known is not None else "1"


def status(keys: PartitionKeys, algorithm: str = "lua") -> Operation[tuple[int, ...]]:
    """Figures of one partition: (now_ms, live, waiting, earliest expiry ms or -1).

    Holders are counted on the clock ``algorithm`` writes expiries with
    (``now_ms`` is that clock's); waiters always on the server's.
    """
    now, _ = _clock(algorithm)
    reply = yield Script(STATUS, keys.main, (now,))
    return tuple(reply)


def holders(keys: PartitionKeys, algorithm: str = "lua") -> Operation[tuple[int, list[tuple[Any, Any, Any]]]]:
    """Raw live holders in token order: (now_ms, [(identifier, expires_ms, record), ...]).

    Live on the clock ``algorithm`` writes expiries with.
    """
    now, _ = _clock(algorithm)
    reply = yield Script(HOLDERS, keys.main, (now,))
    rows = [(reply[i], reply[i + 1], reply[i + 2]) for i in range(1, len(reply), 3)]
    return reply[0], rows


def purge(keys: PartitionKeys, dry_run: bool = False, algorithm: str | None = "lua") -> Operation[int]:
    """Remove (or with dry_run count) expired entries of one partition.

    Expired on the clock ``algorithm`` writes expiries with; ``None`` (the
    algorithm is not known: a semaphore no longer configured) takes the
    earlier of the client's and the server's clock.
    """
    now, earlier = _clock(algorithm)
    reply: int = yield Script(PURGE, keys.main, ("1" if dry_run else "0", now, earlier))
    return reply
