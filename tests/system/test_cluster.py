"""The engine on Redis Cluster (and, for comparison, on one server).

Every test taking ``backend`` runs twice: on the session's single server and
on a three-primary cluster (tests/support/fixtures_redis.py).
"""

import asyncio
import threading
import time

import pytest
from redis.cluster import key_slot

from django_semaphore import Semaphore
from django_semaphore.backend import connection
from django_semaphore.backend.scripting import Command, Pipe, Script, execute
from django_semaphore.engine.algorithms import ALGORITHMS, AcquireRequest
from django_semaphore.engine.inspection import holders, purge, status
from tests.support.helpers import wait_until

ALL = list(ALGORITHMS)


def test_cluster_is_up(redis_cluster, cluster_client):
    assert redis_cluster.is_ok()
    assert len(cluster_client.get_primaries()) == 3


def test_sync_operations(backend, backend_redis):
    sem = Semaphore("cl-sync", limit=2, timeout=5)
    a = sem.acquire(meta={"n": 1})
    b = sem.acquire(key=None)
    assert a and b and b.token > a.token
    assert sem.acquire() is None
    assert sem.available() == 0
    assert [h.identifier for h in sem.holders()] == [a.identifier, b.identifier]
    assert sem.holders()[0].meta["n"] == 1
    assert a.refresh() is True
    assert a.release() is True and a.release() is False
    c = sem.acquire()
    assert c.token > b.token
    # A waiter is woken by a release (BLPOP on its wake list, same slot).
    timer = threading.Timer(0.3, b.release)
    timer.start()
    started = time.monotonic()
    d = sem.acquire(wait=5)
    timer.join()
    assert d is not None and time.monotonic() - started < 4
    for lease in (c, d):
        assert lease.release()
    assert sem.available() == 2


def test_purge_and_partitions_across_nodes(backend, backend_redis):
    sem = Semaphore("cl-purge", limit=1, timeout=0.2)
    leases = [sem.acquire(key=f"user-{i}") for i in range(30)]
    assert all(leases)
    assert len(sem.partitions()) == 30
    deadline = time.monotonic() + 10
    while sem.status(key="user-29").in_use and time.monotonic() < deadline:  # the last one granted
        time.sleep(0.05)
    assert sem.purge_expired() == 30
    assert sem.purge_expired() == 0
    assert all(lease.refresh() is False for lease in leases[:3])


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_release_pushes_the_named_waiters_grant_in_the_partitions_slot(backend, twin):
    # A woken waiter's grant names the next waiter, whose wake-up list its release
    # passes (same hash slot as the partition): on the cluster a list in another
    # slot would be a CROSSSLOT error.
    sem = Semaphore("cl-chain", limit=1, timeout=5)
    first = sem.acquire(key="k")
    got = {}

    def wait(n):
        if twin == "sync":
            got[n] = sem.acquire(key="k", wait=5)
        else:
            got[n] = asyncio.run(sem.aacquire(key="k", wait=5))

    threads = [threading.Thread(target=wait, args=(n,)) for n in range(2)]
    for n, thread in enumerate(threads):
        thread.start()
        deadline = time.monotonic() + 5
        while sem.status(key="k").waiting < n + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert first.release() is True
    threads[0].join(5)
    assert got[0] is not None
    if twin == "sync":
        assert got[0].release() is True
    else:
        assert asyncio.run(got[0].arelease()) is True
    threads[1].join(5)
    assert got[1] is not None and got[1].token > got[0].token
    assert got[0]._granted.successors == (got[1].identifier,)  # the list its release pushed to
    assert got[1].release() is True and sem.status(key="k").waiting == 0


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_quiet_release_judges_liveness_on_the_partitions_own_node(backend, backend_redis, twin):
    # A quiet lease's release is plain commands, TIME among them: on the
    # cluster they run as one script on the node of the partition's slot (a
    # cluster pipeline would send TIME, which has no key, to any node).
    sem = Semaphore("cl-quiet", limit=2, timeout=5)
    for _ in range(8):  # HOLD_FIRST hold times recorded: the next grant is quiet
        lease = sem.acquire(key="k")
        assert lease is not None and lease.release() is True
    lease = sem.acquire(key="k")
    assert lease is not None and lease._granted.quiet
    if twin == "sync":
        assert lease.release() is True
    else:
        assert asyncio.run(lease.arelease()) is True
    assert sem.holders(key="k") == [] and sem.available(key="k") == 2
    # Liveness: an expired quiet lease says False, judged by that node's clock.
    short = Semaphore("cl-quiet", limit=2, timeout=1)
    expired = short.acquire(key="k")
    assert expired is not None and expired._granted.quiet
    # (One machine: the nodes' clocks are this one's.)
    wait_until(lambda: time.time() * 1000 > expired.expires_ms + 5, 5, message="expired")
    assert (expired.release() if twin == "sync" else asyncio.run(expired.arelease())) is False


@pytest.mark.asyncio
async def test_async_operations(backend, backend_redis):
    sem = Semaphore("cl-async", limit=2, timeout=5)
    a = await sem.aacquire()
    b = await sem.aacquire(key="k")
    c = await sem.aacquire(key="k")
    assert a and b and c and await sem.aacquire(key="k") is None
    assert await a.arefresh() is True
    assert [h.identifier for h in await sem.aholders(key="k")] == [b.identifier, c.identifier]
    assert await sem.aavailable(key="k") == 0

    async def release_later():
        await asyncio.sleep(0.3)
        await b.arelease()

    task = asyncio.create_task(release_later())
    d = await sem.aacquire(key="k", wait=5)
    await task
    assert d is not None
    assert await c.arelease()
    async with sem.ahold(key="k") as e:
        assert e.token > d.token
    assert await a.arelease() and await d.arelease()
    assert await sem.apurge_expired() == 0


@pytest.mark.parametrize("algorithm", ALL)
def test_algorithms(backend, algorithm):
    sem = Semaphore("cl-" + algorithm, limit=2, timeout=5, algorithm=algorithm)
    a, b = sem.acquire(key="x"), sem.acquire(key="x")
    assert a and b and sem.acquire(key="x") is None
    assert len(sem.holders(key="x")) == 2
    assert a.refresh() is True
    assert b.release() is True
    assert sem.acquire(key="x", wait=0.2) is not None
    assert sem.purge_expired() == 0


@pytest.mark.parametrize("algorithm", ALL)
@pytest.mark.asyncio
async def test_algorithms_async(backend, algorithm):
    sem = Semaphore("cla-" + algorithm, limit=1, timeout=5, algorithm=algorithm)
    a = await sem.aacquire()
    assert a and await sem.aacquire() is None
    assert await a.arefresh() is True
    assert await a.arelease() is True
    assert await sem.aacquire(wait=0.2) is not None


@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_semaphores_spread_across_primaries(cluster_client, backend):
    leases = [Semaphore(f"spread-{i}", limit=1, timeout=5).acquire() for i in range(60)]
    assert all(leases)
    for lease in leases:
        node = cluster_client.get_node_from_key(lease.keys.timeouts)
        assert node.redis_connection.exists(lease.keys.timeouts, lease.keys.holds) == 2
    used = {cluster_client.get_node_from_key(lease.keys.timeouts).port for lease in leases}
    assert used == {node.port for node in cluster_client.get_primaries()}


def _keys_of(request):
    if type(request) is Script:
        return list(request.keys)
    if type(request) is Pipe:
        # EVAL (scripting.lengthen()) names its keys after the source and their number.
        return [k for c in request.commands for k in (c[3 : 3 + c[2]] if c[0] == "EVAL" else c[1:2])]
    if type(request) is Command and request.args[0] in ("BLPOP",):
        return [request.args[1]]
    return []


def _drive(client, operation, seen):
    """Run an operation generator, recording the slot of every key it names."""
    try:
        request = next(operation)
        while True:
            keys = _keys_of(request)
            if type(request) is Pipe:
                for command in request.commands:
                    if command[0] == "ZINTERSTORE":
                        keys.extend(command[3 : 3 + int(command[2])])
            seen.append({key_slot(k.encode()) for k in keys})
            request = operation.send(execute(client, request))
    except StopIteration as done:
        return done.value


@pytest.mark.parametrize("algorithm", ALL)
def test_every_request_stays_in_one_slot(backend, algorithm):
    sem = Semaphore("slots-\n{x}" + algorithm, limit=1, timeout=5, algorithm=algorithm)
    keys = sem.partition("{evil}\x00key")
    alg = ALGORITHMS[algorithm]
    client = connection.get_client()
    seen = []
    first = _drive(client, alg.acquire(keys, 1, AcquireRequest("id-1", "{}", 5000)), seen)
    _drive(client, alg.acquire(keys, 1, AcquireRequest("id-2", "{}", 5000)), seen)
    _drive(client, alg.refresh(keys, 5000, "id-1"), seen)
    _drive(client, holders(keys, alg), seen)
    _drive(client, status(keys, alg, 1, 5), seen)
    _drive(client, purge(keys, alg), seen)
    _drive(client, alg.release(keys, 1, "id-1"), seen)
    assert first.token > 0
    slots = set().union(*seen)
    assert len(slots) == 1, slots
    wake_slot = key_slot(keys.wake("abc").encode())
    lock_slot = key_slot(keys.lock.encode())
    assert {wake_slot, lock_slot} == slots


def test_script_flush_on_every_node(backend, backend_redis):
    sem = Semaphore("cl-flush", limit=1, timeout=5)
    lease = sem.acquire()
    if backend == "cluster":
        for node in backend_redis.get_primaries():
            node.redis_connection.script_flush()
    else:
        backend_redis.script_flush()
    assert lease.refresh() is True
    assert sem.acquire() is None
    assert lease.release() is True


def test_total_shares_one_slot_and_serves_waiters_across_partitions(backend):
    """TOTAL: every partition of the name in one slot, whatever the key values, and
    a release in one partition grants a waiter of another (direct grant)."""
    sem = Semaphore("cl-total-{x}", limit=2, timeout=5, total=2, wait=10)
    keys = {sem.partition(k).timeouts for k in ("a", "{b}", "\x00c", None)}
    assert len({key_slot(k.encode()) for k in keys}) == 1
    a, b = sem.acquire(key="a"), sem.acquire(key="{b}")
    assert a and b and sem.available() == 0
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(key="\x00c", wait=10)))
    waiter.start()
    deadline = time.monotonic() + 10
    while len(sem.waiters("\x00c")) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert a.release()
    waiter.join(10)
    assert got and got[0] is not None
    assert [h.identifier for h in sem.holders("\x00c")] == [got[0].identifier]
    assert {p.part for p in sem.partitions()} == {sem.partition(k).part for k in ("{b}", "\x00c")}
    assert got[0].release() and b.release()
    assert sem.available() == 2
    assert sem.purge_expired() == 0
