"""semaphore_task with a real Celery worker: held slots, parking, restarts, a view -> task handoff.

Each test starts ``celery -A tests.celery_app worker`` in a subprocess of its
own (fixture ``worker``).  Broker and result backend: database 7 of the test
session's own redis-server (never the machine's 6379, never flushed; only
this module's queue and results are deleted afterwards).  The tasks
(tests/celery_app.py) record their starts and ends in Redis; the tests await
those records with deadlines.  Delays are measured on the Redis server's
clock and printed (``pytest -s``).
"""

import datetime
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid

import pytest
import redis

pytest.importorskip("celery")

from django_semaphore import Semaphore, refresh
from django_semaphore.contrib.celery import PARKED_KWARG, parked, queue_key
from tests.helpers import ROOT, wait_until

BROKER_DB = 7
QUEUE = f"semaphore-tests-{uuid.uuid4().hex[:8]}"
STARTUP_SECONDS = 60
ONE_SECOND_MS = 1000


@pytest.fixture(scope="session")
def broker_url(redis_url):
    parts = urllib.parse.urlsplit(redis_url)
    url = urllib.parse.urlunsplit(parts._replace(path=f"/{BROKER_DB}"))
    os.environ["SEMAPHORE_CELERY_BROKER"] = url
    os.environ["SEMAPHORE_CELERY_QUEUE"] = QUEUE
    from tests import celery_app

    celery_app.app.conf.update(broker_url=url, result_backend=url, task_default_queue=QUEUE)
    yield url
    client = redis.Redis.from_url(url)
    try:  # this module's queue and the results of its tasks; nothing else of the database
        ours = [k for k in client.scan_iter(match=f"*{QUEUE}*")]
        ours += list(client.scan_iter(match="celery-task-meta-*"))
        if ours:
            client.delete(*ours)
    finally:
        client.close()


@pytest.fixture
def app(broker_url):
    from tests import celery_app

    return celery_app


class Worker:
    """``celery worker`` in a process group of its own; ready when its worker_ready record appears."""

    def __init__(self, env, log_path, raw_redis, rec, pool="prefork", concurrency=4):
        self.env, self.log_path, self.raw, self.rec = env, log_path, raw_redis, rec
        self.pool, self.concurrency = pool, concurrency
        self.process = None

    def start(self):
        command = [
            sys.executable, "-m", "celery", "-A", "tests.celery_app", "worker",
            f"--pool={self.pool}", "-c", str(self.concurrency), "-Q", QUEUE,
            "-n", f"{QUEUE}-{uuid.uuid4().hex[:4]}@%h",
            "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "INFO",
        ]  # fmt: skip
        self.log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()/kill()
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        ready = self.rec(f"ready:{self.process.pid}")
        wait_until(
            lambda: self.raw.exists(ready) or self.process.poll() is not None,
            STARTUP_SECONDS,
            interval=0.05,
            message="worker ready",
        )
        if self.process.poll() is not None:
            pytest.fail(f"the Celery worker exited:\n{self.output()}")
        return self

    def output(self):
        with open(self.log_path) as log:
            return log.read()

    def kill(self):
        """SIGKILL the worker and its pool children (its process group)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.log.close()

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        self.raw.set(self.rec("go:all"), "1", ex=600)  # let running tasks end
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.log.close()


@pytest.fixture
def rec(key_prefix):
    return lambda name: f"{key_prefix}:rec:{name}"


@pytest.fixture
def start_worker(app, subprocess_env, broker_url, tmp_path, raw_redis, rec):
    workers = []

    def start(**kwargs):
        worker = Worker(subprocess_env, tmp_path / f"worker{len(workers)}.log", raw_redis, rec, **kwargs)
        workers.append(worker)
        return worker.start()

    yield start
    for worker in workers:
        worker.stop()


@pytest.fixture
def worker(start_worker):
    return start_worker()


def _starts(raw, rec):
    """[(label, server ms, holders seen, own slot among them)] in start order."""
    return [start[:4] for start in _starts_with_tokens(raw, rec)]


def _starts_with_tokens(raw, rec):
    """As _starts, with the fencing token of each task's slot last."""
    out = []
    for item in raw.lrange(rec("starts"), 0, -1):
        label, ms, holders, held, token = item.decode().split(":")
        out.append((label, int(ms), int(holders), held == "1", int(token)))
    return out


def _now_ms(raw):
    seconds, micros = raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _hold(sem, count):
    """``count`` slots held by the test itself, renewed by the watchdog."""
    leases = [sem.acquire() for _ in range(count)]
    assert all(leases)
    return [(lease, refresh.watch(lease)) for lease in leases]


def _give_back(held):
    lease, watch = held
    watch.stop()
    lease.release()


def test_a_running_task_holds_a_slot_named_by_its_task_id(app, worker, raw_redis, rec):
    result = app.job.delay("solo")
    wait_until(lambda: _starts(raw_redis, rec), 20, message="task start")
    holders = app.JOBS.holders()
    assert len(holders) == 1
    assert holders[0].meta["task_id"] == result.id and holders[0].meta["task"] == "tests.job"
    assert _starts(raw_redis, rec)[0][3]  # the task saw its own slot held
    raw_redis.set(rec("go:solo"), "1", ex=600)
    assert result.get(timeout=20) == "solo"
    wait_until(lambda: app.JOBS.holders() == [], 10, message="slot released at the task's end")


def test_parked_tasks_start_within_a_second_of_a_release_in_arrival_order_exactly_once(
    app, worker, raw_redis, rec
):
    held = _hold(app.JOBS, app.LIMIT)
    labels = [f"p{i}" for i in range(6)]
    results = []
    for i, label in enumerate(labels):  # one at a time: the arrival order is the sending order
        results.append(app.job.delay(label))
        wait_until(lambda n=i + 1: len(parked(app.JOBS.partition())) == n, 20, message=f"{label} parked")
    assert [m["args"][0] for m in parked(app.JOBS.partition())] == labels
    assert [m["id"] for m in parked(app.JOBS.partition())] == [r.id for r in results]
    assert _starts(raw_redis, rec) == []  # parked: none ran

    delays = []
    for n, slot in enumerate(held, start=1):  # the test gives its slots back, one at a time
        t0 = _now_ms(raw_redis)
        _give_back(slot)
        wait_until(lambda n=n: len(_starts(raw_redis, rec)) == n, 10, interval=0.005, message="start")
        delays.append(_starts(raw_redis, rec)[-1][1] - t0)
    # Then each task that ends hands its slot to the next parked one.
    for n, label in enumerate(labels[:-2], start=3):
        raw_redis.set(rec(f"go:{label}"), "1", ex=600)
        wait_until(lambda n=n: len(_starts(raw_redis, rec)) == n, 10, interval=0.005, message="start")
    raw_redis.set(rec("go:all"), "1", ex=600)
    assert [r.get(timeout=20) for r in results] == labels
    starts = _starts(raw_redis, rec)
    tokens = [s[4] for s in _starts_with_tokens(raw_redis, rec)]
    assert tokens == sorted(tokens)
    print(f"\nparked task start delays after a release by another process (ms): {delays}")
    assert [s[0] for s in starts] == labels  # arrival order, each exactly once
    assert all(own and holders <= app.LIMIT for _, _, holders, own in starts)  # never without a slot
    assert int(raw_redis.get(rec("peak"))) <= app.LIMIT
    assert max(delays) < ONE_SECOND_MS
    wait_until(lambda: app.JOBS.holders() == [], 10, message="every slot released")
    assert parked(app.JOBS.partition()) == []
    assert sorted(raw_redis.lrange(rec("ends"), 0, -1)) == [label.encode() for label in labels]


def test_a_slot_freed_by_expiry_goes_to_the_parked_task_within_a_second(app, worker, raw_redis, rec):
    lease = app.SHORT.acquire()  # never renewed nor released: it expires after 1.5 s
    result = app.short_job.delay("e1")
    wait_until(lambda: len(parked(app.SHORT.partition())) == 1, 20, message="parked")
    raw_redis.set(rec("go:e1"), "1", ex=600)
    assert result.get(timeout=20) == "e1"
    ((label, started, holders, own),) = _starts(raw_redis, rec)
    delay = started - lease.expires_ms
    print(f"\nparked task start delay after an expiry: {delay} ms")
    assert own and holders == 1
    assert 0 <= delay < ONE_SECOND_MS


def test_a_parked_task_keeps_what_follows_it_and_its_expiry(app, worker, raw_redis, rec):
    held = _hold(app.JOBS, app.LIMIT)
    chained = (app.job.s("c1") | app.followed.s(tag="chain")).delay()
    linked = app.job.apply_async(("l1",), link=app.followed.s(tag="link"))
    wait_until(lambda: len(parked(app.JOBS.partition())) == 2, 20, message="c1 and l1 parked")
    deadline = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    expiring = app.job.apply_async(("x1",), expires=deadline)
    wait_until(lambda: len(parked(app.JOBS.partition())) == 3, 20, message="x1 parked")
    wait_until(lambda: time.time() > deadline.timestamp(), 10, message="x1's expiry")  # while parked
    raw_redis.set(rec("go:all"), "1", ex=600)
    for slot in held:
        _give_back(slot)
    assert chained.get(timeout=20) == "c1"  # the chain went on after the parked task
    assert linked.get(timeout=20) == "l1"
    wait_until(
        lambda: sorted(raw_redis.lrange(rec("followed"), 0, -1)) == [b"chain:c1", b"link:l1"],
        20,
        message="the chain's next task and the link ran",
    )
    # Expired while parked: revoked by the worker, as Celery does any expired task; never run.
    wait_until(lambda: expiring.state == "REVOKED", 20, message="x1 revoked")
    assert sorted(s[0] for s in _starts(raw_redis, rec)) == ["c1", "l1"]
    wait_until(lambda: app.JOBS.holders() == [], 10, message="every slot released")
    assert parked(app.JOBS.partition()) == []


def test_parked_tasks_survive_a_worker_killed_and_restarted(app, start_worker, raw_redis, rec):
    worker = start_worker(concurrency=2)
    held = _hold(app.JOBS, app.LIMIT)
    labels = ["r0", "r1", "r2"]
    results = []
    for i, label in enumerate(labels):
        results.append(app.job.delay(label))
        wait_until(lambda n=i + 1: len(parked(app.JOBS.partition())) == n, 20, message=f"{label} parked")
    worker.kill()
    assert [m["args"][0] for m in parked(app.JOBS.partition())] == labels  # in Redis, not in the worker
    for slot in held:
        _give_back(slot)
    assert raw_redis.llen(queue_key(app.JOBS.partition())) == 3  # no worker: nobody sent them
    raw_redis.set(rec("go:all"), "1", ex=600)
    start_worker(concurrency=2)  # a new worker's dispatcher finds them
    assert [r.get(timeout=30) for r in results] == labels
    starts = _starts_with_tokens(raw_redis, rec)
    # Two slots were free at once: the first two run side by side, so their starts may swap;
    # their slots were taken in arrival order (fencing tokens).
    assert [s[0] for s in sorted(starts, key=lambda s: s[4])] == labels and all(s[3] for s in starts)
    assert int(raw_redis.get(rec("peak"))) <= app.LIMIT


@pytest.mark.urls("tests.handoff_site")
@pytest.mark.django_db(transaction=True)
def test_a_view_hands_its_slot_to_a_task(app, worker, live_server, raw_redis, rec, admin_client):
    reports = Semaphore("reports")
    with urllib.request.urlopen(live_server.url + "/handoff/export/?report=x1") as response:
        assert response.status == 202
        sent = json.loads(response.read())
    # The response has been sent: the slot is still held, now by the task.
    holders = reports.holders()
    assert [h.identifier for h in holders] == [sent["identifier"]]
    wait_until(lambda: _starts(raw_redis, rec), 20, message="task start")
    (holder,) = reports.holders()
    assert holder.identifier == sent["identifier"]
    assert holder.meta["task_id"] == sent["task_id"] and holder.meta["task"] == "tests.export"
    page = admin_client.get("/admin/django_semaphore/semaphore/reports/").content.decode()
    assert sent["task_id"] in page
    raw_redis.set(rec("go:x1"), "1", ex=600)
    assert app.app.AsyncResult(sent["task_id"]).get(timeout=20) == "x1"
    wait_until(lambda: reports.holders() == [], 10, message="released by the task")
    (start,) = _starts(raw_redis, rec)
    assert start[3] and start[2] == 1


def test_a_duplicate_of_a_sent_task_gives_its_slot_back_and_does_not_run(app, worker, raw_redis, rec):
    # What a dispatcher that died between sending a parked task and removing it from the
    # list leaves behind: two messages with the same task id, each carrying a slot.
    task_id = str(uuid.uuid4())
    for _ in range(2):
        ticket = app.JOBS.acquire().handoff()
        app.app.send_task("tests.job", args=["dup"], kwargs={PARKED_KWARG: ticket}, task_id=task_id)
    raw_redis.set(rec("go:dup"), "1", ex=600)
    wait_until(lambda: app.JOBS.holders() == [], 20, message="both slots given back")
    assert [s[0] for s in _starts(raw_redis, rec)] == ["dup"]  # ran once
    assert app.app.AsyncResult(task_id).get(timeout=20) == "dup"
