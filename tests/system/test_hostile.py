"""Hostile input: huge and strange partition keys, floods of abandoned
partitions, a counter near 2^53."""

import time

import pytest
import redis
from redis.cluster import key_slot

from django_semaphore import Semaphore
from django_semaphore.backend import connection
from django_semaphore.backend.keys import stats_keys
from django_semaphore.engine.algorithms import ALGORITHMS, AcquireRequest
from django_semaphore.engine.semaphore import meta_json
from tests.support.helpers import wait_until

LUA = ALGORITHMS["lua"]

HOSTILE_KEYS = [
    "{" * 50_000 + "}" * 50_000,  # 100 kB of braces
    ("a\x00b\n{x}\r\n" * 10_000)[:100_000],  # NUL, newlines, braces
    "😀" * 25_000,  # 100 kB of emoji (4 bytes each in UTF-8)
    "}{",
    "",
    "\x00",
    "*?[]\\",
    "\udcff",  # a lone surrogate (not valid UTF-8)
]


@pytest.mark.parametrize("index", range(len(HOSTILE_KEYS)))
def test_hostile_partition_keys(backend, backend_redis, key_prefix, index):
    key = HOSTILE_KEYS[index]
    sem = Semaphore("host{ile}\n\x00😀" + "x" * 500, limit=1, timeout=10)
    lease = sem.acquire(key=key)
    assert lease is not None
    assert sem.acquire(key=key) is None
    assert sem.acquire(key=key + "!") is not None  # a different partition
    holders = sem.holders(key=key)
    assert [h.identifier for h in holders] == [lease.identifier]
    assert len(holders[0].meta["key"]) <= 64
    keys = [k for k in connection.scan_iter(backend_redis, key_prefix + ":*")]
    assert keys and all(len(k) <= 300 for k in keys)
    assert len({key_slot(k) for k in keys if lease.keys.partition_hash.encode() in k}) == 1
    assert lease.refresh() is True
    assert lease.release() is True
    assert sem.available(key=key) == 1


def test_hostile_names_do_not_share_keys():
    a = Semaphore("x", limit=1, timeout=10)
    b = Semaphore("x:owner", limit=1, timeout=10)
    c = Semaphore("x}{", limit=1, timeout=10)
    leases = [s.acquire() for s in (a, b, c)]
    assert all(leases)
    bases = {lease.keys.base for lease in leases}
    assert len(bases) == 3
    for sem, lease in zip((a, b, c), leases, strict=True):
        assert [h.identifier for h in sem.holders()] == [lease.identifier]


def test_meta_with_hostile_values_round_trips():
    sem = Semaphore("meta", limit=1, timeout=10)
    meta = {"path": "/a:b:c\n\x00{}", "emoji": "😀", "n": 2**60}
    lease = sem.acquire(key="k:1:2", meta=meta)
    holder = sem.holders(key="k:1:2")[0]
    assert {k: holder.meta[k] for k in meta} == meta
    assert holder.token == lease.token
    assert meta_json(None, None)  # the cached process meta is valid JSON text


# -- a counter near 2^53 --------------------------------------------------------------


@pytest.mark.parametrize("start", [2**53 - 3, 2**53 + 1, 2**62])
def test_counter_near_2_53_keeps_tokens_exact(backend, backend_redis, start):
    sem = Semaphore("counter", limit=6, timeout=30)
    sem.acquire().release()
    backend_redis.hset(sem.partition().holds, "#", start)
    leases = [sem.acquire() for _ in range(5)]
    expected = [start + i for i in range(1, 6)]
    assert [lease.token for lease in leases] == expected
    assert [h.token for h in sem.holders()] == expected
    assert all(type(lease.token) is int for lease in leases)
    assert leases[2].release()
    assert sem.acquire().token == start + 6


# -- 10^5 abandoned partitions ---------------------------------------------------------

PARTITIONS = 100_000


def _memory(client):
    return client.info("memory")["used_memory"]


@pytest.mark.slow
def test_abandoned_partitions_leave_nothing_behind(own_redis, settings):
    """10^5 per-IP partitions, TIMEOUT 1, never released: memory and keys come back."""
    settings.SEMAPHORES = {"per-ip": {"LIMIT": 2, "TIMEOUT": 1, "KEY": "ip"}}
    admin = redis.Redis(port=own_redis.port)
    # Redis's own bookkeeping is not the app's memory: the slow log keeps up
    # to 128 commands, and each command's first call allocates its latency
    # histogram, so the warm-up below runs every command the test sends.
    admin.config_set("slowlog-log-slower-than", -1)
    sem = Semaphore("per-ip")
    config = sem.config
    client = connection.get_client()

    # The semaphore's recent stats (two keys, bounded, a TTL of minutes) are
    # not partition keys: every partition key must go.
    per_semaphore = {key.encode() for key in stats_keys(settings.SEMAPHORE_KEY_PREFIX, "per-ip")}

    def partition_keys():
        return [key for key in admin.scan_iter(count=1000) if key not in per_semaphore]

    def left():  # for the failure message: what is still there, with its TTL
        return [(key, admin.pttl(key)) for key in partition_keys()[:5]]

    def flood(count, offset=0):
        # The engine's own acquire requests, pipelined for speed: the same script and keys.
        pipe = client.pipeline(transaction=False)
        for i in range(offset, offset + count):
            address = f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}"
            keys = sem.partition(address)
            request = next(
                LUA.acquire(
                    keys, config.limit, AcquireRequest(f"id{i}", meta_json(None, address), config.timeout_ms)
                )
            )
            pipe.evalsha(request.script.sha, len(request.keys), *request.keys, *request.args)
            if len(pipe) == 2000:
                assert all(reply[0] == 1 for reply in pipe.execute())
        assert all(reply[0] == 1 for reply in pipe.execute())

    assert sem.acquire(key="192.0.2.1").release()  # loads the script
    flood(100, offset=PARTITIONS)
    list(admin.scan_iter(count=1000))
    try:
        wait_until(lambda: not partition_keys(), timeout=15, message="warm-up keys expiring")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; left (key, PTTL ms): {left()}") from None
    readings = []

    def settled():  # the server cron shrinks emptied tables: wait for a steady reading
        readings.append(_memory(admin))
        return len(readings) >= 5 and len(set(readings[-5:])) == 1

    wait_until(settled, timeout=10, interval=0.1, message="steady memory")
    baseline = readings[-1]

    started = time.monotonic()
    flood(PARTITIONS)
    filled = time.monotonic()
    peak_keys = admin.dbsize()
    peak = _memory(admin)
    assert peak > 2 * baseline  # the flood was real (keys expire while it runs: t, o, h each)

    limit = 2 * config.timeout + 10
    recovered = wait_until(
        lambda: not partition_keys() and _memory(admin) <= baseline * 1.05,
        timeout=limit,
        interval=0.1,
        message="memory back within 5% of the baseline with no key left",
    )
    assert recovered
    seconds = time.monotonic() - filled
    final = _memory(admin)
    print(
        f"ABANDONED PARTITIONS: {PARTITIONS} in {filled - started:.1f}s; keys {peak_keys}; "
        f"used_memory baseline {baseline} peak {peak} final {final} "
        f"({100.0 * (final - baseline) / baseline:+.1f}%) after {seconds:.1f}s (limit {limit}s)"
    )
    assert seconds <= limit
    assert partition_keys() == []
    assert all(0 < admin.ttl(key) <= 360 for key in per_semaphore if admin.exists(key))
    admin.close()
