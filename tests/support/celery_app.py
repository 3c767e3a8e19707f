"""The Celery app of the worker tests (tests/system/test_celery_worker.py).

The worker runs ``celery -A tests.support.celery_app worker`` in a subprocess; its
broker and result backend are a database of the test session's own
redis-server (SEMAPHORE_CELERY_BROKER), its queue one of its own
(SEMAPHORE_CELERY_QUEUE).  The tasks record what they see in Redis, under the
test's SEMAPHORE_KEY_PREFIX (``<prefix>:rec:...``), for the test to assert on.
"""

import os
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings")
django.setup()

from celery import Celery, signals  # noqa: E402 - Django first
from django.conf import settings  # noqa: E402

from django_semaphore import Semaphore  # noqa: E402
from django_semaphore.backend import connection  # noqa: E402
from django_semaphore.contrib.celery import current_lease, semaphore_task  # noqa: E402
from django_semaphore.engine import guards  # noqa: E402
from tests.support.helpers import server_ms  # noqa: E402

app = Celery("semaphore_tests")
app.conf.update(
    broker_url=os.environ.get("SEMAPHORE_CELERY_BROKER", "memory://"),
    result_backend=os.environ.get("SEMAPHORE_CELERY_BROKER") or None,
    task_default_queue=os.environ.get("SEMAPHORE_CELERY_QUEUE", "semaphore-tests"),
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
if os.environ.get("SEMAPHORE_CELERY_PICKLE"):  # the worker of tests.pickled_job (pickled messages)
    app.conf.accept_content = ["json", "pickle"]

if os.environ.get("SEMAPHORE_CELERY_PARK_TTL"):  # a test of parked tasks kept past their TTL
    from django_semaphore.contrib.celery import parking

    parking.PARK_TTL = float(os.environ["SEMAPHORE_CELERY_PARK_TTL"])

LIMIT = 2
#: The semaphore of ``job``: ad-hoc, so the worker needs no SEMAPHORES entry for it.
JOBS = Semaphore("bg-jobs", limit=LIMIT, timeout=float(os.environ.get("SEMAPHORE_CELERY_TIMEOUT", "10")))
#: A short lease: a slot freed by expiry.
SHORT = Semaphore("bg-short", limit=1, timeout=1.5)
#: The fair-share tests' TOTAL (the worker's environment sets it): ``fair_job`` runs on the
#: configured ``bg-fair`` (tests/support/settings_celery.py), ``adhoc_fair_job`` on this
#: ad-hoc twin, both LIMIT 4 per tenant.
FAIR_TOTAL = int(os.environ.get("SEMAPHORE_CELERY_TOTAL", "1"))
ADHOC_FAIR = Semaphore("bg-fair-adhoc", limit=4, timeout=10, total=FAIR_TOTAL)
#: An ad-hoc ADAPTIVE semaphore: LIMIT 4, but its limit in force is 2 at most (MAX).
ADAPT = Semaphore("bg-adapt", limit=4, timeout=10, adaptive={"MIN": 1, "MAX": 2})
RECORD_TTL = 600
HOLD_LIMIT = 60.0  # a task never waits longer than this for its "go"

# Counts running jobs; keeps the highest count seen (KEYS: running, peak).
_ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return n
"""


def rec(name):
    """A record key of the running test (same prefix as its semaphores)."""
    return f"{settings.SEMAPHORE_KEY_PREFIX}:rec:{name}"


def _body(label, sem, partition):
    """Record the start (server time, and the holders seen), wait for "go", record the end.

    Also records (``<prefix>:rec:current``) whether the documented
    ``django_semaphore.guards.current_lease()`` gives the task's lease too.
    """
    client = connection.get_client()
    lease = current_lease()
    documented = guards.current_lease()
    client.rpush(rec("current"), f"{label}:{int(lease is not None and documented is lease)}")
    client.expire(rec("current"), RECORD_TTL)
    holders = sem.holders(partition)
    held = lease is not None and lease.identifier in {h.identifier for h in holders}
    client.eval(_ENTER, 2, rec("running"), rec("peak"), RECORD_TTL)
    token = lease.token if lease is not None else -1
    client.rpush(rec("starts"), f"{label}:{int(server_ms(client))}:{len(holders)}:{int(held)}:{token}")
    client.expire(rec("starts"), RECORD_TTL)
    deadline = time.monotonic() + HOLD_LIMIT
    while not client.exists(rec(f"go:{label}"), rec("go:all")) and time.monotonic() < deadline:
        time.sleep(0.01)
    client.decr(rec("running"))
    client.rpush(rec("ends"), label)
    client.expire(rec("ends"), RECORD_TTL)
    return label


@app.task(name="tests.job")
@semaphore_task(JOBS, key=lambda label, tenant=None: tenant)
def job(label, tenant=None):
    return _body(label, JOBS, tenant)


@app.task(name="tests.fair_job")
@semaphore_task("bg-fair", key=lambda label, tenant: tenant)
def fair_job(label, tenant):
    """A tenant's job on the configured TOTAL semaphore; the holders it records are the
    whole name's (every tenant's)."""
    return _body(label, Semaphore("bg-fair"), None)


@app.task(name="tests.adhoc_fair_job")
@semaphore_task(ADHOC_FAIR, key=lambda label, tenant: tenant)
def adhoc_fair_job(label, tenant):
    """As ``fair_job``, on the ad-hoc TOTAL semaphore."""
    return _body(label, ADHOC_FAIR, None)


@app.task(name="tests.adapt_job")
@semaphore_task(ADAPT, wait=0)
def adapt_job(label):
    """A job on the ad-hoc ADAPTIVE semaphore (it parks at once: no WAIT)."""
    return _body(label, ADAPT, None)


@app.task(name="tests.pickled_job", serializer="pickle")
@semaphore_task(JOBS)
def pickled_job(label, tags):
    """A task whose messages are pickled: ``tags`` is a set (JSON has none)."""
    assert isinstance(tags, set)
    return _body(f"{label}-{'-'.join(sorted(tags))}", JOBS, None)


@app.task(name="tests.short_job")
@semaphore_task(SHORT)
def short_job(label):
    return _body(label, SHORT, None)


@app.task(name="tests.export")
@semaphore_task("reports", ticket_arg="ticket")
def export(report, ticket=None):
    """The view -> task flow: adopts the view's lease from ``ticket``."""
    return _body(report, Semaphore("reports"), None)


@app.task(name="tests.bound_job", bind=True)
@semaphore_task(JOBS, key=lambda label, tenant=None: tenant)
def bound_job(self, label, tenant=None):
    """``bind=True``: the task instance comes first (and is not part of a parked message)."""
    assert self.name == "tests.bound_job"
    return _body(label, JOBS, tenant)


@app.task(name="tests.retrying")
@semaphore_task(JOBS)
def retrying(label):
    """Retries once (``retry(countdown=0.2)``) before doing its work."""
    client = connection.get_client()
    client.rpush(rec(f"attempts:{label}"), retrying.request.retries)
    client.expire(rec(f"attempts:{label}"), RECORD_TTL)
    if retrying.request.retries == 0:
        raise retrying.retry(countdown=0.2)
    return _body(label, JOBS, None)


@app.task(name="tests.late_job", acks_late=True, reject_on_worker_lost=True)
@semaphore_task(JOBS)
def late_job(label):
    """acks_late: redelivered when its worker process dies.  Records its pid (for the test to kill)."""
    return _killable_body(label)


def _killable_body(label):
    """Record this process's pid (for the test to kill it), then the body."""
    client = connection.get_client()
    client.rpush(rec(f"pids:{label}"), os.getpid())
    client.expire(rec(f"pids:{label}"), RECORD_TTL)
    return _body(label, JOBS, None)


@app.task(name="tests.mortal_job")
@semaphore_task(JOBS)
def mortal_job(label):
    """Acked on receipt (no redelivery): records its pid, for the test to kill its process."""
    return _killable_body(label)


@app.task(name="tests.followed")
def followed(result, tag="link"):
    """What comes after a job (its chain's next task, or its link): records ``tag:result``."""
    client = connection.get_client()
    client.rpush(rec("followed"), f"{tag}:{result}")
    client.expire(rec("followed"), RECORD_TTL)
    return result


@signals.worker_ready.connect
def _ready(sender=None, **kwargs):
    client = connection.get_client()
    client.set(rec(f"ready:{os.getpid()}"), "1", ex=RECORD_TTL)
