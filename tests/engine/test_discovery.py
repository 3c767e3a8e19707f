"""Partition discovery: one SCAN walk and one error policy for every caller.

Semaphore.partitions() / apartitions(), purge_expired() / apurge_expired(),
the admin and sema_status (monitor), the metrics' gauges and sema_cleanup all
find partitions through django_semaphore.discovery.
"""

import time

import pytest
from django.core.management import CommandError, call_command

from django_semaphore import Semaphore, SemaphoreBackendError, signals
from django_semaphore.backend.keys import PartitionKeys, key_hash
from django_semaphore.engine import discovery
from django_semaphore.ops import monitor
from tests.support.servers import free_port

SEMAPHORES = {
    "reports": {"LIMIT": 2, "TIMEOUT": 30},
    "per-ip": {"LIMIT": 1, "TIMEOUT": 30, "KEY": "ip"},
    "idle": {"LIMIT": 1, "TIMEOUT": 30},
}


@pytest.fixture
def configured(settings):
    settings.SEMAPHORES = SEMAPHORES


@pytest.mark.usefixtures("backend")
def test_find_groups_configured_then_unconfigured_semaphores(configured):
    reports, per_ip = Semaphore("reports"), Semaphore("per-ip")
    reports.acquire()
    per_ip.acquire(key="10.0.0.1")
    per_ip.acquire(key="10.0.0.2")
    Semaphore("gone: old name!", limit=1, timeout=30).acquire()  # not in SEMAPHORES

    found = discovery.find()

    assert [(f.name, f.configured) for f in found] == [
        ("reports", True),
        ("per-ip", True),
        ("idle", True),  # configured, no keys: listed all the same
        ("gone_old_name_", False),  # named by its key slug
    ]
    bases = {f.name: sorted(k.base for k in f.partitions) for f in found}
    assert bases["reports"] == [reports.partition().base]
    assert bases["per-ip"] == sorted(per_ip.partition(ip).base for ip in ("10.0.0.1", "10.0.0.2"))
    assert bases["idle"] == []
    assert bases["gone_old_name_"] == [Semaphore("gone: old name!", limit=1).partition().base]


@pytest.mark.usefixtures("backend")
def test_find_with_names_reads_only_those(configured):
    Semaphore("reports").acquire()
    Semaphore("per-ip").acquire(key="10.0.0.1")
    ad_hoc = Semaphore("ad-hoc", limit=1)
    ad_hoc.acquire()

    assert [(f.name, f.configured, len(f.partitions)) for f in discovery.find(["per-ip"])] == [
        ("per-ip", True, 1)
    ]
    found = discovery.find(["ad-hoc", "reports", "ad-hoc"])
    assert [(f.name, f.configured) for f in found] == [("ad-hoc", False), ("reports", True)]
    assert found[0].partitions == [ad_hoc.partition()]
    assert discovery.find([]) == []


@pytest.mark.usefixtures("backend")
def test_partition_parses_a_key_hash_as_the_admin_gives_it(configured, settings):
    sem = Semaphore("per-ip")
    keys = sem.partition("10.0.0.1")
    assert discovery.partition("per-ip", keys.key_digest) == keys
    assert discovery.partition("per-ip", "_") == sem.partition(None)
    for bad in ("_\n", "0" * 20 + "\n", "x" * 20, "", None):
        with pytest.raises(ValueError):
            discovery.partition("per-ip", bad)


@pytest.mark.usefixtures("backend")
def test_keys_found_by_scan_parse_back(settings):
    settings.SEMAPHORE_KEY_PREFIX = "pre:fix"
    keys = Semaphore("a {name} with: colons", limit=1).partition("{k}")
    found = PartitionKeys.from_timeouts_key(keys.timeouts.encode(), "pre:fix")
    assert found == keys
    assert (found.slug, found.name_digest, found.key_digest) == (
        "a_name_with_colons",
        keys.partition_hash.split(".")[0],
        keys.partition_hash.split(".")[1],
    )


def test_only_keys_of_the_exact_shape_under_the_prefix_parse_back():
    keys = PartitionKeys.build("pre", "name", "k")
    assert PartitionKeys.from_timeouts_key(keys.timeouts, "pre") == keys
    tag = keys.partition_hash
    for stray in (
        PartitionKeys.build("pre:other", "name", "k").timeouts,  # a longer prefix
        PartitionKeys.build("pre", "name", "k").timeouts.replace("pre:", "pref:"),
        f"pre:name:{{{tag}x}}:t",
        f"pre:name:{{{tag.upper()}}}:t",
        f"pre:na me:{{{tag}}}:t",
        f"pre:{'n' * 41}:{{{tag}}}:t",
        "pre:name:{x}:t",
        f"pre:name:{{{tag}}}:t\n",
        f"pre::{{{tag}}}:t",
    ):
        with pytest.raises(ValueError):
            PartitionKeys.from_timeouts_key(stray, "pre")


@pytest.mark.usefixtures("backend")
def test_discovery_keeps_to_the_prefix_and_to_partition_keys(settings, key_prefix, backend_redis):
    # SCAN's pattern "<prefix>:*:{*}:t" also matches another prefix that starts with this
    # one and stray keys: neither is a partition (sema_cleanup rewrote the other prefix's
    # keys and failed with WRONGTYPE on a string key).
    settings.SEMAPHORES = {}
    settings.SEMAPHORE_KEY_PREFIX = f"{key_prefix}:other"
    other = Semaphore("reports", limit=1, timeout=30)
    other.acquire()
    settings.SEMAPHORE_KEY_PREFIX = key_prefix
    ours = Semaphore("reports", limit=1, timeout=30)
    ours.acquire()
    tag = ours.partition().partition_hash.replace("_", "0" * 20)
    backend_redis.zadd(f"{key_prefix}:stray:{{not-ours}}:t", {"x": 1})
    backend_redis.set(f"{key_prefix}:string:{{{tag}}}:t", "not a zset")

    assert ours.partitions() == [ours.partition()]
    assert [(f.name, [k.base for k in f.partitions]) for f in discovery.find()] == [
        ("reports", [ours.partition().base])
    ]
    assert ours.purge_expired() == 0


@pytest.mark.usefixtures("backend")
@pytest.mark.asyncio
async def test_apartitions_finds_what_partitions_finds():
    sem = Semaphore("both", limit=1, timeout=30)
    for key in (None, "a", "b", "{c}"):
        await sem.aacquire(key=key)
    assert sorted(k.base for k in await sem.apartitions()) == sorted(k.base for k in sem.partitions())
    assert len(sem.partitions()) == 4


# -- one error policy -------------------------------------------------------------------


@pytest.fixture
def down(settings):
    """SEMAPHORE_REDIS pointing at a port nobody listens on; the backend_failed calls seen."""
    port = free_port()
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{port}/0"}
    settings.SEMAPHORES = SEMAPHORES
    sent = []

    def failed(sender, error, server, **kwargs):
        sent.append((sender, error, server))

    signals.backend_failed.connect(failed, weak=False)
    yield port, sent
    signals.backend_failed.disconnect(failed)


def _metrics_read_partitions():
    from django_semaphore.ops import metrics

    return metrics.read_partitions([Semaphore("reports")])


SYNC_CALLS = {
    "partitions": lambda: Semaphore("reports").partitions(),
    "purge_expired": lambda: Semaphore("reports").purge_expired(),
    "find": lambda: discovery.find(),
    "find-names": lambda: discovery.find(["reports", "idle"]),
    "monitor": lambda: monitor.read_all(),
    "metrics": _metrics_read_partitions,
}


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("call", SYNC_CALLS.values(), ids=SYNC_CALLS.keys())
def test_redis_down_is_one_backend_error_for_every_caller(down, call):
    port, sent = down
    started = time.monotonic()
    with pytest.raises(SemaphoreBackendError) as info:
        call()
    elapsed = time.monotonic() - started
    assert elapsed < 5, elapsed
    assert info.value.server == f"127.0.0.1:{port}"
    assert [(sender, error) for sender, error, _ in sent] == [(SemaphoreBackendError, info.value)]


ASYNC_CALLS = {
    "apartitions": lambda: Semaphore("reports").apartitions(),
    "apurge_expired": lambda: Semaphore("reports").apurge_expired(),
}


@pytest.mark.usefixtures("backend")
@pytest.mark.asyncio
@pytest.mark.parametrize("call", ASYNC_CALLS.values(), ids=ASYNC_CALLS.keys())
async def test_redis_down_is_one_backend_error_for_every_async_caller(down, call):
    port, sent = down
    with pytest.raises(SemaphoreBackendError) as info:
        await call()
    assert info.value.server == f"127.0.0.1:{port}"
    assert [(sender, error) for sender, error, _ in sent] == [(SemaphoreBackendError, info.value)]


@pytest.mark.usefixtures("backend")
def test_sema_cleanup_reports_redis_down_with_exit_code_1(down):
    port, sent = down
    with pytest.raises(CommandError) as info:
        call_command("sema_cleanup")
    assert info.value.returncode == 1 and f"127.0.0.1:{port}" in str(info.value)
    assert len(sent) == 1


# -- partition hashes from outside (the admin's force-release form) -----------------------------


@pytest.mark.parametrize(
    "value",
    [
        "_\n",
        "_x",
        "",
        "g" * 20,
        "A" * 20,
        "0" * 20 + "\n",
        "0" * 19,
        "0" * 21,
        "\n" + "0" * 20,
        "_ ",
        None,
        5,
    ],
)
def test_partition_hash_must_match_in_full(value):
    with pytest.raises(ValueError, match="is not a partition hash"):
        discovery.partition("web-user", value)  # before: "_\n" and "0"*20 + "\n" were accepted


@pytest.mark.parametrize("value", ["_", key_hash("alice"), key_hash("")])
def test_partition_hashes_of_real_partitions_are_accepted(value):
    keys = discovery.partition("web-user", value)
    assert keys.partition_hash.endswith("." + value)
