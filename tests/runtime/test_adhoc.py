"""The registry of ad-hoc semaphores (django_semaphore.adhoc), against the real Redis.

A process records an ad-hoc semaphore's name and configuration once it takes
a slot of it, and again at most every RENEW_EVERY seconds while it keeps
using it; the control poller sends the records with the stats, so an acquire
never waits for them.
"""

import json
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

from django_semaphore import Semaphore, semaphores
from django_semaphore.backend.keys import adhoc_key, name_hash
from django_semaphore.config import settings as conf
from django_semaphore.ops import monitor
from django_semaphore.runtime import adhoc, stats
from tests.support.helpers import wait_until

pytestmark = pytest.mark.usefixtures("backend")


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = {"reports": {"LIMIT": 2, "TIMEOUT": 30}}


@pytest.fixture(autouse=True)
def fresh_process():
    """As in a process of its own: no name announced yet."""
    adhoc.forget()
    yield
    adhoc.forget()


def _registry(client):
    key = adhoc_key(conf.setting("SEMAPHORE_KEY_PREFIX"))
    fields = {_text(f): json.loads(v) for f, v in client.hgetall(key).items()}
    return fields, client.pttl(key)


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def test_an_ad_hoc_semaphore_is_recorded_once_used_with_a_ttl(backend_redis):
    crawler = Semaphore("crawler", limit=3, timeout=10, wait=0.5)
    lease = crawler.acquire()
    semaphores["reports"].acquire().release()  # configured: never recorded
    stats.flush()
    fields, ttl = _registry(backend_redis)
    assert list(fields) == [name_hash("crawler")]
    entry = fields[name_hash("crawler")]
    assert {k: entry[k] for k in ("name", "limit", "timeout", "wait", "algorithm", "mode")} == {
        "name": "crawler",
        "limit": 3,
        "timeout": 10,
        "wait": 0.5,
        "algorithm": "lua",
        "mode": "enforce",
    }
    assert ttl >= (2 * 10 + 10) * 1000 - 2000  # at least 2 x TIMEOUT + 10 s
    lease.release()


def test_the_registry_ttl_is_never_shortened(backend_redis):
    Semaphore("long", limit=1, timeout=3600).acquire().release()
    stats.flush()
    _, long_ttl = _registry(backend_redis)
    assert long_ttl >= (2 * 3600 + 10) * 1000 - 2000
    Semaphore("short", limit=1, timeout=1).acquire().release()
    stats.flush()
    fields, ttl = _registry(backend_redis)
    assert set(fields) == {name_hash("long"), name_hash("short")}
    assert ttl > long_ttl - 5000  # the short TIMEOUT's write left the longer TTL alone


def test_a_hostile_name_is_stored_bounded(backend_redis):
    name = "<script>alert(1)</script>{x}\n\x00" + "y" * 100_000
    Semaphore(name, limit=1, timeout=5).acquire().release()
    stats.flush()
    fields, _ = _registry(backend_redis)
    (field,) = fields
    assert field == name_hash(name) and len(field) == 16
    entry = fields[field]
    assert entry["truncated"] is True and len(entry["name"]) == adhoc.MAX_NAME_CHARS
    assert name.startswith(entry["name"])
    key = adhoc_key(conf.setting("SEMAPHORE_KEY_PREFIX"))
    assert len(backend_redis.hget(key, field)) < 1000


def _later(monkeypatch, seconds):
    """The registry's clock (only its own) ``seconds`` ahead."""
    now = time.monotonic()
    monkeypatch.setattr(adhoc, "time", SimpleNamespace(monotonic=lambda: now + seconds, time=time.time))


@pytest.mark.parametrize("field", ["limit", "until", "total"])
def test_a_record_with_an_infinite_number_is_malformed_not_fatal(backend_redis, field):
    """JSON's 1e400 reads as float infinity, which int() refuses with OverflowError (not a
    ValueError): one such record made the admin's list page (and sema_status) fail."""
    held = Semaphore("crawler-inf", limit=2, timeout=30).acquire()
    try:
        record = {"name": "crawler-inf", "limit": 2, "timeout": 30, "until": 0, "total": None}
        text = json.dumps({**record, field: 0}).replace(f'"{field}": 0', f'"{field}": 1e400')
        digest = name_hash("crawler-inf")
        key = adhoc_key(conf.setting("SEMAPHORE_KEY_PREFIX"))
        # This process's own record of the acquire goes first (the flush sends it once; the
        # control poller's flush may be sending it already): written after it, the malformed
        # one is what stays, not overwritten by a flush that comes later.
        stats.flush()
        wait_until(lambda: backend_redis.hexists(key, digest), 10, message="the acquire's own record sent")
        backend_redis.hset(key, digest, text)
        assert adhoc.Entry.parse(digest, text) is None
        names = [summary.name for summary in monitor.read_all()]
        assert "reports" in names and "crawler-inf" not in names  # the record is malformed
    finally:
        held.release()


def test_a_name_in_use_is_recorded_again_only_after_renew_every(backend_redis, monkeypatch):
    crawler = Semaphore("crawler", limit=3, timeout=10)
    crawler.acquire().release()
    stats.flush()
    key = adhoc_key(conf.setting("SEMAPHORE_KEY_PREFIX"))
    backend_redis.delete(key)
    crawler.acquire().release()
    stats.flush()
    assert backend_redis.exists(key) == 0  # recorded less than RENEW_EVERY ago: not again
    _later(monkeypatch, adhoc.RENEW_EVERY + 1)
    crawler.acquire().release()
    stats.flush()
    assert backend_redis.exists(key) == 1


def test_a_refreshed_lease_keeps_its_semaphore_recorded(backend_redis, monkeypatch):
    lease = Semaphore("long-job", limit=1, timeout=10).acquire()
    stats.flush()
    key = adhoc_key(conf.setting("SEMAPHORE_KEY_PREFIX"))
    backend_redis.delete(key)  # as if the registry had expired while the job ran on
    _later(monkeypatch, adhoc.RENEW_EVERY + 1)
    assert lease.refresh()
    stats.flush()
    assert name_hash("long-job") in _registry(backend_redis)[0]
    lease.release()


def test_a_failed_send_is_sent_again(backend_redis):
    Semaphore("crawler", limit=3, timeout=10).acquire().release()
    pending = stats.drain()
    assert pending.commands
    pending.restore()  # the poller's pipeline failed
    stats.flush()
    assert name_hash("crawler") in _registry(backend_redis)[0]


class Monitor:
    """Every command the single server runs meanwhile (redis-py's MONITOR), in a thread."""

    def __init__(self, client):
        self.client = client
        self.commands = []
        self.stop = f"stop-monitor-{uuid.uuid4().hex}"
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with self.client.monitor() as monitor:
            self.ready.set()
            for record in monitor.listen():
                if self.stop in record["command"]:
                    return
                if record.get("client_type") != "lua":  # not the commands scripts run
                    self.commands.append(record["command"])

    def __enter__(self):
        self.thread.start()
        self.ready.wait(5)
        time.sleep(0.1)  # MONITOR is in force once its reply came
        return self

    def __exit__(self, *exc):
        self.client.echo(self.stop)
        self.thread.join(10)

    def naming(self, text):
        return [command for command in self.commands if text in command]


def test_the_hot_path_gains_no_round_trip(raw_redis, settings):
    """100 acquires and releases of an ad-hoc semaphore send as many commands as those of a
    configured one; the registry gets one write, from the poller."""
    settings.SEMAPHORES = {"configured": {"LIMIT": 3, "TIMEOUT": 10}}
    configured, ad_hoc = semaphores["configured"], Semaphore("ad-hoc", limit=3, timeout=10)
    for sem in (configured, ad_hoc):  # scripts loaded, clients connected, overrides read
        sem.acquire().release()
    adhoc.forget()
    stats.flush()
    registry = adhoc_key(conf.setting("SEMAPHORE_KEY_PREFIX"))
    with Monitor(raw_redis) as seen:
        for sem in (configured, ad_hoc):
            for _ in range(100):
                sem.acquire().release()
        stats.flush()
    per_partition = {sem.name: len(seen.naming(sem.partition().base)) for sem in (configured, ad_hoc)}
    # A round trip is a script, or a quiet release's plain commands (its ZSCORE one of them).
    trips = {
        sem.name: sum(c.split()[0] in ("EVALSHA", "ZSCORE") for c in seen.naming(sem.partition().base))
        for sem in (configured, ad_hoc)
    }
    print(f"\ncommands sent for 100 acquire + release cycles: {per_partition}, round trips {trips}")
    assert per_partition["ad-hoc"] == per_partition["configured"]
    assert trips["ad-hoc"] == trips["configured"] == 200  # one round trip each
    assert len(seen.naming(registry)) == 1  # the registry: once, not per acquire
