"""contrib.celery.task: semaphore_task outside a worker (direct and eager calls), annotate."""

import threading
import time

import pytest

pytest.importorskip("celery")

from celery import Celery
from celery.app.task import Context
from celery.exceptions import Ignore

from django_semaphore import Semaphore, SemaphoreFull
from django_semaphore.contrib import celery as sc
from django_semaphore.contrib.celery import dispatcher, parking, runs, task
from django_semaphore.engine import guards, handoff
from django_semaphore.engine.semaphore import Lease
from tests.contrib.celery.support import Outbox, park, total_semaphore
from tests.support.helpers import wait_until

pytestmark = pytest.mark.usefixtures("backend")


def celery_app():
    app = Celery("contrib-tests", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    return app


def test_annotate_adds_to_a_live_holders_meta():
    sem = Semaphore("cel-meta", limit=1, timeout=30)
    lease = sem.acquire(meta={"path": "/export/"})
    assert task.annotate(lease, task_id="abc", task="app.export")
    (holder,) = sem.holders()
    assert holder.meta["path"] == "/export/" and holder.meta["task_id"] == "abc"
    assert holder.token == lease.token
    lease.release()
    assert not task.annotate(lease, task_id="late")


def test_a_direct_or_eager_call_holds_a_slot_or_raises():
    sem = Semaphore("cel-direct", limit=1, timeout=30)
    app = celery_app()
    seen = []

    @app.task
    @task.semaphore_task(sem, key=lambda n: f"k{n}")
    def work(n):
        seen.append((task.current_lease().key, sem.available(f"k{n}")))
        return n

    assert work(1) == 1 and work.delay(2).get() == 2  # direct, and eager
    assert seen == [("k1", 0), ("k2", 0)]
    assert sem.available("k1") == 1 and task.current_lease() is None
    held = sem.acquire(key="k3")
    with pytest.raises(SemaphoreFull):
        work(3)
    held.release()


def test_a_direct_call_adopts_a_ticket():
    sem = Semaphore("cel-ticket", limit=1, timeout=30)
    app = celery_app()

    @app.task
    @task.semaphore_task(sem, ticket_arg="ticket")
    def work(ticket=None):
        return task.current_lease().identifier

    lease = sem.acquire()
    assert work(ticket=lease.handoff()) == lease.identifier
    assert sem.available() == 1  # released when the task ended


def test_disabled_semaphores_pass_through(settings):
    settings.SEMAPHORE_ENABLED = False
    sem = Semaphore("cel-off", limit=1, timeout=30)
    held = sem.acquire()

    @task.semaphore_task(sem)
    def work():
        return "ran"

    assert work() == "ran"
    settings.SEMAPHORE_ENABLED = True
    held.release()


def test_there_is_one_current_lease():
    """contrib.celery's current_lease is the function guards' (one ContextVar, below both)."""
    assert sc.current_lease is task.current_lease is guards.current_lease


def test_the_documented_current_lease_gives_the_tasks_lease_direct_and_eager():
    sem = Semaphore("cel-current", limit=1, timeout=30)
    app = celery_app()
    inner = Semaphore("cel-inner", limit=1, timeout=30)
    seen = []

    @app.task
    @task.semaphore_task(sem)
    def work():
        lease = guards.current_lease()
        holders = [h.identifier for h in sem.holders()]
        by_name = guards.current_lease("cel-current")
        seen.append((lease.semaphore.name, holders == [lease.identifier], by_name))

        @inner
        def nested():  # a guard inside the task: the innermost is current, the task's by name
            return guards.current_lease().semaphore.name, guards.current_lease("cel-current") is lease

        return nested()

    assert work() == ("cel-inner", True)
    assert work.delay().get() == ("cel-inner", True)  # eager
    assert [(name, own) for name, own, _ in seen] == [("cel-current", True)] * 2
    assert all(by_name is not None for _, _, by_name in seen)
    assert guards.current_lease() is None


@pytest.fixture
def waiting_entry(settings):
    settings.SEMAPHORES = {**settings.SEMAPHORES, "cel-wait": {"LIMIT": 1, "TIMEOUT": 30, "WAIT": 0.5}}


def _refused_after(func):
    started = time.monotonic()
    with pytest.raises(SemaphoreFull) as refused:
        func()
    return time.monotonic() - started, refused.value.reason


@pytest.mark.usefixtures("waiting_entry")
def test_wait_none_is_the_entrys_wait_and_wait_0_refuses_at_once():
    held = Semaphore("cel-wait").acquire()
    try:

        @task.semaphore_task("cel-wait")
        def configured():
            return "ran"

        @task.semaphore_task("cel-wait", wait=0)
        def at_once():
            return "ran"

        waited, reason = _refused_after(configured)
        assert waited >= 0.45 and reason == "timeout"
        _, reason = _refused_after(at_once)
        assert reason == "full"  # refused without waiting: "timeout" had it waited
    finally:
        held.release()


def test_wait_none_is_an_ad_hoc_semaphores_own_wait():
    sem = Semaphore("cel-wait-adhoc", limit=1, timeout=30, wait=0.5)
    held = sem.acquire(wait=0)

    @task.semaphore_task(sem)
    def work():
        return "ran"

    try:
        waited, reason = _refused_after(work)
        assert waited >= 0.45 and reason == "timeout"
    finally:
        held.release()
    assert work() == "ran"


class _WorkerTask:
    """A task in a worker, as _take sees it: its name, request and app."""

    name = "app.export"

    def __init__(self):
        self.app = Outbox()
        self.request = Context(id="task-1", args=(), kwargs={}, delivery_info={})


@pytest.mark.usefixtures("waiting_entry")
@pytest.mark.parametrize(("wait", "least", "most"), [(None, 0.45, 5), (0, 0, 0.4)])
def test_in_a_worker_wait_none_waits_the_entrys_wait_before_parking(wait, least, most):
    sem = Semaphore("cel-wait")
    held = sem.acquire()
    options = task.Options("cel-wait", None, None, wait, None)
    call = task.Call(lambda: "ran", (), {}, ())
    try:
        started = time.monotonic()
        with pytest.raises(Ignore):
            task._take(_WorkerTask(), call, sem, None, options, None)
        assert least <= time.monotonic() - started < most
        assert parking.count(sem.partition(None)) == 1  # parked after waiting
    finally:
        held.release()


@pytest.mark.parametrize("kind", ["configured", "adhoc"])
def test_a_parked_tasks_slot_is_adopted_and_given_back_under_total(settings, kind):
    # What a parked task's run does with the ticket its message carries (task._take), on a
    # semaphore_task(Semaphore(..., total=1)) as on a configured TOTAL name.
    sem = total_semaphore(settings, kind, "cel-total-adopt", 1)
    park(sem, "A", "a0")
    outbox = Outbox()
    assert dispatcher.dispatch(sem, "A", outbox) == 1
    lease = Lease.adopt(outbox.sent[0]["kwargs"][dispatcher.PARKED_KWARG], meta={"task_id": "id-a0"})
    got = []
    waiters = [threading.Thread(target=lambda k=k: got.append(sem.acquire(k, wait=10))) for k in ("B", "C")]
    for thread in waiters:
        thread.start()
    wait_until(lambda: len(sem.waiters()) == 2, 5, message="B and C queued")
    assert lease.release()  # the task's run ends: its one permit goes to B or C, not both
    wait_until(lambda: got, 5, message="one granted")
    assert len(sem.holders()) == 1 and len(sem.waiters()) == 1
    assert lease.config.total == 1
    got[0].release()
    for thread in waiters:
        thread.join(10)
    assert len(got) == 2 and got[1].release() and sem.available() == 1


@pytest.mark.parametrize(
    "case", ["acquired", "its ticket expired", "handed over again", "handed on to another task"]
)
def test_a_redelivered_run_gives_back_the_slot_its_dead_run_held_unless_it_is_used(case, backend_redis):
    sem = Semaphore("cel-orphan", limit=2, timeout=30)
    dead = sem.acquire(key="p")
    if case in ("its ticket expired", "handed over again"):  # the dead run adopted it
        assert handoff.claim(dead.keys, dead.identifier, 30, "t-1")
    if case == "handed on to another task":  # its body handed it on; another task adopted it
        assert handoff.claim(dead.keys, dead.identifier, 30, "t-other")
    handed = dead if case == "handed over again" else None  # the redelivery's ticket is good
    run = runs.Run("k", "v", "s", orphan=dead.identifier)
    task._give_back_orphan(run, sem, "p", handed, "t-1")
    held = {h.identifier for h in sem.holders("p")}
    assert (dead.identifier in held) == (case in ("handed over again", "handed on to another task"))
    if case == "acquired":  # nobody can adopt it once given back
        assert not handoff.claim(dead.keys, dead.identifier, 30, "t-late")
    dead.release()
