"""django_semaphore.contrib.celery: its public names and the signals it answers.

Each part has its own tests in tests/contrib/celery/ (without a worker:
``Outbox`` stands for the broker); tests/system/test_celery_worker.py runs
the whole under a real Celery worker.
"""

from types import SimpleNamespace

import pytest

pytest.importorskip("celery")

from celery import Celery
from celery import signals as celery_signals

from django_semaphore import Semaphore
from django_semaphore.contrib import celery as sc
from django_semaphore.contrib.celery import dispatcher, parking, task
from django_semaphore.engine.semaphore import Lease

pytestmark = pytest.mark.usefixtures("backend")


def test_the_public_names():
    assert sc.semaphore_task is task.semaphore_task and sc.current_lease is task.current_lease
    assert sc.dispatch is dispatcher.dispatch and sc.park is parking.park
    assert sc.PARKED_KWARG == "_semaphore_parked"
    assert set(sc.__all__) <= set(dir(sc))


def test_a_release_in_this_process_wakes_the_dispatcher():
    parking.wake.clear()
    Semaphore("cel-wake", limit=1, timeout=30).acquire().release()
    assert parking.wake.is_set()


def _revoked_task(sem, ticket_arg=None):
    app = Celery("contrib-revoke", broker="memory://", set_as_current=False)

    @app.task(name="tests.revoked_job")
    @sc.semaphore_task(sem, ticket_arg=ticket_arg)
    def revoked_job(ticket=None):
        return "ran"

    return revoked_job


@pytest.mark.parametrize("how", ["parked", "ticket_arg"])
def test_a_revoked_task_gives_back_the_slot_its_message_carried(how):
    sem = Semaphore(f"cel-revoke-{how}", limit=1, timeout=30)
    revoked_job = _revoked_task(sem, ticket_arg="ticket" if how == "ticket_arg" else None)
    ticket = sem.acquire().handoff()
    kwargs = {sc.PARKED_KWARG: ticket} if how == "parked" else {"ticket": ticket}
    # What a worker sends when it discards a revoked (or expired) message.
    request = SimpleNamespace(id="t-1", kwargs=kwargs)
    celery_signals.task_revoked.send(sender=revoked_job, request=request, terminated=False)
    assert sem.available() == 1


def test_a_revoked_duplicate_leaves_an_adopted_slot_to_its_run():
    sem = Semaphore("cel-revoke-adopted", limit=1, timeout=30)
    revoked_job = _revoked_task(sem)
    ticket = sem.acquire().handoff()
    running = Lease.adopt(ticket)  # a run of the task holds it
    request = SimpleNamespace(id="t-2", kwargs={sc.PARKED_KWARG: ticket})
    celery_signals.task_revoked.send(sender=revoked_job, request=request, terminated=False)
    assert sem.available() == 0  # still the run's
    celery_signals.task_revoked.send(sender=revoked_job, request=request, terminated=True)
    assert sem.available() == 1  # the revoke terminated the run: its slot comes back
    assert running.release() is False
