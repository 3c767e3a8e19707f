"""manage.py sema_status, against the real Redis."""

import pytest
from django.core.management import CommandError

from django_semaphore import Semaphore, semaphores
from django_semaphore.ops import monitor
from django_semaphore.runtime import adhoc, stats
from tests.support.helpers import run_command

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


def test_status_table():
    reports, per_ip = semaphores["reports"], semaphores["per-ip"]
    held = [reports.acquire(), per_ip.acquire(key="192.0.2.7")]
    try:
        lines = run_command("sema_status")
    finally:
        for lease in held:
            lease.release()
    assert lines[0].split() == [
        "SEMAPHORE", "PARTITION", "LIMIT", "IN", "USE", "FREE", "WAITING", "MODE", "LIMIT", "FROM"
    ]  # fmt: skip
    rows = [line.split() for line in lines[2:]]
    assert ["reports", "-", "2", "1", "1", "0", "enforce", "settings"] in rows
    assert ["quick", "-", "5", "0", "5", "0", "enforce", "settings"] in rows
    assert ["per-ip", "192.0.2.7", "1", "1", "0", "0", "enforce", "settings"] in rows


def test_status_says_where_the_limit_in_force_comes_from(settings):
    settings.SEMAPHORES = {**SEMAPHORES, "api": {"LIMIT": 4, "ADAPTIVE": {"MIN": 2, "MAX": 16}}}
    semaphores["reports"].override(limit=7, mode="dry_run")
    try:
        rows = [line.split() for line in run_command("sema_status")[2:]]
    finally:
        semaphores["reports"].clear_override()
    by_name = {row[0]: row for row in rows}
    assert by_name["reports"][2:6] == ["7", "0", "7", "0"]
    assert by_name["reports"][6:] == ["dry_run", "override", "(settings:", "2", "enforce)"]
    assert by_name["api"][2:] == ["4", "0", "4", "0", "enforce", "adaptive", "[2,", "16]"]


def test_status_with_name_lists_holders_in_token_order():
    reports = semaphores["reports"]
    first = reports.acquire(
        meta={"user": "alice", "method": "GET", "path": "/r/1", "remote_addr": "10.1.1.1"}
    )
    second = reports.acquire(meta={"user": "bob"})
    try:
        out = "\n".join(run_command("sema_status", "reports"))
    finally:
        first.release()
        second.release()
    assert "Holders: 2 of 2 in use, 0 waiting" in out
    assert out.index("alice") < out.index("bob")
    row = next(line for line in out.splitlines() if "alice" in line).split()
    assert row[0] == str(first.token)
    assert {"GET", "/r/1", "10.1.1.1"} <= set(row)
    assert first.identifier not in out


def test_status_unknown_name():
    with pytest.raises(CommandError, match="Unknown semaphore 'nope'") as info:
        run_command("sema_status", "nope")
    assert info.value.returncode == 2


@pytest.mark.parametrize("value", ["0", "-1", "-100"])
def test_max_partitions_below_one_is_a_command_error(value):
    # Used to be taken: 0 listed no partition and -1 one fewer, with false "more" figures.
    Semaphore("per-ip").acquire(key="10.0.0.1")
    for args, options in (((f"--max-partitions={value}",), {}), ((), {"max_partitions": int(value)})):
        with pytest.raises(CommandError, match="max_partitions must be an int >= 1") as info:
            run_command("sema_status", *args, **options)
        assert info.value.returncode == 2
    with pytest.raises(ValueError, match="max_partitions"):
        monitor.read_all(int(value))
    with pytest.raises(ValueError, match="max_partitions"):
        monitor.read_semaphore("per-ip", None, int(value))
    assert run_command("sema_status", "--max-partitions=1")  # the least


def test_ad_hoc_semaphores_in_use_are_listed_and_shown():
    adhoc.forget()
    crawler = Semaphore("crawler", limit=3, timeout=10)
    lease = crawler.acquire(key="example.com", meta={"user": "dana", "method": "CRAWL"})
    stats.flush()
    try:
        rows = [line.split() for line in run_command("sema_status")[2:]]
        out = "\n".join(run_command("sema_status", "crawler"))
    finally:
        lease.release()
    assert rows[-1] == ["crawler", "example.com", "3", "1", "2", "0", "enforce", "ad", "hoc"]
    assert [row[0] for row in rows[:-1]] == list(SEMAPHORES)
    assert "Partition example.com: 1 of 3 in use" in out and "dana" in out
    assert "crawler" not in [line.split()[0] for line in run_command("sema_status")[2:]]  # released


def test_a_total_name_shows_its_total_then_its_partitions(settings):
    settings.SEMAPHORES = {**SEMAPHORES, "exports": {"LIMIT": 2, "TIMEOUT": 30, "KEY": "user", "TOTAL": 3}}
    exports = semaphores["exports"]
    held = [
        exports.acquire(key="alice", meta={"user": "alice"}),
        exports.acquire(key="alice", meta={"user": "alice"}),
        exports.acquire(key="bob", meta={"user": "bob", "method": "POST"}),
    ]
    assert all(held)
    try:
        rows = [line.split() for line in run_command("sema_status")[2:]]
        out = "\n".join(run_command("sema_status", "exports"))
        exports.override(total=4)
        overridden = [line.split() for line in run_command("sema_status")[2:]]
    finally:
        exports.clear_override()
        for lease in held:
            lease.release()
    mine = [row for row in rows if row[0] == "exports"]
    assert mine == [
        ["exports", "(total)", "3", "3", "0", "0", "enforce", "settings"],
        ["exports", "alice", "2", "2", "0", "0", "enforce", "settings"],
        ["exports", "bob", "2", "1", "0", "0", "enforce", "settings"],  # no room left under TOTAL
    ]
    assert "+" not in [row[1] for row in rows]
    assert out.index("All partitions: 3 of 3 (TOTAL) in use, 0 waiting") < out.index("Partition alice")
    assert "Partition alice: 2 of 2 in use, 0 waiting" in out
    assert "Partition bob: 1 of 2 in use, 0 waiting" in out
    assert out.index("alice") < out.index("bob") and "POST" in out
    assert all(lease.identifier not in out for lease in held)
    total_row = next(row for row in overridden if row[:2] == ["exports", "(total)"])
    assert total_row[2:] == [
        "4",
        "3",
        "1",
        "0",
        "enforce",
        "override",
        "(settings:",
        "2",
        "enforce",
        "total",
        "3)",
    ]


def test_an_idle_total_name_shows_its_total(settings):
    settings.SEMAPHORES = {**SEMAPHORES, "exports": {"LIMIT": 2, "KEY": "user", "TOTAL": 3}}
    rows = [line.split() for line in run_command("sema_status")[2:]]
    assert [row for row in rows if row[0] == "exports"] == [
        ["exports", "(total)", "3", "0", "3", "0", "enforce", "settings"]
    ]
    out = run_command("sema_status", "exports")
    assert "All partitions: 0 of 3 (TOTAL) in use, 0 waiting" in out and "(no live partition)" in out
