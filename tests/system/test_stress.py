"""Stress: 32 processes, more than 10^5 contended acquires on LIMIT 5.

Every hold is recorded as (start, end) with ``time.monotonic()`` — one
system-wide clock (CLOCK_MONOTONIC) for every process on the machine — from
the moment ``acquire()`` returned to the moment ``release()`` was called.  Each
recorded interval lies inside the interval during which Redis counted the
holder, so a sweep over all of them that finds more than LIMIT open at once
would prove over-admission.  It must find at most LIMIT, and every release
must confirm that the slot was still held.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import max_overlap

PROCESSES = 32
ATTEMPTS = 3200  # per process: 32 x 3200 = 102,400 acquires
LIMIT = 5

WORKER = textwrap.dedent(
    """
    import json, os, random, sys, time
    import django
    django.setup()
    import redis
    from django_semaphore import Semaphore
    index, attempts, out, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    sem = Semaphore("stress", limit=LIMIT, timeout=30)
    wait = 0.5 if index % 4 == 0 else 0  # a quarter of the workers queue for a slot
    sem.available()  # connect and load the scripts before the start
    redis.Redis.from_url(os.environ["REDIS_URL"]).blpop(go, 60)
    monotonic = time.monotonic
    holds, refused, lost = [], 0, 0
    started = monotonic()
    for _ in range(attempts):
        lease = sem.acquire(wait=wait)
        if lease is None:
            refused += 1
            continue
        begin = monotonic()
        time.sleep(random.random() * 0.002)  # hold the slot a little: holders overlap
        end = monotonic()
        if not lease.release():
            lost += 1
        holds.append((begin, end))
    with open(out, "w") as f:
        json.dump({"holds": holds, "refused": refused, "lost": lost,
                   "seconds": monotonic() - started}, f)
    """
).replace("LIMIT", str(LIMIT))


@pytest.mark.slow
def test_never_more_than_limit_holders(subprocess_env, raw_redis, key_prefix, tmp_path):
    go = f"{key_prefix}:go"
    outputs = [tmp_path / f"worker-{i}.json" for i in range(PROCESSES)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(i), str(ATTEMPTS), str(outputs[i]), go],
            env=subprocess_env,
        )
        for i in range(PROCESSES)
    ]
    try:
        # Start together: every worker blocks on BLPOP until the list is filled.
        deadline = time.monotonic() + 120
        while raw_redis.execute_command("CLIENT", "LIST").count(b"cmd=blpop") < PROCESSES:
            assert time.monotonic() < deadline, "workers did not get ready"
            assert all(w.poll() is None for w in workers), "a worker died before the start"
            time.sleep(0.1)
        started = time.monotonic()
        raw_redis.rpush(go, *range(PROCESSES))
        for worker in workers:
            assert worker.wait(300) == 0
        elapsed = time.monotonic() - started
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    holds, refused, lost = [], 0, 0
    for path in outputs:
        data = json.loads(path.read_text())
        holds.extend(tuple(h) for h in data["holds"])
        refused += data["refused"]
        lost += data["lost"]
    attempts = len(holds) + refused
    peak, levels = max_overlap(holds)
    above = sum(1 for level in levels if level > LIMIT)
    figures = {
        "processes": PROCESSES,
        "acquires": attempts,
        "granted": len(holds),
        "refused": refused,
        "leases_lost": lost,
        "peak_holders": peak,
        "moments_above_limit": above,
        "seconds": round(elapsed, 1),
    }
    print("STRESS FIGURES", json.dumps(figures))
    path = os.environ.get("SEMAPHORE_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"stress": figures}) + "\n")
    assert attempts == PROCESSES * ATTEMPTS >= 10**5
    assert refused > 0, "the semaphore was never contended"
    assert lost == 0
    assert peak <= LIMIT and above == 0
    assert peak == LIMIT  # the limit was reached, so the check had something to find
