"""Recent statistics: refusals, would-be refusals and hold times, cluster-wide.

Each process counts, in memory, the refusals and dry-run (would-be)
refusals of each semaphore in 10-second buckets, and keeps the hold times
(seconds, on this process's monotonic clock) of the leases it released.
Recording is a dict update under a lock: nothing on the acquire or release
path talks to Redis for statistics.  The control poller
(:mod:`django_semaphore.runtime.control`) flushes what was recorded in its next tick
(every half second), in the same pipeline as its read of the overrides:

* ``<prefix>:stats:<name hash>:c``: a HASH of counts per bucket, fields
  ``r:<bucket>`` (refusals) and ``d:<bucket>`` (would-be refusals), HINCRBY;
* ``<prefix>:stats:<name hash>:h``: a LIST of the last ``HOLD_SAMPLES`` hold
  times, ``<bucket>:<seconds>``, LPUSH + LTRIM.

Both get a TTL of ``TTL_MS`` (six minutes) at every write, so they outlive
the five-minute window and vanish when nothing happens.  Each key is its own
cluster slot (a non-transactional pipeline is split per node).  The same
flush carries this process's records of the ad-hoc semaphores it uses
(:mod:`django_semaphore.runtime.adhoc`).
:func:`recent` reads the last ``WINDOW`` seconds of every process's flushed
data.  A bucket is ``int(epoch seconds // BUCKET)``; the functions take ``now``
so that tests need not wait.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from ..backend import connection, forks
from ..backend.keys import stats_keys
from ..backend.scripting import Operation, Pipe, arun, run
from ..config import settings
from . import adaptive, adhoc

BUCKET = 10  # seconds per bucket
WINDOW = 300  # seconds that recent() looks back
TTL_MS = 360_000  # the stats keys' TTL, renewed at every write
HOLD_SAMPLES = 200  # hold times kept per semaphore (cluster-wide)
PRUNE_BUCKETS = 30  # buckets older than the window deleted at each flush

__all__ = ["Recent", "arecent", "drain", "flush", "recent", "record_hold", "record_refusal"]


class Recent(NamedTuple):
    """One semaphore's last five minutes, every process's: refusals, would-be
    (dry-run) refusals, and the median and 95th percentile of recent hold
    times in seconds (None without any) over ``samples`` hold times."""

    refused: int
    dry_run_refused: int
    hold_p50: float | None
    hold_p95: float | None
    samples: int


class _Counts:
    __slots__ = ("refused", "dry_run", "holds")

    def __init__(self) -> None:
        self.refused: dict[int, int] = {}
        self.dry_run: dict[int, int] = {}
        # The newest hold times: a flush sends HOLD_SAMPLES at most, so no more are kept
        # (a full deque drops its oldest as it takes one, in constant time).
        self.holds: deque[tuple[int, float]] = deque(maxlen=HOLD_SAMPLES)

    def merge(self, other: _Counts) -> None:
        for bucket, n in other.refused.items():
            self.refused[bucket] = self.refused.get(bucket, 0) + n
        for bucket, n in other.dry_run.items():
            self.dry_run[bucket] = self.dry_run.get(bucket, 0) + n
        self.holds = deque(itertools.chain(other.holds, self.holds), maxlen=HOLD_SAMPLES)


_lock = threading.Lock()
#: Held while drained counts are on their way to Redis (by :func:`flush`, or the
#: control poller): a flush returns only once everything recorded before it landed.
sending = threading.Lock()
_pending: dict[tuple[str, str], _Counts] = {}


@forks.in_child
def _forget_the_parents_counts() -> None:
    global _lock, sending, _pending
    # The parent flushes its own counts; a lock may have been held at the fork.
    _lock, sending, _pending = threading.Lock(), threading.Lock(), {}


def bucket_of(now: float | None = None) -> int:
    """The bucket of epoch second ``now`` (None: the current time)."""
    return int((time.time() if now is None else now) // BUCKET)


def _counts(name: str, prefix: str) -> _Counts:
    key = (prefix, name)
    counts = _pending.get(key)
    if counts is None:
        counts = _pending[key] = _Counts()
    return counts


def record_refusal(
    name: str, dry_run: bool = False, now: float | None = None, prefix: str | None = None
) -> None:
    """Count one refusal (``dry_run``: one would-be refusal) of semaphore ``name``
    (for an adaptive semaphore, also pressure: :mod:`django_semaphore.runtime.adaptive`)."""
    bucket = bucket_of(now)
    prefix = prefix or settings.setting("SEMAPHORE_KEY_PREFIX")
    adaptive.record_pressure(prefix, name)
    with _lock:
        counts = _counts(name, prefix)
        table = counts.dry_run if dry_run else counts.refused
        table[bucket] = table.get(bucket, 0) + 1


def record_hold(name: str, seconds: float, now: float | None = None, prefix: str | None = None) -> None:
    """Keep one hold time (seconds a released lease was held) of semaphore ``name``
    (for an adaptive semaphore, also a sample of its window: :mod:`django_semaphore.runtime.adaptive`)."""
    bucket = bucket_of(now)
    prefix = prefix or settings.setting("SEMAPHORE_KEY_PREFIX")
    adaptive.record_hold(prefix, name, seconds)
    with _lock:
        _counts(name, prefix).holds.append((bucket, max(0.0, seconds)))


class Pending:
    """What :func:`drain` took: the Redis commands that flush it, and a way to put it back."""

    def __init__(self, taken: dict[tuple[str, str], _Counts], recorded: adhoc.Pending | None = None) -> None:
        self.taken = taken
        self.recorded = recorded or adhoc.Pending({})
        self.commands = _commands(taken) + self.recorded.commands

    def restore(self) -> None:
        """The flush failed: keep the counts (and the ad-hoc records) for the next one."""
        self.recorded.restore()
        if not self.taken:
            return
        with _lock:
            for key, counts in self.taken.items():
                current = _pending.get(key)
                if current is None:
                    _pending[key] = counts
                else:
                    current.merge(counts)


def drain() -> Pending:
    """Take everything recorded so far, ad-hoc records included (the poller flushes it)."""
    global _pending
    recorded = adhoc.drain()
    if not _pending:
        return Pending({}, recorded)
    with _lock:
        taken, _pending = _pending, {}
    return Pending(taken, recorded)


def _commands(taken: dict[tuple[str, str], _Counts]) -> tuple[tuple[Any, ...], ...]:
    commands: list[tuple[Any, ...]] = []
    for (prefix, name), counts in taken.items():
        count_key, holds_key = stats_keys(prefix, name)
        if counts.refused or counts.dry_run:
            for bucket, n in counts.refused.items():
                commands.append(("HINCRBY", count_key, f"r:{bucket}", n))
            for bucket, n in counts.dry_run.items():
                commands.append(("HINCRBY", count_key, f"d:{bucket}", n))
            newest = max([*counts.refused, *counts.dry_run])
            old = range(newest - WINDOW // BUCKET - PRUNE_BUCKETS, newest - WINDOW // BUCKET - 1)
            commands.append(("HDEL", count_key, *(f"{kind}:{b}" for b in old for kind in "rd")))
            commands.append(("PEXPIRE", count_key, TTL_MS))
        if counts.holds:
            samples = [f"{bucket}:{seconds:.6f}" for bucket, seconds in counts.holds]
            commands.append(("LPUSH", holds_key, *samples))
            commands.append(("LTRIM", holds_key, 0, HOLD_SAMPLES - 1))
            commands.append(("PEXPIRE", holds_key, TTL_MS))
    return tuple(commands)


def flush() -> None:
    """Send what this process recorded now, on the sync client (the poller does it by
    itself); when it returns, every count recorded before the call is in Redis."""
    with sending:  # after a poll that drained counts before this call, and sent them
        pending = drain()
        if not pending.commands:
            return
        try:
            run(connection.get_client(), _pipe(pending.commands))
        except BaseException:
            pending.restore()
            raise


def _pipe(commands: tuple[tuple[Any, ...], ...]) -> Operation[Any]:
    replies = yield Pipe(commands, transaction=False)
    return replies


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of ``values`` by nearest rank (None if empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(counts: Any, holds: Iterable[Any], now: float | None = None) -> Recent:
    """The :class:`Recent` of a counts HASH and a hold-times LIST as Redis returned them."""
    first = bucket_of(now) - WINDOW // BUCKET + 1
    refused = dry_run = 0
    for field, value in (counts or {}).items():
        kind, _, bucket = _text(field).partition(":")
        if not bucket.lstrip("-").isdigit() or int(bucket) < first:
            continue
        if kind == "r":
            refused += int(value)
        elif kind == "d":
            dry_run += int(value)
    samples: list[float] = []
    for item in holds or ():
        bucket, _, seconds = _text(item).partition(":")
        try:
            if int(bucket) >= first:
                samples.append(float(seconds))
        except ValueError:
            continue
    return Recent(refused, dry_run, percentile(samples, 0.5), percentile(samples, 0.95), len(samples))


def _name(semaphore: Any) -> str:
    return str(getattr(semaphore, "name", semaphore))


def read(semaphore: Any, now: float | None = None) -> Operation[Recent]:
    """The operation reading :class:`Recent` of ``semaphore`` (a Semaphore or a name)."""
    count_key, holds_key = stats_keys(settings.setting("SEMAPHORE_KEY_PREFIX"), _name(semaphore))
    counts, holds = yield Pipe((("HGETALL", count_key), ("LRANGE", holds_key, 0, -1)), transaction=False)
    return summarize(counts, holds, now)


def recent(semaphore: Any, now: float | None = None) -> Recent:
    """Refusals, would-be refusals and hold times of ``semaphore`` in the last five minutes,
    from every process (as flushed: up to half a second behind)."""
    return run(connection.get_client(), read(semaphore, now))


async def arecent(semaphore: Any, now: float | None = None) -> Recent:
    """The asyncio twin of :func:`recent`."""
    return await arun(connection.get_async_client(), read(semaphore, now))
