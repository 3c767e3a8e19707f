"""Faults real deployments meet, each with its outcome asserted.

Restarts without persistence, SCRIPT FLUSH, CLIENT PAUSE with a client-side
retry, holders that are SIGKILLed or SIGSTOPped past their lease.  Tests that
restart or pause Redis use a redis-server of their own (``own_redis``).
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_semaphore import Semaphore, SemaphoreBackendError, signals
from django_semaphore.backend import connection
from django_semaphore.backend.scripting import execute, run
from django_semaphore.engine.algorithms import ALGORITHMS, AcquireRequest, Granted
from tests.support.helpers import server_ms, wait_until

LUA = ALGORITHMS["lua"]


@pytest.fixture
def lost():
    """Leases for which lease_lost was sent during the test."""
    seen = []

    def receiver(sender, lease, **kwargs):
        seen.append(lease)

    signals.lease_lost.connect(receiver, weak=False)
    yield seen
    signals.lease_lost.disconnect(receiver)


# -- restart without persistence ------------------------------------------------


def test_restart_without_persistence_during_traffic(own_redis, lost):
    sem = Semaphore("restart", limit=3, timeout=30)
    held = [sem.acquire(), sem.acquire()]
    assert all(held)
    tokens_before = max(lease.token for lease in held)

    stop = threading.Event()
    outcomes = {"granted": 0, "errors": 0}

    def traffic():
        while not stop.is_set():
            try:
                lease = sem.acquire()
                if lease:
                    outcomes["granted"] += 1
                    lease.release()
            except SemaphoreBackendError:
                outcomes["errors"] += 1
                time.sleep(0.01)

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    wait_until(lambda: outcomes["granted"] >= 20, message="traffic before the restart")
    errors_before = outcomes["errors"]
    stopping = time.monotonic()
    own_redis.restart()
    restarted = time.monotonic()
    granted = outcomes["granted"]
    wait_until(lambda: outcomes["granted"] > granted, message="a grant after the restart")
    first_grant = time.monotonic()
    wait_until(lambda: outcomes["granted"] >= granted + 20, message="traffic after the restart")
    stop.set()
    thread.join(10)
    print(
        f"RESTART FIGURES: server down and up in {restarted - stopping:.2f}s, "
        f"{outcomes['errors'] - errors_before} failed calls, first grant "
        f"{first_grant - restarted:.3f}s after the server was back"
    )

    # The next call on the engine's own client succeeds (a stale pooled
    # connection is retried once on a fresh one) and the scripts reload.
    fresh = sem.acquire()
    assert fresh is not None
    assert fresh.token > tokens_before  # the counter re-seeds from server time
    # The holders whose entries vanished learn it, once each.
    assert held[0].refresh() is False
    assert held[1].release() is False
    assert {id(lease) for lease in lost} == {id(held[0]), id(held[1])}
    assert held[0].release() is False  # a lost lease stays lost
    assert [h.identifier for h in sem.holders()] == [fresh.identifier]
    assert fresh.release() is True


@pytest.mark.asyncio
async def test_restart_without_persistence_async(own_redis, lost):
    sem = Semaphore("arestart", limit=1, timeout=30)
    lease = await sem.aacquire()
    own_redis.restart()
    fresh = None
    deadline = time.monotonic() + 5
    while fresh is None:
        try:
            fresh = await sem.aacquire()  # the slot is free again: the entry is gone
        except SemaphoreBackendError:
            if time.monotonic() > deadline:
                raise
    assert await lease.arefresh() is False
    assert await lease.arelease() is False
    assert lost == [lease]
    assert await fresh.arelease() is True


# -- SCRIPT FLUSH -------------------------------------------------------------


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_script_flush_between_calls(backend, backend_redis, algorithm):
    def flush():
        if backend == "cluster":
            for node in backend_redis.get_primaries():
                node.redis_connection.script_flush()
        else:
            backend_redis.script_flush()

    sem = Semaphore("flush-" + algorithm, limit=1, timeout=10, algorithm=algorithm)
    flush()
    lease = sem.acquire()
    flush()
    assert sem.acquire() is None
    flush()
    assert lease.refresh() is True
    flush()
    assert len(sem.holders()) == 1
    flush()
    assert lease.release() is True
    flush()
    assert sem.purge_expired() == 0


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
@pytest.mark.asyncio
async def test_script_flush_between_async_calls(backend, backend_redis, algorithm):
    """On an asyncio cluster client, MULTI/EXEC pipes run as a script: flushed too."""

    def flush():
        if backend == "cluster":
            for node in backend_redis.get_primaries():
                node.redis_connection.script_flush()
        else:
            backend_redis.script_flush()

    sem = Semaphore("aflush-" + algorithm, limit=1, timeout=10, algorithm=algorithm)
    flush()
    lease = await sem.aacquire()
    flush()
    assert await sem.aacquire() is None
    flush()
    assert await lease.arefresh() is True
    flush()
    assert await lease.arelease() is True


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_script_flush_inside_a_multi_step_operation(backend, backend_redis, algorithm):
    """SCRIPT FLUSH before every request of one operation (pipes, lock, unlock script)."""

    def flush():
        if backend == "cluster":
            for node in backend_redis.get_primaries():
                node.redis_connection.script_flush()
        else:
            backend_redis.script_flush()

    sem = Semaphore("flush-op-" + algorithm, limit=1, timeout=10, algorithm=algorithm)
    keys = sem.partition()
    client = connection.get_client()
    op = ALGORITHMS[algorithm].acquire(keys, 1, AcquireRequest("flushed-id", "{}", 10000))
    requests = 0
    try:
        request = next(op)
        while True:
            flush()
            requests += 1
            request = op.send(execute(client, request))
    except StopIteration as done:
        outcome = done.value
    assert isinstance(outcome, Granted)
    assert [h.identifier for h in sem.holders()] == ["flushed-id"]
    assert requests >= 1


# -- CLIENT PAUSE and a retried acquire ---------------------------------------


def test_client_pause_retry_uses_one_slot(own_redis, settings):
    """A timed-out acquire is retried by redis-py on a fresh connection; one slot is used."""
    # The engine does not retry timeouts by itself (an unresponsive server must
    # fail fast); an application that wants it configures redis-py to.
    retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError, redis.TimeoutError))
    settings.SEMAPHORE_REDIS = {"URL": own_redis.url, "OPTIONS": {"socket_timeout": 1.0, "retry": retry}}
    sem = Semaphore("paused", limit=2, timeout=30)
    warm = sem.acquire()  # load the scripts before the pause
    assert warm.release()
    admin = redis.Redis(port=own_redis.port)
    admin.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
    started = time.monotonic()
    lease = sem.acquire()  # times out at 1 s, is sent again, both run when the pause ends
    assert time.monotonic() - started >= 1.0
    assert lease is not None
    holders = sem.holders()
    assert [h.identifier for h in holders] == [lease.identifier]
    assert sem.available() == 1
    assert lease.release() and sem.available() == 2
    admin.close()


def test_client_pause_manual_retry_same_identifier(own_redis):
    """The acquire operation run twice with one identifier: the second returns the first grant."""
    sem = Semaphore("paused-manual", limit=2, timeout=30)
    keys = sem.partition()
    client = connection.get_client()
    run(client, LUA.acquire(keys, 2, AcquireRequest("warm", "{}", 30000)))  # load the script
    run(client, LUA.release(keys, 2, "warm"))
    impatient = redis.Redis(port=own_redis.port, socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    admin = redis.Redis(port=own_redis.port)
    admin.execute_command("CLIENT", "PAUSE", 600, "WRITE")
    with pytest.raises(SemaphoreBackendError):
        run(impatient, LUA.acquire(keys, 2, AcquireRequest("retried", "{}", 30000)))
    # The first attempt is still queued in Redis; the retry waits behind it.
    second = run(client, LUA.acquire(keys, 2, AcquireRequest("retried", "{}", 30000)))
    third = run(client, LUA.acquire(keys, 2, AcquireRequest("retried", "{}", 30000)))
    assert isinstance(second, Granted) and second == third
    assert [h.identifier for h in sem.holders()] == ["retried"]
    assert sem.available() == 1
    impatient.close()
    admin.close()


# -- holders killed or stopped -------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import json, sys, time
    import django
    django.setup()
    from django_semaphore import Semaphore, signals
    lost = []
    signals.lease_lost.connect(lambda sender, lease, **kw: lost.append(lease.identifier), weak=False)
    sem = Semaphore(sys.argv[1], limit=1, timeout=float(sys.argv[2]))
    lease = sem.acquire()
    print(json.dumps({"identifier": lease.identifier, "expires_ms": lease.expires_ms}), flush=True)
    sys.stdin.readline()
    refreshed = lease.refresh()
    released = lease.release()
    again = sem.holders()
    print(json.dumps({"refresh": refreshed, "release": released, "lost": lost,
                      "holders": [h.identifier for h in again]}), flush=True)
    """
)


def _holder(env, name, timeout):
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, name, str(timeout)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line, "the holder process did not start"
    return process, json.loads(line)


@pytest.mark.slow
def test_sigkilled_holder_slot_free_within_timeout_plus_one(subprocess_env, raw_redis):
    timeout = 2.0
    sem = Semaphore("killed", limit=1, timeout=timeout)
    process, held = _holder(subprocess_env, "killed", timeout)
    try:
        assert sem.acquire() is None
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        killed = time.monotonic()
        lease = wait_until(sem.acquire, timeout=timeout + 1.0, interval=0.01, message="slot recovery")
        recovery = time.monotonic() - killed
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert recovery <= timeout + 1.0
    assert lease.token > 0 and lease.identifier != held["identifier"]
    print(f"SLOT RECOVERY after SIGKILL: {recovery:.3f}s (TIMEOUT {timeout}s)")
    assert lease.release()


@pytest.mark.slow
def test_sigstopped_holder_learns_it_lost_the_slot(subprocess_env, raw_redis):
    timeout = 1.0
    sem = Semaphore("stopped", limit=1, timeout=timeout)
    process, held = _holder(subprocess_env, "stopped", timeout)
    try:
        process.send_signal(signal.SIGSTOP)
        successor = wait_until(sem.acquire, timeout=timeout + 2.0, interval=0.01, message="slot taken over")
        assert server_ms(raw_redis) >= held["expires_ms"]  # a lease ends at its expiry
        process.send_signal(signal.SIGCONT)
        process.stdin.write("go\n")
        process.stdin.flush()
        report = json.loads(process.stdout.readline())
        process.wait(10)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait()
    assert report == {
        "refresh": False,
        "release": False,
        "lost": [held["identifier"]],
        "holders": [successor.identifier],  # no silent re-acquire, the successor untouched
    }
    assert successor.refresh() is True
    assert successor.release() is True


# -- fork() while holding ---------------------------------------------------------


@pytest.mark.slow
def test_forked_child_neither_renews_nor_releases(raw_redis):
    """A child forked while the parent holds a watched lease leaves that lease alone.

    The child inherits the lease object and the watchdog's state; it finds no
    watch to renew (the watchdog forgets the parent's leases after fork) and its
    refresh() and release() return False without touching Redis, so unwinding a
    ``with sem.hold()`` block in the child releases nothing.  The parent stops its own watch at the fork, so
    only the child could have renewed the lease: it must expire on time.
    """
    from django_semaphore.engine import watchdog

    sem = Semaphore("forked", limit=1, timeout=1.5)
    lease = sem.acquire()
    handle = watchdog.watch(lease)
    first = lease.expires_ms
    wait_until(lambda: lease.expires_ms > first, timeout=5, message="a renewal by the parent's watchdog")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, try everything, exit without running the parent's teardown
        try:
            os.close(read_end)
            report = {
                "watches": watchdog.watchdog().count(),
                "refresh": lease.refresh(),
                "release": lease.release(),  # what leaving ``with sem.hold()`` does
            }
            time.sleep(2.0)  # a watchdog of the child would have renewed by now
            report["watches_later"] = watchdog.watchdog().count()
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    handle.stop()  # the parent stops renewing: only the child could renew now
    os.close(write_end)
    expires = float(raw_redis.zscore(lease.keys.timeouts, lease.identifier))
    with os.fdopen(read_end) as pipe:
        report = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert report == {"watches": 0, "refresh": False, "release": False, "watches_later": 0}
    # Not renewed by the child (its expiry has not moved) and not released by it:
    # it is still the holder until it expires, then the slot is free.
    score = raw_redis.zscore(lease.keys.timeouts, lease.identifier)
    assert score is None or float(score) == expires
    assert lease.lost is False and lease.released is False
    wait_until(lambda: sem.available() == 1, timeout=5, message="the lease expiring")
    assert lease.refresh() is False and lease.lost is True
