"""manage.py sema_cleanup, against the real Redis."""

import json
import subprocess
import sys
import threading

import pytest
from django.core.management import CommandError

from django_semaphore import Semaphore, semaphores
from django_semaphore.backend.keys import PartitionKeys, adhoc_key, name_hash
from django_semaphore.config import settings as conf
from django_semaphore.runtime import adhoc, stats
from tests.support.helpers import run_command, wait_until_expired
from tests.support.servers import free_port

# Every test runs on a single server and on a Redis Cluster (tests/support/fixtures_redis.py),
# except those that talk to the single server directly.
pytestmark = pytest.mark.usefixtures("backend")


SEMAPHORES = {
    "reports": {"LIMIT": 2, "TIMEOUT": 30},
    "quick": {"LIMIT": 5, "TIMEOUT": 0.2},
    "per-ip": {"LIMIT": 1, "TIMEOUT": 0.2, "KEY": "ip"},
}


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = SEMAPHORES


@pytest.fixture
def expired_and_live(raw_redis):
    """3 expired entries in "quick", 2 in two "per-ip" partitions, a live "reports" holder."""
    quick, per_ip = semaphores["quick"], semaphores["per-ip"]
    assert all([quick.acquire(), quick.acquire(), quick.acquire()])
    assert per_ip.acquire(key="10.0.0.1") and per_ip.acquire(key="10.0.0.2")
    live = semaphores["reports"].acquire()
    partitions = [quick.partition(), per_ip.partition("10.0.0.1"), per_ip.partition("10.0.0.2")]
    wait_until_expired(raw_redis, *partitions)
    yield live
    live.release()


def test_nothing_to_clean():
    assert run_command("sema_cleanup") == ["Removed 0 expired entries from 3 semaphores."]
    assert run_command("sema_cleanup", "--dry-run") == ["Would remove 0 expired entries from 3 semaphores."]


def test_dry_run_then_cleanup(expired_and_live, raw_redis):
    live = expired_and_live
    lines = run_command("sema_cleanup", "--dry-run", verbosity=2)
    assert lines == [
        "reports: would remove 0 expired entries from 1 partitions.",
        "quick: would remove 3 expired entries from 1 partitions.",
        "per-ip: would remove 2 expired entries from 2 partitions.",
        "Would remove 5 expired entries from 3 semaphores.",
    ]
    assert raw_redis.zcard(semaphores["quick"].partition().timeouts) == 3  # nothing removed

    assert run_command("sema_cleanup") == ["Removed 5 expired entries from 3 semaphores."]
    assert raw_redis.zcard(semaphores["quick"].partition().timeouts) == 0
    # No holder's record is left: only the counter, the TTL watermark, hold times and the note.
    assert set(raw_redis.hkeys(semaphores["quick"].partition().holds)) <= {b"#", b"e", b"%", b"~"}
    assert [h.token for h in semaphores["reports"].holders()] == [live.token]
    assert live.refresh() is True
    assert run_command("sema_cleanup", verbosity=0) == ["Removed 0 expired entries from 3 semaphores."]


def test_selected_semaphores(expired_and_live):
    lines = run_command(
        "sema_cleanup", "--semaphore", "per-ip", "--semaphore", "reports", "--semaphore", "per-ip"
    )
    assert lines == ["Removed 2 expired entries from 2 semaphores."]
    assert run_command("sema_cleanup", "--semaphore", "quick", verbosity=2) == [
        "quick: removed 3 expired entries from 1 partitions.",
        "Removed 3 expired entries from 1 semaphores.",
    ]


def test_unconfigured_semaphores_under_the_prefix_are_cleaned(raw_redis, settings):
    settings.SEMAPHORES = {**SEMAPHORES, "retired:old": {"LIMIT": 3, "TIMEOUT": 0.2}}
    retired = semaphores["retired:old"]
    assert retired.acquire() and retired.acquire()
    settings.SEMAPHORES = SEMAPHORES  # removed from settings while its entries are in Redis
    wait_until_expired(raw_redis, retired.partition())
    lines = run_command("sema_cleanup", verbosity=2)
    assert "retired_old (not in SEMAPHORES): removed 2 expired entries from 1 partitions." in lines
    assert lines[-1] == "Removed 2 expired entries from 4 semaphores."
    assert raw_redis.zcard(retired.partition().timeouts) == 0


def test_keys_of_a_longer_prefix_and_stray_keys_are_left_alone(backend_redis, key_prefix, settings):
    # "<prefix>:*:{*}:t" also matches prefix "<prefix>:other": its expired entries are its own.
    settings.SEMAPHORE_KEY_PREFIX = f"{key_prefix}:other"
    other = semaphores["quick"]
    assert other.acquire() and other.acquire()
    other_timeouts = other.partition().timeouts
    wait_until_expired(backend_redis, other.partition())
    settings.SEMAPHORE_KEY_PREFIX = key_prefix
    tag = semaphores["quick"].partition().partition_hash
    stray_zset = f"{key_prefix}:x:{{stray}}:t"
    backend_redis.zadd(stray_zset, {"member": 1})
    backend_redis.set(f"{key_prefix}:string:{{{tag}}}:t", "not a zset")

    assert run_command("sema_cleanup") == ["Removed 0 expired entries from 3 semaphores."]
    assert backend_redis.zcard(other_timeouts) == 2
    assert backend_redis.zcard(stray_zset) == 1


def test_a_partition_with_a_key_of_the_wrong_type_is_skipped(backend_redis, key_prefix, caplog):
    # A partition's timeout ZSET beside an owner "ZSET" that is a string: its purge fails with
    # WRONGTYPE; the cleanup used to end there (exit code 1), leaving every other partition.
    broken = PartitionKeys.build(key_prefix, "broken")
    backend_redis.zadd(broken.timeouts, {"gone": 1})  # expired long ago
    backend_redis.set(broken.owners, "not a zset")
    quick = semaphores["quick"]
    assert quick.acquire() and quick.acquire()
    wait_until_expired(backend_redis, quick.partition())

    lines = run_command("sema_cleanup", verbosity=2)
    assert "quick: removed 2 expired entries from 1 partitions." in lines
    assert lines[-1] == "Removed 2 expired entries from 4 semaphores."
    assert f"Skipped the partition {broken.base}" in caplog.text and "WRONGTYPE" in caplog.text


def test_ad_hoc_semaphores_are_cleaned_and_their_unused_records_removed(raw_redis):
    adhoc.forget()
    crawler = Semaphore("crawl:er", limit=3, timeout=0.2)
    assert crawler.acquire() and crawler.acquire()
    live = Semaphore("live-ad-hoc", limit=1, timeout=30)
    held = live.acquire()
    stats.flush()
    registry = adhoc_key(conf.setting("SEMAPHORE_KEY_PREFIX"))
    # A record whose semaphore has had no partition for longer than the record lasts.
    old = json.loads(raw_redis.hget(registry, name_hash("live-ad-hoc")))
    raw_redis.hset(registry, name_hash("gone"), json.dumps({**old, "name": "gone", "until": 1}))
    raw_redis.hset(registry, name_hash("live-ad-hoc"), json.dumps({**old, "until": 1}))  # live: kept
    wait_until_expired(raw_redis, crawler.partition())
    lines = run_command("sema_cleanup", "--dry-run", verbosity=2)
    assert "crawl:er (ad hoc): would remove 2 expired entries from 1 partitions." in lines
    assert raw_redis.hexists(registry, name_hash("gone"))  # a dry run removes nothing
    lines = run_command("sema_cleanup", verbosity=2)
    assert "crawl:er (ad hoc): removed 2 expired entries from 1 partitions." in lines
    assert "Removed 1 unused ad-hoc semaphore records." in lines
    assert lines[-1] == "Removed 2 expired entries from 5 semaphores."
    assert raw_redis.zcard(crawler.partition().timeouts) == 0
    fields = {f.decode() for f in raw_redis.hkeys(registry)}
    assert fields == {name_hash("crawl:er"), name_hash("live-ad-hoc")}  # crawl:er's record is recent
    held.release()


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_cleanup_scans_every_primary_of_a_cluster(backend, backend_redis):
    per_ip = semaphores["per-ip"]
    addresses = [f"192.0.2.{n}" for n in range(12)]
    for address in addresses:
        assert per_ip.acquire(key=address)
    partitions = [per_ip.partition(address) for address in addresses]
    nodes = {backend_redis.get_node_from_key(keys.timeouts).name for keys in partitions}
    assert len(nodes) > 1  # the partitions are spread over several primaries
    live = semaphores["reports"].acquire()
    wait_until_expired(backend_redis, *partitions)
    assert run_command("sema_cleanup", "--dry-run", verbosity=2)[2] == (
        "per-ip: would remove 12 expired entries from 12 partitions."
    )
    assert run_command("sema_cleanup")[-1] == "Removed 12 expired entries from 3 semaphores."
    assert all(backend_redis.zcard(keys.timeouts) == 0 for keys in partitions)
    assert [h.token for h in semaphores["reports"].holders()] == [live.token]
    rows = [line.split()[:6] for line in run_command("sema_status")[2:]]
    assert ["reports", "-", "2", "1", "1", "0"] in rows


def test_unknown_semaphore_is_a_command_error():
    with pytest.raises(CommandError, match="Unknown semaphore.*'nope'") as info:
        run_command("sema_cleanup", "--semaphore", "reports", "--semaphore", "nope")
    assert info.value.returncode == 2


def test_never_removes_a_live_holder_while_traffic_flows(settings):
    """Workers take and give back slots of a long lease while cleanup runs over and over."""
    settings.SEMAPHORES = {**SEMAPHORES, "busy": {"LIMIT": 1000, "TIMEOUT": 30}}
    busy = semaphores["busy"]
    lost = []
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            leases = [busy.acquire(key=k) for k in ("a", "b", None)]
            for lease in leases:
                if lease is None or not lease.refresh() or not lease.release():
                    lost.append(lease)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(30):
            assert run_command("sema_cleanup", "--semaphore", "busy") == [
                "Removed 0 expired entries from 1 semaphores."
            ]
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert lost == []


def _manage(subprocess_env, *args, redis_url=None):
    env = dict(subprocess_env)
    if redis_url:
        env["REDIS_URL"] = redis_url
    return subprocess.run(
        # --skip-checks: tests.support.urls guards views with entries only the web tests define (E027).
        [sys.executable, "-m", "django", *args, "--settings", "tests.support.settings", "--skip-checks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_exit_codes(subprocess_env):
    done = _manage(subprocess_env, "sema_cleanup")
    assert (done.returncode, done.stdout) == (0, "Removed 0 expired entries from 1 semaphores.\n")
    unknown = _manage(subprocess_env, "sema_cleanup", "--semaphore", "nope")
    assert unknown.returncode == 2 and "Unknown semaphore(s): 'nope'" in unknown.stderr
    down = _manage(subprocess_env, "sema_cleanup", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    assert down.returncode == 1 and "failed" in down.stderr
    status = _manage(subprocess_env, "sema_status", "nope")
    assert status.returncode == 2


def test_every_option_names_its_default():
    from django_semaphore.management.commands import sema_cleanup, sema_status

    for module in (sema_cleanup, sema_status):
        parser = module.Command().create_parser("manage.py", module.__name__.rsplit(".", 1)[1])
        own = [a for a in parser._actions if a.dest in ("names", "dry_run", "name", "max_partitions")]
        assert own
        for action in own:
            assert "Default:" in action.help, action.dest


def test_a_total_name_is_cleaned_once_for_all_its_partitions(raw_redis, settings):
    settings.SEMAPHORES = {**SEMAPHORES, "exports": {"LIMIT": 2, "TIMEOUT": 0.2, "KEY": "user", "TOTAL": 3}}
    exports = semaphores["exports"]
    assert exports.acquire(key="a") and exports.acquire(key="a") and exports.acquire(key="b")
    keys = exports.partition("a")
    wait_until_expired(raw_redis, keys)
    lines = run_command("sema_cleanup", "--dry-run", verbosity=2)
    assert "exports: would remove 3 expired entries from all partitions (TOTAL)." in lines
    assert lines[-1] == "Would remove 3 expired entries from 4 semaphores."
    lines = run_command("sema_cleanup", "--semaphore", "exports", verbosity=2)
    assert lines == [
        "exports: removed 3 expired entries from all partitions (TOTAL).",
        "Removed 3 expired entries from 1 semaphores.",
    ]
    assert raw_redis.zcard(keys.timeouts) == 0
    assert exports.status().in_use == 0 and exports.partitions() == []
    assert run_command("sema_cleanup") == ["Removed 0 expired entries from 4 semaphores."]
