"""Read-only overviews of the semaphores in Redis (django_semaphore.monitor), as the
admin and ``sema_status`` show them, and the cleanup they run."""

import pytest

from django_semaphore import Semaphore, semaphores
from django_semaphore.backend.keys import key_hash, name_hash
from django_semaphore.config import settings as conf
from django_semaphore.engine import discovery
from django_semaphore.ops import monitor
from django_semaphore.runtime import adhoc, stats
from tests.support.helpers import wait_until_expired

SEMAPHORES = {
    "reports": {"LIMIT": 4, "TIMEOUT": 30},
    "per-ip": {"LIMIT": 2, "TIMEOUT": 30, "KEY": "ip"},
    "per-user": {"LIMIT": 1, "KEY": "user"},
    "per-tenant": {"LIMIT": 1, "KEY": "header:X-Tenant"},
    "per-function": {"LIMIT": 1, "KEY": "django_semaphore.config.key_functions.by_ip"},
    "per-lambda": {"LIMIT": 1, "KEY": lambda request: "k"},
    "broken": {"LIMIT": 0},
}


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = SEMAPHORES


def test_describe_key_says_how_a_semaphore_is_partitioned():
    described = {name: monitor.describe_key(conf.get_config(name)) for name in SEMAPHORES if name != "broken"}
    assert described == {
        "reports": "",
        "per-ip": "per IP",
        "per-user": "per user",
        "per-tenant": "per X-Tenant header",
        "per-function": "per IP",  # the dotted path names the same function as "ip"
        "per-lambda": "per <lambda>",
    }


@pytest.mark.usefixtures("backend")
def test_partitions_are_listed_busiest_first_with_their_figures():
    per_ip = semaphores["per-ip"]
    held = [per_ip.acquire(key="10.0.0.1"), per_ip.acquire(key="10.0.0.2"), per_ip.acquire(key="10.0.0.2")]
    try:
        view = monitor.read_semaphore("per-ip")
    finally:
        for lease in held:
            lease.release()
    assert (view.name, view.partitioned_by, view.error) == ("per-ip", "per IP", "")
    assert [(p.label, p.in_use, p.free, p.utilisation, p.level) for p in view.partitions] == [
        ("10.0.0.2", 2, 0, 100, "full"),
        ("10.0.0.1", 1, 1, 50, "low"),
    ]
    assert view.in_use == 3
    busiest = view.partitions[0]
    assert [h.token for h in busiest.holders] == [held[1].token, held[2].token]  # token order
    for data in busiest.as_dict(holders=True)["holders"]:
        assert held[1].identifier not in str(data) and held[2].identifier not in str(data)


@pytest.mark.usefixtures("backend")
def test_an_unpartitioned_semaphore_shows_its_one_partition_even_unused():
    (partition,) = monitor.read_semaphore("reports").partitions
    assert partition.unpartitioned and partition.label == ""
    assert (partition.limit, partition.in_use, partition.free, partition.level) == (4, 0, 4, "idle")


@pytest.mark.usefixtures("backend")
def test_partitions_beyond_the_maximum_are_counted_not_read():
    per_ip = semaphores["per-ip"]
    held = [per_ip.acquire(key=f"10.0.1.{n}") for n in range(5)]
    try:
        view = monitor.read_semaphore("per-ip", max_partitions=3)
    finally:
        for lease in held:
            lease.release()
    assert (len(view.partitions), view.hidden) == (3, 2)


def test_a_semaphore_with_bad_settings_gets_its_error_instead_of_figures():
    view = monitor.read_semaphore("broken")
    assert "LIMIT" in view.error and "E003" in view.error
    assert view.partitions == []


@pytest.mark.usefixtures("backend")
def test_cleanup_removes_expired_entries_only(backend_redis):
    quick = Semaphore("reports", limit=4, timeout=0.2)  # leases that end at once, in a partition of their own
    assert quick.acquire(key="old") and quick.acquire(key="old")
    live = semaphores["reports"].acquire()
    wait_until_expired(backend_redis, quick.partition("old"))
    (found,) = discovery.find(["reports"])
    assert len(found.partitions) == 2
    assert monitor.cleanup(found, dry_run=True) == 2
    assert monitor.cleanup(found) == 2
    assert monitor.cleanup(found) == 0
    assert [h.token for h in semaphores["reports"].holders()] == [live.token]
    assert live.release() is True


@pytest.fixture
def fresh_process():
    """As in a process of its own: no ad-hoc name announced yet."""
    adhoc.forget()
    yield
    adhoc.forget()


@pytest.mark.usefixtures("backend", "fresh_process")
def test_ad_hoc_semaphores_with_live_partitions_are_listed_after_the_configured_ones():
    crawler = Semaphore("crawler", limit=3, timeout=10)
    held = [crawler.acquire(key="example.com"), crawler.acquire(key="example.com")]
    held.append(crawler.acquire(key="example.org"))
    Semaphore("idle-ad-hoc", limit=1, timeout=10).acquire().release()  # recorded, no live partition
    stats.flush()
    try:
        views = monitor.read_all()
        one = monitor.read_semaphore("crawler")
        by_partition = monitor.read_semaphore("crawler", key_hash("example.org"))
    finally:
        for lease in held:
            lease.release()
    assert [v.name for v in views] == [*SEMAPHORES, "crawler"]
    view = views[-1]
    assert view.ad_hoc and not any(v.ad_hoc for v in views[:-1])
    assert (view.limit, view.timeout, view.algorithm, view.error, view.mode) == (3, 10, "lua", "", "enforce")
    assert view.ident == "crawler" and view.as_dict()["ad_hoc"] is True
    figures = [(p.label, p.in_use, p.free) for p in view.partitions]
    assert figures == [("example.com", 2, 1), ("example.org", 1, 2)]
    assert one.ad_hoc and [h.token for h in one.partitions[0].holders] == [held[0].token, held[1].token]
    assert [p.label for p in by_partition.partitions] == ["example.org"]
    # Released: no live partition, no line (and the registry alone never makes one).
    assert [v.name for v in monitor.read_all()] == list(SEMAPHORES)
    after = monitor.read_semaphore("crawler")  # its own page: recorded, nothing held
    assert after.ad_hoc and after.partitions == [] and after.error == ""
    assert "nope" in monitor.read_semaphore("nope").error


@pytest.mark.usefixtures("backend", "fresh_process")
def test_an_ad_hoc_semaphore_whose_name_was_cut_is_read_by_its_digest():
    name = "x" * (adhoc.MAX_NAME_CHARS + 50)
    lease = Semaphore(name, limit=2, timeout=10).acquire()
    stats.flush()
    try:
        (view,) = [v for v in monitor.read_all() if v.ad_hoc]
        again = monitor.read_semaphore(view.ident)
    finally:
        lease.release()
    assert view.name == name[: adhoc.MAX_NAME_CHARS] and view.ident == name_hash(name)
    assert [p.in_use for p in view.partitions] == [1] and [p.in_use for p in again.partitions] == [1]
