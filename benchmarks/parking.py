"""Background work: a parked Celery task's start delay after a release, against the retry pattern.

A real ``celery worker`` (prefork, 2 processes; this module is its app: ``-A
benchmarks.parking``) on the benchmark's throwaway Redis (broker: database 1).
The main process holds the only slot of a LIMIT 1 semaphore and sends one task;
once the task has found the slot taken, the main process waits a random 0-1 s
(a release comes at any moment), reads the Redis server's clock and releases.
The task records the server's clock when its body starts.

* ``parked``: ``@semaphore_task``: the task is parked, and sent again by the
  dispatcher on the worker (or by the releasing task) once the slot is free.
* ``retry``: the documented timer pattern, ``self.retry(countdown=1)`` while
  ``acquire()`` finds no slot.
"""

import os
import random
import subprocess
import sys
import time
import uuid

from .common import percentile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BROKER_DB = 1
RETRY_COUNTDOWN = 1  # seconds: the retry pattern's Retry-After
STARTS = "bench:parking:starts"  # LIST "<kind>:<n>:<server ms>"
TRIED = "bench:parking:tried"  # LIST "<kind>:<n>": the task found the slot taken
READY = "bench:parking:ready"

try:
    import celery  # noqa: F401

    AVAILABLE = True
except ImportError:  # the optional "celery" extra
    AVAILABLE = False


def _broker(redis_url):
    return redis_url.rsplit("/", 1)[0] + f"/{BROKER_DB}"


if os.environ.get("BENCH_PARKING_WORKER"):  # imported by the worker: Django first
    from .common import setup_django

    setup_django(os.environ["BENCH_REDIS_URL"])

if AVAILABLE:
    from celery import Celery, signals

    from django_semaphore import Semaphore
    from django_semaphore.backend import connection
    from django_semaphore.contrib.celery import semaphore_task

    app = Celery("bench_parking")
    app.conf.update(
        broker_url=_broker(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0")),
        task_default_queue="bench-parking",
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
    )
    PARKED = Semaphore("bench-parked", limit=1, timeout=10)
    RETRIED = Semaphore("bench-retried", limit=1, timeout=10)

    def _server_ms(client):
        seconds, micros = client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def _started(kind, n):
        client = connection.get_client()
        client.rpush(STARTS, f"{kind}:{n}:{_server_ms(client)}")

    @app.task(name="bench.parked")
    @semaphore_task(PARKED)
    def parked(n):
        _started("parked", n)

    @app.task(name="bench.retry", bind=True, max_retries=None)
    def retry(self, n):
        lease = RETRIED.acquire()
        if lease is None:
            connection.get_client().rpush(TRIED, f"retry:{n}")
            raise self.retry(countdown=RETRY_COUNTDOWN)
        try:
            _started("retry", n)
        finally:
            lease.release()

    @signals.worker_ready.connect
    def _ready(sender=None, **kwargs):
        connection.get_client().set(READY, str(os.getpid()), ex=600)


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.002)


def _start_worker(redis_url, log):
    env = dict(os.environ)
    env.update(
        BENCH_PARKING_WORKER="1",
        BENCH_REDIS_URL=redis_url,
        DJANGO_SETTINGS_MODULE="benchmarks.settings",
        PYTHONPATH=os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")])),
    )
    command = [
        sys.executable, "-m", "celery", "-A", "benchmarks.parking", "worker", "--pool=prefork", "-c", "2",
        "-Q", "bench-parking", "-n", f"bench-{uuid.uuid4().hex[:6]}@%h", "--without-heartbeat",
        "--without-gossip", "--without-mingle", "-l", "WARNING",
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _sample(client, kind, n, sem, send):
    lease = sem.acquire()
    send(n)
    if kind == "parked":  # the task found no slot: its message is parked
        from django_semaphore.contrib.celery import queue_key

        _wait(lambda: client.llen(queue_key(sem.partition())) == 1, 20, "parked")
    else:
        _wait(lambda: f"retry:{n}".encode() in client.lrange(TRIED, 0, -1), 20, "first attempt")
    time.sleep(random.uniform(0, 1))  # the release comes at any moment
    released = _server_ms(client)
    lease.release()
    prefix = f"{kind}:{n}:".encode()

    def started():
        return next((s for s in client.lrange(STARTS, 0, -1) if s.startswith(prefix)), None)

    _wait(started, 20, f"{kind} task start")
    return int(started()[len(prefix) :]) - released


def measure(redis_url, samples):
    """p50 / p99 / max start delay (ms) after a release: parked vs retry(countdown=1)."""
    client = connection.get_client()
    client.delete(STARTS, TRIED, READY)
    with open(os.devnull, "w") as log:
        worker = _start_worker(redis_url, log)
        try:
            _wait(lambda: client.exists(READY) or worker.poll() is not None, 60, "worker ready")
            if worker.poll() is not None:
                raise RuntimeError("the Celery worker exited")
            delays = {"parked": [], "retry": []}
            for n in range(samples):  # interleaved: both see the same machine load
                delays["parked"].append(_sample(client, "parked", n, PARKED, parked.delay))
                delays["retry"].append(_sample(client, "retry", n, RETRIED, retry.delay))
        finally:
            os.killpg(worker.pid, 15)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, 9)
                worker.wait(10)
    return {
        kind: {
            "samples": len(values),
            "p50_ms": percentile(values, 50),
            "p99_ms": percentile(values, 99),
            "max_ms": max(values),
        }
        for kind, values in delays.items()
    }


if __name__ == "__main__":  # python -m benchmarks.parking [N]: this section alone
    from tests.support.servers import RedisServer

    server = RedisServer().start()
    try:
        from .common import setup_django

        setup_django(server.url)
        os.environ["BENCH_REDIS_URL"] = server.url
        app.conf.broker_url = _broker(server.url)
        result = measure(server.url, int(sys.argv[1]) if len(sys.argv) > 1 else 30)
        for kind, row in result.items():
            print(f"{kind:7} n={row['samples']}  p50 {row['p50_ms']:.0f} ms  p99 {row['p99_ms']:.0f} ms  "
                  f"max {row['max_ms']:.0f} ms")  # fmt: skip
    finally:
        server.cleanup()
