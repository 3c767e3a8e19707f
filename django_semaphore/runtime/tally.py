"""The tally: this process's counts of grants, refusals, releases and waits, per semaphore.

What the Prometheus counters and wait histogram report
(:mod:`django_semaphore.ops.metrics`), counted where it happens: the engine
calls :func:`acquired`, :func:`refused` and :func:`released` as a grant, a
refusal or a release settles, and the metrics read :func:`rows` at scrape
time.  Counting is an integer added under a lock, about a microsecond of
CPU; sending the ``acquired`` and ``released`` signals to receivers that
update prometheus-client's objects cost a cycle about ten times as much
(``docs/benchmarks.rst``, the row "ours, no signal receivers").  So the tally
is off (:data:`counting` False, and the engine calls nothing) until the
metrics :func:`start` it; under prometheus-client's multi-process mode, where
every process must write its counts to its own files, they use their
receivers instead and leave it off.

A row is kept per semaphore name, with the semaphore object the engine
passes (``owner``: this layer knows no Semaphore, the metrics do), up to
:data:`MAX_NAMES` names; what names beyond them do is counted in one row
whose name and owner are None.  A forked child keeps its parent's counts,
as prometheus-client's objects would.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

from ..backend import forks

__all__ = ["MAX_NAMES", "WAIT_BUCKETS", "Row", "acquired", "counting", "refused", "released", "rows", "start"]

#: The upper bounds (seconds) of the wait histogram's buckets, the last one +inf.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf"))

#: Semaphore names counted one by one; the others share one row (ad-hoc names
#: can be made up at run time, one per user or job).
MAX_NAMES = 1000

#: True once :func:`start` ran: the engine calls the tally only then.
counting = False


class _Waits:
    """The callers of one outcome (granted or refused): how many, per wait bucket, and their waits' sum."""

    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.buckets = [0] * len(WAIT_BUCKETS)


class _Counts:
    __slots__ = ("acquired", "owner", "refused", "released")

    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.acquired = _Waits()
        self.refused = _Waits()
        self.released = 0


@dataclass(frozen=True)
class Row:
    """One semaphore's counts so far (``name`` and ``owner`` None: the names beyond
    :data:`MAX_NAMES`).  The waits are per bucket of :data:`WAIT_BUCKETS`, not
    cumulative, with their sum in seconds."""

    name: str | None
    owner: object
    acquired: int
    refused: int
    released: int
    acquired_waits: tuple[int, ...]
    acquired_sum: float
    refused_waits: tuple[int, ...]
    refused_sum: float


_lock = threading.Lock()
_counts: dict[str | None, _Counts] = {}


@forks.in_child
def _new_lock() -> None:
    global _lock
    _lock = threading.Lock()  # one held at the fork stays held; the counts are the parent's so far


def start() -> None:
    """Count from now on (the metrics call it when they report from this process's counts)."""
    global counting
    counting = True


def _row(name: str, owner: object) -> _Counts:
    # Under _lock.
    counts = _counts.get(name)
    if counts is None:
        if len(_counts) >= MAX_NAMES:
            counts = _counts.get(None)
            if counts is None:
                counts = _counts[None] = _Counts(None)
        else:
            counts = _counts[name] = _Counts(owner)
    return counts


def acquired(name: str, owner: object, waited: float) -> None:
    """Count a grant of semaphore ``name`` (``owner``: the semaphore) after ``waited`` seconds."""
    _count(name, owner, waited, refused=False)


def refused(name: str, owner: object, waited: float) -> None:
    """Count a refusal of semaphore ``name`` after ``waited`` seconds (not a dry run's)."""
    _count(name, owner, waited, refused=True)


def _count(name: str, owner: object, waited: float, refused: bool) -> None:
    bucket = bisect.bisect_left(WAIT_BUCKETS, waited)
    with _lock:
        counts = _row(name, owner)
        waits = counts.refused if refused else counts.acquired
        waits.count += 1
        waits.buckets[bucket] += 1
        waits.sum += waited


def released(name: str, owner: object) -> None:
    """Count a release of semaphore ``name`` (held or lost, once per lease)."""
    with _lock:
        _row(name, owner).released += 1


def rows() -> list[Row]:
    """Every semaphore's counts so far, in the order their names were first counted."""
    with _lock:
        return [
            Row(
                name,
                c.owner,
                c.acquired.count,
                c.refused.count,
                c.released,
                tuple(c.acquired.buckets),
                c.acquired.sum,
                tuple(c.refused.buckets),
                c.refused.sum,
            )
            for name, c in _counts.items()
        ]
