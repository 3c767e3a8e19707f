"""Waiting: from a release to the first waiter holding the slot.

The main process holds the only slot of a LIMIT 1 semaphore; a child process
queues with ``acquire(wait=5)`` (its ticket is visible in ``status().waiting``);
the main process reads time.monotonic() and releases; the child reads it
again as soon as its acquire returns.
"""

import multiprocessing
import time
import uuid

from .common import percentile


def _waiter(name, conn):
    from django_semaphore import Semaphore
    from django_semaphore.backend import connection

    connection.reset()
    sem = Semaphore(name, limit=1, timeout=10, wait=5)
    while conn.recv() == "go":
        lease = sem.acquire(wait=5)
        woke = time.monotonic()
        if lease is None:
            conn.send(None)
            continue
        lease.release()
        conn.send(woke)


def measure(samples):
    from django_semaphore import Semaphore

    name = f"waiting-{uuid.uuid4().hex[:6]}"
    sem = Semaphore(name, limit=1, timeout=10, wait=5)
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_waiter, args=(name, there))
    child.start()
    latencies = []
    missed = 0
    try:
        for _ in range(samples):
            lease = sem.acquire(wait=5)
            here.send("go")
            deadline = time.monotonic() + 5
            while sem.status().waiting < 1 and time.monotonic() < deadline:
                time.sleep(0.0005)
            time.sleep(0.002)  # let the waiter reach its BLPOP
            released = time.monotonic()
            lease.release()
            woke = here.recv()
            if woke is None:
                missed += 1
            else:
                latencies.append((woke - released) * 1000.0)
    finally:
        here.send("stop")
        child.join(10)
    return {
        "samples": len(latencies),
        "missed": missed,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies) if latencies else float("nan"),
    }
