"""The demo's background export: the work a Celery task would do, run in a thread by default.

``make demo`` runs no Celery worker, so the export view hands its lease to a
thread of the server process: the thread adopts it from the ticket exactly as
a worker would (``Lease.adopt``), records its task id in the holder's meta
(the admin shows it), renews the lease while it works and releases it at the
end.  With a Celery worker (``pip install django-semaphore[celery]``) the same
work is the task below, sent with ``export_task.delay(seconds, ticket=ticket)``.
"""

import threading
import time

from django_semaphore import Lease
from django_semaphore.engine import watchdog

TASK_NAME = "demo.export"


def export_body(seconds):
    """The export itself: here, just time passing."""
    time.sleep(seconds)


def run_in_thread(ticket, task_id, seconds):
    """Adopt the view's lease in a background thread and do the export there."""

    def work():
        lease = Lease.adopt(ticket, meta={"task_id": task_id, "task": TASK_NAME, "runner": "thread"})
        try:
            with watchdog.watching(lease):
                export_body(seconds)
        finally:
            lease.release()

    thread = threading.Thread(target=work, name=f"demo-export-{task_id[:8]}", daemon=True)
    thread.start()
    return thread


try:  # the Celery flavour, for a project that runs workers
    from celery import shared_task

    from django_semaphore.contrib.celery import semaphore_task
except ImportError:  # the optional "celery" extra is not installed
    export_task = None
else:

    @shared_task(name=TASK_NAME)
    @semaphore_task("exports", ticket_arg="ticket")
    def export_task(seconds, ticket=None):
        export_body(seconds)
