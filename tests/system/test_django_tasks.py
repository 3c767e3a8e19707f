"""Django's own tasks framework (django.tasks, Django 6.0+): task functions under a semaphore.

The function guard (``Semaphore.guard()``, django_semaphore.guards) is all it
takes: it holds a slot for each run of the task function, whichever backend
runs it; a run that finds no slot raises SemaphoreFull, which the backend
records as the task's error.  Parking (as django_semaphore.contrib.celery
does) needs from a backend what django.tasks does not define yet: a way for a
task to give its worker back without finishing and be enqueued again later
with the same id (docs/background.rst).
"""

import pytest

from django_semaphore import Semaphore

tasks = pytest.importorskip("django.tasks", reason="django.tasks is new in Django 6.0: this Django has none")

EXPORTS = Semaphore("dj-task-exports", limit=1, timeout=30)


@tasks.task
@EXPORTS.guard(key=lambda account: f"account-{account}")
def export(account):
    """Returns how many slots of its partition were free while it ran (0: it held the only one)."""
    return EXPORTS.available(f"account-{account}")


@pytest.fixture(autouse=True)
def immediate_backend(settings):
    settings.TASKS = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}


def test_a_guarded_task_holds_a_slot_while_it_runs():
    result = export.enqueue(7)
    assert result.status == tasks.TaskResultStatus.SUCCESSFUL
    assert result.return_value == 0  # it held the only slot
    assert EXPORTS.available("account-7") == 1  # released at its end


def test_a_task_that_finds_no_slot_fails_with_semaphore_full():
    held = EXPORTS.acquire("account-8")
    try:
        result = export.enqueue(8)
        assert result.status == tasks.TaskResultStatus.FAILED
        assert result.errors[0].exception_class_path == "django_semaphore.exceptions.SemaphoreFull"
        assert export.enqueue(9).status == tasks.TaskResultStatus.SUCCESSFUL  # another partition
    finally:
        held.release()
