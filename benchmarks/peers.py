"""The peers every section measures beside django-semaphore, in one place.

* the seed: the bare Lua acquire of *Redis in Action* 11.2.3 (listing 11.8)
  and its one-``ZREM`` release (6.3.1), called with ``EVALSHA`` on the same
  redis-py client the app uses: the cheapest counting semaphore on Redis;
* the pip peers (always): redis-py's ``Lock`` and python-redis-lock, both
  mutexes (one slot);
* the node peer (when ``node`` and ``npm`` are installed and ``make bench``
  has run ``npm ci`` in benchmarks/node): swarthy/redis-semaphore's
  ``Semaphore`` on ioredis, driven by ``benchmarks/node/bench.js``.
"""

import json
import os
import shutil
import subprocess
import time
import uuid

from .common import START_LEAD

LEASE = 600  # seconds: no peer's lease expires during a run

# Listing 11.8, verbatim apart from whitespace.
SEED_ACQUIRE = """
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[1])
if redis.call('zcard', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('zadd', KEYS[1], ARGV[3], ARGV[4])
    return ARGV[4]
end
"""

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
NODE_SCRIPT = os.path.join(NODE_DIR, "bench.js")


def seed_cycle(client, holders=0, limit=None):
    """The seed's acquire+release on ``client``, with ``holders`` other live holders: a cycle function."""
    sha = client.script_load(SEED_ACQUIRE)
    key = f"bench:seed:{uuid.uuid4().hex[:8]}"
    limit = limit or holders + 5
    if holders:
        now = time.time()
        for start in range(0, holders, 1000):
            client.zadd(key, {f"fill{i}": now + LEASE for i in range(start, min(start + 1000, holders))})

    def run():
        identifier = os.urandom(16).hex()
        now = time.time()
        if client.evalsha(sha, 1, key, now - LEASE, limit, now, identifier) is None:
            raise RuntimeError("seed semaphore refused with nobody else using it")
        client.zrem(key, identifier)

    return run


def pip_peers(client):
    """One-slot peers, where installed: {name: cycle function} on ``client``."""
    found = {}
    lock = client.lock("bench:peer:redis-py", timeout=LEASE, thread_local=False)

    def redis_py():
        if not lock.acquire(blocking=False):
            raise RuntimeError("redis-py Lock refused")
        lock.release()

    found["redis-py Lock"] = redis_py
    try:
        import redis_lock
    except ImportError:
        return found
    other = redis_lock.Lock(client, "bench:peer:python-redis-lock", expire=LEASE)

    def python_redis_lock():
        if not other.acquire(blocking=False):
            raise RuntimeError("python-redis-lock refused")
        other.release()

    found["python-redis-lock"] = python_redis_lock
    return found


def blocking_mutex(kind, client, name):
    """(acquire, release) of a contended pip peer, waiting with the library's defaults.

    redis-py's ``Lock`` polls every 0.1 s (its default ``sleep``);
    python-redis-lock waits on a ``BLPOP`` its release signals.
    """
    if kind == "redis-py Lock":
        lock = client.lock(name, timeout=LEASE, thread_local=False, blocking_timeout=60)
        return lock.acquire, lock.release
    if kind == "python-redis-lock":
        import redis_lock

        lock = redis_lock.Lock(client, name, expire=LEASE)
        return (lambda: lock.acquire(timeout=60)), lock.release
    raise ValueError(kind)


def blocking_mutex_names():
    """The pip peers installed, by the names :func:`blocking_mutex` takes."""
    names = ["redis-py Lock"]
    try:
        import redis_lock  # noqa: F401

        names.append("python-redis-lock")
    except ImportError:
        pass
    return names


def node_status():
    """None when the node peer can run, else why it cannot (one line)."""
    if os.environ.get("BENCH_SKIP_NODE"):
        return "--skip-node"
    if not shutil.which("node"):
        return "node is not on PATH"
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "redis-semaphore")):
        return "benchmarks/node/node_modules is missing (make bench runs npm ci there when npm is on PATH)"
    return None


def node_run(args, timeout=300):
    """Run benchmarks/node/bench.js with ``args`` (a dict): its JSON answer."""
    done = subprocess.run(
        ["node", NODE_SCRIPT, json.dumps(args)],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"node bench.js {args['mode']} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def node_workers(url, key, limit, processes, duration, hold):
    """Contended node processes (bench.js "worker"), all started on one instant: their triples.

    Each connects and says "ready"; once all have, they are sent one start
    time (``time.monotonic()`` + :data:`common.START_LEAD`), so node's start-up is not measured.
    """
    args = {"mode": "worker", "url": url, "key": key, "limit": limit, "duration": duration, "hold": hold}
    workers = [
        subprocess.Popen(
            ["node", NODE_SCRIPT, json.dumps(args)],
            cwd=NODE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for w in workers:
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError(f"node worker failed: {w.stderr.read().strip()[-500:]}")
        start_at = time.monotonic() + START_LEAD
        for w in workers:
            w.stdin.write(f"{start_at!r}\n")
            w.stdin.flush()
        triples = []
        for w in workers:
            stdout, stderr = w.communicate(timeout=duration + 120)
            if w.returncode != 0:
                raise RuntimeError(f"node worker failed: {stderr.strip()[-500:]}")
            triples.extend(tuple(t) for t in json.loads(stdout.strip().splitlines()[-1])["intervals"])
        return triples
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()


def node_cycles(url, rounds, seconds, limits=(1, 5)):
    """The node peer's cycles/s per limit and its own PING-pair floor, or {"skipped": why}."""
    why = node_status()
    if why:
        return {"skipped": why}
    return node_run(
        {"mode": "cycles", "url": url, "limits": list(limits), "rounds": rounds, "seconds": seconds}
    )


def node_cpu(url, cycles, rounds, limit=5):
    """The node peer's Redis CPU per PING pair and per cycle (usec), or {"skipped": why}."""
    why = node_status()
    if why:
        return {"skipped": why}
    return node_run({"mode": "cpu", "url": url, "limit": limit, "cycles": cycles, "rounds": rounds})
