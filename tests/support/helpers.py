"""Small helpers shared by the test modules."""

import asyncio
import json
import os
import threading
import time
from io import StringIO

import redis.cluster
from django.core.management import call_command
from django.core.signals import request_finished
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

#: The repository's root (README.rst, docs/, testproject/, the package).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


#: Limits that every way of setting one must refuse (LIMIT and ADAPTIVE in settings, an
#: ad-hoc Semaphore, override() and aoverride()): out of 0..1,000,000, or not an int.
HOSTILE_LIMITS = (10**6 + 1, 10**20, 2**63 - 1, 2**53 + 1, -1, 1.5, "3", True, "١٢", "1_000", "+3", " 7 ", "")
#: The same as an operator types them (``sema_set --limit``, the admin form): anything
#: but ASCII digits for a number from 0 to 1,000,000.
HOSTILE_LIMIT_TEXTS = (
    "1000001",
    str(10**20),
    "99999999999999999999999",
    str(2**63 - 1),
    str(2**53 + 1),
    "9" * 5000,
    "-1",
    "1.5",
    "3.0",
    "1e3",
    "0x10",
    "True",
    "١٢",
    "1_000",
    "+3",
    " 7 ",
    "7\n",
    "",
)


def wait_until(predicate, timeout=10.0, interval=0.02, message="condition", state=None):
    """Poll ``predicate`` until it returns a true value; fail after ``timeout`` seconds.

    ``state``: a callable whose value the failure quotes (what was seen instead), so
    that a failure seen once on a loaded machine says why."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = "" if state is None else f"; seen: {state()!r}"
            raise AssertionError(f"{message} not reached within {timeout}s{seen}")
        time.sleep(interval)


async def until(predicate, timeout=10.0, message="condition", interval=0.02):
    """Await ``predicate()`` (a coroutine function) becoming true; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() >= deadline:
            raise AssertionError(f"{message} not reached within {timeout}s")
        await asyncio.sleep(interval)


def release_all(held, waiter, got):
    """A test's teardown of leases and one waiting thread: release ``held``, let the
    ``waiter`` thread end (a release above serves it), then release what it ``got``."""
    for lease in held:
        lease.release()
    waiter.join(30)
    for lease in got:
        if lease:
            lease.release()


def max_overlap(intervals):
    """Sweep line over (start, end) intervals.

    Returns ``(maximum concurrency, starts)`` where ``starts`` lists, for
    every interval start, how many intervals were open just after it (ends
    sort before starts at equal times, so touching intervals do not overlap).
    """
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    open_now = peak = 0
    levels = []
    for _, delta in events:
        open_now += delta
        if delta > 0:
            levels.append(open_now)
        peak = max(peak, open_now)
    return peak, levels


# -- signals --------------------------------------------------------------------------


def names_of(seen, name):
    """The kwargs of every ``name`` signal in ``seen`` (the ``received`` fixture's record)."""
    return [kwargs for signal, kwargs in seen if signal == name]


# -- responses ------------------------------------------------------------------------


def body(response):
    """A response's JSON body."""
    return json.loads(response.content)


def close(response):
    """Close like a server would, without request_finished touching the test database."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


# -- management commands and expired leases ---------------------------------------------


def run_command(*args, **options):
    """``call_command(*args)``: the lines it wrote to stdout."""
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue().splitlines()


def server_ms(client, key=None):
    """The Redis clock (ms, with its fraction: ``int()`` gives the whole ms the scripts
    use) of the server holding ``key``; ``client`` a Redis client, or a RedisCluster
    client with the ``key`` that picks the node."""
    if isinstance(client, redis.cluster.RedisCluster):
        client = client.get_node_from_key(key).redis_connection
    seconds, micros = client.time()
    return seconds * 1000 + micros / 1000


def expire_now(client, timeouts, identifier):
    """Move ``identifier``'s lease expiry in the timeouts ZSET ``timeouts`` into the
    server's past (a millisecond ago), as if its TIMEOUT had passed: the ZADD's reply
    (0, since the entry is there and only its score changes)."""
    past = int(server_ms(client, timeouts)) - 1
    return client.zadd(timeouts, {identifier: past}, xx=True)


def wait_until_expired(client, *partitions):
    """Block until the Redis clock is past every lease in ``partitions`` (PartitionKeys).

    The keys are PERSISTed first: their TTL (lease + 1 s) must not remove them
    before the cleanup under test sees the expired entries on a slow machine.
    ``client`` is a plain Redis or RedisCluster client.
    """
    for keys in partitions:
        for key in (keys.timeouts, keys.owners, keys.holds):
            client.persist(key)
        scores = client.zrange(keys.timeouts, 0, -1, withscores=True)
        assert scores, f"no lease in {keys.base}"
        deadline = max(score for _, score in scores) + 1
        while (left_ms := deadline - server_ms(client, keys.timeouts)) >= 0:
            time.sleep(left_ms / 1000)


def count_round_trips(monkeypatch):
    """The round trips the calling thread makes from now on, as a list that grows: each
    request the driver sends (``EVALSHA`` for a script, a command's first word,
    ``PIPELINE``), whether redis-py or a lane carries it.  Other threads (the
    scheduler's poll and flush) are left out."""
    from django_semaphore.backend import scripting

    sent = []
    original = scripting.execute
    thread = threading.get_ident()

    def counting(client, request):
        if threading.get_ident() == thread:
            if type(request) is scripting.Script:
                sent.append("EVALSHA")
            elif type(request) is scripting.Pipe:
                sent.append("PIPELINE")
            elif type(request) is scripting.Command:
                sent.append(str(request.args[0]).upper())
        return original(client, request)

    monkeypatch.setattr(scripting, "execute", counting)
    return sent


def scripts_run(monkeypatch):
    """The scripts the calling code runs from now on, by name (sync and async drivers)."""
    from django_semaphore.backend import scripting

    ran = []
    original, aoriginal = scripting.execute, scripting.aexecute

    def counting(client, request):
        if type(request) is scripting.Script:
            ran.append(request.script.name)
        return original(client, request)

    async def acounting(client, request):
        if type(request) is scripting.Script:
            ran.append(request.script.name)
        return await aoriginal(client, request)

    monkeypatch.setattr(scripting, "execute", counting)
    monkeypatch.setattr(scripting, "aexecute", acounting)
    return ran


#: _lib.lua's HOLD_FIRST: releases record their hold times until this many are recorded.
HOLD_FIRST = 8


def lease_keys_state(raw_redis, keys):
    """What a partition's lease keys hold: the timeouts ZSET's entries and scores,
    the holds HASH's fields, and whether each key has a TTL.  By content, not by
    ``DUMP``: a hashtable-encoded HASH's dump moves with its incremental rehashing."""
    return (
        raw_redis.zrange(keys.timeouts, 0, -1, withscores=True),
        raw_redis.hgetall(keys.holds),
        [raw_redis.pttl(key) > 0 for key in (keys.timeouts, keys.holds)],
    )


def warm_hold_times(sem, **kwargs):
    """``sem.acquire(**kwargs)`` and release, HOLD_FIRST times: the hold times its
    releases record from then on are only the ones still wanted (its grants are quiet)."""
    for _ in range(HOLD_FIRST):
        lease = sem.acquire(**kwargs)
        assert lease is not None and lease.release() is True


def queue_waiters(sem, count, wait=10):
    """``count`` threads that each ``sem.acquire(wait=wait)``, queued in order (each
    is waiting before the next starts): (the threads, {n: the lease it got})."""
    got = {}
    threads = []
    for n in range(count):
        thread = threading.Thread(target=lambda n=n: got.__setitem__(n, sem.acquire(wait=wait)))
        thread.start()
        threads.append(thread)
        wait_until(lambda n=n: sem.status().waiting == n + 1, 5, message="queued")
    return threads, got


def run_model(machine, examples, steps=30):
    """Run a Hypothesis state machine against the real engine: ``examples`` runs of
    up to ``steps`` steps, no deadline (a step waits on real servers), no example
    database, and the health checks a function-scoped fixture and slow steps trip."""
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            database=None,
        ),
    )
