"""Reading a partition: its live holders, its figures, and purging what expired.

The three operations run one script each (``status.lua``, ``holders.lua``,
``purge.lua``) whatever the algorithm, since all of them share one key layout.

One clock: an entry is judged by the clock that wrote it.  "lua" writes
expiries on the server's clock, so its scripts read TIME; the Redis in Action
variants write them on the client's clock, so the client's now is passed in
(the scripts' optional ARGV; see :meth:`Algorithm.clock
<django_semaphore.engine.algorithms.base.Algorithm.clock>`).  For a semaphore whose
algorithm is unknown (no longer in SEMAPHORES), :func:`purge` takes the earlier
of the two clocks: an entry is removed only once it has ended on both, so
whoever wrote it, no live holder is evicted as long as the clocks of the app
servers agree with each other.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar, cast

from redis.exceptions import NoScriptError

from ..backend.keys import PartitionKeys
from ..backend.scripting import LuaScript, Operation, Pipe, Script
from .algorithms import Algorithm
from .algorithms.base import as_int, client_ms, parse_slots, retry_after_seconds
from .algorithms.total import decode_priority

STATUS = LuaScript("status")
HOLDERS = LuaScript("holders")
PURGE = LuaScript("purge")
WAITERS = LuaScript("waiters")

#: Scripts :func:`batched` sends per pipeline (one round trip each; one per node on a cluster).
BATCH = 500

T = TypeVar("T")


def to_datetime(ms: float) -> datetime.datetime:
    """An aware UTC datetime from milliseconds since the epoch."""
    return datetime.datetime.fromtimestamp(ms / 1000.0, tz=datetime.UTC)


class Holder(NamedTuple):
    """One live holder of a semaphore, as read from Redis."""

    identifier: str
    token: int
    acquired_at: datetime.datetime | None  # None only for a malformed record
    expires_at: datetime.datetime
    meta: dict[str, Any]
    permits: int = 1  # how many of the limit it holds
    slots: tuple[int, ...] = ()  # its slot numbers (SLOTS True; empty otherwise)


class Waiter(NamedTuple):
    """One caller queued for a slot ("lua"), as read from Redis."""

    identifier: str
    priority: int  # higher is served first
    permits: int  # how many permits it waits for
    since: datetime.datetime  # when it queued (its ticket, server time)
    meta: dict[str, Any]


class PartitionStatus(NamedTuple):
    """Figures of one partition, read at one instant of server time.

    With TOTAL, ``total`` is the TOTAL in force and ``total_in_use`` the permits
    all partitions of the name hold; the figures of the whole name (key hash
    ``+``) have the TOTAL as their ``limit``."""

    key_hash: str
    limit: int
    in_use: int  # permits held by live holders
    waiting: int
    retry_after: int  # seconds until the earliest lease ends (0 if none held)
    holders: int = -1  # live holders (-1: not read)
    total: int | None = None  # TOTAL in force (None: no TOTAL)
    total_in_use: int = 0  # TOTAL: permits held in the whole name

    @property
    def free(self) -> int:
        """Free permits: the limit minus the permits held, never below 0; with
        TOTAL, no more than the TOTAL's free permits."""
        free = max(0, self.limit - self.in_use)
        if self.total is not None:
            free = min(free, max(0, self.total - self.total_in_use))
        return free


def status(
    keys: PartitionKeys, algorithm: Algorithm, limit: int, timeout: float
) -> Operation[PartitionStatus]:
    """The :class:`PartitionStatus` of one partition of a semaphore of ``limit`` and ``timeout``.

    Holders are counted on the clock ``algorithm`` writes expiries with;
    waiters always on the server's.
    """
    now_ms, used, waiters, earliest, live = yield Script(STATUS, keys.main, (algorithm.clock(),))
    retry = retry_after_seconds(earliest - now_ms, timeout) if earliest >= 0 else 0
    return PartitionStatus(keys.key_digest, limit, used, waiters, retry, live)


def total_status(keys: PartitionKeys, limit: int, total: int, timeout: float) -> Operation[PartitionStatus]:
    """The :class:`PartitionStatus` of a partition of a TOTAL name (``keys.part``),
    or of the whole name (no part: its ``limit`` is ``total``)."""
    reply = yield Script(STATUS, keys.main, ("", keys.part))
    now_ms, used, waiters, earliest, live = reply[:5]
    retry = retry_after_seconds(earliest - now_ms, timeout) if earliest >= 0 else 0
    if not keys.part:
        return PartitionStatus(keys.key_digest, total, used, waiters, retry, live, total, used)
    return PartitionStatus(keys.part, limit, reply[5], reply[6], retry, -1, total, used)


def batched(operations: Sequence[Operation[T]], size: int | None = None) -> Operation[list[T]]:
    """The results of ``operations``, each of which sends one :class:`Script` and returns
    (:func:`status`, :func:`total_status`), with their scripts sent ``size`` at a time in
    one pipeline each (default :data:`BATCH`): a round trip per ``size`` partitions, not
    one each.

    Cluster-safe: each script's keys are one partition's, which share one hash slot,
    and redis-py's cluster pipeline sends each call to the node of its slot (one round
    trip per node).  The results are those of running the operations one by one: a
    script's error raises as it would alone; one found missing on its node (NOSCRIPT,
    after a restart or SCRIPT FLUSH) is run alone once, which loads it there, and the
    others sent again.
    """
    size = size or BATCH
    results: list[T] = []
    for start in range(0, len(operations), size):
        chunk = operations[start : start + size]
        requests = [next(operation) for operation in chunk]
        if not all(type(request) is Script for request in requests):
            raise TypeError("batched() runs operations that send one Script each")
        scripts = cast("list[Script]", requests)
        replies: list[Any] = [None] * len(chunk)
        pending = list(range(len(chunk)))
        while pending:
            sent = tuple(_evalsha(scripts[i]) for i in pending)
            got = yield Pipe(sent, transaction=False, raise_on_error=False)
            missing = []
            for i, reply in zip(pending, got, strict=True):
                if isinstance(reply, NoScriptError):
                    missing.append(i)
                elif isinstance(reply, Exception):
                    raise reply
                else:
                    replies[i] = reply
            if missing:  # alone: EVAL loads the script on that node
                replies[missing[0]] = yield scripts[missing[0]]
            pending = missing[1:]
        results.extend(_finish(operation, reply) for operation, reply in zip(chunk, replies, strict=True))
    return results


def _evalsha(request: Script) -> tuple[Any, ...]:
    return ("EVALSHA", request.script.sha, len(request.keys), *request.keys, *request.args)


def _finish(operation: Operation[T], reply: Any) -> T:
    """The result of ``operation`` given the reply to its one request."""
    try:
        operation.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result
    raise TypeError("batched() runs operations that send one Script each")


def holders(keys: PartitionKeys, algorithm: Algorithm) -> Operation[list[Holder]]:
    """The live holders of one partition, in token order (oldest first).

    Live on the clock ``algorithm`` writes expiries with.  Of a TOTAL name: the
    partition's (``keys.part``), or every partition's.
    """
    reply = yield Script(HOLDERS, keys.main, (algorithm.clock(),))
    result = [_parse_holder(*reply[i : i + 5]) for i in range(1, len(reply), 5)]
    if keys.part:
        mine = keys.part + "/"
        result = [holder for holder in result if holder.identifier.startswith(mine)]
    # The script lists them by expiry; the grant order is the tokens'.
    result.sort(key=lambda holder: holder.token)
    return result


def waiters(keys: PartitionKeys) -> Operation[list[Waiter]]:
    """The waiters of one partition in serving order (priority, then arrival), with
    live tickets only ("lua")."""
    if not keys.shared:
        reply = yield Script(WAITERS, keys.main, ())
        return [_parse_waiter(*reply[i : i + 5]) for i in range(1, len(reply), 5)]
    # TOTAL: the queue holds each partition's waiters in their serving order;
    # those of the whole name are listed round robin between the partitions
    # (the script's order, by partition, is not the serving order).
    reply = yield Script(WAITERS, keys.main, (keys.part,))
    found = [_parse_waiter(*reply[i : i + 5]) for i in range(1, len(reply), 5)]
    if keys.part:
        return found
    rank: dict[str, int] = {}
    ordered = []
    for waiter in found:
        part = waiter.identifier.partition("/")[0]
        rank[part] = rank.get(part, -1) + 1
        ordered.append((-waiter.priority, rank[part], waiter.since, waiter))
    ordered.sort(key=lambda item: item[:3])
    return [item[3] for item in ordered]


def _parse_waiter(identifier: Any, ticket: Any, record: Any, priority: Any, permits: Any) -> Waiter:
    text = record.decode("utf-8", "replace") if isinstance(record, bytes) else str(record)
    text = (text.split(":", 2) + ["", "", ""])[2]  # "ticket:permits:meta json"
    meta: Any
    try:
        meta = json.loads(text) if text else {}
    except ValueError:
        meta = {"raw": text}
    number = ticket.decode() if isinstance(ticket, bytes) else str(ticket)
    try:
        since = to_datetime(float(number) / 1000.0)  # ticket numbers are server microseconds
    except ValueError:
        since = to_datetime(0)
    level = priority.decode() if isinstance(priority, bytes) else str(priority)
    return Waiter(
        identifier.decode() if isinstance(identifier, bytes) else str(identifier),
        decode_priority(level[1:]) if level.startswith("p") else int(level),
        as_int(permits),
        since,
        meta if isinstance(meta, dict) else {"raw": meta},
    )


def _parse_holder(identifier: Any, expires_ms: Any, record: Any, slots: Any, permits: Any) -> Holder:
    """A :class:`Holder` from its identifier, expiry, ``token:acquired_ms:meta json``
    record (a weighted holder's has its permits tag before the JSON:
    ``token:acquired_ms:m2{...}``), slot numbers (``3,5``; empty without SLOTS
    and for the Redis in Action variants) and permits.

    A malformed record still gives a Holder (token 0, no acquired_at, the
    unparsable meta under ``"raw"``): the admin shows what is there.
    """
    numbers = parse_slots(slots)
    text = record.decode("utf-8", "replace") if isinstance(record, bytes) else record
    token, acquired, raw_meta = (text.split(":", 2) + ["", "", ""])[:3]
    if raw_meta and not raw_meta.startswith("{") and "{" in raw_meta:
        raw_meta = raw_meta[raw_meta.index("{") :]  # the permits tag (permits come apart)
    meta: Any
    try:
        meta = json.loads(raw_meta) if raw_meta else {}
    except ValueError:
        meta = {"raw": raw_meta}
    return Holder(
        identifier.decode() if isinstance(identifier, bytes) else identifier,
        int(token) if token.isdigit() else 0,
        to_datetime(int(acquired)) if acquired.isdigit() else None,
        to_datetime(int(expires_ms)),
        meta,
        max(1, as_int(permits)),
        numbers,
    )


def purge(keys: PartitionKeys, algorithm: Algorithm | None, dry_run: bool = False) -> Operation[int]:
    """Remove (or with ``dry_run`` count) the expired entries of one partition.

    Expired on the clock ``algorithm`` writes expiries with; ``None`` (the
    algorithm is not known: a semaphore no longer configured) takes the
    earlier of the client's and the server's clock.
    """
    if algorithm is None:
        now, earlier = f"{client_ms():.3f}", "1"
    else:
        now, earlier = algorithm.clock(), ""
    removed: int = yield Script(PURGE, keys.main, ("1" if dry_run else "0", now, earlier))
    return removed
