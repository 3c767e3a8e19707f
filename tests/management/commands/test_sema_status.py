"""manage.py sema_status, against the real Redis."""

import pytest
from django.core.management import CommandError

from django_semaphore import semaphores
from tests.helpers import run_command

# Every test runs on a single server and on a Redis Cluster (tests/fixtures_redis.py),
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
    assert lines[0].split() == ["SEMAPHORE", "PARTITION", "LIMIT", "IN", "USE", "FREE", "WAITING"]
    rows = [line.split() for line in lines[2:]]
    assert ["reports", "-", "2", "1", "1", "0"] in rows
    assert ["quick", "-", "5", "0", "5", "0"] in rows
    assert ["per-ip", "192.0.2.7", "1", "1", "0", "0"] in rows


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
