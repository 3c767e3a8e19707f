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

from .common import ALGORITHMS, sweep

LIMIT = 5
HOLD = 0.001  # seconds a granted process keeps its slot
PROCESSES = (1, 4, 16, 32)


def _worker(name, algorithm, start_at, duration, out):
    from django_semaphore import Semaphore, connection

    connection.reset()  # never share the parent's sockets
    sem = Semaphore(name, limit=LIMIT, timeout=10, algorithm=algorithm)
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
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    name = f"contention-{algorithm}-{processes}-{uuid.uuid4().hex[:6]}"
    start_at = time.monotonic() + 0.3 + 0.02 * processes
    workers = [
        ctx.Process(target=_worker, args=(name, algorithm, start_at, duration, out)) for _ in range(processes)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=duration + 60) for _ in workers]
    for w in workers:
        w.join()
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
