"""contrib.celery.orphans: the slots of runs whose process died are given back at once."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("celery")

from django_semaphore import Semaphore
from django_semaphore.contrib.celery import orphans, runs, store
from django_semaphore.engine import handoff
from tests.contrib.celery.support import total_semaphore

pytestmark = pytest.mark.usefixtures("backend")


def _gone_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _run_on_slot(backend_redis, sem, key, task_id, pid, adopted=False):
    """A run of ``task_id`` by process ``pid`` of this host holding a slot (``adopted``: from
    a ticket, as a parked task does), recorded as semaphore_task records it: (the run, its lease)."""
    lease = sem.acquire(key)
    keys = sem.partition(key)
    run = runs.Run(store.run_key(keys, task_id), f"run:{runs.HOST}:{pid}:abc:", store.slot_key(keys, task_id))
    backend_redis.set(run.slot, f"{runs.HOST}:{pid}:{lease.identifier}", px=60_000)
    if adopted:
        assert handoff.claim(lease.keys, lease.identifier, 30, task_id)
    orphans.register(run, sem, key, lease.identifier, task_id, adopted)
    return run, lease


def _host_fields(backend_redis):
    return {f.decode() for f in backend_redis.hkeys(store.host_key(runs.HOST))}


@pytest.mark.parametrize("kind", ["configured", "ad hoc"])
def test_the_slot_of_a_run_whose_process_died_is_given_back(settings, backend_redis, kind):
    sem = total_semaphore(settings, kind, f"cel-reap-{kind.replace(' ', '')}", total=8)
    run, lease = _run_on_slot(backend_redis, sem, "tenant-a", "t-1", _gone_pid())
    assert orphans.reap() == 1
    assert sem.holders("tenant-a") == [] and sem.available("tenant-a") == 4
    assert f"{run.pid}:{run.slot}" not in _host_fields(backend_redis)
    assert not backend_redis.exists(run.slot)
    assert not handoff.claim(lease.keys, lease.identifier, 30, "t-late")  # nobody adopts it now


def test_a_parked_tasks_slot_is_left_to_its_redelivery_a_while_then_given_back(backend_redis, monkeypatch):
    # The dead run had adopted the slot from its ticket: an acks_late redelivery takes it
    # over if it comes within ADOPTED_GRACE; after that the reaper gives it back, and a
    # redelivery that comes later cannot adopt it again (it parks again).
    sem = Semaphore("cel-reap-parked", limit=1, timeout=30)
    run, lease = _run_on_slot(backend_redis, sem, None, "t-5", _gone_pid(), adopted=True)
    assert orphans.reap() == 0
    assert [h.identifier for h in sem.holders()] == [lease.identifier]
    monkeypatch.setattr(orphans, "ADOPTED_GRACE", 0.0)
    assert orphans.reap() == 1
    assert sem.holders() == [] and orphans._gone_since == {}
    assert not handoff.claim(lease.keys, lease.identifier, 30, "t-5")


def test_a_redelivered_run_that_claimed_the_task_id_keeps_the_slot_from_the_reaper(
    backend_redis, monkeypatch
):
    monkeypatch.setattr(orphans, "ADOPTED_GRACE", 0.0)
    sem = Semaphore("cel-reap-redelivered", limit=1, timeout=30)
    dead, lease = _run_on_slot(backend_redis, sem, None, "t-6", _gone_pid(), adopted=True)
    redelivered = runs.claim(sem.partition(), "t-6")  # it adopts the ticket again next
    assert redelivered.orphan == lease.identifier
    assert backend_redis.get(dead.slot).decode() == f"{runs.HOST}:{os.getpid()}:{lease.identifier}"
    assert orphans.reap() == 0
    assert [h.identifier for h in sem.holders()] == [lease.identifier]
    runs.end(redelivered, done=True)
    lease.release()


def test_the_slot_of_a_live_process_is_kept(backend_redis):
    sem = Semaphore("cel-reap-live", limit=1, timeout=30)
    run, lease = _run_on_slot(backend_redis, sem, None, "t-2", os.getppid())
    assert orphans.reap() == 0
    assert [h.identifier for h in sem.holders()] == [lease.identifier]
    assert f"{run.pid}:{run.slot}" in _host_fields(backend_redis)
    backend_redis.hdel(store.host_key(runs.HOST), f"{run.pid}:{run.slot}")
    lease.release()


@pytest.mark.parametrize("case", ["taken over by a redelivered run", "handed on to another task"])
def test_a_dead_runs_slot_someone_else_uses_is_left_alone(backend_redis, case):
    sem = Semaphore("cel-reap-used", limit=2, timeout=30)
    run, lease = _run_on_slot(backend_redis, sem, None, "t-3", _gone_pid())
    if case == "taken over by a redelivered run":  # it took the task id, then a slot of its own
        backend_redis.set(run.slot, f"{runs.HOST}:{os.getpid()}:another-lease", px=60_000)
    else:
        assert handoff.claim(lease.keys, lease.identifier, 30, "t-other")
    assert orphans.reap() == 0
    assert [h.identifier for h in sem.holders()] == [lease.identifier]
    assert f"{run.pid}:{run.slot}" not in _host_fields(backend_redis)  # looked at once
    lease.release()


def test_a_run_that_ended_leaves_nothing_for_the_reaper(backend_redis):
    sem = Semaphore("cel-reap-ended", limit=1, timeout=30)
    keys = sem.partition()
    run = runs.claim(keys, "t-4")
    lease = sem.acquire()
    runs.hold(run, lease.identifier, 30)
    orphans.register(run, sem, None, lease.identifier, "t-4", adopted=False)
    assert f"{os.getpid()}:{run.slot}" in _host_fields(backend_redis)
    lease.release()
    runs.end(run, done=True)
    orphans.unregister(run)
    assert f"{os.getpid()}:{run.slot}" not in _host_fields(backend_redis)
    assert not backend_redis.exists(run.slot)


def test_an_unreadable_entry_is_dropped_with_a_warning(backend_redis, caplog):
    field = f"{_gone_pid()}:some-slot"
    backend_redis.hset(store.host_key(runs.HOST), field, "{not json")
    assert orphans.reap() == 0
    assert field not in _host_fields(backend_redis)
    assert "could not be given back" in caplog.text
