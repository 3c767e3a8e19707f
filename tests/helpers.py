"""Small helpers shared by the engine tests."""

import time


def wait_until(predicate, timeout=10.0, interval=0.02, message="condition"):
    """Poll ``predicate`` until it returns a true value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} not reached within {timeout}s")
        time.sleep(interval)


def max_overlap(intervals):
    """Sweep line over (start, end) intervals.

    Returns ``(maximum concurrency, starts)`` where ``starts`` lists, for
    every interval start, how many intervals were open just after it (ends
    sort before starts at equal times, so touching intervals do not overlap).
    """
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    open_now = peak = 0
    levels = []
    for _, delta in events:
        open_now += delta
        if delta > 0:
            levels.append(open_now)
        peak = max(peak, open_now)
    return peak, levels
