"""What the contrib.celery tests share: a broker stand-in and parked messages."""

from django_semaphore.contrib.celery import parking


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
