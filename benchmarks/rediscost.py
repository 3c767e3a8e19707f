"""Redis-side cost: server microseconds per call, from INFO commandstats.

Our acquire and release scripts (called through the app, EVALSHA) beside the
seeds' bare Lua acquire of Redis in Action 11.2.3 (and its ZREM release),
in alternating batches of a few calls between INFO snapshots, at 10, 1 000 and
10 000 live holders.  Per-call durations are measured by Redis itself, so the
client's own speed does not enter these figures.
"""

import collections
import time
import uuid

from django_semaphore import Semaphore
from django_semaphore.backend import connection

from .common import ALGORITHMS, median
from .cycles import WEIGHTED, fill
from .peers import LEASE, SEED_ACQUIRE

BATCH = 5


# The plain commands this process sends (a quiet release's pipeline), tallied
# by name: INFO commandstats counts a command the client sends and one a script
# runs inside under the same name (TIME is both in a quiet cycle).
_sent: collections.Counter[str] = collections.Counter()


def _tally_sent():
    """Wrap the driver so that every plain command it sends is tallied (once per process)."""
    from django_semaphore.backend import scripting

    if getattr(scripting.execute, "tallies", False):
        return
    original = scripting.execute

    def execute(client, request):
        if type(request) is scripting.Pipe:
            _sent.update(str(command[0]).lower() for command in request.commands)
        return original(client, request)

    execute.tallies = True
    scripting.execute = execute


def _usec(client):
    """INFO commandstats as {command: (usec, calls)}, with "sent:NAME": (0, count) for
    the plain commands this process sent (see :func:`sent_usec`)."""
    _tally_sent()
    stats = client.info("commandstats")
    result = {name[8:]: (v["usec"], v["calls"]) for name, v in stats.items()}
    result.update({f"sent:{name}": (0, count) for name, count in _sent.items()})
    return result


def sent_usec(after, before):
    """Server usec of the commands the client sent between two :func:`_usec` snapshots:
    its scripts and transactions (:data:`TOP_LEVEL`, what runs inside them
    included) and its plain commands, each at its mean usec per call in the
    interval (the same command run inside a script costs the same)."""
    usec = sum(_delta(after, before, command)[0] for command in TOP_LEVEL)
    for name in after:
        if name.startswith("sent:"):
            sent = _delta(after, before, name)[1]
            total, calls = _delta(after, before, name[5:])
            if sent and calls:
                usec += total * min(sent, calls) / calls
    return usec


def _run_calls(after, before):
    """Redis commands run between two snapshots: inside scripts, and plain ones sent."""
    return sum(
        _delta(after, before, command)[1]
        for command in after
        if command not in TOP_LEVEL and command not in ("info", "ping") and not command.startswith("sent:")
    )


def _delta(after, before, command):
    a, b = after.get(command, (0, 0)), before.get(command, (0, 0))
    return a[0] - b[0], a[1] - b[1]


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
            for name, (after, before) in {
                "acquire": (s1, s0),
                "release": (s2, s1),  # a quiet release: plain commands, no script
                "seed_acquire": (s3, s2),
            }.items():
                batches[name].append(sent_usec(after, before) / BATCH)
                calls[name].append(_run_calls(after, before) / BATCH)
            usec, n = _delta(s4, s3, "zrem")
            batches["seed_release"].append(usec / n)
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
    return sent_usec(after, before) / BATCH


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


# The same calls as our common acquire (issue 23), with nothing around them:
# what the calls and an EVALSHA with a partition's 7 keys cost by themselves,
# the floor any Lua of ours could reach.  (A quiet release is plain commands
# already: both cycles of minimal_bound send the same ones.)
MINIMAL_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HMGET', KEYS[3], '#', '+', 'w', 'e', '%', 'r')
redis.call('ZCARD', KEYS[1])
local expires = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'NX', expires, ARGV[3])
local token = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('HSET', KEYS[3], '#', token, ARGV[3], token .. ':' .. now .. ':' .. ARGV[4])
return {1, token, now, expires, 0, '', 1}
"""

# The same for the script the common case runs (acquire_fast.lua: 2 keys, 4
# arguments, its reply a string): its five calls with nothing around them but
# the token (TIME's two strings, the microseconds padded to six digits) and
# the expiry they need.
MINIMAL_FAST = """
local t = redis.call('TIME')
redis.call('HMGET', KEYS[2], '#', '+', 'w', 'e', '%', 'r')
redis.call('ZCARD', KEYS[1])
local usec = t[2]
if #usec < 6 then usec = string.rep('0', 6 - #usec) .. usec end
local token = t[1] .. usec
local now_ms = string.sub(token, 1, -4)
redis.call('ZADD', KEYS[1], 'NX', tonumber(now_ms) + tonumber(ARGV[2]), ARGV[3])
redis.call('HSET', KEYS[2], '#', token, ARGV[3], token .. ':' .. now_ms .. ':' .. ARGV[4])
return token .. ':' .. now_ms .. ':1:0'
"""

#: A quiet release's plain commands (lua.quiet_release), by name: run only by
#: the release in minimal_bound's cycles, but TIME (the acquire's first call too).
_RELEASE_ONLY = ("zscore", "zrem", "hdel", "hget")


def minimal_bound(rounds=20, cycles=200):
    """Server usec per uncontended cycle of our acquire scripts and of their calls in
    minimal Lua (the same calls, keys and arguments), each with the same quiet
    release, in alternating batches: ``acquire.lua`` against MINIMAL_ACQUIRE, and
    under ``"fast"`` the common case's ``acquire_fast.lua`` against MINIMAL_FAST."""
    from django_semaphore.engine.algorithms.base import as_str
    from django_semaphore.engine.algorithms.lua import ACQUIRE, FAST_ACQUIRE

    client = connection.get_client()
    sem = Semaphore(f"minimal-{uuid.uuid4().hex[:6]}", limit=20, timeout=60)
    keys = sem.partition()
    for _ in range(20):  # HOLD_FIRST hold times recorded: the grants are quiet
        sem.acquire().release()
    meta = '{"host":"bench","pid":1}'
    full = client.script_load(ACQUIRE.source)

    def full_script(sha):
        def acquire(identifier):
            granted = client.evalsha(sha, len(keys.main), *keys.main, 20, 60000, identifier, meta, 0, "")
            assert granted[6] == 1  # quiet

        return acquire

    def fast_script(sha):
        fast_keys = (keys.timeouts, keys.holds)

        def acquire(identifier):
            reply = client.evalsha(sha, 2, *fast_keys, 20, 60000, identifier, meta)
            if not reply:  # not the common case (the TTL watermark moves, once a lease): as the app does
                return full_script(full)(identifier)
            assert as_str(reply).split(":")[2] == "1"  # quiet

        return acquire

    def bound(scripts):
        def batch(name):
            acquire = scripts[name]
            ids = [uuid.uuid4().hex for _ in range(cycles)]
            before = _usec(client)
            for identifier in ids:
                acquire(identifier)
                pipe = client.pipeline(transaction=False)
                pipe.time()
                pipe.zscore(keys.timeouts, identifier)
                pipe.zrem(keys.timeouts, identifier)
                pipe.hdel(keys.holds, identifier)
                pipe.hget(keys.holds, "w")
                pipe.execute()
            after = _usec(client)
            usec = _delta(after, before, "evalsha")[0] + sum(
                _delta(after, before, c)[0] for c in _RELEASE_ONLY
            )
            time_usec, time_calls = _delta(after, before, "time")
            usec += time_usec * cycles / time_calls  # the release's TIME: half of them
            return usec / cycles

        for name in scripts:  # warm-up
            batch(name)
        figures = {"ours": [], "minimal": []}
        for r in range(rounds):
            for name in ("ours", "minimal") if r % 2 else ("minimal", "ours"):
                figures[name].append(batch(name))
        result = {name: median(values) for name, values in figures.items()}
        result["ratio"] = median(
            [o / m for o, m in zip(figures["ours"], figures["minimal"], strict=True) if m]
        )
        return result

    result = bound({"ours": full_script(full), "minimal": full_script(client.script_load(MINIMAL_ACQUIRE))})
    fast = {
        "ours": fast_script(client.script_load(FAST_ACQUIRE.source)),
        "minimal": fast_script(client.script_load(MINIMAL_FAST)),
    }
    result["fast"] = bound(fast)
    return result
