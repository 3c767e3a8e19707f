"""The Redis in Action variants: "basic" (6.3.1), "fair" (6.3.2), "fair_locked" (6.3.5).

* ``fair_locked``: the fair semaphore run under a short lock; correct, but
  several round trips and client clocks.
* ``fair``: counter + owner ZSET via pipelines; over-admits when two clients
  interleave their round trips.
* ``basic``: one ZSET ranked by client time; over-admits under contention and
  trusts every client's clock.

None of them queues: a waiting caller polls (:mod:`~django_semaphore.engine.waiting`),
and ``abandon`` does nothing.  They write expiries on the client's clock, so
the inspection scripts judge their entries by it (:meth:`Basic.clock`).

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
from typing import Any

from ...backend.keys import RANKS, PartitionKeys
from ...backend.scripting import LuaScript, Operation, Pipe, Script, Sleep, lengthen
from .base import AcquireRequest, Granted, Outcome, Refused, client_ms, record

UNLOCK = LuaScript("unlock")

LOCK_ACQUIRE_TIMEOUT = 0.01  # seconds, as the seeds' acquire_semaphore_with_lock
LOCK_TIMEOUT_MS = 1000

#: The limit a dry run acquires with once refused: no partition has this many holders.
UNBOUNDED = 2**31 - 1
DRY_RUN_ATTEMPTS = 3

#: Most expired identifiers one seed operation reads back to remove their
#: owner entries and records; more are left to purge (sema_cleanup).
EXPIRED_BATCH = 1000


def _keep_alive(ttl_ms: int, *names: str) -> tuple[tuple[Any, ...], ...]:
    """Give each key a TTL of at least ``ttl_ms``, never a shorter one than it has.

    A key that has none (just created) gets one, and a TTL is only ever
    lengthened: processes may disagree on TIMEOUT (a rolling deploy that
    changes it), and an unconditional PEXPIRE from a short-TIMEOUT process
    would shorten the TTL a longer holder's entries rely on, so that the keys
    vanished with the holder in them.  One command,
    :func:`~django_semaphore.backend.scripting.lengthen` (a few lines of Lua: PTTL,
    then PEXPIRE only if that lengthens; ``PEXPIRE ... NX`` and ``GT`` would
    need Redis 7.0), always sent in the same MULTI as the write that may
    create the key: no interruption between two round trips leaves a key
    without a TTL.
    """
    return (lengthen(ttl_ms, *names),)


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
    schedules = False

    def acquire(
        self, keys: PartitionKeys, limit: int, request: AcquireRequest, ticket: str = ""
    ) -> Operation[Outcome]:
        """Take a slot, or a refusal (``request.ticket_ms`` and ``ticket`` are ignored: no
        queue; ``permits``, ``priority``, ``max_waiters`` and ``slots`` too: the engine
        sends only their defaults, see :attr:`Algorithm.schedules`).

        ``request.dry_run``: a refused caller acquires again with an unbounded limit
        and is granted with ``over_limit`` set: one more round trip (two for
        "fair"), only when enforcing would have refused it.
        """
        outcome = yield from self.acquire_once(keys, limit, request)
        if not request.dry_run or isinstance(outcome, Granted):
            return outcome
        for _ in range(DRY_RUN_ATTEMPTS):  # "fair_locked" may miss its lock
            again = yield from self.acquire_once(keys, UNBOUNDED, request)
            if isinstance(again, Granted):
                again.over_limit = True
                return again
        return outcome

    def acquire_once(self, keys: PartitionKeys, limit: int, request: AcquireRequest) -> Operation[Outcome]:
        """Take a slot, or a refusal (``request.ticket_ms`` is ignored: no queue)."""
        timeout_ms, identifier = request.timeout_ms, request.identifier
        now = client_ms()
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
                    ("HSET", keys.holds, identifier, record(token, int(now), request.meta_json)),
                )
                + _keep_alive(ttl, keys.owners, keys.holds)
            )
            return Granted(token, int(now), int(now + timeout_ms))
        yield Pipe((("ZREM", keys.timeouts, identifier),) + _forget_ids(keys, expired))
        return Refused(_retry_ms(reply[6], now, timeout_ms))

    def release(
        self,
        keys: PartitionKeys,
        limit: int,
        identifier: str,
        granted: Granted | None = None,
    ) -> Operation[bool]:
        """Give the slot back; True if it was still live (``granted`` is ignored)."""
        now = client_ms()
        reply = yield Pipe(
            (
                ("ZSCORE", keys.timeouts, identifier),
                ("ZREM", keys.timeouts, identifier),
                ("ZREM", keys.owners, identifier),
                ("HDEL", keys.holds, identifier),
            )
        )
        return reply[0] is not None and float(reply[0]) > now

    def grant_from(self, payload: Any, permits: int, slots: bool) -> Granted | None:
        """None: no queue, nothing is ever pushed to a waiter."""
        return None

    def refresh(
        self, keys: PartitionKeys, timeout_ms: int, identifier: str, claim_token: int | None = None
    ) -> Operation[float | None]:
        """Extend the lease, or report it lost: the check and the write are one MULTI.

        Expired entries (the caller's own included) are removed first, so
        ``ZADD XX`` extends the entry only if it was still live, and the
        ZSCORE after it says which happened: a refresh never reports success
        for a slot lost before it, and never revives an expired entry.  A
        second round trip removes what expired from the owner ZSET and the
        records (cleaning only: the answer is already decided).  (``claim_token``
        is always None: these variants grant no claims.)
        """
        now = client_ms()
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

    def abandon(self, keys: PartitionKeys, limit: int, identifier: str) -> Operation[None]:
        """Nothing to give up: a waiter of these variants holds no place in a queue."""
        return
        yield  # a generator that sends no request

    def clock(self) -> str:
        """This client's now: expiries are written on the client's clock."""
        return f"{client_ms():.3f}"


class Fair(Basic):
    """Redis in Action 6.3.2: a counter ranks clients in the owner ZSET.

    The seed prunes the owner ZSET with ``ZINTERSTORE owners owners
    timeouts``, which re-creates the key without a TTL (and would drop a
    longer holder's TTL to this process's); here the intersection goes to a
    scratch ZSET, ranked in and deleted within the same MULTI, and expired
    identifiers are removed from the owner ZSET one by one.
    """

    name = "fair"

    def acquire_once(self, keys: PartitionKeys, limit: int, request: AcquireRequest) -> Operation[Outcome]:
        """Take a slot, or a refusal (``request.ticket_ms`` is ignored: no queue)."""
        timeout_ms, identifier = request.timeout_ms, request.identifier
        now = client_ms()
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
                (("HSET", keys.holds, identifier, record(token, int(now), request.meta_json)),)
                + _keep_alive(ttl, keys.holds)
            )
            return Granted(token, int(now), int(now + timeout_ms))
        yield Pipe((("ZREM", keys.timeouts, identifier), ("ZREM", keys.owners, identifier)))
        return Refused(_retry_ms(first, now, timeout_ms))


class FairLocked(Fair):
    """Redis in Action 6.3.5: the fair semaphore under a short lock."""

    name = "fair_locked"

    def acquire_once(self, keys: PartitionKeys, limit: int, request: AcquireRequest) -> Operation[Outcome]:
        """Take the lock (refused if it stays taken LOCK_ACQUIRE_TIMEOUT), then acquire as "fair"."""
        identifier = request.identifier
        deadline = time.monotonic() + LOCK_ACQUIRE_TIMEOUT
        while True:
            reply = yield Pipe(
                (("SET", keys.lock, identifier, "NX", "PX", LOCK_TIMEOUT_MS),), transaction=False
            )
            if reply[0]:
                break
            if time.monotonic() >= deadline:
                return Refused(min(request.timeout_ms, 1000))
            yield Sleep(0.001)
        # No try/finally: a generator must not yield while being closed. If
        # Redis fails in between, the lock expires after LOCK_TIMEOUT_MS.
        outcome = yield from super().acquire_once(keys, limit, request)
        yield Script(UNLOCK, (keys.lock,), (identifier,))
        return outcome
