"""What the contrib.celery tests share: a broker stand-in, parked messages, TOTAL semaphores."""

from django_semaphore import Semaphore, semaphores
from django_semaphore.contrib.celery import dispatcher, parking
from django_semaphore.engine.semaphore import Lease
from tests.support.helpers import wait_until


class Outbox:
    """Stands for a Celery app's send_task: records the messages, or fails."""

    def __init__(self, fail=False):
        self.sent = []
        self.fail = fail

    def send_task(self, name, args=None, kwargs=None, task_id=None, **options):
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append({"task": name, "args": args, "kwargs": kwargs, "id": task_id, "options": options})


def message(sem, key, n, options=None):
    entry = parking.describe(sem, key)
    return parking.dumps(
        {
            **entry,
            "task": "app.export",
            "id": f"id-{n}",
            "args": [n],
            "kwargs": {"k": n},
            "options": options or {},
        }
    )


def park(sem, key, n, options=None):
    """Park message ``n`` (task id ``id-<n>``) on ``sem``'s partition ``key``."""
    return parking.park(sem, key, message(sem, key, n, options))


def parked_ids(sem, key):
    """The task ids parked on ``sem``'s partition ``key``, in the order they will be sent."""
    return [m["id"] for m in parking.parked(sem.partition(key))]


def total_semaphore(settings, kind, name, total):
    """A semaphore of LIMIT 4 per partition and TOTAL ``total``: configured in SEMAPHORES
    (``kind`` "configured") or ad hoc."""
    if kind == "configured":
        entry = {"LIMIT": 4, "KEY": "header:X-Tenant", "TOTAL": total, "TIMEOUT": 30}
        settings.SEMAPHORES = {**settings.SEMAPHORES, name: entry}
        return semaphores[name]
    return Semaphore(name, limit=4, timeout=30, total=total)


def run_in_turn(sem, outbox, expected, total):
    """Run each task the dispatcher sends (adopt its ticket) and end the oldest running one
    (release it), until ``expected`` tasks were sent: the task ids in the order they were
    sent, and the most holders of the name seen at once."""
    running, peak, adopted = [], 0, 0
    while adopted < expected:
        if running:
            running.pop(0).release()
        wait_until(lambda n=adopted: len(outbox.sent) > n, 5, interval=0.002, message="next task sent")
        for m in outbox.sent[adopted:]:
            running.append(Lease.adopt(m["kwargs"][dispatcher.PARKED_KWARG]))
            adopted += 1
        peak = max(peak, len(sem.holders()))
        assert len(running) <= total
    for lease in running:
        lease.release()
    return [m["id"] for m in outbox.sent], peak
