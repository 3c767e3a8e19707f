"""Logging once per burst, and request data made safe for a log line.

Under load, a full semaphore refuses many requests a second and a dead Redis
fails every one: :class:`Bursts` turns each run of like events into a WARNING
for its first event (and one every BURST_REPEAT seconds while it lasts, with a
count) and DEBUG lines for the others.  :func:`printable` escapes what a
client controls (the path, header values) before it reaches a log line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.dispatch import receiver

if TYPE_CHECKING:
    from django.http import HttpRequest

#: Seconds without a refusal of a semaphore that end its burst of refusals.
REFUSAL_QUIET = 10.0
#: Seconds after which a burst still going is logged at WARNING again, with a count.
BURST_REPEAT = 300.0
#: How much of the path a log line shows.
PATH_LOG_LENGTH = 200


def _now() -> float:
    return time.monotonic()


class _Burst:
    __slots__ = ("last", "warned_at", "since_warning", "total")

    def __init__(self, now: float) -> None:
        self.last = self.warned_at = now
        self.since_warning = 0  # events logged at DEBUG since the last WARNING
        self.total = 1


class Bursts:
    """Bursts of like events (refusals of one semaphore, failures of one Redis server).

    The first event of a burst is logged at WARNING, the next ones at DEBUG,
    and a burst still going after BURST_REPEAT seconds at WARNING again with
    how many were logged at DEBUG meanwhile: a dead Redis or an overloaded
    view under load writes a few lines, not one per request.  A burst ends
    after ``quiet`` seconds without an event (None: only by :meth:`end`).
    """

    def __init__(self, quiet: float | None) -> None:
        self.quiet = quiet
        self._lock = threading.Lock()
        self._active: dict[Hashable, _Burst] = {}

    def event(self, label: Hashable) -> int | None:
        """Record one event: None to log it at DEBUG, else log it at WARNING.

        The number is how many events of the burst were logged at DEBUG since
        its last warning (0 for the first event of a burst).
        """
        now = _now()
        with self._lock:
            burst = self._active.get(label)
            if burst is None or (self.quiet is not None and now - burst.last > self.quiet):
                self._active[label] = _Burst(now)
                return 0
            burst.last = now
            burst.total += 1
            if now - burst.warned_at >= BURST_REPEAT:
                skipped, burst.since_warning, burst.warned_at = burst.since_warning, 0, now
                return skipped
            burst.since_warning += 1
            return None

    def end(self) -> list[tuple[Hashable, int]]:
        """End every burst: ``[(label, events in the burst)]``."""
        if not self._active:  # the common case, without the lock
            return []
        with self._lock:
            ended, self._active = self._active, {}
        return [(label, burst.total) for label, burst in ended.items()]

    def reset(self) -> None:
        """Forget every burst without reporting it (the settings changed)."""
        with self._lock:
            self._active = {}


#: Refusals, per semaphore name; failures, per Redis server (ended when Redis answers).
refusals = Bursts(quiet=REFUSAL_QUIET)
failures = Bursts(quiet=None)


@receiver(setting_changed)
def _reset_bursts(*, setting: str, **kwargs: Any) -> None:
    if setting in ("SEMAPHORE_REDIS", "CACHES"):
        failures.reset()
    if setting in ("SEMAPHORES", "SEMAPHORE_KEY_PREFIX", "SEMAPHORE_REDIS", "CACHES"):
        refusals.reset()


def printable(text: object) -> str:
    """``text`` made safe for one log line: unprintable characters escaped.

    Control characters (``\\n``, ``\\r``, ``\\x1b``...), Unicode line
    separators and format characters (bidi overrides) are written as Python
    escapes, and a backslash is doubled so an escape cannot be forged;
    printable non-ASCII text stays readable.  A client controls the path and
    header values: raw, they could start a forged log line or drive a terminal.
    """
    text = str(text)
    if text.isprintable() and "\\" not in text:  # the common case, without a copy
        return text
    return "".join(
        char if char.isprintable() and char != "\\" else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def describe(request: HttpRequest) -> str:
    """The request as a log line shows it: method and (the start of the) path, escaped."""
    return f"{printable(request.method)} {printable(request.path[:PATH_LOG_LENGTH])}"
