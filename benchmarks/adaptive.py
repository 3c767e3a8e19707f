"""Adaptive limit (issue 17): does ADAPTIVE find a shared resource's knee, hold it, and follow it?

The resource is simulated and shared by every caller process: its in-flight
count ``n`` is a multiprocessing shared value, and a call entering it when
``n`` calls are in flight (itself included) lasts ``BASE x max(1, n / KNEE)``:
20 ms up to KNEE = 8 in flight, then longer in proportion (twice as long at
16, four times at 32). Its throughput is ``min(n, KNEE) / BASE`` (400 calls/s
at the knee): more than KNEE in flight adds only latency. The knee is a
shared value too, moved from 8 to 4 in one scenario.

32 callers (2 processes x 16 threads) loop acquire (queueing up to WAIT) ->
call the resource -> release, on one semaphore through the app against a
real Redis. Scenarios: ADAPTIVE starting at limit 2, at 48, and at 2 with the
knee moving 8 -> 4 once settled; static limits 4..16 (the best static
throughput is the yardstick); and the peer, Netflix concurrency-limits'
Gradient2Limit re-implemented in each process (:class:`Gradient2`) guarding
a local threading semaphore of its own limit: the processes do not know of
each other, so the limit that matters is the SUM of theirs.

The parent samples every SAMPLE seconds the limit in force (the Semaphore's
``effective()``; the sum of the per-process limits for the peer), the
resource's in-flight count and the knee; every call records its end time and
its own latency (not the wait for a slot).

``python -m benchmarks.adaptive [--quick] [--chart PATH] [--json PATH]`` runs
it alone against a throwaway redis-server; ``measure(redis_url)`` returns the
figures for ``python -m benchmarks``.
"""

import argparse
import json
import math
import multiprocessing
import os
import sys
import threading
import time
import uuid

from .common import median, setup_django

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BASE = 0.020  # seconds: a call's latency up to KNEE in flight
KNEE = 8
MOVED_KNEE = 4
PROCESSES = 2
THREADS = 16  # per process: 32 callers
WAIT = 30  # seconds a caller queues for a slot (never reached: no caller is refused)
TIMEOUT = 10  # lease TIMEOUT
SAMPLE = 0.25  # seconds between samples
ADAPTIVE = {"MIN": 1, "MAX": 64, "INTERVAL": 1.0, "TOLERANCE": 1.25, "MIN_SAMPLES": 10}
BAND = (6, 12)  # "settled": the limit in force within this range
FOLLOWED = 6  # the knee moved to 4 is "followed" once the limit is <= this
STATIC = (4, 6, 8, 10, 12, 16)
GRADIENT2 = {"initial": 1, "min": 1, "max": 64}  # per process

TARGETS = {
    "settle_s": 30.0,  # from 2 and from 48, into BAND
    "settled_spread": 2,  # min..max of the settled limit within +-2 of its median
    "vs_best_static": 0.9,  # throughput once settled / best static throughput
    "p50_vs_base": 1.5,  # the work's own p50 latency once settled / BASE
    "follow_s": 10.0,  # knee 8 -> 4: limit <= FOLLOWED within this
}


def durations(quick):
    """Seconds per scenario, and when the knee moves in the "knee" scenario."""
    if quick:
        return {"run": 10.0, "knee_run": 14.0, "knee_at": 6.0, "static": 1.2}
    return {"run": 30.0, "knee_run": 35.0, "knee_at": 15.0, "static": 4.0}


# -- the resource --------------------------------------------------------------------------------------


class Resource:
    """The shared resource: latency BASE x max(1, n / knee) for a call entering with n in flight."""

    def __init__(self, ctx):
        self.inflight = ctx.Value("i", 0)
        self.knee = ctx.Value("d", float(KNEE))

    def call(self):
        """One call; returns its latency in seconds, measured (sleep overshoot included)."""
        lock = self.inflight.get_lock()
        with lock:
            self.inflight.value += 1
            n = self.inflight.value
        started = time.monotonic()
        try:
            time.sleep(BASE * max(1.0, n / self.knee.value))
            return time.monotonic() - started
        finally:
            with lock:
                self.inflight.value -= 1


# -- the peer: Gradient2 -------------------------------------------------------------------------------


class ExpAvg:
    """concurrency-limits' ExpAvgMeasurement: a plain mean for the first ``warmup`` samples,
    then an EMA with factor 2 / (window + 1)."""

    def __init__(self, window, warmup):
        self.window, self.warmup = window, warmup
        self.value = 0.0
        self.total = 0.0
        self.count = 0

    def add(self, sample):
        if self.count < self.warmup:
            self.count += 1
            self.total += sample
            self.value = self.total / self.count
        else:
            factor = 2.0 / (self.window + 1)
            self.value = self.value * (1 - factor) + sample * factor
        return self.value


class Gradient2:
    """Gradient2Limit of Netflix concurrency-limits (``_update``), one sample at a time.

    longRtt is an EMA over ~600 samples; shortRtt the sample itself;
    ``gradient = max(0.5, min(1, tolerance x longRtt / shortRtt))``;
    ``new = limit x gradient + queueSize``, smoothed by 0.2, kept in [min, max].
    The long RTT decays by 5 % a sample while it is more than twice the short
    one, and the limit does not grow while fewer than half of it are in flight
    ("app limited"). queueSize is sqrt(limit), as in Gradient (the original
    Gradient2 builder's default is a constant 4; sqrt is the smaller below 16).
    """

    def __init__(self, initial, minimum, maximum, tolerance=1.5, smoothing=0.2, window=600, warmup=10):
        self.limit = float(initial)
        self.minimum, self.maximum = minimum, maximum
        self.tolerance, self.smoothing = tolerance, smoothing
        self.long_rtt = ExpAvg(window, warmup)

    def sample(self, rtt, inflight):
        """Update from one call's ``rtt`` with ``inflight`` calls in flight when it started."""
        queue = math.sqrt(self.limit)
        short = rtt
        long = self.long_rtt.add(rtt)
        if long / short > 2:
            self.long_rtt.value *= 0.95
        if inflight < self.limit / 2:
            return self.limit
        gradient = max(0.5, min(1.0, self.tolerance * long / short))
        new = self.limit * gradient + queue
        new = self.limit * (1 - self.smoothing) + new * self.smoothing
        self.limit = max(self.minimum, min(self.maximum, new))
        return self.limit


class LocalLimiter:
    """A blocking limiter in one process: at most int(gradient.limit) calls at once (like
    concurrency-limits' BlockingLimiter over a SimpleLimiter)."""

    def __init__(self, gradient, report):
        self.gradient = gradient
        self.report = report  # called with the new limit after every sample
        self.inflight = 0
        self.cond = threading.Condition()
        report(int(gradient.limit))

    def acquire(self):
        with self.cond:
            while self.inflight >= int(self.gradient.limit):
                self.cond.wait()
            self.inflight += 1
            return self.inflight

    def release(self, rtt, inflight):
        with self.cond:
            self.inflight -= 1
            self.report(int(self.gradient.sample(rtt, inflight)))
            self.cond.notify_all()


# -- the caller processes ------------------------------------------------------------------------------


def _semaphore(job):
    from django_semaphore import Semaphore

    options = {"wait": WAIT}
    if job.get("adaptive"):
        options["adaptive"] = job["adaptive"]
    return Semaphore(job["name"], limit=job["limit"], timeout=TIMEOUT, **options)


def _run(job, index, resource, limits):
    """One process's share of a scenario: THREADS callers; returns (calls, refusals, errors)."""
    start_at = job["start_at"]
    end = start_at + job["duration"]
    calls = []  # (end time, latency) per call; list.append is atomic
    counts = {"refusals": 0, "errors": 0}
    monotonic = time.monotonic
    limiter = sem = None
    if job["kind"] == "gradient2":

        def report(limit):
            limits[index] = limit

        g = GRADIENT2
        limiter = LocalLimiter(Gradient2(g["initial"], g["min"], g["max"]), report)
    else:
        sem = _semaphore(job)
        sem.available()  # connect before the start

    def caller():
        while monotonic() < start_at:
            time.sleep(0.001)
        while monotonic() < end:
            if limiter is not None:
                inflight = limiter.acquire()
                rtt = resource.call()
                limiter.release(rtt, inflight)
                calls.append((monotonic(), rtt))
                continue
            try:
                lease = sem.acquire()
            except Exception:
                counts["errors"] += 1
                time.sleep(0.01)
                continue
            if lease is None:
                counts["refusals"] += 1
                continue
            try:
                if monotonic() >= end:
                    break
                latency = resource.call()
            finally:
                lease.release()
            calls.append((monotonic(), latency))

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return calls, counts["refusals"], counts["errors"]


def _process(index, redis_url, resource, limits, commands, out):
    setup_django(redis_url)
    out.put(("ready", index, None))
    while True:
        job = commands.get()
        if job is None:
            return
        try:
            out.put(("done", index, _run(job, index, resource, limits)))
        except BaseException as exc:  # reported, not swallowed: the parent raises it
            out.put(("failed", index, repr(exc)))
            raise


class Callers:
    """PROCESSES spawned processes that run one scenario after another on command."""

    def __init__(self, redis_url):
        ctx = multiprocessing.get_context("spawn")
        self.resource = Resource(ctx)
        self.limits = ctx.Array("i", PROCESSES)
        self.out = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(PROCESSES)]
        self.processes = [
            ctx.Process(
                target=_process,
                args=(i, redis_url, self.resource, self.limits, self.commands[i], self.out),
                daemon=True,
            )
            for i in range(PROCESSES)
        ]
        for p in self.processes:
            p.start()
        for _ in self.processes:
            self._get("ready", 120)

    def _get(self, expected, timeout):
        kind, index, payload = self.out.get(timeout=timeout)
        if kind == "failed":
            raise RuntimeError(f"caller process {index} failed: {payload}")
        assert kind == expected, (kind, expected)
        return payload

    def run(self, job, reader):
        """Run ``job`` in every process; sample ``reader()`` (the limit) every SAMPLE seconds."""
        resource = self.resource
        resource.knee.value = float(KNEE)
        job = dict(job, start_at=time.monotonic() + 0.5)
        for q in self.commands:
            q.put(job)
        start_at, end = job["start_at"], job["start_at"] + job["duration"]
        knee_at = start_at + job["knee_at"] if job.get("knee_at") is not None else None
        samples = []  # (t, limit, in flight, knee)
        tick = start_at
        while tick <= end:
            now = time.monotonic()
            if tick > now:
                time.sleep(tick - now)
            if knee_at is not None and time.monotonic() >= knee_at:
                resource.knee.value = float(MOVED_KNEE)
                knee_at = None
            samples.append((tick - start_at, reader(), resource.inflight.value, resource.knee.value))
            tick += SAMPLE
        results = [self._get("done", job["duration"] + WAIT + 60) for _ in self.processes]
        resource.knee.value = float(KNEE)
        calls = sorted((t - start_at, latency) for r in results for t, latency in r[0])
        return {
            "samples": samples,
            "calls": calls,
            "refusals": sum(r[1] for r in results),
            "errors": sum(r[2] for r in results),
            "duration": job["duration"],
        }

    def close(self):
        for q in self.commands:
            q.put(None)
        for p in self.processes:
            p.join(timeout=30)


# -- the figures ---------------------------------------------------------------------------------------


def _calls_between(calls, start, end):
    return [latency for t, latency in calls if start <= t < end]


def _window(run, start, end):
    """Throughput, p50 latency and median in flight over [start, end) seconds of a run."""
    latencies = _calls_between(run["calls"], start, end)
    inflight = [n for t, _, n, _ in run["samples"] if start <= t < end]
    span = max(end - start, 1e-9)
    p50 = median(latencies)
    return {
        "calls_per_s": len(latencies) / span,
        "p50_ms": p50 * 1000,
        "p50_vs_base": p50 / BASE,
        "inflight_median": median(inflight),
    }


def _settling(samples, start=0.0, band=BAND):
    """Seconds after ``start`` from which the limit stays within ``band`` to the end (None: never)."""
    after = [(t, limit) for t, limit, _, _ in samples if t >= start]
    settled = None
    for t, limit in after:
        if band[0] <= limit <= band[1]:
            if settled is None:
                settled = t
        else:
            settled = None
    return None if settled is None else settled - start


def _first(samples, test, start=0.0):
    for t, limit, _, _ in samples:
        if t >= start and test(limit):
            return t - start
    return None


def _settled(run, settle_s, start=0.0, end=None):
    """The settling time and the steady state: the limit's range, throughput and p50 over
    the second half of [start, end), or from the settling time if that is later."""
    end = run["duration"] if end is None else end
    begin = max(start + (end - start) / 2, start + (settle_s or 0.0))
    limits = [limit for t, limit, _, _ in run["samples"] if begin <= t <= end]
    med = median(limits)
    figures = {
        "settle_s": settle_s,
        "first_in_band_s": _first(run["samples"], lambda x: BAND[0] <= x <= BAND[1], start),
        "from_s": begin,
        "limit_min": min(limits) if limits else None,
        "limit_max": max(limits) if limits else None,
        "limit_median": med,
        "spread": max(max(limits) - med, med - min(limits)) if limits else None,
    }
    figures.update(_window(run, begin, end))
    return figures


def summarise(runs):
    """The figures of issue 17 from the raw runs (see TARGETS)."""
    static = {
        limit: _window(runs[f"static {limit}"], 0.5, runs[f"static {limit}"]["duration"]) for limit in STATIC
    }
    best_limit = max(static, key=lambda limit: static[limit]["calls_per_s"])
    best = static[best_limit]["calls_per_s"]
    figures = {"static": static, "best_static_limit": best_limit, "best_static_calls_per_s": best}
    for name in ("from 2", "from 48"):
        run = runs[name]
        row = _settled(run, _settling(run["samples"]))
        row["vs_best_static"] = row["calls_per_s"] / best
        figures[name] = row
    run = runs["knee 8 -> 4"]
    knee_at = run["knee_at"]
    before = _settled(run, _settling([s for s in run["samples"] if s[0] < knee_at]), end=knee_at)
    follow = _first(run["samples"], lambda x: x <= FOLLOWED, knee_at)
    after = _window(run, knee_at + (follow or 0), run["duration"])
    limits_after = [limit for t, limit, _, _ in run["samples"] if t >= knee_at + (follow or 0)]
    after.update(
        follow_s=follow,
        limit_median=median(limits_after),
        limit_min=min(limits_after) if limits_after else None,
        limit_max=max(limits_after) if limits_after else None,
    )
    figures["knee 8 -> 4"] = {"knee_at_s": knee_at, "before": before, "after": after}
    # The peer against ours from 2, both over their second half.
    for name, key in (("gradient2", "gradient2"), ("from 2", "ours")):
        run = runs[name]
        half = run["duration"] / 2
        row = _window(run, half, run["duration"])
        limits = [limit for t, limit, _, _ in run["samples"] if t >= half]
        row["limit_median"] = median(limits)
        row["limit_max"] = max(limits) if limits else None
        row["inflight_vs_knee"] = row["inflight_median"] / KNEE
        row["vs_best_static"] = row["calls_per_s"] / best
        figures.setdefault("peer", {})[key] = row
    figures["refusals"] = sum(r["refusals"] for r in runs.values())
    figures["errors"] = sum(r["errors"] for r in runs.values())
    return figures


# -- the run -------------------------------------------------------------------------------------------


def measure(redis_url, quick=False, say=None):
    """Every scenario against the Redis at ``redis_url``: {"runs": raw series, "figures": ...}."""
    from django.conf import settings

    if not settings.configured:
        setup_django(redis_url)
    say = say or (lambda text: None)
    d = durations(quick)
    tag = uuid.uuid4().hex[:6]
    plan = [
        ("from 2", {"kind": "ours", "limit": 2, "adaptive": ADAPTIVE, "duration": d["run"]}),
        ("from 48", {"kind": "ours", "limit": 48, "adaptive": ADAPTIVE, "duration": d["run"]}),
        (
            "knee 8 -> 4",
            {
                "kind": "ours",
                "limit": 2,
                "adaptive": ADAPTIVE,
                "duration": d["knee_run"],
                "knee_at": d["knee_at"],
            },
        ),
    ]
    plan += [(f"static {n}", {"kind": "static", "limit": n, "duration": d["static"]}) for n in STATIC]
    plan.append(("gradient2", {"kind": "gradient2", "limit": 0, "duration": d["run"]}))
    callers = Callers(redis_url)
    runs = {}
    try:
        for name, job in plan:
            job = dict(job, name=f"adaptive-bench-{tag}-{name.replace(' ', '')}")
            say(f"adaptive: {name} ({job['duration']:.0f} s)")
            if job["kind"] == "gradient2":
                limits = callers.limits
                reader = lambda limits=limits: sum(limits[:])  # noqa: E731
            elif job["kind"] == "static":
                reader = lambda n=job["limit"]: n  # noqa: E731
            else:
                sem = _semaphore(job)
                reader = lambda sem=sem: sem.effective(fresh=True).limit  # noqa: E731
            run = callers.run(job, reader)
            run.update(kind=job["kind"], start_limit=job["limit"], knee_at=job.get("knee_at"))
            runs[name] = run
    finally:
        callers.close()
    return {"quick": quick, "model": model(), "runs": runs, "figures": summarise(runs)}


def model():
    return {
        "base_ms": BASE * 1000,
        "knee": KNEE,
        "moved_knee": MOVED_KNEE,
        "callers": PROCESSES * THREADS,
        "processes": PROCESSES,
        "adaptive": ADAPTIVE,
        "gradient2": GRADIENT2,
    }


# -- the table and the chart ---------------------------------------------------------------------------


def _f(value, spec=".1f"):
    return "-" if value is None or value != value else format(value, spec)


def _verdict(ok):
    return "met" if ok else "NOT met"


def _goal(value, op, goal, unit=""):
    """``"<= 10 s: met"``: ``value`` against ``goal`` (None is never met)."""
    ok = value is not None and value == value and (value <= goal if op == "<=" else value >= goal)
    return f"{op} {goal:g}{unit}: {_verdict(ok)}"


def _range(row):
    return f"{_f(row['limit_min'], 'g')}..{_f(row['limit_max'], 'g')} ({_f(row['limit_median'], 'g')})"


def rows(result):
    """(section, measure, figure, ratio, target) rows, the shape of benchmarks/report.py's table."""
    f = result["figures"]
    out = []
    for name in ("from 2", "from 48"):
        row = f[name]
        s = row["settle_s"]
        out.append(
            (
                f"adaptive {name}",
                f"seconds to settle into {BAND[0]}..{BAND[1]}",
                _f(s),
                "",
                _goal(s, "<=", TARGETS["settle_s"], " s"),
            )
        )
        spread = row["spread"]
        out.append(
            (
                f"adaptive {name}",
                "steady limit min..max (median)",
                _range(row),
                "",
                _goal(spread, "<=", TARGETS["settled_spread"]).replace("<=", "spread <=", 1),
            )
        )
        out.append(
            (
                f"adaptive {name}",
                "steady calls/s, x best static",
                _f(row["calls_per_s"], ".0f"),
                _f(row["vs_best_static"], ".2f"),
                _goal(row["vs_best_static"], ">=", TARGETS["vs_best_static"]),
            )
        )
        out.append(
            (
                f"adaptive {name}",
                "steady resource p50 ms, x BASE",
                _f(row["p50_ms"]),
                _f(row["p50_vs_base"], ".2f"),
                _goal(row["p50_vs_base"], "<=", TARGETS["p50_vs_base"]),
            )
        )
    knee = f["knee 8 -> 4"]
    follow = knee["after"]["follow_s"]
    out.append(
        (
            "adaptive knee 8 -> 4",
            f"seconds to limit <= {FOLLOWED}",
            _f(follow),
            "",
            _goal(follow, "<=", TARGETS["follow_s"], " s"),
        )
    )
    after = knee["after"]
    out.append(
        (
            "adaptive knee 8 -> 4",
            "limit after, min..max (median)",
            _range(after),
            "",
            "",
        )
    )
    out.append(
        (
            "adaptive knee 8 -> 4",
            "calls/s after, p50 x BASE",
            _f(after["calls_per_s"], ".0f"),
            _f(after["p50_vs_base"], ".2f"),
            f"(knee 4: {MOVED_KNEE / BASE:.0f}/s at 1.00)",
        )
    )
    for limit, row in f["static"].items():
        best = " (best)" if limit == f["best_static_limit"] else ""
        out.append(
            (
                "static limit",
                f"{limit}{best}: calls/s, p50 x BASE",
                _f(row["calls_per_s"], ".0f"),
                _f(row["p50_vs_base"], ".2f"),
                "",
            )
        )
    peer = f["peer"]
    for key, label in (("ours", "ours from 2"), ("gradient2", "Gradient2 per process")):
        row = peer[key]
        out.append(
            (
                "adaptive vs peer",
                f"{label}: limit (sum) median / max",
                f"{_f(row['limit_median'], 'g')} / {_f(row['limit_max'], 'g')}",
                "",
                "",
            )
        )
        out.append(
            (
                "adaptive vs peer",
                f"{label}: in flight median, x knee",
                _f(row["inflight_median"], "g"),
                _f(row["inflight_vs_knee"], ".2f"),
                "",
            )
        )
        out.append(
            (
                "adaptive vs peer",
                f"{label}: calls/s, p50 x BASE",
                _f(row["calls_per_s"], ".0f"),
                _f(row["p50_vs_base"], ".2f"),
                "",
            )
        )
    less = peer["ours"]["inflight_median"] < peer["gradient2"]["inflight_median"]
    out.append(
        ("adaptive vs peer", "ours overshoots the knee less", "yes" if less else "no", "", _verdict(less))
    )
    return out


def table(result):
    """The rows as a reStructuredText simple table."""
    header = ("section", "measure", "figure", "ratio", "target")
    body = rows(result)
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(5)]
    rule = "  ".join("=" * w for w in widths)
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([rule, line(header), rule, *map(line, body), rule])


def _series(run, bucket=1.0):
    """Throughput and p50 latency per ``bucket`` seconds of a run."""
    n = int(math.ceil(run["duration"] / bucket))
    per = [[] for _ in range(n)]
    for t, latency in run["calls"]:
        i = int(t // bucket)
        if 0 <= i < n:
            per[i].append(latency)
    xs = [(i + 0.5) * bucket for i in range(n)]
    return xs, [len(p) / bucket for p in per], [median(p) / BASE if p else float("nan") for p in per]


def _after(seconds):
    return "never" if seconds is None else f"after {seconds:.1f} s"


def draw(result, path, summary=""):
    """docs/images/adaptive.png: the limit over time in each scenario, ours and the peer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, f = result["runs"], result["figures"]
    fig, axes = plt.subplots(3, 2, figsize=(11, 10), dpi=100)
    blue, grey, red, orange = "#1f6feb", "#8c959f", "#cf222e", "#d4770c"

    def limit_panel(ax, name, title):
        run = runs[name]
        ts = [s[0] for s in run["samples"]]
        ax.axhspan(*BAND, color="#2da44e", alpha=0.08, label=f"{BAND[0]}..{BAND[1]}")
        ax.step(ts, [s[3] for s in run["samples"]], where="post", color=red, ls="--", lw=1, label="knee")
        ax.plot(ts, [s[2] for s in run["samples"]], color=grey, lw=0.8, label="in flight")
        ax.step(ts, [s[1] for s in run["samples"]], where="post", color=blue, lw=1.8, label="limit")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("s", fontsize=8)
        ax.set_ylim(0, max(50, run["start_limit"] + 2) if name == "from 48" else 34)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)

    row = f["from 2"]
    limit_panel(axes[0][0], "from 2", f"ADAPTIVE from limit 2: settled {_after(row['settle_s'])}")
    axes[0][0].legend(fontsize=7, loc="upper right")
    row = f["from 48"]
    limit_panel(axes[0][1], "from 48", f"ADAPTIVE from limit 48: settled {_after(row['settle_s'])}")
    knee = f["knee 8 -> 4"]
    limit_panel(
        axes[1][0],
        "knee 8 -> 4",
        f"knee 8 -> 4 at {knee['knee_at_s']:.0f} s: limit <= {FOLLOWED} " + _after(knee["after"]["follow_s"]),
    )
    ax = axes[1][1]
    ours, peer = runs["from 2"], runs["gradient2"]
    ax.axhline(KNEE, color=red, ls="--", lw=1, label="knee")
    ax.step(
        [s[0] for s in peer["samples"]],
        [s[1] for s in peer["samples"]],
        where="post",
        color=orange,
        lw=1.8,
        label=f"Gradient2 x {PROCESSES}: sum of limits",
    )
    ax.plot(
        [s[0] for s in peer["samples"]],
        [s[2] for s in peer["samples"]],
        color=orange,
        lw=0.8,
        alpha=0.6,
        label="Gradient2: in flight",
    )
    ax.step(
        [s[0] for s in ours["samples"]],
        [s[1] for s in ours["samples"]],
        where="post",
        color=blue,
        lw=1.8,
        label="ours: limit",
    )
    ax.plot(
        [s[0] for s in ours["samples"]],
        [s[2] for s in ours["samples"]],
        color=blue,
        lw=0.8,
        alpha=0.6,
        label="ours: in flight",
    )
    ax.set_title("ours vs per-process Gradient2 (both from 2 in all)", fontsize=9)
    ax.set_ylim(0, 70)
    ax.set_xlabel("s", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)

    compared = (("from 2", blue), ("from 48", "#54aeff"), ("knee 8 -> 4", "#0a3069"), ("gradient2", orange))
    ax = axes[2][0]
    for name, colour in compared:
        xs, rate, _ = _series(runs[name])
        ax.plot(xs, rate, color=colour, lw=1.2, label=name)
    ax.axhline(
        f["best_static_calls_per_s"],
        color=grey,
        ls=":",
        lw=1,
        label=f"best static (limit {f['best_static_limit']})",
    )
    ax.set_title("throughput, calls/s per second", fontsize=9)
    ax.set_xlabel("s", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    ax = axes[2][1]
    for name, colour in compared:
        xs, _, p50 = _series(runs[name])
        ax.plot(xs, p50, color=colour, lw=1.2, label=name)
    ax.axhline(TARGETS["p50_vs_base"], color=red, ls=":", lw=1, label=f"{TARGETS['p50_vs_base']} x BASE")
    ax.set_title("the resource's p50 latency, x BASE (20 ms)", fontsize=9)
    ax.set_xlabel("s", fontsize=8)
    ax.set_ylim(0, 5)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    fig.suptitle(
        f"django-semaphore ADAPTIVE: {PROCESSES * THREADS} callers in {PROCESSES} processes, "
        f"latency BASE x max(1, in flight / knee)\n{summary}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.adaptive", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="shorter scenarios (a smoke run, about a minute)"
    )
    parser.add_argument(
        "--chart",
        metavar="PATH",
        default=os.path.join(ROOT, "docs", "images", "adaptive.png"),
        help="where to write the chart (default docs/images/adaptive.png; '' for none)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures and series as JSON")
    args = parser.parse_args(argv)
    from tests.support.servers import RedisServer

    started = time.monotonic()
    server = RedisServer().start()
    try:

        def say(text):
            print(f"[{time.monotonic() - started:6.1f}s] {text}", file=sys.stderr, flush=True)

        setup_django(server.url)
        from django_semaphore.backend import connection

        version = connection.get_client().info("server")["redis_version"]
        result = measure(server.url, quick=args.quick, say=say)
        elapsed = time.monotonic() - started
        python = sys.version.split()[0]
        summary = f"{os.cpu_count()} cores, Redis {version}, Python {python}; run took {elapsed:.0f} s"
        result["summary"] = summary
        print(summary)
        print(table(result))
        if args.chart:
            draw(result, args.chart, summary)
            say(f"chart written to {args.chart}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
