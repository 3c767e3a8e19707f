"""Acquire+release cycles on one connection, beside the PING-pair floor and the pip peers (benchmarks.peers).

Also a weighted, prioritised cycle (``permits=2, priority=5``) beside the plain
one on the same kind of semaphore: scheduling must cost at most 1.1 x.
"""

import os
import uuid

from django_semaphore import Semaphore
from django_semaphore.backend import connection
from django_semaphore.engine.algorithms.lua import ACQUIRE, RELEASE

from .common import ALGORITHMS, SEED, interleaved, median, paired, quartiles, ratio
from .peers import LEASE, pip_peers, seed_cycle

HOLDER_COUNTS = (0, 10, 1000, 10000)


def semaphore(algorithm, holders):
    name = f"cycle-{algorithm}-{holders}-{uuid.uuid4().hex[:6]}"
    return Semaphore(name, limit=holders + 5, timeout=LEASE, algorithm=algorithm)


def fill(sem, holders, client):
    """Give ``sem`` ``holders`` live holders, with the app's own acquire script."""
    keys = sem.partition()
    meta = '{"host":"bench","pid":1}'
    for start in range(0, holders, 1000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(start + 1000, holders)):
            pipe.evalsha(
                ACQUIRE.sha,
                len(keys.main),
                *keys.main,
                holders + 5,
                LEASE * 1000,
                f"fill{i}",
                meta,
                0,
                "",
            )
        try:
            pipe.execute()
        except Exception:  # NOSCRIPT on a fresh server: load it once, then again
            client.script_load(ACQUIRE.source)
            return fill(sem, holders, client)
    assert len(sem.holders()) == holders


def cycle(sem, permits=1, priority=0):
    def run():
        lease = sem.acquire(permits=permits, priority=priority)
        if lease is None:
            raise RuntimeError(f"{sem.name}: refused with nobody else using it")
        lease.release()

    return run


#: The weighted, prioritised cycle's arguments.
WEIGHTED = {"permits": 2, "priority": 5}


def metrics_off(fn):
    """``fn`` run with the app's metrics off (the [prometheus] extra's tally, and any signal
    receivers), or None if nothing counts: the row that prices the metrics per cycle."""
    from django_semaphore import signals
    from django_semaphore.runtime import tally

    hooked = [s for s in (signals.acquired, signals.released) if s.receivers]
    if not hooked and not tally.counting:
        return None

    def run():
        saved = [s.receivers for s in hooked]
        counting = tally.counting
        for s in hooked:
            s.receivers = []
        tally.counting = False
        try:
            fn()
        finally:
            tally.counting = counting
            for s, receivers in zip(hooked, saved, strict=True):
                s.receivers = receivers

    return run


def measure(rounds, seconds, holder_counts=HOLDER_COUNTS, pairs=0, pair_seconds=0.2):
    """Cycle rates per algorithm and holder count, peers and the floor, interleaved.

    Then, with ``pairs``, goal 2's comparison again as ``pairs`` adjacent pairs
    (``benchmarks.common.paired``): ours at 10 holders against the seed and
    each peer, ``pair_seconds`` each, the figure the goal rows report."""
    client = connection.get_client()

    def floor():
        client.ping()
        client.ping()

    nop = client.script_load("return 1")

    def script_floor():  # two EVALSHA round trips with no work inside
        client.evalsha(nop, 0)
        client.evalsha(nop, 0)

    raw_sem = semaphore("lua", 0)
    raw_keys = raw_sem.partition()
    meta = '{"host":"bench","pid":1}'

    def raw_scripts():  # our two scripts, called without the Python layer above them
        identifier = os.urandom(16).hex()
        n = len(raw_keys.main)
        granted = client.evalsha(ACQUIRE.sha, n, *raw_keys.main, 5, 60000, identifier, meta, 0, "")
        client.evalsha(RELEASE.sha, n, *raw_keys.main, identifier, 5, granted[2])  # [2]: acquired ms

    raw_sem.acquire().release()  # loads both scripts
    contenders = {"floor": floor, "script floor": script_floor, "raw scripts": raw_scripts}
    sems = {}
    for algorithm in ALGORITHMS:
        for holders in holder_counts:
            sem = semaphore(algorithm, holders)
            fill(sem, holders, client)
            sems[(algorithm, holders)] = sem
            contenders[(algorithm, holders)] = cycle(sem)
    weighted_sem = semaphore("lua", 0)
    contenders["lua weighted"] = cycle(weighted_sem, **WEIGHTED)
    quiet = metrics_off(cycle(sems[("lua", holder_counts[0])]))
    if quiet is not None:
        contenders["lua, metrics off"] = quiet
    contenders[SEED] = seed_cycle(client, 10)  # Redis in Action 11.2.3, 10 other holders
    peer_fns = pip_peers(client)
    contenders.update(peer_fns)
    for fn in contenders.values():  # warm up: scripts loaded, connections open
        for _ in range(50):
            fn()
    rates, relative = interleaved(contenders, rounds, seconds)
    result = {
        "rounds": rounds,
        "seconds": seconds,
        "floor": median(rates["floor"]),
        "algorithms": {},
        "peers": {},
    }
    for algorithm in ALGORITHMS:
        rows = {}
        for holders in holder_counts:
            key = (algorithm, holders)
            rows[holders] = {
                "rate": median(rates[key]),
                "vs_floor": ratio(relative, key, "floor"),
                "vs_empty": ratio(relative, key, (algorithm, holder_counts[0])),
            }
        result["algorithms"][algorithm] = rows
    for name in ("script floor", "raw scripts", "lua, metrics off", SEED):
        if name not in rates:
            continue
        result[name] = {"rate": median(rates[name]), "vs_floor": ratio(relative, name, "floor")}
    for name in peer_fns:
        result["peers"][name] = {"rate": median(rates[name]), "vs_floor": ratio(relative, name, "floor")}
    if ("lua", 10) in sems:  # issue 23, goal 2: beside the seed with as many holders, and the peers
        ten = ("lua", 10)
        result["vs_seed"] = ratio(relative, ten, SEED)
        result["vs_peers"] = {name: ratio(relative, ten, name) for name in peer_fns}
        if pairs:
            others = {SEED: contenders[SEED], **peer_fns}
            result["paired"] = {
                "pairs": pairs,
                "seconds": pair_seconds,
                "vs": {
                    name: quartiles(paired(contenders[ten], fn, pairs, pair_seconds))
                    for name, fn in others.items()
                },
            }
    lua0 = ("lua", holder_counts[0])
    result["lua_vs_fair_locked"] = ratio(relative, lua0, ("fair_locked", holder_counts[0]))
    # Plain / weighted cycles per second: how much longer a weighted cycle takes.
    result["weighted"] = {
        "rate": median(rates["lua weighted"]),
        "vs_floor": ratio(relative, "lua weighted", "floor"),
        "plain_vs_weighted": ratio(relative, lua0, "lua weighted"),
    }
    result["sems"] = sems
    return result
