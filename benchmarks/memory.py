"""Abandoned partitions: does Redis memory come back by itself? (issue 15, goal 5)

On a redis-server of its own (so no other section's keys move the figure), a
child process (``python -m benchmarks.memory``) reads ``INFO memory``
``used_memory`` after a warm-up (the scripts loaded): the baseline.  Then
``WORKERS`` processes acquire one slot in each of ``partitions`` partitions
(``acquire(key=str(i))``) of a semaphore with a short TIMEOUT and never release
nor refresh them, as processes killed mid-request would.  ``used_memory`` and
``DBSIZE`` are sampled every ``SAMPLE`` s until 2 x TIMEOUT + 10 s after the last
acquire (the API's bound for a partition nobody uses to disappear); the figure
is the last sample against the baseline.
"""

import json
import multiprocessing
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTITIONS = 100_000
TIMEOUT = 2  # seconds: the abandoned leases' TIMEOUT
WORKERS = 4
SAMPLE = 0.25  # seconds between samples


def _abandon(name, timeout, keys, out):
    from django_semaphore import Semaphore
    from django_semaphore.backend import connection

    connection.reset()  # never share the parent's sockets
    sem = Semaphore(name, limit=1, timeout=timeout)
    refused = 0
    for i in keys:
        if sem.acquire(key=str(i)) is None:  # dropped, never released
            refused += 1
    out.put(refused)


def run(partitions=PARTITIONS, timeout=TIMEOUT, workers=WORKERS):
    """The measurement itself, in this process (Django already set up on a server of its own)."""
    from django_semaphore import Semaphore
    from django_semaphore.backend import connection

    client = connection.get_client()

    def sample(t0):
        return (time.monotonic() - t0, int(client.info("memory")["used_memory"]), client.dbsize())

    warm = Semaphore("abandoned-warm-up", limit=1, timeout=timeout)
    for i in range(20):
        warm.acquire(key=str(i)).release()
    time.sleep(2 * timeout + 2)  # the warm-up's own keys gone
    t0 = time.monotonic()
    baseline = sample(t0)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    name = "abandoned"
    procs = [
        ctx.Process(target=_abandon, args=(name, timeout, range(w, partitions, workers), out))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    samples = [baseline]
    while any(p.is_alive() for p in procs) and out.qsize() < workers:
        time.sleep(SAMPLE)
        samples.append(sample(t0))
    refused = sum(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join()
    created = time.monotonic() - t0
    deadline = time.monotonic() + 2 * timeout + 10
    while time.monotonic() < deadline:
        time.sleep(SAMPLE)
        samples.append(sample(t0))
    final = samples[-1]
    back = next(
        (s[0] for s in samples if s[0] > created and s[1] <= baseline[1] * 1.05),
        None,
    )
    return {
        "partitions": partitions,
        "timeout": timeout,
        "refused": refused,
        "create_s": created,
        "baseline_bytes": baseline[1],
        "baseline_keys": baseline[2],
        "peak_bytes": max(s[1] for s in samples),
        "peak_keys": max(s[2] for s in samples),
        "final_bytes": final[1],
        "final_keys": final[2],
        "final_vs_baseline": final[1] / baseline[1],
        "waited_s": 2 * timeout + 10,
        "back_within_5pc_s": None if back is None else back - created,
        "samples": samples,
    }


def measure(partitions=PARTITIONS, timeout=TIMEOUT):
    """Goal 5, in a child process with its own redis-server: :func:`run`'s figures."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", str(partitions), str(timeout)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.memory failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # python -m benchmarks.memory [PARTITIONS [TIMEOUT]]: prints one JSON line
    from tests.support.servers import RedisServer

    from .common import setup_django

    server = RedisServer().start()
    try:
        setup_django(server.url)
        args = [int(a) for a in sys.argv[1:3]]
        print(json.dumps(run(*args)))
    finally:
        server.cleanup()
