"""Redis keys: bounded, prefixed, one hash slot per partition, no collisions, always a TTL."""

import threading
import time

import pytest
from redis.crc import key_slot

from django_semaphore import Semaphore
from django_semaphore.backend import keys as keys_module
from django_semaphore.backend.keys import STATS, PartitionKeys, adhoc_key, stats_keys
from django_semaphore.config import settings as conf
from django_semaphore.runtime import stats
from tests.support.helpers import wait_until

HOSTILE = [
    "x",
    "x:owner",
    "x:o",
    "x:{x}:t",
    "{",
    "}",
    "{}",
    "a{b}c",
    "line\nbreak",
    "\r\n",
    "nul\0byte",
    "\0",
    " ",
    "*",
    "[a-z]?",
    "ünïcødé",
    "🚦🔒",
    "\ud800",  # a lone surrogate: not even valid UTF-8
    "k" * 100_000,
    "{" * 100_000,
]
NAMES = [n for n in HOSTILE if n != ""]
KEYS = [None, "", *HOSTILE]

TIMEOUT = 20


def written_keys(raw_redis, prefix):
    """The partition keys under ``prefix``: not the per-name stats keys nor the registry of
    ad-hoc semaphores, which the control poller flushes in the background at any moment
    (see the end of the test; tests/test_adhoc.py has the registry's)."""
    stats = f"{prefix}:{STATS}:".encode()
    registry = adhoc_key(prefix).encode()
    keys = raw_redis.scan_iter(match=prefix + ":*", count=1000)
    return {k for k in keys if not k.startswith(stats) and k != registry}


def test_every_key_is_bounded_prefixed_and_in_one_slot_per_partition(raw_redis, key_prefix):
    prefix = key_prefix.encode()
    seen = {}  # written key -> (name, key) that wrote it
    combos = [(name, None) for name in NAMES] + [("x", key) for key in KEYS[1:]]
    combos += [("🚦🔒", "\0"), ("{", "}"), ("\0", "\0"), ("k" * 100_000, "k" * 100_000)]
    assert len(set(combos)) == len(combos)
    for name, key in combos:
        before = written_keys(raw_redis, key_prefix)
        sem = Semaphore(name, limit=1, timeout=TIMEOUT)
        lease = sem.acquire(key=key)
        assert lease is not None, (name[:20], key and key[:20])
        assert sem.acquire(key=key) is None  # the partition is full...
        stats.flush()  # (the poller may flush the refusal's count here: make it always)
        new = written_keys(raw_redis, key_prefix) - before
        assert new, "the acquire wrote keys"
        for redis_key in new:
            assert len(redis_key) <= 300
            assert redis_key.startswith(prefix + b":")
            assert redis_key not in seen, f"{name[:20], key and key[:20]} shares with {seen[redis_key]}"
            seen[redis_key] = (name[:20], key and key[:20])
        assert len({key_slot(k) for k in new}) == 1
        # The key names the engine derives (including those not written yet) agree.
        keys = sem.partition(key)
        derived = [*keys.main, keys.lock, keys.wake(lease.identifier)]
        assert {k.encode() for k in derived} >= new
        assert all(len(k.encode()) <= 300 for k in derived)
        assert {key_slot(k.encode()) for k in derived} == {key_slot(next(iter(new)))}
    # ...and no other partition or name was touched: each still has its own free slot.
    assert Semaphore("x", limit=1).available(key="never-used") == 1
    # The refusals above are counted per name, in keys just as bounded and prefixed.
    stats.flush()
    counted = set(raw_redis.scan_iter(match=f"{key_prefix}:{STATS}:*", count=1000))
    assert counted == {stats_keys(key_prefix, name)[0].encode() for name in {n for n, _ in combos}}
    assert all(len(k) <= 300 for k in counted)


def test_x_owner_is_not_part_of_x():
    x = Semaphore("x", limit=1, timeout=TIMEOUT)
    x_owner = Semaphore("x:owner", limit=1, timeout=TIMEOUT)
    lease = x.acquire()
    assert x_owner.available() == 1 and x_owner.holders() == []
    other = x_owner.acquire()
    assert other is not None
    assert [h.identifier for h in x.holders()] == [lease.identifier]
    assert x.purge_expired() == 0 and x_owner.purge_expired() == 0


def test_key_none_and_empty_key_are_different_partitions():
    sem = Semaphore("split", limit=1, timeout=TIMEOUT)
    whole = sem.acquire(key=None)
    assert sem.available(key="") == 1
    empty = sem.acquire(key="")
    assert whole and empty
    assert sem.partition(None).base != sem.partition("").base
    assert [h.identifier for h in sem.holders()] == [whole.identifier]
    assert [h.identifier for h in sem.holders(key="")] == [empty.identifier]


def test_partitions_of_one_semaphore_are_found_for_purge(key_prefix):
    sem = Semaphore("many", limit=1, timeout=0.3)
    for key in ["a", "{b}", "\n", "🚦", "k" * 100_000]:
        assert sem.acquire(key=key) is not None
    Semaphore("many-other", limit=1, timeout=0.3).acquire()  # not part of "many"
    assert len(sem.partitions()) == 5
    wait_until(lambda: all(sem.available(k) == 1 for k in ["a", "{b}", "\n"]), message="expiry")
    assert sem.purge_expired() == 5


def test_the_prefix_comes_from_settings(settings, raw_redis):
    settings.SEMAPHORE_KEY_PREFIX = settings.SEMAPHORE_KEY_PREFIX + ":nested"
    sem = Semaphore("pre", limit=1)
    sem.acquire()
    assert sem.partition().base.startswith(settings.SEMAPHORE_KEY_PREFIX + ":")
    assert raw_redis.exists(sem.partition().timeouts)


def test_long_name_keys_stay_readable_and_bounded():
    base = PartitionKeys.build("sema", "reports/" + "é" * 10_000, "k" * 10_000).base
    assert base.startswith("sema:reports_")
    assert len(base.encode()) < 120


def _cache_calls():
    """Hits plus misses of the two key caches: a call that went through a cache counts one."""
    return sum(
        c.cache_info().hits + c.cache_info().misses
        for c in (keys_module._build_cached, keys_module._total_cached)
    )


@pytest.mark.parametrize("key", [None, "k"])
def test_a_long_name_is_not_kept_in_the_key_caches(key):
    """Ad-hoc names come from runtime input: a name longer than CACHED_NAME_LENGTH is built
    at every call, never stored in the 1,024-entry caches; its keys are the same."""
    long_name = "adhoc/" + "n" * 100_000
    before = _cache_calls()
    built = PartitionKeys.build("sema", long_name, key)
    total = PartitionKeys.for_total("sema", long_name, key)
    assert _cache_calls() == before  # neither cache was consulted, so nothing was stored
    assert built == PartitionKeys(keys_module._base("sema", long_name, key))
    assert built.main == PartitionKeys.build("sema", long_name, key).main
    assert total == PartitionKeys(
        keys_module._base("sema", long_name, keys_module.WHOLE_NAME, hashed=True), keys_module.key_hash(key)
    )
    # At the bound, a name is still cached, and gives the keys built without the cache.
    short_name = "n" * keys_module.CACHED_NAME_LENGTH
    assert PartitionKeys.build("sema", short_name, key) == PartitionKeys(
        keys_module._base("sema", short_name, key)
    )
    assert _cache_calls() == before + 1


# -- TTLs ---------------------------------------------------------------------


def _assert_fresh_ttl(raw_redis, names, timeout_ms, written_after):
    """API: at least TIMEOUT + 1 s right after a write; gone within 2 x TIMEOUT + 10 s.

    ``written_after`` is time.monotonic() just before the write: the TTL may
    have run down by the time elapsed since then, no more.
    """
    for name in names:
        pttl = raw_redis.pttl(name)
        elapsed_ms = (time.monotonic() - written_after) * 1000
        assert timeout_ms + 1000 - elapsed_ms - 5 <= pttl <= 2 * timeout_ms + 10_000, (name, pttl)


@pytest.mark.parametrize("algorithm", ["lua", "fair_locked", "fair", "basic"])
def test_keys_get_a_ttl_of_timeout_plus_one_second(raw_redis, algorithm):
    timeout = 5
    sem = Semaphore("ttl", limit=2, timeout=timeout, algorithm=algorithm)
    keys = sem.partition()
    # The "lua" engine keeps tokens in the holds HASH: it writes no owners ZSET.
    names = [keys.timeouts, keys.holds] + ([] if algorithm == "lua" else [keys.owners])
    started = time.monotonic()
    lease = sem.acquire()
    assert raw_redis.exists(keys.owners) == (0 if algorithm == "lua" else 1)
    _assert_fresh_ttl(raw_redis, names, timeout * 1000, started)
    # Renewed when written: let the TTLs run down a little, then refresh.
    first = raw_redis.pttl(keys.timeouts)
    wait_until(lambda: raw_redis.pttl(keys.timeouts) < first - 500, message="TTL running down")
    started = time.monotonic()
    assert lease.refresh() is True
    _assert_fresh_ttl(raw_redis, names, timeout * 1000, started)


def test_a_shorter_lease_never_shortens_the_ttl_below_a_longer_one(raw_redis):
    keys = Semaphore("ttl", limit=2).partition()
    started = time.monotonic()
    Semaphore("ttl", limit=2, timeout=TIMEOUT).acquire()
    Semaphore("ttl", limit=2, timeout=1).acquire()  # same keys, one-second lease
    _assert_fresh_ttl(raw_redis, [keys.timeouts, keys.holds], TIMEOUT * 1000, started)


def test_the_waiting_queue_keys_outlive_a_lease_too(raw_redis):
    sem = Semaphore("ttl-queue", limit=1, timeout=TIMEOUT)
    keys = sem.partition()
    sem.acquire()
    started = time.monotonic()
    assert sem.acquire(wait=0.05) is None  # queued, then gave up
    thread_result = {}
    thread = threading.Thread(target=lambda: thread_result.update(lease=sem.acquire(wait=2)))
    thread.start()
    wait_until(lambda: sem.status().waiting == 1, message="waiter queued")
    _assert_fresh_ttl(raw_redis, [keys.queue, keys.queue_deadlines], TIMEOUT * 1000, started)
    thread.join(10)


def test_no_key_is_ever_left_without_a_ttl(raw_redis, key_prefix):
    # Exercise every kind of write: grants, refusals, waiters, refreshes, releases.
    for algorithm in ["lua", "fair_locked", "fair", "basic"]:
        sem = Semaphore("ttl-" + algorithm, limit=1, timeout=5, algorithm=algorithm)
        for key in [None, "p"]:
            lease = sem.acquire(key=key)
            assert sem.acquire(key=key) is None
            assert sem.acquire(key=key, wait=0.05) is None
            waiter = {}
            thread = threading.Thread(
                target=lambda s=sem, k=key, w=waiter: w.update(lease=s.acquire(key=k, wait=10))
            )
            thread.start()
            if algorithm == "lua":
                wait_until(lambda s=sem, k=key: s.status(k).waiting == 1, message="waiter queued")
            lease.refresh()
            lease.release()
            thread.join(10)
            assert waiter["lease"] is not None
            waiter["lease"].refresh()
    found = written_keys(raw_redis, key_prefix)
    assert found
    ttls = {k: raw_redis.pttl(k) for k in found}
    # -1 would be a key without a TTL; -2 a short-lived key (a queue ticket) gone since the SCAN.
    assert all(ttl > 0 or ttl == -2 for ttl in ttls.values()), ttls


@pytest.mark.slow
def test_an_unused_partition_disappears_by_itself(prefix_keys):
    sem = Semaphore("vanish", limit=2, timeout=0.5)
    sem.acquire(key="k")
    sem.acquire(key="k", meta={"x": 1})
    assert prefix_keys()
    # API: within 2 x TIMEOUT + 10 s, without anyone releasing or purging. (The registry
    # of ad-hoc semaphores is no partition: it outlives them, tests/test_adhoc.py.)
    registry = adhoc_key(conf.setting("SEMAPHORE_KEY_PREFIX"))
    wait_until(lambda: set(prefix_keys()) <= {registry}, timeout=2 * 0.5 + 10, message="keys expiring")


def test_a_key_lost_alone_comes_back_with_a_ttl(raw_redis):
    # maxmemory's volatile-* policies evict keys one by one: the counter hash
    # can vanish while the ZSETs stay. It must come back with a TTL, and the
    # tokens must keep increasing.
    sem = Semaphore("evicted", limit=3, timeout=TIMEOUT)
    first = sem.acquire()
    keys = sem.partition()
    raw_redis.delete(keys.holds)
    second = sem.acquire()
    assert second.token > first.token
    assert all(raw_redis.pttl(k) > TIMEOUT * 1000 for k in (keys.timeouts, keys.holds))
