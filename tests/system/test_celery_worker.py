"""semaphore_task with a real Celery worker: held slots, parking, restarts, a view -> task handoff.

Each test starts ``celery -A tests.support.celery_app worker`` in a subprocess of its
own (fixture ``worker``).  Broker and result backend: database 7 of the test
session's own redis-server (never the machine's 6379, never flushed; only
this module's queue and results are deleted afterwards).  The tasks
(tests/support/celery_app.py) record their starts and ends in Redis; the tests await
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

from django_semaphore import Semaphore
from django_semaphore.contrib.celery import LOCK_SUFFIX, PARKED_KWARG, parked, queue_key
from django_semaphore.engine import watchdog
from tests.support.helpers import ROOT, server_ms, wait_until

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
    from tests.support import celery_app

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
    from tests.support import celery_app

    return celery_app


class Worker:
    """``celery worker`` in a process group of its own; ready when its worker_ready record appears."""

    def __init__(self, env, log_path, raw_redis, rec, pool="prefork", concurrency=4, queues=QUEUE):
        self.env, self.log_path, self.raw, self.rec = env, log_path, raw_redis, rec
        self.pool, self.concurrency, self.queues = pool, concurrency, queues
        self.process = None

    def start(self):
        command = [
            sys.executable, "-m", "celery", "-A", "tests.support.celery_app", "worker",
            f"--pool={self.pool}", "-c", str(self.concurrency), "-Q", self.queues,
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

    def start(total=1, env=None, **kwargs):
        # The session's settings, with the configured TOTAL semaphore of the fair-share tests.
        env = {
            **subprocess_env,
            "DJANGO_SETTINGS_MODULE": "tests.support.settings_celery",
            "SEMAPHORE_CELERY_TOTAL": str(total),
            **(env or {}),
        }
        worker = Worker(env, tmp_path / f"worker{len(workers)}.log", raw_redis, rec, **kwargs)
        workers.append(worker)
        return worker.start()

    yield start
    for worker in workers:
        worker.stop()
        # Printed at teardown, so pytest shows it with a failed test's report only: what the
        # worker saw (received, ignored, WorkerLostError...) when a wait above timed out.
        if worker.process is not None:
            print(f"--- {worker.log_path.name} (pid {worker.process.pid}) ---\n{worker.output()[-12000:]}")
    # Messages a failed test left in the queue (re-sent parked tasks, with tickets under its key
    # prefix) would run in the next test's worker: none survive the test.
    client = redis.Redis.from_url(broker_url)
    try:
        ours = list(client.scan_iter(match=f"{QUEUE}*"))
        if ours:
            client.delete(*ours)
    finally:
        client.close()


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


def _current(raw, rec):
    """[(label, whether django_semaphore.guards.current_lease() was the task's lease)], in start order."""
    return [
        (label, flag == "1")
        for label, flag in (i.decode().split(":") for i in raw.lrange(rec("current"), 0, -1))
    ]


def _hold(sem, count):
    """``count`` slots held by the test itself, renewed by the watchdog."""
    leases = [sem.acquire() for _ in range(count)]
    assert all(leases)
    return [(lease, watchdog.watch(lease)) for lease in leases]


def _give_back(held):
    lease, watch = held
    watch.stop()
    lease.release()


def _holder_of(app, result):
    """The holder of JOBS that task ``result`` acquired (None before it has)."""
    return next((h for h in app.JOBS.holders() if h.meta.get("task_id") == result.id), None)


def _kill_once_started(raw, rec, label):
    """SIGKILL the process of task ``label`` once it has recorded its pid and its start
    (a task that records its pid: late_job, mortal_job); the moment of the kill."""
    started = lambda: raw.llen(rec(f"pids:{label}")) == 1 and _starts(raw, rec)  # noqa: E731
    wait_until(started, 20, message=f"{label} started")
    os.kill(int(raw.lindex(rec(f"pids:{label}"), 0)), signal.SIGKILL)
    return time.monotonic()


def test_a_running_task_holds_a_slot_named_by_its_task_id(app, worker, raw_redis, rec):
    result = app.job.delay("solo")
    wait_until(lambda: _starts(raw_redis, rec), 20, message="task start")
    holders = app.JOBS.holders()
    assert len(holders) == 1
    assert holders[0].meta["task_id"] == result.id and holders[0].meta["task"] == "tests.job"
    assert _starts(raw_redis, rec)[0][3]  # the task saw its own slot held
    assert _current(raw_redis, rec) == [("solo", True)]  # the documented current_lease() gives it
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
        t0 = int(server_ms(raw_redis))
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


@pytest.mark.urls("tests.support.handoff_site")
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
    assert _current(raw_redis, rec) == [("x1", True)]  # an adopted lease is the current lease too


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


def _park(app, task, labels, **options):
    """Send ``task`` once per label, one at a time, each parked before the next is sent."""
    results = []
    for label in labels:
        results.append(task.apply_async((label,), **options))
        n = len(results)
        wait_until(lambda n=n: len(parked(app.JOBS.partition())) >= n, 20, message=f"{label} parked")
    return results


def test_a_parked_task_that_retries_runs_again(app, worker, raw_redis, rec):
    # Issue 22.1: the retry of a parked task was sent with its spent ticket and dropped.
    held = _hold(app.JOBS, app.LIMIT)
    labels = ["t0", "t1", "t2"]
    results = _park(app, app.retrying, labels)
    raw_redis.set(rec("go:all"), "1", ex=600)
    for slot in held:
        _give_back(slot)
    assert sorted(r.get(timeout=30) for r in results) == labels
    for label in labels:  # each ran twice: the retry, then the work
        assert raw_redis.lrange(rec(f"attempts:{label}"), 0, -1) == [b"0", b"1"]
    starts = _starts(raw_redis, rec)
    assert sorted(s[0] for s in starts) == labels and all(own for _, _, _, own in starts)
    assert int(raw_redis.get(rec("peak"))) <= app.LIMIT
    wait_until(lambda: app.JOBS.holders() == [], 10, message="every slot released")


def test_bound_tasks_park_and_run(app, worker, raw_redis, rec):
    # Issue 22.6: with bind=True the task instance was put in the parked message (TypeError).
    labels = [f"b{i}" for i in range(6)]
    results = [app.bound_job.delay(label) for label in labels]
    wait_until(lambda: len(_starts(raw_redis, rec)) == app.LIMIT, 20, message="two running")
    wait_until(lambda: len(parked(app.JOBS.partition())) == 4, 20, message="four parked")
    raw_redis.set(rec("go:all"), "1", ex=600)
    assert sorted(r.get(timeout=30) for r in results) == labels
    assert all(r.state == "SUCCESS" for r in results)
    assert int(raw_redis.get(rec("peak"))) <= app.LIMIT
    assert all(own for _, _, _, own in _starts(raw_redis, rec))


def test_an_acks_late_task_whose_run_was_killed_runs_again(app, worker, raw_redis, rec):
    # Issue 22.2: redelivered after its pool process was SIGKILLed, a parked task was "ignored".
    held = _hold(app.JOBS, app.LIMIT)
    (result,) = _park(app, app.late_job, ["k1"])
    _give_back(held[0])
    # The task records its pid, then its start: both are awaited before it is killed.
    t0 = _kill_once_started(raw_redis, rec, "k1")
    first_token = _starts_with_tokens(raw_redis, rec)[0][4]
    wait_until(lambda: raw_redis.llen(rec("pids:k1")) == 2, 30, message="k1 redelivered and started again")
    print(f"\nacks_late redelivery after SIGKILL started in {time.monotonic() - t0:.2f} s")
    raw_redis.set(rec("go:all"), "1", ex=600)
    assert result.get(timeout=30) == "k1"
    starts = _starts_with_tokens(raw_redis, rec)
    assert [s[0] for s in starts] == ["k1", "k1"] and all(s[3] for s in starts)
    assert starts[1][4] == first_token  # the redelivered run took over the dead run's slot
    assert all(s[2] <= app.LIMIT for s in starts)
    _give_back(held[1])
    wait_until(lambda: app.JOBS.holders() == [], 10, message="every slot released")


def test_an_acks_late_task_that_took_its_own_slot_gives_it_back_when_its_run_is_killed(
    app, worker, raw_redis, rec
):
    # A run that acquired its slot (nothing parked) carries no ticket: before, its redelivery
    # found the dead run's slot still held until its lease expired (TIMEOUT after the
    # watchdog's last refresh) and parked behind it.
    held = _hold(app.JOBS, app.LIMIT - 1)
    result = app.late_job.delay("k2")
    wait_until(lambda: _holder_of(app, result), 20, message="k2 holding its slot")
    dead = _holder_of(app, result)
    t0 = _kill_once_started(raw_redis, rec, "k2")
    wait_until(lambda: raw_redis.llen(rec("pids:k2")) == 2, 30, message="k2 redelivered")
    wait_until(lambda: len(_starts(raw_redis, rec)) == 2, 30, message="k2 started again")
    print(f"\nacks_late redelivery of a run that acquired its slot started in {time.monotonic() - t0:.2f} s")
    first, second = _starts_with_tokens(raw_redis, rec)
    # Started on a slot of its own well before the dead run's lease would have expired.
    assert second[1] < dead.expires_at.timestamp() * 1000 - ONE_SECOND_MS
    assert second[3] and second[4] > first[4] and second[2] <= app.LIMIT
    assert dead.identifier not in {h.identifier for h in app.JOBS.holders()}
    raw_redis.set(rec("go:all"), "1", ex=600)
    assert result.get(timeout=30) == "k2"
    _give_back(held[0])
    wait_until(lambda: app.JOBS.holders() == [], 10, message="every slot released")


def test_the_slot_of_a_task_whose_process_was_killed_is_given_back_by_its_worker(app, worker, raw_redis, rec):
    # No acks_late: nothing delivers the task again. Before, its slot stayed held until its
    # lease expired (TIMEOUT after the watchdog's last refresh); the worker's main process
    # now gives it back within about a second of the kill.
    result = app.mortal_job.delay("m1")
    wait_until(lambda: _holder_of(app, result), 20, message="m1 holding its slot")
    dead = _holder_of(app, result)
    t0 = _kill_once_started(raw_redis, rec, "m1")
    wait_until(lambda: app.JOBS.holders() == [], 30, interval=0.02, message="the dead run's slot given back")
    given_back_at = server_ms(raw_redis)
    print(f"\nthe slot of a killed task's process was given back in {time.monotonic() - t0:.2f} s")
    assert given_back_at < dead.expires_at.timestamp() * 1000 - ONE_SECOND_MS
    # Logged just after the give-back (force_release, then the log line): awaited, not raced.
    wait_until(lambda: "whose process died" in worker.output(), 10, message="the give-back logged")


def test_one_ticket_never_runs_two_bodies(app, worker, raw_redis, rec):
    # Issue 22.3: two messages carrying one ticket ran their bodies at once on one slot.
    reports = Semaphore("reports")
    task_id = str(uuid.uuid4())
    ticket = reports.acquire().handoff()
    app.export.apply_async(("twin",), {"ticket": ticket}, task_id=task_id)
    wait_until(lambda: _starts(raw_redis, rec), 20, message="one run")
    # The same message again while it runs (a redelivery after the visibility timeout): it
    # finds the first run alive (its heartbeat), waits it out and is dropped.
    app.export.apply_async(("twin",), {"ticket": ticket}, task_id=task_id)
    dropped = f"Task tests.export[{task_id}] ignored"
    wait_until(lambda: dropped in worker.output(), 15, message="the duplicate dropped")
    raw_redis.set(rec("go:all"), "1", ex=600)
    assert app.app.AsyncResult(task_id).get(timeout=30) == "twin"
    wait_until(lambda: reports.holders() == [], 20, message="slot released")
    wait_until(lambda: raw_redis.llen(queue_key(reports.partition())) == 0, 1)  # nothing parked
    assert [s[0] for s in _starts(raw_redis, rec)] == ["twin"]


def test_a_ticket_sent_to_two_tasks_is_adopted_once(app, worker, live_server, raw_redis, rec):
    reports = Semaphore("reports")
    ticket = reports.acquire().handoff()
    first = app.export.delay("e1", ticket=ticket)
    wait_until(lambda: _starts(raw_redis, rec), 20, message="e1 started")
    second = app.export.delay("e2", ticket=ticket)
    with pytest.raises(Exception, match="single-use"):
        second.get(timeout=20)
    raw_redis.set(rec("go:all"), "1", ex=600)
    assert first.get(timeout=20) == "e1"
    assert [s[0] for s in _starts(raw_redis, rec)] == ["e1"]
    wait_until(lambda: reports.holders() == [], 10, message="released by e1")


def test_revoked_parked_tasks_give_their_slots_back_at_once(app, worker, raw_redis, rec):
    # Issue 22.5: each revoked parked task held a slot until TIMEOUT.
    running = [app.job.delay(label) for label in ("r0", "r1")]
    wait_until(lambda: len(_starts(raw_redis, rec)) == 2, 20, message="two running")
    labels = ["p0", "p1", "p2", "p3"]
    results = _park(app, app.job, labels)
    for result in results[1:3]:
        app.app.control.revoke(result.id, reply=True, timeout=5)
    t0 = int(server_ms(raw_redis))
    raw_redis.set(rec("go:r0"), "1", ex=600)
    raw_redis.set(rec("go:r1"), "1", ex=600)
    wait_until(lambda: len(_starts(raw_redis, rec)) == 4, 10, interval=0.005, message="p0 and p3 start")
    starts = _starts(raw_redis, rec)
    delays = [start[1] - t0 for start in starts[2:]]
    print(f"\nstarts of the parked tasks after two revokes (ms after the running ones end): {delays}")
    assert sorted(s[0] for s in starts[2:]) == ["p0", "p3"]
    assert max(delays) < ONE_SECOND_MS
    raw_redis.set(rec("go:all"), "1", ex=600)
    assert [r.get(timeout=20) for r in running] == ["r0", "r1"]
    assert [results[0].get(timeout=20), results[3].get(timeout=20)] == ["p0", "p3"]
    wait_until(lambda: results[1].state == "REVOKED" and results[2].state == "REVOKED", 10, message="revoked")
    wait_until(lambda: app.JOBS.holders() == [], 10, message="every slot released")


def test_parked_tasks_start_within_a_second_of_a_release_after_a_worker_restart(
    app, start_worker, raw_redis, rec
):
    # Issue 22.7: the killed worker's dispatcher lock held the partition for seconds.
    old = start_worker(concurrency=2)
    held = _hold(app.JOBS, app.LIMIT)
    results = _park(app, app.job, ["s0", "s1"])
    # The old worker's dispatcher queues for a slot on s0's behalf: kill it there.
    lock = app.JOBS.partition().base + LOCK_SUFFIX
    wait_until(lambda: (raw_redis.get(lock) or b"").startswith(b"w:"), 10, message="dispatcher queued")
    old.kill()
    raw_redis.set(rec("go:all"), "1", ex=600)
    start_worker(concurrency=2)
    delays = []
    for n, slot in enumerate(held, start=1):
        t0 = int(server_ms(raw_redis))
        _give_back(slot)
        wait_until(lambda n=n: len(_starts(raw_redis, rec)) == n, 10, interval=0.005, message="start")
        delays.append(_starts(raw_redis, rec)[-1][1] - t0)
    print(f"\nparked task start delays after a release, worker restarted (ms): {delays}")
    assert max(delays) < ONE_SECOND_MS
    assert [r.get(timeout=20) for r in results] == ["s0", "s1"]


#: How many tasks tenant A parks in the fair-share tests; B, C and D send one each.
FAIR_BACKLOG = 30
OTHERS = ("b0", "c0", "d0")


def _fair(app, settings, kind, total):
    """The task of a fair-share test and its semaphore, as this process sees it."""
    if kind == "configured":
        from tests.support.settings_celery import fair_entry

        settings.SEMAPHORES = {**settings.SEMAPHORES, "bg-fair": fair_entry(total)}
        return app.fair_job, Semaphore("bg-fair")
    return app.adhoc_fair_job, Semaphore("bg-fair-adhoc", limit=4, timeout=10, total=total)


def _labels(messages):
    return [m["args"][0] for m in messages]


@pytest.mark.parametrize("total", [1, 2])
@pytest.mark.parametrize("kind", ["configured", "adhoc"])
def test_a_tenants_parked_backlog_does_not_hold_up_the_other_tenants(
    app, start_worker, raw_redis, rec, settings, kind, total
):
    # shared/API.md, "Fair share across partitions": Celery tasks parked on a TOTAL semaphore
    # get the same fair share (LIMIT 4 per tenant, TOTAL 1 or 2 in all).
    task, sem = _fair(app, settings, kind, total)
    start_worker(total=total)
    # Task ids only: an AsyncResult kept in a failed test's traceback is collected at exit, noisily.
    results = {f"a{n}": task.delay(f"a{n}", "A").id for n in range(FAIR_BACKLOG)}
    wait_until(
        lambda: (
            len(_starts(raw_redis, rec)) == total and len(parked(sem.partition("A"))) == FAIR_BACKLOG - total
        ),
        30,
        message="TOTAL tasks of A running, the others parked",
    )
    a_parked = _labels(parked(sem.partition("A")))
    for label in OTHERS:  # tenants B, C and D
        tenant = label[0].upper()
        results[label] = task.delay(label, tenant).id
        wait_until(lambda t=tenant: parked(sem.partition(t)), 20, message=f"{label} parked")
    # One set of keys for the name, but each tenant's tasks parked apart, in a list of its own.
    for label in OTHERS:
        assert _labels(parked(sem.partition(label[0].upper()))) == [label]
    assert _labels(parked(sem.partition("A"))) == a_parked
    assert len({queue_key(sem.partition(t)) for t in "ABCD"}) == 4
    # A dispatcher of each tenant queues for a slot of the name (on its first parked task's behalf).
    queued = {results[label] for label in (a_parked[0], *OTHERS)}
    wait_until(lambda: queued <= {w.meta.get("task_id") for w in sem.waiters()}, 20, message="4 dispatchers")

    sent_at = len(_starts(raw_redis, rec))  # the others are parked: the starts from here on count
    everyone = len(results)
    for released in range(1, everyone + 1):  # end the oldest running task: its slot goes on
        raw_redis.set(rec(f"go:{_starts(raw_redis, rec)[released - 1][0]}"), "1", ex=600)
        expected = min(released + total, everyone)
        wait_until(
            lambda n=expected: len(_starts(raw_redis, rec)) >= n, 20, interval=0.005, message="a start"
        )
        assert len(_starts(raw_redis, rec)) <= released + total  # never more than TOTAL at once
    assert all(app.app.AsyncResult(i).get(timeout=30) == label for label, i in results.items())

    starts = _starts(raw_redis, rec)
    after = [label for label, *_ in starts[sent_at:]]
    a_before = {label: sum(1 for x in after[: after.index(label)] if x[0] == "a") for label in OTHERS}
    print(
        f"\nTOTAL {total} ({kind}): starts after B, C and D parked: {after[:6]}...; "
        f"positions {[after.index(label) for label in OTHERS]}, A's tasks started before each {a_before}"
    )
    # Round robin: B, C and D (never served) before A (served last) again; at most one of A's
    # 30 ahead of each (a dispatcher between two of its WAITs misses a turn), not all of them.
    assert max(a_before.values()) <= 1
    assert [label for label in after if label.startswith("a")] == a_parked  # A's in their order
    # Every task ran exactly once, with its own slot, never more than TOTAL at once.
    assert sorted(label for label, *_ in starts) == sorted(results)
    assert sorted(raw_redis.lrange(rec("ends"), 0, -1)) == sorted(label.encode() for label in results)
    assert all(own and holders <= total for _, _, holders, own in starts)
    assert int(raw_redis.get(rec("peak"))) <= total
    wait_until(lambda: sem.holders() == [], 10, message="every slot released")
    assert sem.available() == total and all(parked(sem.partition(t)) == [] for t in "ABCD")


def test_more_tenants_than_a_dispatcher_queues_for_take_turns(app, start_worker, raw_redis, rec, settings):
    # A worker's dispatcher queues for MAX_WAITING (32) partitions at a time. With 32 tenants
    # with a backlog each, a 33rd used to wait until one of them had sent all of its parked
    # tasks (here 2 grants each: 64); it waits one grant per other waiting tenant at most.
    from django_semaphore.contrib.celery import MAX_WAITING

    task, sem = _fair(app, settings, "configured", 1)
    start_worker(total=1)
    tenants, each = [f"t{n:02}" for n in range(MAX_WAITING)], 3
    results = {f"{t}-{n}": task.delay(f"{t}-{n}", t).id for n in range(each) for t in tenants}
    wait_until(
        lambda: sum(len(parked(sem.partition(t))) for t in tenants) == len(results) - 1,
        30,
        message="one running, the others parked",
    )
    wait_until(lambda: len(sem.waiters()) == MAX_WAITING, 20, message="the dispatcher queues for 32 tenants")
    results["z"] = task.delay("z", "Z").id
    wait_until(lambda: parked(sem.partition("Z")), 20, message="z parked")

    for released in range(1, len(results) + 1):  # end the running task: its slot goes on
        raw_redis.set(rec(f"go:{_starts(raw_redis, rec)[released - 1][0]}"), "1", ex=600)
        expected = min(released + 1, len(results))
        wait_until(
            lambda n=expected: len(_starts(raw_redis, rec)) >= n, 20, interval=0.005, message="a start"
        )
        assert len(_starts(raw_redis, rec)) <= released + 1
    assert all(app.app.AsyncResult(i).get(timeout=30) == label for label, i in results.items())

    starts = _starts(raw_redis, rec)
    after = [label for label, *_ in starts[1:]]
    print(f"\n{MAX_WAITING} tenants with {each} tasks each, then Z with 1: Z started at {after.index('z')}")
    assert after.index("z") <= MAX_WAITING
    for t in tenants:  # each tenant's in the order they were sent
        assert [label for label, *_ in starts if label.startswith(t)] == [f"{t}-{n}" for n in range(each)]
    assert sorted(label for label, *_ in starts) == sorted(results)
    assert all(own and holders <= 1 for _, _, holders, own in starts)
    assert int(raw_redis.get(rec("peak"))) == 1
    wait_until(lambda: sem.holders() == [], 10, message="every slot released")


def test_a_parked_task_sent_to_another_queue_runs_from_that_queue(app, start_worker, raw_redis, rec):
    # A task routed to a queue (apply_async(queue=...), @app.task(queue=...)) comes by the
    # anonymous exchange: it used to be sent again to the default queue once parked, where
    # no worker of its queue would ever see it.
    other = f"{QUEUE}-other"
    start_worker(queues=other)  # consumes only that queue, not the default one
    held = _hold(app.JOBS, app.LIMIT)
    (result,) = _park(app, app.job, ["q1"], queue=other)
    assert parked(app.JOBS.partition())[0]["options"]["queue"] == other
    raw_redis.set(rec("go:all"), "1", ex=600)
    _give_back(held[0])
    assert result.get(timeout=20) == "q1"
    assert [s[0] for s in _starts(raw_redis, rec)] == ["q1"]
    _give_back(held[1])
    wait_until(lambda: app.JOBS.holders() == [], 10, message="every slot released")


def test_a_parked_task_keeps_ignore_result(app, start_worker, raw_redis, rec):
    # apply_async(ignore_result=True) was dropped from the parked message: its run stored a result.
    start_worker(concurrency=1)  # one process: a task sent after it runs after its result is stored
    held = _hold(app.JOBS, app.LIMIT)
    (ignored,) = _park(app, app.job, ["i1"], ignore_result=True)
    assert parked(app.JOBS.partition())[0]["options"]["ignore_result"] is True
    raw_redis.set(rec("go:all"), "1", ex=600)
    _give_back(held[0])
    wait_until(lambda: raw_redis.lrange(rec("ends"), 0, -1) == [b"i1"], 20, message="i1 ran")
    assert app.followed.delay("after", tag="next").get(timeout=20) == "after"  # i1's run is over
    assert ignored.state == "PENDING"  # no result stored
    _give_back(held[1])
    wait_until(lambda: app.JOBS.holders() == [], 10, message="every slot released")


def test_a_backlog_served_for_longer_than_its_ttl_is_kept(app, start_worker, raw_redis, rec):
    # The parked tasks' TTL (PARK_TTL, a day) was set only by a park: a backlog sent (or
    # waited for) by the dispatcher for longer than that, with no new park, expired mid-way.
    # Here PARK_TTL is 1 s in the worker: SHORT's parked tasks are kept 2.5 s (TIMEOUT + 1).
    start_worker(env={"SEMAPHORE_CELERY_PARK_TTL": "1"})
    (held,) = _hold(app.SHORT, 1)
    labels = ["k0", "k1", "k2"]
    results = []
    for n, label in enumerate(labels, start=1):
        results.append(app.short_job.delay(label))
        wait_until(lambda n=n: len(parked(app.SHORT.partition())) == n, 20, message=f"{label} parked")
    last_park = time.monotonic()
    queue = queue_key(app.SHORT.partition())
    assert 0 < raw_redis.pttl(queue) <= 2500
    _give_back(held)  # k0 is sent (popped); k1 and k2 wait behind it, served by a dispatcher
    wait_until(lambda: _starts(raw_redis, rec), 10, message="k0 started")
    wait_until(lambda: time.monotonic() > last_park + 4, 10, message="twice the TTL since the last park")
    assert _labels(parked(app.SHORT.partition())) == ["k1", "k2"]
    assert 0 < raw_redis.pttl(queue) <= 2500
    raw_redis.set(rec("go:all"), "1", ex=600)
    assert [r.get(timeout=20) for r in results] == labels
    assert [s[0] for s in _starts(raw_redis, rec)] == labels


def test_parked_tasks_of_an_ad_hoc_adaptive_semaphore_keep_its_limit_in_force(app, worker, raw_redis, rec):
    # The dispatcher rebuilt an ad-hoc semaphore from LIMIT, TIMEOUT and ALGORITHM only: without
    # ADAPTIVE it took slots at LIMIT (4) for parked tasks, above the limit in force (2).
    sem = app.ADAPT
    assert sem.effective().limit == 2
    labels = [f"a{i}" for i in range(5)]
    results = {}
    for n, label in enumerate(labels, start=1):  # one at a time: the first two run, the others park
        results[label] = app.adapt_job.delay(label)
        wait_until(
            lambda n=n: (
                len(_starts(raw_redis, rec)) + len(parked(sem.partition())) == n
                or len(_starts(raw_redis, rec)) > 2
            ),  # (over the limit: the assertion below says so)
            20,
            message=f"{label} started or parked",
        )
        assert [s[0] for s in _starts(raw_redis, rec)] == ["a0", "a1"][:n]
    first_parked = results["a2"].id
    # The dispatcher queues for a slot on a2's behalf (none free at the limit in force)...
    wait_until(
        lambda: (
            first_parked in {w.meta.get("task_id") for w in sem.waiters()} or len(_starts(raw_redis, rec)) > 2
        ),
        20,
        message="a2's slot queued for",
    )
    assert len(_starts(raw_redis, rec)) == 2  # ...instead of sending it at once
    raw_redis.set(rec("go:all"), "1", ex=600)
    assert [results[label].get(timeout=30) for label in labels] == labels
    starts = _starts(raw_redis, rec)
    assert sorted(s[0] for s in starts) == labels and all(
        own and holders <= 2 for _, _, holders, own in starts
    )
    assert int(raw_redis.get(rec("peak"))) <= 2
    wait_until(lambda: sem.holders() == [], 10, message="every slot released")


def test_a_parked_task_of_a_pickle_serializer_runs(app, start_worker, raw_redis, rec):
    # A parked message was always encoded with JSON: a task sent with pickle whose arguments
    # JSON cannot encode (a set) failed when it had to park, without running.
    from django_semaphore.contrib.celery import parking

    # A worker that accepts pickle (as root: Celery wants to be told it may).
    start_worker(env={"SEMAPHORE_CELERY_PICKLE": "1", "C_FORCE_ROOT": "1"})
    held = _hold(app.JOBS, app.LIMIT)
    result = app.pickled_job.delay("p1", {"b", "a"})
    wait_until(lambda: parked(app.JOBS.partition()), 20, message="p1 parked")
    (message,) = parked(app.JOBS.partition())  # (left encoded: this process accepts JSON only)
    assert message["body"]["serializer"] == "pickle" and "args" not in message
    opened = parking.opened(message, {"application/x-python-serialize"})
    assert opened["args"] == ["p1", {"a", "b"}] and opened["options"]["ignore_result"] is False
    raw_redis.set(rec("go:all"), "1", ex=600)
    _give_back(held[0])
    assert result.get(timeout=20) == "p1-a-b"
    assert [s[0] for s in _starts(raw_redis, rec)] == ["p1-a-b"]
    _give_back(held[1])
    wait_until(lambda: app.JOBS.holders() == [], 10, message="every slot released")
