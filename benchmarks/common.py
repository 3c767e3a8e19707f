"""Helpers shared by the benchmark sections: Django set-up, timing, statistics."""

import os
import random
import statistics
import time

ALGORITHMS = ("lua", "fair_locked", "fair", "basic")
#: The seed's contender in the cycle rows (Redis in Action 11.2.3's Lua acquire and a ZREM), by its name.
SEED = "seed Lua + ZREM"
META = None  # the app still stores {"host", "pid"} with every holder
#: Seconds from the last contending process ready to the start of a contended run
#: (contention._Gate for forked Python processes, peers.node_workers for node).
START_LEAD = 0.2


def setup_django(redis_url):
    """Configure Django with benchmarks.settings against ``redis_url``."""
    os.environ["BENCH_REDIS_URL"] = redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()


def median(values):
    return statistics.median(values) if values else float("nan")


def percentile(values, p):
    """Nearest-rank percentile (p in 0..100) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100.0 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def rate(fn, seconds, batch=25):
    """Calls of ``fn`` per second over about ``seconds``."""
    count = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(batch):
            fn()
        count += batch
        now = time.perf_counter()
        if now >= end:
            return count / (now - start)


def interleaved(contenders, rounds, seconds, base="floor"):
    """Rates of every contender, each measured right after a shorter run of ``base``.

    Returns ``(rates, relative)``: ``rates[name]`` is the rate per round, and
    ``relative[name]`` the rate per round divided by the ``base`` rate measured
    just before it.  The machine's load drifts (other jobs share the cores), so
    a ratio to the adjacent floor is far steadier than a ratio of medians.
    The order rotates from round to round.
    """
    names = [name for name in contenders if name != base]
    rates = {name: [0.0] * rounds for name in names}
    relative = {name: [0.0] * rounds for name in names}
    rates[base], relative[base] = [], [1.0] * rounds
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            floor = rate(contenders[base], seconds / 2)
            rates[base].append(floor)
            rates[name][r] = rate(contenders[name], seconds)
            relative[name][r] = rates[name][r] / floor
    return rates, relative


def paired(fn, other, pairs, seconds):
    """Rate of ``fn`` over that of ``other``, measured as pairs of adjacent runs.

    Each pair runs the two for ``seconds`` each, one right after the other,
    in ABBA order (the order swaps from pair to pair, so neither always runs
    first, after the other has warmed the caches or the machine's load has
    moved).  Returns the per-pair ratios, sorted: their median is the figure,
    their quartiles its spread.  Two contenders alone, back to back, for a
    goal that compares just those two: ``interleaved``'s ratio of two
    contenders measured apart within a round moves by several percent from
    run to run on a loaded machine.
    """
    ratios = []
    for p in range(pairs):
        mine, theirs = in_turn(p, lambda: rate(fn, seconds), lambda: rate(other, seconds))
        ratios.append(mine / theirs)
    return sorted(ratios)


def in_turn(p, mine, other):
    """Run ``mine()`` and ``other()`` back to back, ``mine`` first in an even pair
    ``p`` and second in an odd one (ABBA: neither always runs first); their
    results, ``mine``'s first."""
    if p % 2 == 0:
        first = mine()
        return first, other()
    second = other()
    return mine(), second


def quartiles(values):
    """(lower quartile, median, upper quartile) of ``values``."""
    if len(values) < 2:
        x = median(values)
        return x, x, x
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3


def ratio_of_medians(mine, other, resamples=2000):
    """median(mine) / median(other) over paired measurements, with its spread:
    (lower quartile, figure, upper quartile), the quartiles those of the same
    ratio over ``resamples`` resamplings of the pairs (with replacement, a
    fixed seed: the same data gives the same figures)."""
    figure = median(mine) / median(other)
    pick = random.Random(0).choices
    n = len(mine)
    estimates = []
    for _ in range(resamples):
        drawn = pick(range(n), k=n)
        below = median([other[i] for i in drawn])
        if below > 0:
            estimates.append(median([mine[i] for i in drawn]) / below)
    q1, _, q3 = quartiles(estimates)
    return q1, figure, q3


def ratio(relative, name, other):
    """Median over rounds of relative[name] / relative[other] (each against its adjacent floor)."""
    return median([a / b for a, b in zip(relative[name], relative[other], strict=True) if b])


def sweep(intervals, limit):
    """Moments above ``limit`` and the peak, over (start, end) hold intervals.

    A moment is each grant that raised the number of overlapping holds above
    the limit.  Ends sort before starts at the same instant.
    """
    events = sorted(
        [(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1])
    )
    live = peak = above = 0
    for _, step in events:
        live += step
        if step > 0 and live > limit:
            above += 1
        peak = max(peak, live)
    return above, peak
