"""Contention: N processes hammer one LIMIT 5 semaphore; holds are checked with a sweep line.

Each process loops acquire -> hold HOLD seconds -> release, retrying at once
when refused, and records its hold intervals with time.monotonic() (one clock
for every process on the machine).  An interval runs from acquire() returning
to release() being called, so it lies inside the real server-side hold: any
overlap above LIMIT is a real over-admission.
"""

import multiprocessing
import time
import uuid
from functools import partial

from .common import ALGORITHMS, START_LEAD, in_turn, sweep

LIMIT = 5
HOLD = 0.001  # seconds a granted process keeps its slot
PROCESSES = (1, 4, 16, 32)


def _worker(name, algorithm, gate, duration, out):
    from django_semaphore import Semaphore
    from django_semaphore.backend import connection

    connection.reset()  # never share the parent's sockets
    sem = Semaphore(name, limit=LIMIT, timeout=10, algorithm=algorithm)
    connection.get_client().ping()  # connected before the start
    start_at = gate.wait()
    grants = refusals = errors = 0
    intervals = []
    monotonic, sleep = time.monotonic, time.sleep
    while monotonic() < start_at:
        sleep(0.0005)
    end = start_at + duration
    while monotonic() < end:
        try:
            lease = sem.acquire()
        except Exception:
            errors += 1
            continue
        if lease is None:
            refusals += 1
            continue
        held_from = monotonic()
        sleep(HOLD)
        held_to = monotonic()
        lease.release()
        intervals.append((held_from, held_to))
        grants += 1
    out.put((grants, refusals, errors, intervals))


def run(algorithm, processes, duration):
    name = f"contention-{algorithm}-{processes}-{uuid.uuid4().hex[:6]}"
    results = _forked(_worker, lambda n, gate: (name, algorithm, gate, duration), processes, duration + 60)
    grants = sum(r[0] for r in results)
    refusals = sum(r[1] for r in results)
    errors = sum(r[2] for r in results)
    intervals = [i for r in results for i in r[3]]
    above, peak = sweep(intervals, LIMIT)
    return {
        "grants_per_s": grants / duration,
        "refusals_per_s": refusals / duration,
        "errors": errors,
        "above_limit": above,
        "peak": peak,
    }


def measure(duration, processes=PROCESSES):
    return {(a, n): run(a, n, duration) for a in ALGORITHMS for n in processes}


# Goal 3 (issue 15): PROCESSES_GOAL processes, each looping request -> wait for
# a slot -> hold HOLD -> release, ours and the peers side by side.  Ours waits in
# its queue (``acquire(wait=...)``); every peer waits its own way, with its
# defaults.  Each process records (requested, granted, released) on
# time.monotonic() (CLOCK_MONOTONIC, the clock node's hrtime reads too).
PROCESSES_GOAL = 16
WAIT = 30.0  # seconds: long enough that no request in a run gives up
FIFO_MARGIN = 0.001  # seconds: an earlier request counts as earlier only by more than this


def _waiting_worker(kind, name, limit, gate, duration, out):
    from django_semaphore import Semaphore
    from django_semaphore.backend import connection

    from .peers import blocking_mutex

    connection.reset()  # never share the parent's sockets
    if kind == "ours":
        sem = Semaphore(name, limit=limit, timeout=10, wait=WAIT)

        def acquire():
            lease = sem.acquire(wait=WAIT)
            if lease is None:
                raise RuntimeError(f"{name}: no slot within {WAIT} s")
            # The server's record of order: the grant's fencing token, and the
            # ticket number it queued with ("" when granted at once).
            return lease.release, (lease.token, int(lease.ticket) if lease.ticket else None)

    else:
        take, give = blocking_mutex(kind, connection.get_client(), name)

        def acquire():
            if not take():
                raise RuntimeError(f"{kind}: no lock within 60 s")
            return give, None

    # Connected, scripts loaded, threads started before the start, as the node
    # peer's workers are (bench.js: one acquire and release, then "ready").
    release, _ = acquire()
    release()
    start_at = gate.wait()
    triples = []
    monotonic, sleep = time.monotonic, time.sleep
    while monotonic() < start_at:
        sleep(0.0005)
    end = start_at + duration
    while monotonic() < end:
        requested = monotonic()
        release, token = acquire()
        granted = monotonic()
        sleep(HOLD)
        released = monotonic()
        release()
        triples.append(
            (requested, granted, released) if token is None else (requested, granted, released, *token)
        )
    out.put(triples)


class _Gate:
    """One start time for forked processes, set once every one of them is ready.

    A process calls :meth:`wait` when it is ready (connected, warmed up) and
    gets the start time; the parent's :meth:`open` waits for all of them, then
    sets it :data:`START_LEAD` ahead, as :func:`peers.node_workers` starts the
    node peer's processes: no contender's start-up is measured.  (A start time
    fixed when the processes were forked counted each Python process's first
    acquire, with its start-up, and the node peer's not.)
    """

    def __init__(self, ctx):
        self._ready = ctx.Semaphore(0)
        self._go = ctx.Event()
        self._at = ctx.Value("d", 0.0)

    def wait(self):
        self._ready.release()
        self._go.wait()
        return self._at.value

    def open(self, processes, timeout):
        for _ in range(processes):
            if not self._ready.acquire(timeout=timeout):
                raise RuntimeError(f"a forked process was not ready within {timeout} s")
        self._at.value = time.monotonic() + START_LEAD
        self._go.set()


def _forked(target, args_of, processes, timeout):
    """Run ``target(*args_of(n, gate), out)`` in ``processes`` forked processes that
    start together at the time ``gate.wait()`` gives them (see :class:`_Gate`);
    the value each puts on ``out``."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    gate = _Gate(ctx)
    workers = [ctx.Process(target=target, args=(*args_of(n, gate), out)) for n in range(processes)]
    for w in workers:
        w.start()
    try:
        gate.open(processes, WAIT + 60)
        results = [out.get(timeout=timeout) for _ in workers]
    except BaseException:
        for w in workers:
            w.kill()
        raise
    for w in workers:
        w.join()
    return results


def _python_contenders(kind, limit, processes, duration):
    name = f"fifo-{kind.split()[0]}-{limit}-{uuid.uuid4().hex[:6]}"
    results = _forked(
        _waiting_worker,
        lambda n, gate: (kind, name, limit, gate, duration),
        processes,
        duration + WAIT + 60,
    )
    return [t for r in results for t in r]


def fifo(triples, margin=FIFO_MARGIN):
    """How far grants strayed from arrival order, over (requested, granted, released[, token]) tuples.

    A grant *overtook* a request that was made more than ``margin`` seconds
    before its own and granted after it.  Grant order is the server's when a
    tuple has a fencing token (ours: strictly increasing per grant), else the
    client's clock when the acquire returned (the peers have no token).
    Returns the fraction of grants that overtook at least one request, and the
    most requests one grant overtook.
    """
    import bisect

    by_request = sorted((t[0], t[3] if len(t) > 3 else t[1]) for t in triples)
    requested = [t[0] for t in by_request]
    later_grants = []  # grant times of the requests made so far (more than margin earlier), sorted
    out_of_order = most = 0
    j = 0
    for t in by_request:
        while j < len(by_request) and requested[j] < t[0] - margin:
            bisect.insort(later_grants, by_request[j][1])
            j += 1
        overtaken = len(later_grants) - bisect.bisect_right(later_grants, t[1])
        if overtaken:
            out_of_order += 1
            most = max(most, overtaken)
    return (out_of_order / len(triples) if triples else float("nan")), most


def server_fifo(triples):
    """Grant order against arrival order, both on the server's clock, for our grants.

    Each tuple carries the grant's fencing token and its queue ticket number
    (server microseconds when it queued; None when it was granted at once, so
    that it arrived at its token's moment: tokens are the server's microseconds
    too, or one more than the last).  A grant *overtook* a caller that arrived
    before it and was granted after it.  Returns the fraction of grants that
    overtook anyone, and the most callers one grant overtook: 0 and 0 when the
    queue is served in exact order.
    """
    import bisect

    ours = [t for t in triples if len(t) > 4]
    by_arrival = sorted((t[4] if t[4] is not None else t[3], t[3]) for t in ours)
    granted_before = []  # tokens of the callers that arrived earlier, sorted
    out_of_order = most = 0
    for _, token in by_arrival:
        overtaken = len(granted_before) - bisect.bisect_right(granted_before, token)
        if overtaken:
            out_of_order += 1
            most = max(most, overtaken)
        bisect.insort(granted_before, token)
    return (out_of_order / len(ours) if ours else float("nan")), most


def _row(triples, limit, duration, peer=None):
    from .common import percentile

    above, peak = sweep([(t[1], t[2]) for t in triples], limit)
    out_of_order, most = fifo(triples)
    server = server_fifo(triples) if triples and len(triples[0]) > 4 else None
    waits = [(t[1] - t[0]) * 1000.0 for t in triples]
    return {
        "limit": limit,
        "peer": peer,
        "grants_per_s": len(triples) / duration,
        "above_limit": above,
        "peak": peak,
        "out_of_order": out_of_order,
        "max_overtaken": most,
        "wait_p50_ms": percentile(waits, 50),
        "wait_p99_ms": percentile(waits, 99),
        # Ours: grant order against arrival order on the server's clock (tokens, tickets).
        "server_out_of_order": None if server is None else server[0],
        "server_max_overtaken": None if server is None else server[1],
    }


def _baton_worker(n, batons, lists, gate, duration, out):
    from django_semaphore.backend import connection

    connection.reset()  # never share the parent's sockets
    client = connection.get_client()
    mine, after = lists[n], lists[(n + 1) % len(lists)]
    client.ping()
    start_at = gate.wait()
    if n < batons:
        while time.monotonic() < start_at:
            time.sleep(0.0005)
        client.rpush(mine, "go")
    grants, end = 0, start_at + duration
    while True:
        popped = client.blpop([mine], timeout=1)
        if popped is None:
            if time.monotonic() > end + WAIT:
                break
            continue
        if popped[1] == b"stop" or time.monotonic() >= end:
            client.rpush(after, "stop")  # passed round the ring: each stops once
            break
        grants += 1
        time.sleep(HOLD)
        client.rpush(after, "go")
    out.put(grants)


def fifo_floor(processes, duration, batons=1):
    """Grants/s of the cheapest FIFO hand-over there is, on the same machine and server:
    ``processes`` processes in a ring, each blocked on its own list (``BLPOP``);
    a holder holds ``HOLD``, then pushes to the next (``RPUSH``): one round trip
    and one process wake-up per grant, no lease, no queue, no semaphore.
    ``batons`` go round at once (LIMIT).  Any semaphore that serves waiters in
    order between processes hands over at most this fast; one whose releasing
    process takes the slot straight back need not."""
    lists = [f"bench:baton:{uuid.uuid4().hex[:6]}:{n}" for n in range(processes)]
    grants = sum(
        _forked(
            _baton_worker,
            lambda n, gate: (n, batons, lists, gate, duration),
            processes,
            duration + 2 * WAIT + 60,
        )
    )
    from django_semaphore.backend import connection

    connection.get_client().delete(*lists)  # the last "stop" is left in the first stopper's list
    return grants / duration


def _node_contenders(redis_url, limit, processes, duration):
    from .peers import node_workers

    key = f"fifo-node-{limit}-{uuid.uuid4().hex[:6]}"
    return node_workers(redis_url, key, limit, processes, duration, HOLD)


def _run(contenders, limit, duration):
    """One run of ``contenders(duration)`` (their triples), as its row."""
    return _row(contenders(duration), limit, duration)


def measure_pairs(redis_url, pairs, duration, processes=PROCESSES_GOAL):
    """Goal 3's ratios as adjacent pairs: ours beside each peer, one run right
    after the other (ABBA: the order swaps from pair to pair), ``pairs`` times.

    A single run of each contender, seconds apart, moves with the machine's
    load: LIMIT 5 against the node peer read 0.80 x in one full run and 1.13 x
    in the next, on the same code.  Per peer: the sorted per-pair ratios of
    grants/s (ours over theirs), for redis-py Lock also of the p99 wait, and
    over all of our paired runs the moments above LIMIT and the grants out of
    queue order on the server's clock (more runs, more chances to see one).
    """
    from .peers import blocking_mutex_names, node_status

    # (Named as measure_goal's rows.)
    peers = {
        f"{kind} (mutex)": (1, lambda d, kind=kind: _python_contenders(kind, 1, processes, d))
        for kind in blocking_mutex_names()
    }
    if node_status() is None:
        peers[f"redis-semaphore, LIMIT {LIMIT}"] = (
            LIMIT,
            lambda d: _node_contenders(redis_url, LIMIT, processes, d),
        )
    result = {"pairs": pairs, "duration": duration, "peers": {}}
    for name, (limit, theirs) in peers.items():
        grants, waits, rates, above, out_of_order, most = [], [], [], 0, 0.0, 0
        ours = partial(_python_contenders, "ours", limit, processes)
        for p in range(pairs):
            mine, other = in_turn(
                p, partial(_run, ours, limit, duration), partial(_run, theirs, limit, duration)
            )
            rates.append((mine["grants_per_s"], other["grants_per_s"]))
            grants.append(mine["grants_per_s"] / other["grants_per_s"])
            waits.append(mine["wait_p99_ms"] / other["wait_p99_ms"])
            above += mine["above_limit"]
            out_of_order = max(out_of_order, mine["server_out_of_order"])
            most = max(most, mine["server_max_overtaken"])
        result["peers"][name] = {
            "mine": f"ours, LIMIT {limit}",
            "grants": sorted(grants),
            "wait_p99": sorted(waits),
            "rates": rates,  # (ours, theirs) grants/s, pair by pair
            "above_limit": above,
            "server_out_of_order": out_of_order,
            "server_max_overtaken": most,
        }
    return result


def measure_goal(redis_url, duration, processes=PROCESSES_GOAL):
    """Goal 3: ours at LIMIT 5 beside the node peer's Semaphore, ours at LIMIT 1 beside the pip
    mutexes; grants/s, moments above the limit, and FIFO figures for each.  One run each, each
    peer right after ours at its limit (the floors last), so that no contender runs first or
    last of the section for the others; :func:`measure_pairs` gives the goal's ratios."""
    from .peers import blocking_mutex_names, node_status

    result = {"processes": processes, "duration": duration, "hold": HOLD, "margin": FIFO_MARGIN, "rows": {}}
    rows = result["rows"]
    rows[f"ours, LIMIT {LIMIT}"] = _row(
        _python_contenders("ours", LIMIT, processes, duration), LIMIT, duration
    )
    why = node_status()
    if why:
        result["node_skipped"] = why
    else:
        triples = _node_contenders(redis_url, LIMIT, processes, duration)
        rows[f"redis-semaphore, LIMIT {LIMIT}"] = _row(triples, LIMIT, duration, peer=f"ours, LIMIT {LIMIT}")
    rows["ours, LIMIT 1"] = _row(_python_contenders("ours", 1, processes, duration), 1, duration)
    for kind in blocking_mutex_names():
        triples = _python_contenders(kind, 1, processes, duration)
        rows[f"{kind} (mutex)"] = _row(triples, 1, duration, peer="ours, LIMIT 1")
    result["fifo_floor"] = fifo_floor(processes, duration)
    result["fifo_floor_limit"] = fifo_floor(processes, duration, batons=LIMIT)
    result["floor_batons"] = LIMIT
    return result
