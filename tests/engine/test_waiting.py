"""Waiting for a slot (django_semaphore.waiting): first come, first served, and
dead and stalled waiters.

A waiter that dies while queued must not hold up the waiters behind it for
long, and a waiter that is only slow (stopped, paused) must not lose its place
in the queue.  The waiters that die or stall are real processes, SIGKILLed or
SIGSTOPped; the live ones are threads or asyncio tasks of the test process.
"""

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from django_semaphore import Semaphore
from django_semaphore.backend import connection
from tests.support.helpers import expire_now, server_ms, until, wait_until

WAITER = textwrap.dedent(
    """
    import json, sys
    import django
    django.setup()
    from django_semaphore import Semaphore
    name, limit, timeout, wait, label = sys.argv[1:6]
    sem = Semaphore(name, limit=int(limit), timeout=float(timeout))
    print("ready", flush=True)
    sys.stdin.readline()
    lease = sem.acquire(wait=float(wait), meta={"w": label})
    print(json.dumps({"granted": lease is not None}), flush=True)
    sys.stdin.readline()
    if lease is not None:
        lease.release()
    """
)


def _waiter(env, name, label, limit=1, timeout=30, wait=60):
    """A waiter process, ready to queue on ``name`` once it is told to (see _queue)."""
    process = subprocess.Popen(
        [sys.executable, "-c", WAITER, name, str(limit), str(timeout), str(wait), label],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "ready", "the waiter process did not start"
    return process


def _queue(process, sem, waiting):
    """Tell ``process`` to acquire; return once the queue holds ``waiting`` waiters."""
    process.stdin.write("go\n")
    process.stdin.flush()
    wait_until(lambda: sem.status().waiting == waiting, message=f"{waiting} waiters queued")


def _stop(process):
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
    process.wait(10)


def _in_thread(sem, **kwargs):
    """sem.acquire(**kwargs) in a thread; the result dict gets the lease and when it came."""
    result = {}

    def target():
        result["lease"] = sem.acquire(**kwargs)
        result["at"] = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def test_a_dead_waiter_delays_the_next_by_less_than_a_second(subprocess_env):
    # Issue 11, item 8: the waiter at the head of the queue is SIGKILLed; the
    # live waiter behind it must get the slot freed by a release promptly, not
    # when the dead waiter's ticket runs out (2-3 s before the fix).
    sem = Semaphore("dead-head", limit=1, timeout=30)
    holder = sem.acquire()
    dead = _waiter(subprocess_env, "dead-head", "dead")
    try:
        _queue(dead, sem, 1)
        live, result = _in_thread(sem, wait=30, meta={"w": "live"})
        wait_until(lambda: sem.status().waiting == 2, message="live waiter queued behind")
        dead.kill()
        dead.wait(10)
        freed = time.monotonic()
        assert holder.release() is True
        live.join(30)
    finally:
        _stop(dead)
    assert result["lease"] is not None
    delay = result["at"] - freed
    print(f"DEAD WAITER at the head: the next waiter got the released slot after {delay:.3f}s")
    assert delay < 1.5
    assert [h.meta["w"] for h in sem.holders()] == ["live"]
    assert result["lease"].release() is True
    assert sem.status().waiting == 0


@pytest.mark.asyncio
async def test_a_dead_waiter_does_not_hold_up_an_async_waiter_when_a_lease_expires(subprocess_env):
    # An expiring lease pushes no wake-up: the live waiter's own acquire, at
    # the expiry, finds the slot free and the dead waiter ahead entitled to
    # it, wakes it, and takes the slot once the dead one failed to claim it.
    sem = Semaphore("dead-expiry", limit=1, timeout=30)
    dead = await asyncio.to_thread(_waiter, subprocess_env, "dead-expiry", "dead")
    try:
        holder = await Semaphore("dead-expiry", limit=1, timeout=1.5).aacquire()  # never released
        await asyncio.to_thread(_queue, dead, sem, 1)
        live = asyncio.create_task(sem.aacquire(wait=30, meta={"w": "live"}))
        await asyncio.to_thread(
            wait_until, lambda: sem.status().waiting == 2, message="live waiter queued behind"
        )
        dead.kill()
        await asyncio.to_thread(dead.wait, 10)
        now_ms = await asyncio.to_thread(server_ms, connection.get_client())
        expiry = time.monotonic() + (holder.expires_ms - now_ms) / 1000
        lease = await asyncio.wait_for(live, 30)
        granted = time.monotonic()
    finally:
        await asyncio.to_thread(_stop, dead)
    assert lease is not None
    delay = granted - expiry
    print(f"DEAD WAITER at the head: the next (async) waiter got the expired slot after {delay:.3f}s")
    assert delay < 1.5
    assert await lease.arelease() is True


@pytest.mark.slow
def test_a_stalled_waiter_keeps_its_place_in_the_queue(subprocess_env):
    # A waiter stopped for longer than its ticket lasts (a SIGSTOP here; a long
    # GC pause or a swapped-out process in real life) is dropped from the
    # queue meanwhile, so the waiters behind it are not held up. When it runs
    # again it goes back to its place, ahead of the waiters that queued after
    # it, not to the back of the queue.
    sem = Semaphore("stalled", limit=1, timeout=30)
    holder = sem.acquire()
    # Every script cached on the server, as in a warm deployment (a waiter's claim
    # refresh sent behind its BLPOP then runs for the stopped waiter, which holds
    # the slot for its TIMEOUT: the waiters behind it must not wait that long).
    assert holder.refresh()
    stalled = _waiter(subprocess_env, "stalled", "stalled")
    try:
        _queue(stalled, sem, 1)
        second, second_result = _in_thread(sem, wait=30, meta={"w": "second"})
        wait_until(lambda: sem.status().waiting == 2, message="second waiter queued")
        third, third_result = _in_thread(sem, wait=30, meta={"w": "third"})
        wait_until(lambda: sem.status().waiting == 3, message="third waiter queued")
        stalled.send_signal(signal.SIGSTOP)
        assert holder.release() is True
        second.join(30)
        assert second_result["lease"] is not None
        # Stopped past its ticket: only the third waiter is still queued.
        wait_until(lambda: sem.status().waiting == 1, message="stalled waiter dropped")
        stalled.send_signal(signal.SIGCONT)
        wait_until(lambda: sem.status().waiting == 2, message="stalled waiter back in the queue")
        assert second_result["lease"].release() is True
        holders = wait_until(sem.holders, message="the slot taken again")
        assert [h.meta["w"] for h in holders] == ["stalled"]  # before the fix: "third"
        assert json.loads(stalled.stdout.readline()) == {"granted": True}
        assert third.is_alive()
        stalled.stdin.write("release\n")
        stalled.stdin.flush()
        assert stalled.wait(10) == 0
        third.join(30)
        assert third_result["lease"] is not None
        assert third_result["lease"].release() is True
    finally:
        _stop(stalled)


def test_stalled_waiters_that_come_back_to_an_empty_queue_keep_their_order(subprocess_env):
    # Both waiters stopped past their tickets: the queue empties. What a Sentinel failover
    # does too (the new primary's copy of the queue expired while the waiters renewed
    # their tickets on the old one, or replication never carried it).  The first to come
    # back found nobody queued and took a new number, behind the second's old one: the
    # second, queued after it, was served first.
    sem = Semaphore("stalled-both", limit=1, timeout=30)
    holder = sem.acquire()
    assert holder.refresh()  # every script cached, as in test_a_stalled_waiter_keeps_its_place_in_the_queue
    first = _waiter(subprocess_env, "stalled-both", "first")
    second = _waiter(subprocess_env, "stalled-both", "second")
    try:
        _queue(first, sem, 1)
        _queue(second, sem, 2)
        first.send_signal(signal.SIGSTOP)
        second.send_signal(signal.SIGSTOP)
        wait_until(lambda: sem.status().waiting == 0, message="both stalled waiters dropped")
        first.send_signal(signal.SIGCONT)
        wait_until(lambda: sem.status().waiting == 1, message="the first back in the queue")
        second.send_signal(signal.SIGCONT)
        wait_until(lambda: sem.status().waiting == 2, message="the second back in the queue")
        assert holder.release() is True
        holders = wait_until(sem.holders, message="the slot taken again")
        assert [h.meta["w"] for h in holders] == ["first"]  # before the fix: "second"
        assert json.loads(first.stdout.readline()) == {"granted": True}
        first.stdin.write("release\n")
        first.stdin.flush()
        assert first.wait(10) == 0
        assert json.loads(second.stdout.readline()) == {"granted": True}
        second.stdin.write("release\n")
        second.stdin.flush()
        assert second.wait(10) == 0
    finally:
        _stop(first)
        _stop(second)


def test_a_waiter_on_one_server_fails_at_once_when_the_server_goes(own_redis):
    # Only a waiter on a Sentinel primary rides out a failed request (system/test_sentinel.py:
    # test_a_waiter_keeps_its_place_through_a_failover): on one server, no other primary
    # can take over, and the caller hears of the failure at once, not when its WAIT ends.
    from django_semaphore import SemaphoreBackendError

    sem = Semaphore("server-goes", limit=1, timeout=30)
    holder = sem.acquire()
    outcome = {}

    def wait():
        try:
            outcome["lease"] = sem.acquire(wait=60)
        except SemaphoreBackendError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    wait_until(lambda: sem.status().waiting == 1, message="the waiter queued")
    own_redis.stop()
    thread.join(20)  # far less than its WAIT
    assert not thread.is_alive(), "still waiting"
    assert "error" in outcome, outcome
    assert holder is not None


# -- the queue, on a single server and on a Redis Cluster -----------------------------
# (tests/support/fixtures_redis.py); the tests above talk to the single server directly.


def _call_in_thread(func, *args, **kwargs):
    """``func(*args, **kwargs)`` in a thread; the result dict gets what it returned."""
    result = {}

    def target():
        result["value"] = func(*args, **kwargs)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


@pytest.mark.usefixtures("backend")
def test_waiting_gives_up_after_wait_seconds():
    sem = Semaphore("queue", limit=1, timeout=30)
    holder = sem.acquire()
    started = time.monotonic()
    assert sem.acquire(wait=0.3) is None
    assert 0.3 <= time.monotonic() - started < 5
    assert sem.status().waiting == 0  # the ticket was given back
    holder.release()
    assert sem.acquire(wait=0.3) is not None


@pytest.mark.usefixtures("backend")
def test_waiters_are_served_first_come_first_served():
    sem = Semaphore("queue", limit=1, timeout=30)
    holder = sem.acquire()
    first, first_result = _call_in_thread(sem.acquire, wait=20, meta={"w": 1})
    wait_until(lambda: sem.status().waiting == 1, message="first waiter queued")
    second, second_result = _call_in_thread(sem.acquire, wait=20, meta={"w": 2})
    wait_until(lambda: sem.status().waiting == 2, message="second waiter queued")
    assert holder.release() is True
    first.join(10)
    assert first_result["value"] is not None
    assert second.is_alive() and sem.holders()[0].meta["w"] == 1
    assert first_result["value"].release() is True
    second.join(10)
    assert second_result["value"] is not None
    assert second_result["value"].token > first_result["value"].token
    second_result["value"].release()


@pytest.mark.usefixtures("backend")
def test_a_newcomer_cannot_overtake_a_queued_waiter():
    sem = Semaphore("queue", limit=1, timeout=30)
    holder = sem.acquire()
    waiter, result = _call_in_thread(sem.acquire, wait=20)
    wait_until(lambda: sem.status().waiting == 1, message="waiter queued")
    assert holder.release() is True
    # The slot is free (or already taken by the waiter): either way not ours.
    assert sem.acquire() is None
    waiter.join(10)
    assert result["value"] is not None
    assert [h.identifier for h in sem.holders()] == [result["value"].identifier]


def test_a_newcomer_let_in_beside_a_waiter_is_granted_after_it(raw_redis):
    # Permits came free with nobody serving the waiter: two leases expired (which
    # wakes nobody; so does a quiet release until its serve.lua, one round trip
    # later). A newcomer for whom there is room too is let in, but the waiter ahead
    # of it is granted first, so that the fencing tokens follow the queue. Before:
    # the newcomer's token came first, and the waiter got its permit when it next
    # looked (make bench's server-clock FIFO figure counted it out of order).
    sem = Semaphore("beside", limit=2, timeout=30)
    holders = [sem.acquire(), sem.acquire()]
    waiter, result = _in_thread(sem, wait=20)
    wait_until(lambda: sem.status().waiting == 1, message="waiter queued")
    for lease in holders:
        expire_now(raw_redis, lease.keys.timeouts, lease.identifier)
    newcomer = sem.acquire()
    assert newcomer is not None
    waiter.join(10)
    assert result["lease"] is not None
    assert result["lease"].token < newcomer.token
    assert sorted(h.identifier for h in sem.holders()) == sorted(
        [newcomer.identifier, result["lease"].identifier]
    )


@pytest.mark.usefixtures("backend")
def test_a_waiter_gets_a_slot_whose_lease_expired():
    sem = Semaphore("queue", limit=1, timeout=0.5)
    sem.acquire()  # never released
    lease = sem.acquire(wait=10)
    assert lease is not None
    assert lease.waited < 10


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("algorithm", ["fair_locked", "fair", "basic"])
def test_polling_variants_wait_too(algorithm):
    sem = Semaphore("poll", limit=1, timeout=30, algorithm=algorithm)
    holder = sem.acquire()
    thread, result = _call_in_thread(sem.acquire, wait=20)
    time.sleep(0.1)  # most likely the waiter polls while full; either way it must get the slot
    holder.release()
    thread.join(10)
    assert result["value"] is not None


@pytest.mark.usefixtures("backend")
@pytest.mark.asyncio
async def test_async_waiter_is_woken_by_a_release():
    sem = Semaphore("await", limit=1, timeout=30)
    holder = await sem.aacquire()
    waiter = asyncio.create_task(sem.aacquire(wait=20))

    async def queued():
        return await asyncio.to_thread(lambda: sem.status().waiting) == 1

    await until(queued, message="waiter queued")
    assert not waiter.done()
    assert await holder.arelease() is True
    lease = await asyncio.wait_for(waiter, 10)
    assert lease is not None and lease.token > holder.token
    assert await lease.arelease() is True


@pytest.mark.usefixtures("backend")
@pytest.mark.asyncio
async def test_async_wait_times_out_without_blocking_the_loop():
    sem = Semaphore("await", limit=1, timeout=30)
    await sem.aacquire()
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        assert await sem.aacquire(wait=0.5) is None
    finally:
        task.cancel()
    assert ticks >= 3  # the loop kept running while we waited


@pytest.mark.usefixtures("backend")
@pytest.mark.asyncio
async def test_a_cancelled_waiter_does_not_hold_up_the_queue():
    sem = Semaphore("acancel", limit=1, timeout=30)
    holder = await sem.aacquire()
    waiter = asyncio.create_task(sem.aacquire(wait=20))

    async def queued():
        return await asyncio.to_thread(lambda: sem.status().waiting) == 1

    await until(queued, message="waiter queued")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # The cancelled waiter took its ticket back on the way out: the queue is
    # empty at once, not when the abandoned ticket would have expired.
    assert await asyncio.to_thread(lambda: sem.status().waiting) == 0
    assert await holder.arelease() is True
    assert await sem.aacquire() is not None
