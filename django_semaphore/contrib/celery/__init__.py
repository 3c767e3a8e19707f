"""Celery tasks that hold a semaphore slot while they run, parked (not retried) when none is free.

Install the extra (``pip install django-semaphore[celery]``), then::

    from celery import shared_task
    from django_semaphore.contrib.celery import semaphore_task

    @shared_task
    @semaphore_task("exports", key=lambda account_id, **kw: str(account_id))
    def export(account_id): ...

docs/howto/celery-tasks.rst shows how to use it; docs/parking.rst has the whole story
and the figures.  The parts:

* :mod:`.task`: the decorator; a worker run claims its task id, holds a slot
  (acquired, or adopted from the ticket its message carries) while its body
  runs, and parks when there is none;
* :mod:`.runs`: one live run per task id, none after one completed (Celery's
  redeliveries and duplicates);
* :mod:`.orphans`: the slot of a run whose process died (SIGKILL, the OOM
  killer, a hard time limit) given back at once, by the task's redelivery or
  by the worker's main process, instead of when its lease expires;
* :mod:`.parking`: the parked messages, in Redis, in arrival order;
* :mod:`.dispatcher`: sends parked tasks again, each with a slot taken for it;
* :mod:`.store`: the keys and Redis calls of all of the above.

Every Celery worker runs a dispatcher (``worker_ready``); a release in a
worker process makes it look at once; a revoked task gives back the slot its
message carried (``task_revoked``).
"""

from __future__ import annotations

from typing import Any

from celery import signals as celery_signals

from ... import signals
from . import parking
from .dispatcher import (
    LOCK_MS,
    MAX_WAITING,
    PARKED_KWARG,
    POLL_INTERVAL,
    WAIT,
    Dispatcher,
    dispatch,
    dispatch_all,
    start_dispatcher,
    stop_dispatcher,
)
from .parking import PARK_TTL, park, parked, parked_partitions
from .store import LOCK_SUFFIX, QUEUE_SUFFIX, REGISTRY_SUFFIX, RUN_SUFFIX, queue_key, registry_key
from .task import annotate, current_lease, on_revoked, semaphore_task

__all__ = [
    "LOCK_MS",
    "LOCK_SUFFIX",
    "MAX_WAITING",
    "PARKED_KWARG",
    "PARK_TTL",
    "POLL_INTERVAL",
    "QUEUE_SUFFIX",
    "REGISTRY_SUFFIX",
    "RUN_SUFFIX",
    "WAIT",
    "Dispatcher",
    "annotate",
    "current_lease",
    "dispatch",
    "dispatch_all",
    "park",
    "parked",
    "parked_partitions",
    "queue_key",
    "registry_key",
    "semaphore_task",
    "start_dispatcher",
    "stop_dispatcher",
]


def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    start_dispatcher(getattr(sender, "app", None))


def _on_worker_shutdown(**kwargs: Any) -> None:
    stop_dispatcher()


def _on_release(**kwargs: Any) -> None:
    parking.wake.set()  # a slot came free in this process: the dispatcher looks now


# Every worker (its main process) runs a dispatcher: parked tasks need no extra service.
celery_signals.worker_ready.connect(_on_worker_ready, weak=False)
celery_signals.worker_shutting_down.connect(_on_worker_shutdown, weak=False)
celery_signals.task_revoked.connect(on_revoked, weak=False)
signals.released.connect(_on_release, weak=False, dispatch_uid="django_semaphore.contrib.celery")
