"""Read-only overviews of the semaphores in Redis (django_semaphore.monitor), as the
admin and ``sema_status`` show them, and the cleanup they run."""

import pytest

from django_semaphore import Semaphore, conf, discovery, monitor, semaphores
from tests.helpers import wait_until_expired

SEMAPHORES = {
    "reports": {"LIMIT": 4, "TIMEOUT": 30},
    "per-ip": {"LIMIT": 2, "TIMEOUT": 30, "KEY": "ip"},
    "per-user": {"LIMIT": 1, "KEY": "user"},
    "per-tenant": {"LIMIT": 1, "KEY": "header:X-Tenant"},
    "per-function": {"LIMIT": 1, "KEY": "django_semaphore.partitions.by_ip"},
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
