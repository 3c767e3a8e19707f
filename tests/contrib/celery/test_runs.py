"""contrib.celery.runs: one live run of a task id at a time, none after one completed."""

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("celery")

from django_semaphore import Semaphore
from django_semaphore.contrib.celery import runs, store
from tests.support.helpers import wait_until

pytestmark = pytest.mark.usefixtures("backend")


@pytest.fixture
def keys():
    return Semaphore("cel-runs", limit=1, timeout=30).partition("p")


@pytest.fixture
def quick(monkeypatch):
    """A short heartbeat, so that waiting out a run takes a fraction of a second."""
    monkeypatch.setattr(runs, "HEARTBEAT_MS", 300)
    monkeypatch.setattr(runs, "HEARTBEAT_EVERY", 0.05)


def test_a_completed_run_makes_later_messages_duplicates(keys, backend_redis):
    run = runs.claim(keys, "t-1", "lease-a")
    assert isinstance(run, runs.Run)
    runs.end(run, done=True)
    assert runs.claim(keys, "t-1", "lease-b") == runs.Duplicate(done=True)
    assert 3_500_000 < backend_redis.pttl(store.run_key(keys, "t-1")) <= 3_600_000


def test_a_run_that_raised_or_retried_lets_its_task_id_go(keys):
    run = runs.claim(keys, "t-2")
    runs.end(run, done=False)
    again = runs.claim(keys, "t-2")
    assert isinstance(again, runs.Run) and again.value != run.value
    runs.end(again, done=True)


def test_a_live_run_is_waited_out_then_the_message_is_a_duplicate(keys, quick):
    run = runs.claim(keys, "t-3", "lease-a")  # renewed by this process's heartbeat
    started = time.monotonic()
    found = runs.claim(keys, "t-3", "lease-b")
    waited = time.monotonic() - started
    assert found == runs.Duplicate(done=False, identifier="lease-a")
    assert 0.3 <= waited < 3  # the heartbeat's TTL plus a second, not longer
    runs.end(run, done=True)


def test_a_run_whose_heartbeat_stopped_is_taken_over(keys, quick, backend_redis):
    # Another host's run whose process died: nothing renews its claim.
    backend_redis.set(store.run_key(keys, "t-4"), "run:elsewhere:1:abc:lease-a", px=300)
    run = runs.claim(keys, "t-4", "lease-b")
    assert isinstance(run, runs.Run)
    runs.end(run, done=True)


def test_a_run_of_a_dead_process_on_this_host_is_taken_over_at_once(keys, backend_redis):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    backend_redis.set(store.run_key(keys, "t-5"), f"run:{runs.HOST}:{dead.pid}:abc:lease-a", px=60_000)
    started = time.monotonic()
    run = runs.claim(keys, "t-5", "lease-b")
    # Taken over (its claim outlives claim()'s wait, so a Run proves it), and without
    # waiting out that wait (HEARTBEAT_MS + 1 s): well under half of it, on any load.
    assert isinstance(run, runs.Run) and time.monotonic() - started < runs.HEARTBEAT_MS / 2000
    runs.end(run, done=True)


def test_a_run_in_another_pid_namespace_of_this_host_is_never_taken_for_dead(
    keys, quick, backend_redis, subprocess_env
):
    # Containers that share the host's network share its hostname, not its PIDs:
    # a run there names a pid that here is no process (or another one). It must
    # be waited out like a run on another host, never taken over at once.
    other = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-c",
            "import django; django.setup(); "
            "from django_semaphore.contrib.celery import runs; print(runs.HOST)",
        ],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert other != runs.HOST and other.split("/")[0] == runs.HOST.split("/")[0]  # same hostname
    no_process_here = subprocess.Popen([sys.executable, "-c", "pass"])
    no_process_here.wait()
    claimant = f"run:{other}:{no_process_here.pid}:abc:lease-a"
    backend_redis.set(store.run_key(keys, "t-ns"), claimant, px=60_000)
    assert runs.claim(keys, "t-ns", "lease-b") == runs.Duplicate(done=False, identifier="lease-a")
    assert backend_redis.get(store.run_key(keys, "t-ns")).decode() == claimant


def test_the_heartbeat_keeps_a_live_runs_claim(keys, quick, backend_redis):
    run = runs.claim(keys, "t-6")
    key = store.run_key(keys, "t-6")
    time.sleep(1.0)  # three TTLs: the claim lives on only if it is renewed
    assert backend_redis.get(key).decode() == run.value
    runs.end(run, done=False)
    assert not backend_redis.exists(key)


def test_the_end_of_another_processs_run_is_not_ours(keys, backend_redis):
    run = runs.claim(keys, "t-7")
    backend_redis.set(run.key, "run:elsewhere:1:xyz:", px=60_000)  # taken over meanwhile
    runs.end(run, done=True)
    assert backend_redis.get(run.key) == b"run:elsewhere:1:xyz:"


def test_a_lost_claim_is_logged_once(keys, quick, backend_redis, caplog):
    run = runs.claim(keys, "t-8")
    backend_redis.set(run.key, "run:elsewhere:1:xyz:", px=60_000)
    wait_until(lambda: "claim was lost" in caplog.text, 5, message="the warning")
    assert caplog.text.count("claim was lost") == 1


def _gone_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_slot_of_a_run_whose_process_died_is_told_to_the_next_run(keys, backend_redis):
    # Its claim expired long ago (Celery redelivered after the heartbeat's TTL): the slot
    # record, kept as long as the lease can live, still names the dead run's lease.
    backend_redis.set(store.slot_key(keys, "t-9"), f"{runs.HOST}:{_gone_pid()}:lease-a", px=60_000)
    run = runs.claim(keys, "t-9", "")
    assert isinstance(run, runs.Run) and run.orphan == "lease-a"
    runs.end(run, done=True)


@pytest.mark.parametrize("where", ["a live process", "another host", "malformed"])
def test_a_slot_whose_holder_may_be_alive_is_no_orphan(keys, backend_redis, where):
    record = {
        "a live process": f"{runs.HOST}:{os.getppid()}:lease-a",
        "another host": f"elsewhere/abc:{_gone_pid()}:lease-a",
        "malformed": f"{runs.HOST}:not-a-pid:lease-a",
    }[where]
    backend_redis.set(store.slot_key(keys, "t-10"), record, px=60_000)
    run = runs.claim(keys, "t-10", "")
    assert isinstance(run, runs.Run) and run.orphan == ""
    runs.end(run, done=False)
    # Taken over all the same: it names this process now (no reaper gives it back under it).
    assert backend_redis.get(store.slot_key(keys, "t-10")).decode() == f"{runs.HOST}:{os.getpid()}:lease-a"


def test_a_held_slot_is_recorded_for_as_long_as_its_lease_can_live(keys, quick, backend_redis):
    run = runs.claim(keys, "t-11")
    runs.hold(run, "lease-a", timeout=0.5)
    slot = store.slot_key(keys, "t-11")
    assert backend_redis.get(slot).decode() == f"{runs.HOST}:{os.getpid()}:lease-a"
    time.sleep(2.0)  # past the record's first TTL (TIMEOUT + 1 s): it lives on if renewed
    assert backend_redis.get(slot).decode().endswith(":lease-a")
    assert 0 < backend_redis.pttl(slot) <= 1500
    runs.end(run, done=True)
    assert not backend_redis.exists(slot)


def _state(pid):
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rpartition(b")")[2].split()[0]


def test_a_process_that_died_and_is_not_reaped_yet_is_gone():
    # A pool child killed a moment ago stays a zombie until its worker reaps it.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_until(lambda: _state(child.pid) == b"Z", message="a zombie")
        assert runs.process_gone(runs.HOST, child.pid)
    finally:
        child.wait()
    assert not runs.process_gone(runs.HOST, os.getppid())  # a live process is not
