"""Redis-side cost: server microseconds per call, from INFO commandstats.

Our acquire and release scripts (called through the app, EVALSHA) beside the
seeds' bare Lua acquire of Redis in Action 11.2.3 (and its ZREM release),
in alternating batches of a few calls between INFO snapshots, at 10, 1 000 and
10 000 live holders.  Per-call durations are measured by Redis itself, so the
client's own speed does not enter these figures.
"""

import time
import uuid

from django_semaphore import Semaphore
from django_semaphore.backend import connection

from .common import ALGORITHMS, median
from .cycles import WEIGHTED, fill
from .peers import LEASE, SEED_ACQUIRE

BATCH = 5


def _usec(client):
    stats = client.info("commandstats")
    return {name[8:]: (v["usec"], v["calls"]) for name, v in stats.items()}


def _delta(after, before, command):
    a, b = after.get(command, (0, 0)), before.get(command, (0, 0))
    return a[0] - b[0], a[1] - b[1]


def _nested(after, before):
    """Commands run inside scripts (``redis.call``) between two snapshots."""
    return sum(
        _delta(after, before, command)[1] for command in after if command not in ("evalsha", "eval", "info")
    )


def measure(rounds, holder_counts=(10, 1000, 10000)):
    client = connection.get_client()
    seed_sha = client.script_load(SEED_ACQUIRE)
    result = {}
    for holders in holder_counts:
        sem = Semaphore(f"cost-{holders}-{uuid.uuid4().hex[:6]}", limit=holders + 2 * BATCH, timeout=LEASE)
        fill(sem, holders, client)
        seed_key = f"bench:seed:{uuid.uuid4().hex[:6]}"
        now = time.time()
        if holders:
            client.zadd(seed_key, {f"fill{i}": now for i in range(holders)})
        for _ in range(20):  # warm-up
            sem.acquire().release()
        batches = {"acquire": [], "release": [], "seed_acquire": [], "seed_release": []}
        calls = {"acquire": [], "release": [], "seed_acquire": []}
        ratios = []
        for _ in range(rounds):
            s0 = _usec(client)
            leases = [sem.acquire() for _ in range(BATCH)]
            s1 = _usec(client)
            for lease in leases:
                lease.release()
            s2 = _usec(client)
            ids = [str(uuid.uuid4()) for _ in range(BATCH)]
            for identifier in ids:
                now = time.time()
                client.evalsha(seed_sha, 1, seed_key, now - LEASE, holders + 2 * BATCH, now, identifier)
            s3 = _usec(client)
            for identifier in ids:  # release_semaphore() of 6.3.1: one ZREM
                client.zrem(seed_key, identifier)
            s4 = _usec(client)
            for name, (after, before, command) in {
                "acquire": (s1, s0, "evalsha"),
                "release": (s2, s1, "evalsha"),
                "seed_acquire": (s3, s2, "evalsha"),
                "seed_release": (s4, s3, "zrem"),
            }.items():
                usec, n = _delta(after, before, command)
                batches[name].append(usec / n)
            for name, (after, before) in {
                "acquire": (s1, s0),
                "release": (s2, s1),
                "seed_acquire": (s3, s2),
            }.items():
                calls[name].append(_nested(after, before) / BATCH)
            if batches["seed_acquire"][-1]:
                ratios.append(batches["acquire"][-1] / batches["seed_acquire"][-1])
        # Medians over batches: a burst from another process on the machine
        # spoils a batch, not the figure.
        row = {name: median(values) for name, values in batches.items()}
        row["ratio"] = median(ratios)
        # Redis commands run inside the scripts, per call (the seed's ZREM release is one command).
        row["calls"] = {name: median(values) for name, values in calls.items()}
        result[holders] = row
        client.delete(seed_key)
    return result


# Commands the client sends itself in a cycle of any ALGORITHM.  Redis also
# counts every command run inside a script or a MULTI/EXEC under its own name,
# and the EVALSHA / EXEC time already includes them: summing those would count
# the same microseconds twice.
TOP_LEVEL = ("evalsha", "eval", "multi", "exec", "set")


def _cycle_usec(client, sem, kwargs):
    """Server microseconds of one batch of acquire+release cycles, per cycle."""
    before = _usec(client)
    for _ in range(BATCH):
        sem.acquire(**kwargs).release()
    after = _usec(client)
    return sum(_delta(after, before, c)[0] for c in TOP_LEVEL) / BATCH


def per_cycle(rounds=100):
    """Server microseconds per acquire+release cycle (the commands the client sends), per
    ALGORITHM; and "lua weighted" (``permits=2, priority=5``) with "lua plain" beside it,
    measured in pairs whose order alternates, and ``weighted_ratio``, the median of
    the pairs' ratios (a batch's cost depends a little on what ran just before it)."""
    client = connection.get_client()
    result = {}
    for algorithm in ALGORITHMS:
        sem = Semaphore(
            f"costcycle-{algorithm}-{uuid.uuid4().hex[:6]}", limit=5, timeout=60, algorithm=algorithm
        )
        for _ in range(20):
            sem.acquire().release()
        result[algorithm] = median([_cycle_usec(client, sem, {}) for _ in range(rounds)])
    plain = Semaphore(f"costcycle-plain-{uuid.uuid4().hex[:6]}", limit=5, timeout=60)
    weighted = Semaphore(f"costcycle-weighted-{uuid.uuid4().hex[:6]}", limit=5, timeout=60)
    for _ in range(20):
        plain.acquire().release()
        weighted.acquire(**WEIGHTED).release()
    pairs = []
    for r in range(rounds):
        if r % 2:
            w, p = _cycle_usec(client, weighted, WEIGHTED), _cycle_usec(client, plain, {})
        else:
            p, w = _cycle_usec(client, plain, {}), _cycle_usec(client, weighted, WEIGHTED)
        pairs.append((p, w))
    result["lua plain"] = median([p for p, _ in pairs])
    result["lua weighted"] = median([w for _, w in pairs])
    result["weighted_ratio"] = median([w / p for p, w in pairs if p])
    return result


# The same calls as our common acquire and release (issue 23), with nothing
# around them: what the calls and the two EVALSHA with a partition's 7 keys
# cost by themselves, the floor any Lua of ours could reach.
MINIMAL_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HMGET', KEYS[3], '#', '+', 'w', 'e')
redis.call('ZCARD', KEYS[1])
local expires = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'NX', expires, ARGV[3])
local token = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('HSET', KEYS[3], '#', token, ARGV[3], token .. ':' .. now .. ':' .. ARGV[4])
return {1, token, now, expires, 0, ''}
"""
MINIMAL_RELEASE = """
redis.call('TIME')
redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('HMGET', KEYS[3], '*' .. ARGV[1], '@' .. ARGV[1], 'w', '%', 'r')
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1], '*' .. ARGV[1], '@' .. ARGV[1])
return {1}
"""


def minimal_bound(rounds=20, cycles=200):
    """Server usec per uncontended cycle of our two scripts and of MINIMAL_ACQUIRE /
    MINIMAL_RELEASE (the same calls, keys and arguments), in alternating batches."""
    from django_semaphore.engine.algorithms.lua import ACQUIRE, RELEASE

    client = connection.get_client()
    keys = Semaphore(f"minimal-{uuid.uuid4().hex[:6]}", limit=20, timeout=60).partition().main
    pairs = {
        "ours": (client.script_load(ACQUIRE.source), client.script_load(RELEASE.source)),
        "minimal": (client.script_load(MINIMAL_ACQUIRE), client.script_load(MINIMAL_RELEASE)),
    }
    meta = '{"host":"bench","pid":1}'

    def batch(name):
        acquire, release = pairs[name]
        ids = [uuid.uuid4().hex for _ in range(cycles)]
        before = _usec(client)
        for identifier in ids:
            granted = client.evalsha(acquire, len(keys), *keys, 20, 60000, identifier, meta, 0, "")
            client.evalsha(release, len(keys), *keys, identifier, 20, granted[2])
        return _delta(_usec(client), before, "evalsha")[0] / cycles

    for name in pairs:  # warm-up: the HASH and its watermark exist
        batch(name)
    figures = {"ours": [], "minimal": []}
    for r in range(rounds):
        for name in ("ours", "minimal") if r % 2 else ("minimal", "ours"):
            figures[name].append(batch(name))
    result = {name: median(values) for name, values in figures.items()}
    result["ratio"] = median([o / m for o, m in zip(figures["ours"], figures["minimal"], strict=True) if m])
    return result
