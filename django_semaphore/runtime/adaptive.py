"""The adaptive limit: a limit that follows the guarded work's hold times, one for every process.

``"ADAPTIVE": {"MIN": m, "MAX": M}`` in a SEMAPHORES entry (``adaptive={...}``
for an ad-hoc :class:`~django_semaphore.Semaphore`) makes LIMIT the starting
point of a limit kept in Redis and moved by a controller, within [MIN, MAX].

Where it lives
    The controller's state is one field of the control HASH
    (:func:`~django_semaphore.backend.keys.control_key`), beside the overrides:
    ``b"\\xffa:" + name`` (:func:`state_field`; the byte 0xFF never occurs in a
    name sent as UTF-8, so no semaphore name can be that field), a JSON
    document with the limit, the baseline, the last window's mean hold, the
    direction of the last change, its server time and the window accumulated
    since.  Every process reads it with the overrides, in the control poller's
    HGETALL (:mod:`django_semaphore.runtime.control`): the limit reaches every process
    within a second, with no Redis round trip per acquire.  One key, so it
    works the same on Redis Cluster.

Samples
    Each process adds up, per adaptive semaphore, the hold times of the
    leases it released (as :mod:`~django_semaphore.runtime.stats` measures them) and
    the *pressure*: acquires that were refused or had to queue, and in MODE
    "dry_run" the would-be refusals (the demand exceeded the limit).  The
    control poller sends each window with samples in its next tick (every
    half second), one EVALSHA of ``adapt.lua`` per semaphore in the same
    pipeline as the HGETALL that follows it; a failed
    pipeline keeps the window for the next tick.  The script adds the window
    to the shared one and, at most once per INTERVAL (server ``TIME``) and
    only with at least MIN_SAMPLES holds in it, runs the control law on the
    shared window, then starts a new one.

The baseline B is the mean hold at a concurrency low enough not to load the
resource.  It is measured by a *probe*: the limit drops to the probe limit
(:data:`PROBE_LIMIT`, 3, within [MIN, MAX]) for one window, whose mean hold
becomes B, and then goes back to where it was.  A probe runs at the first
update (unless the limit is already that low: then the first window is the
measurement), every PROBE_INTERVAL seconds (default 60; 0: never on a
timer), and when the baseline is in doubt: the last update lowered the limit
and the holds did not get shorter (S >= 0.95 x the previous window's), so the
latency is not the limit's doing (the resource got slower at every load).
Between probes, a window shorter than B lowers B to it.

The control law (one update), with S the window's mean hold and r = S / B:

1. If r > TOLERANCE (the holds got slower than the tolerance allows: the
   resource is saturated), the limit shrinks to
   max(MIN, limit // 2, floor(limit x TOLERANCE / r)), and at least by 1
   (unless at MIN).
2. Else, if there was pressure in the window (demand exceeded the limit),
   it grows: by max(1, floor(sqrt(limit))) while r <= 1 + (TOLERANCE - 1) / 2
   (the holds are near their uncontended level), else by 1.
3. Else it stays.  The result is clamped into [MIN, MAX].

Without probes, a limit that starts above the saturation point would never
come down: the first window, already slow, would be the baseline, so r
would stay near 1 (measured in ``benchmarks/adaptive.py``: from 48 the limit
stayed at 48, holds at 4 x their uncontended time).

After an update that changed the limit (a probe's two included), the next
window is dropped when it is due (a *settling* window): it mixes holds taken
under the old limit (processes apply the change within a poll, and holds
started before it end after it), and judging the new limit by them made the
limit ratchet up past saturation (measured: 2 -> 12 instead of oscillating
around the saturation point 4 in ``tests/runtime/test_adaptive.py``'s
three-process test).

Precedence: while an override of the limit is set
(:meth:`Semaphore.override <django_semaphore.Semaphore.override>`),
the controller does not move (the windows measured meanwhile are dropped)
and the override's limit is in force, ``source == "override"``; once it is
cleared, the adaptive limit resumes from its last value.  An override of the
mode alone keeps the adaptive limit, with ``source == "override"`` as for
any override in force (clearing it has something to clear).  Without an
override, :meth:`Semaphore.effective
<django_semaphore.Semaphore.effective>` says ``source == "adaptive"``.
Before the first update reaches a process, the limit in force is LIMIT
clamped into [MIN, MAX].
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from redis.exceptions import NoScriptError

from ..backend import forks
from ..backend.keys import control_key
from ..backend.scripting import Command, LuaScript, Operation, Script

if TYPE_CHECKING:
    from ..config.validation import SemaphoreConfig

FIELD_PREFIX = b"\xffa:"  # the controller's field in the control HASH: FIELD_PREFIX + name

ADAPT = LuaScript("adapt")

#: The limit a probe holds for a window to measure the baseline (clamped into [MIN, MAX]):
#: low enough not to load most resources, as Envoy's adaptive concurrency filter's
#: ``min_concurrency``.
PROBE_LIMIT = 3

__all__ = [
    "Pending",
    "State",
    "Step",
    "adapt",
    "drain",
    "forget",
    "limit_from",
    "read_state",
    "record_hold",
    "record_pressure",
    "state_field",
    "watch",
]


class Step(NamedTuple):
    """What one call of the controller did: ``status`` ("updated", "interval": not due
    yet, "samples": fewer than MIN_SAMPLES holds, "settling": the window after a change,
    dropped, "probe": a probe starts, "probed": a probe measured the baseline,
    "override": a limit override is in force) and the limit, baseline and last
    window's mean hold (ms) after it."""

    status: str
    limit: int
    baseline_ms: float
    mean_ms: float


class State(NamedTuple):
    """The controller's state as stored: limit, baseline and last mean hold (ms), the
    last update's direction (-1, 0, 1) and server time (ms), the open window, and
    whether that window will be dropped (the one after a change), and whether a probe
    holds the limit down (to measure the baseline)."""

    limit: int
    baseline_ms: float
    mean_ms: float
    direction: int
    at_ms: int
    window_holds: int
    window_pressure: int
    settling: bool
    probing: bool = False


def state_field(name: str) -> bytes:
    """The control HASH field holding semaphore ``name``'s controller state."""
    return FIELD_PREFIX + name.encode("utf-8")


def _decode_state(raw: Any) -> State | None:
    try:
        data = json.loads(raw)
        limit = data["limit"]
        if not isinstance(limit, (int, float)) or isinstance(limit, bool):
            return None
        return State(
            int(limit),
            float(data.get("base", 0)),
            float(data.get("mean", 0)),
            int(data.get("dir", 0)),
            int(data.get("at", 0)),
            int(data.get("n", 0)),
            int(data.get("p", 0)),
            data.get("settle", 0) == 1,
            data.get("probe", 0) == 1,
        )
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError):  # JSON 1e400: inf
        return None


def limit_from(raw: Any) -> int | None:
    """The adaptive limit in a stored state (None if malformed)."""
    state = _decode_state(raw)
    return None if state is None else state.limit


def _args(config: SemaphoreConfig, hold_ms: float, holds: int, pressure: int) -> tuple[Any, ...]:
    adaptive = config.adaptive
    assert adaptive is not None
    return (
        config.name,
        f"{hold_ms:.3f}",
        holds,
        pressure,
        adaptive.min,
        adaptive.max,
        max(1, round(adaptive.interval * 1000)),
        repr(float(adaptive.tolerance)),
        adaptive.min_samples,
        adaptive.clamp(config.limit),
        round(adaptive.probe_interval * 1000),
        PROBE_LIMIT,
    )


def _step(reply: Any) -> Step:
    status, limit, base, mean = (v.decode() if isinstance(v, bytes) else str(v) for v in reply)
    return Step(status, int(float(limit)), float(base), float(mean))


def adapt(prefix: str, config: SemaphoreConfig, hold_ms: float, holds: int, pressure: int) -> Operation[Step]:
    """Send one window (``holds`` hold times adding up to ``hold_ms``, and
    ``pressure``) of adaptive semaphore ``config`` to the controller; what it did.

    The control poller sends the windows itself; this is the same script, for
    tools and tests.
    """
    reply = yield Script(ADAPT, (control_key(prefix),), _args(config, hold_ms, holds, pressure))
    return _step(reply)


def read_state(prefix: str, name: str) -> Operation[State | None]:
    """The stored controller state of semaphore ``name`` (None before its first window)."""
    raw = yield Command(("HGET", control_key(prefix), state_field(name)))
    return None if raw is None else _decode_state(raw)


# -- this process's windows ---------------------------------------------------------------


class _Window:
    __slots__ = ("hold_ms", "holds", "pressure")

    def __init__(self) -> None:
        self.hold_ms = 0.0
        self.holds = 0
        self.pressure = 0

    def merge(self, other: _Window) -> None:
        self.hold_ms += other.hold_ms
        self.holds += other.holds
        self.pressure += other.pressure


_lock = threading.Lock()
_configs: dict[tuple[str, str], SemaphoreConfig] = {}  # the adaptive semaphores in use
_windows: dict[tuple[str, str], _Window] = {}  # their samples not sent yet
_eval = True  # send the source (EVAL) until a call with it succeeds: first use, or after NOSCRIPT


@forks.in_child
def _forget_the_parents_samples() -> None:
    global _lock, _windows
    _lock, _windows = threading.Lock(), {}  # the parent sends its own samples


def watch(prefix: str, config: SemaphoreConfig) -> None:
    """Count the samples of adaptive semaphore ``config`` under ``prefix`` from now on
    (called with every use: the configuration sent is the latest)."""
    key = (prefix, config.name)
    if _configs.get(key) is not config:
        with _lock:
            _configs[key] = config


def _window(prefix: str, name: str) -> _Window | None:
    key = (prefix, name)
    if key not in _configs:
        return None
    window = _windows.get(key)
    if window is None:
        window = _windows[key] = _Window()
    return window


def record_hold(prefix: str, name: str, seconds: float) -> None:
    """Add one hold time of semaphore ``name`` to this process's window (if it is adaptive)."""
    if (prefix, name) not in _configs:
        return
    with _lock:
        window = _window(prefix, name)
        if window is not None:
            window.hold_ms += max(0.0, seconds) * 1000.0
            window.holds += 1


def record_pressure(prefix: str, name: str) -> None:
    """Count one acquire of semaphore ``name`` that was refused or had to queue (if adaptive)."""
    if (prefix, name) not in _configs:
        return
    with _lock:
        window = _window(prefix, name)
        if window is not None:
            window.pressure += 1


class Pending:
    """What :func:`drain` took: one adapt.lua call per window, and a way to put them back."""

    def __init__(self, taken: Mapping[tuple[str, str], tuple[SemaphoreConfig, _Window]]) -> None:
        self.taken = dict(taken)
        verb, script = ("EVAL", ADAPT.source) if _eval else ("EVALSHA", ADAPT.sha)
        self.commands = tuple(
            (verb, script, 1, control_key(prefix), *_args(config, w.hold_ms, w.holds, w.pressure))
            for (prefix, _), (config, w) in self.taken.items()
        )

    def settle(self, replies: list[Any] | None) -> None:
        """Put back the windows whose call failed (all of them if ``replies`` is None)."""
        global _eval
        failed = []
        for index, key in enumerate(self.taken):
            reply = None if replies is None else replies[index]
            if replies is None or isinstance(reply, Exception):
                failed.append(key)
                if isinstance(reply, NoScriptError):
                    _eval = True
            elif self.commands[index][0] == "EVAL":
                _eval = False
        if not failed:
            return
        with _lock:
            for key in failed:
                current = _windows.get(key)
                if current is None:
                    _windows[key] = self.taken[key][1]
                else:
                    current.merge(self.taken[key][1])


def drain() -> Pending:
    """Take every window with samples (the control poller sends them)."""
    global _windows
    if not _windows:
        return Pending({})
    with _lock:
        taken, _windows = _windows, {}
        pairs = {key: (_configs[key], w) for key, w in taken.items() if key in _configs}
    return Pending(pairs)


def forget() -> None:
    """Drop the samples not sent yet (another Redis server)."""
    global _windows
    with _lock:
        _windows = {}
