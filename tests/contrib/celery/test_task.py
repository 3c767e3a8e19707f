"""contrib.celery.task: semaphore_task outside a worker (direct and eager calls), annotate."""

import pytest

pytest.importorskip("celery")

from celery import Celery

from django_semaphore import Semaphore, SemaphoreFull
from django_semaphore.contrib.celery import task

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
