"""Stress: 32 processes, more than 10^5 contended acquires on LIMIT 5.

Every hold is recorded as (start, end) with ``time.monotonic()`` — one
system-wide clock (CLOCK_MONOTONIC) for every process on the machine — from
the moment ``acquire()`` returned to the moment ``release()`` was called.  Each
recorded interval lies inside the interval during which Redis counted the
holder, so a sweep over all of them that finds more than LIMIT open at once
would prove over-admission.  It must find at most LIMIT, and every release
must confirm that the slot was still held.

The weighted stress does the same with 16 processes taking 1 to 4 permits at
random priorities on LIMIT 8: the sweep sums permits instead of counting
holders, and checks that no hold starts on a slot number that an open hold
has (or outside range(LIMIT)).
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support.helpers import max_overlap

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


def report(label, key, figures):
    """Print a stress test's figures, and append them to $SEMAPHORE_FIGURES (JSON lines) if set."""
    print(label, json.dumps(figures))
    path = os.environ.get("SEMAPHORE_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({key: figures}) + "\n")


def run_workers(source, count, attempts, go, timeout, raw_redis, subprocess_env, tmp_path):
    """Start ``count`` processes running ``source`` together (each blocks on BLPOP ``go``
    until all are ready), wait for them; return (holds, refused, lost, seconds)."""
    outputs = [tmp_path / f"{go.rsplit(':', 1)[-1]}-{i}.json" for i in range(count)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", source, str(i), str(attempts), str(outputs[i]), go],
            env=subprocess_env,
        )
        for i in range(count)
    ]
    try:
        # Start together: every worker blocks on BLPOP until the list is filled.
        deadline = time.monotonic() + 120
        while raw_redis.execute_command("CLIENT", "LIST").count(b"cmd=blpop") < count:
            assert time.monotonic() < deadline, "workers did not get ready"
            assert all(w.poll() is None for w in workers), "a worker died before the start"
            time.sleep(0.1)
        started = time.monotonic()
        raw_redis.rpush(go, *range(count))
        for worker in workers:
            assert worker.wait(timeout) == 0
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
    return holds, refused, lost, elapsed


@pytest.mark.slow
def test_never_more_than_limit_holders(subprocess_env, raw_redis, key_prefix, tmp_path):
    holds, refused, lost, elapsed = run_workers(
        WORKER, PROCESSES, ATTEMPTS, f"{key_prefix}:go", 300, raw_redis, subprocess_env, tmp_path
    )
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
    report("STRESS FIGURES", "stress", figures)
    assert attempts == PROCESSES * ATTEMPTS >= 10**5
    assert refused > 0, "the semaphore was never contended"
    assert lost == 0
    assert peak <= LIMIT and above == 0
    assert peak == LIMIT  # the limit was reached, so the check had something to find


# -- weighted and prioritised ("lua" scheduling) -------------------------------------------

WEIGHTED_PROCESSES = 16
WEIGHTED_ATTEMPTS = 6400  # per process: 16 x 6400 = 102,400 weighted acquires
WEIGHTED_LIMIT = 8

WEIGHTED_WORKER = textwrap.dedent(
    """
    import json, os, random, sys, time
    import django
    django.setup()
    import redis
    from django_semaphore import Semaphore
    index, attempts, out, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    sem = Semaphore("weighted-stress", limit=LIMIT, timeout=30, slots=True)
    wait = 0.5 if index % 4 == 0 else 0  # a quarter of the workers queue
    sem.available()
    redis.Redis.from_url(os.environ["REDIS_URL"]).blpop(go, 60)
    monotonic = time.monotonic
    holds, refused, lost = [], 0, 0
    started = monotonic()
    for _ in range(attempts):
        permits = random.randint(1, 4)
        lease = sem.acquire(wait=wait, permits=permits, priority=random.choice((-1, 0, 1)))
        if lease is None:
            refused += 1
            continue
        begin = monotonic()
        time.sleep(random.random() * 0.002)
        end = monotonic()
        if not lease.release():
            lost += 1
        holds.append((begin, end, permits, list(lease.slots)))
    with open(out, "w") as f:
        json.dump({"holds": holds, "refused": refused, "lost": lost,
                   "seconds": monotonic() - started}, f)
    """
).replace("LIMIT", str(WEIGHTED_LIMIT))


def weighted_sweep(holds):
    """Sweep over (start, end, permits, slots) holds (ends before starts at equal times).

    Returns (peak permits held at once, moments above the limit, slot clashes:
    a hold starting on a slot that an open hold has, or outside range(limit)).
    """
    events = sorted(
        [(s, 1, i) for i, (s, _, _, _) in enumerate(holds)]
        + [(e, -1, i) for i, (_, e, _, _) in enumerate(holds)]
    )
    held = peak = above = clashes = 0
    taken = set()
    for _, delta, i in events:
        permits, slots = holds[i][2], holds[i][3]
        if delta < 0:
            held -= permits
            taken.difference_update(slots)
            continue
        held += permits
        peak = max(peak, held)
        above += held > WEIGHTED_LIMIT
        if len(slots) != permits or taken & set(slots) or any(not 0 <= s < WEIGHTED_LIMIT for s in slots):
            clashes += 1
        taken.update(slots)
    return peak, above, clashes


@pytest.mark.slow
def test_weighted_acquires_never_exceed_the_limit(subprocess_env, raw_redis, key_prefix, tmp_path):
    holds, refused, lost, elapsed = run_workers(
        WEIGHTED_WORKER,
        WEIGHTED_PROCESSES,
        WEIGHTED_ATTEMPTS,
        f"{key_prefix}:weighted-go",
        600,
        raw_redis,
        subprocess_env,
        tmp_path,
    )
    attempts = len(holds) + refused
    peak, above, clashes = weighted_sweep(holds)
    figures = {
        "processes": WEIGHTED_PROCESSES,
        "weighted_acquires": attempts,
        "granted": len(holds),
        "permits_granted": sum(h[2] for h in holds),
        "refused": refused,
        "leases_lost": lost,
        "peak_permits": peak,
        "moments_above_limit": above,
        "slot_clashes": clashes,
        "seconds": round(elapsed, 1),
    }
    report("WEIGHTED STRESS FIGURES", "weighted_stress", figures)
    assert attempts == WEIGHTED_PROCESSES * WEIGHTED_ATTEMPTS >= 10**5
    assert refused > 0, "the semaphore was never contended"
    assert lost == 0
    assert above == 0 and peak <= WEIGHTED_LIMIT
    assert clashes == 0
    assert peak >= WEIGHTED_LIMIT - 1  # (nearly) full at times: the check had something to find


# -- TOTAL: LIMIT per partition, TOTAL across the partitions -------------------------------

TOTAL_PROCESSES = 16
TOTAL_ATTEMPTS = 7500  # per process; 14 of the 16 wait for every grant: > 10^5 grants
TOTAL_PARTITIONS = 8
TOTAL_LIMIT = 2
TOTAL_TOTAL = 5

TOTAL_WORKER = (
    textwrap.dedent(
        """
    import json, os, random, sys, time
    import django
    django.setup()
    import redis
    from django_semaphore import Semaphore
    index, attempts, out, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    sem = Semaphore("total-stress", limit=LIMIT, total=TOTAL, timeout=30)
    key = str(index % PARTITIONS)  # two processes per partition
    wait = 0 if index % 8 == 0 else 10  # two refuse at once, the others queue
    sem.available()
    redis.Redis.from_url(os.environ["REDIS_URL"]).blpop(go, 60)
    monotonic = time.monotonic
    holds, refused, lost = [], 0, 0
    started = monotonic()
    for _ in range(attempts):
        permits = 2 if random.random() < 0.1 else 1
        lease = sem.acquire(key=key, wait=wait, permits=permits, priority=random.choice((0, 0, 1)))
        if lease is None:
            refused += 1
            continue
        begin = monotonic()
        time.sleep(random.random() * 0.001)
        end = monotonic()
        if not lease.release():
            lost += 1
        holds.append((begin, end, permits, key))
    with open(out, "w") as f:
        json.dump({"holds": holds, "refused": refused, "lost": lost,
                   "seconds": monotonic() - started}, f)
    """
    )
    .replace("LIMIT", str(TOTAL_LIMIT))
    .replace("TOTAL", str(TOTAL_TOTAL))
    .replace("PARTITIONS", str(TOTAL_PARTITIONS))
)


def permit_levels(holds):
    """Sweep: the permits held just after each hold starts (ends before starts at equal times)."""
    events = sorted([(h[0], 1, h[2]) for h in holds] + [(h[1], -1, h[2]) for h in holds])
    level, levels = 0, []
    for _, sign, permits in events:
        level += sign * permits
        if sign > 0:
            levels.append(level)
    return levels


@pytest.mark.slow
def test_total_never_exceeds_limit_per_partition_nor_total(subprocess_env, raw_redis, key_prefix, tmp_path):
    holds, refused, lost, elapsed = run_workers(
        TOTAL_WORKER,
        TOTAL_PROCESSES,
        TOTAL_ATTEMPTS,
        f"{key_prefix}:go-total",
        600,
        raw_redis,
        subprocess_env,
        tmp_path,
    )
    name_levels = permit_levels(holds)
    partition_peaks = {}
    above_limit = 0
    for part in {h[3] for h in holds}:
        levels = permit_levels([h for h in holds if h[3] == part])
        partition_peaks[part] = max(levels)
        above_limit += sum(1 for level in levels if level > TOTAL_LIMIT)
    above_total = sum(1 for level in name_levels if level > TOTAL_TOTAL)
    figures = {
        "processes": TOTAL_PROCESSES,
        "partitions": len(partition_peaks),
        "grants": len(holds),
        "refused": refused,
        "leases_lost": lost,
        "peak_permits": max(name_levels),
        "peak_partition_permits": max(partition_peaks.values()),
        "moments_above_limit": above_limit,
        "moments_above_total": above_total,
        "seconds": round(elapsed, 1),
    }
    report("TOTAL STRESS FIGURES", "total_stress", figures)
    assert len(holds) >= 10**5
    assert len(partition_peaks) == TOTAL_PARTITIONS
    assert lost == 0
    assert above_limit == 0 and above_total == 0
    assert max(name_levels) == TOTAL_TOTAL  # the TOTAL was reached: the check had something to find
    assert refused > 0
