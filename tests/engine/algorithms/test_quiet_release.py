"""The quiet release: a lease granted while nobody waited gives its permit back
with plain commands (one round trip, no script), and still keeps every promise.

* Only a lease the common case granted with nobody waiting and no hold time
  wanted (the first HOLD_FIRST releases of a partition record theirs), without
  slot numbers and of at most 8 permits, is released so (a weighted one too:
  its other permits are members of the timeouts ZSET, removed by the same
  ZREM); the others run the script.
* Liveness is judged on the server's clock, as the script does: an expired
  lease's release says False.
* Waiters that queued while it was held are served at once (serve.lua, which
  also records the hold time their Retry-After comes from), in queue order.
* A process that dies between the plain commands and serving the queue
  leaves the permit free: the waiter takes it when it looks again (at the
  latest when the lease would have expired), not later.
"""

import asyncio
import threading
import time

import pytest
import redis

from django_semaphore import Semaphore
from django_semaphore.backend import connection, scripting
from django_semaphore.backend.keys import glob_escape
from django_semaphore.backend.scripting import Pipe, execute
from django_semaphore.engine.algorithms import ALGORITHMS
from django_semaphore.engine.algorithms.lua import quiet_release
from tests.support.helpers import (
    HOLD_FIRST,
    count_round_trips,
    queue_waiters,
    server_ms,
    wait_until,
    warm_hold_times,
)

LUA = ALGORITHMS["lua"]


def _recorded(raw_redis, keys):
    return int(raw_redis.hget(keys.holds, "%") or 0) % 1024  # the packed count (HOLD_SCALE)


def _count_both_drivers(monkeypatch):
    """count_round_trips, with the asyncio driver's requests too."""
    sent = count_round_trips(monkeypatch)
    original = scripting.aexecute

    async def counting(client, request):
        sent.append("PIPELINE" if type(request) is Pipe else "EVALSHA")
        return await original(client, request)

    monkeypatch.setattr(scripting, "aexecute", counting)
    return sent


def test_a_quiet_lease_is_given_back_with_plain_commands_in_one_round_trip(monkeypatch, raw_redis):
    sem = Semaphore("quiet-plain", limit=2, timeout=30)
    keys = sem.partition()
    first = sem.acquire()
    assert first is not None and not first._granted.quiet  # no hold time recorded yet: wanted
    sent = count_round_trips(monkeypatch)
    assert first.release() is True
    assert sent == ["EVALSHA"]
    monkeypatch.undo()
    warm_hold_times(sem)
    lease = sem.acquire()
    other = sem.acquire()
    assert lease is not None and other is not None and lease._granted.quiet
    sent = count_round_trips(monkeypatch)
    assert lease.release() is True
    assert sent == ["PIPELINE"]
    # Gone from the timeouts ZSET and the records; the other holder untouched.
    assert [h.identifier for h in sem.holders()] == [other.identifier]
    assert raw_redis.hexists(keys.holds, lease.identifier) == 0
    assert raw_redis.zscore(keys.timeouts, lease.identifier) is None
    assert lease.release() is False  # once only, as always
    assert other.release() is True
    assert sem.status().holders == 0
    assert _recorded(raw_redis, keys) == HOLD_FIRST  # a quiet release records no hold time


def test_a_numbered_lease_is_released_by_the_script(monkeypatch):
    # The slot bitmap is written with a condition (SETBIT must not create the
    # bitmap without its TTL): a script's job.
    sem = Semaphore("quiet-not-slots", limit=4, timeout=30, slots=True)
    warm_hold_times(sem)
    lease = sem.acquire()
    assert lease is not None and not lease._granted.quiet
    sent = count_round_trips(monkeypatch)
    assert lease.release() is True
    assert sent == ["EVALSHA"]
    monkeypatch.undo()
    assert sem.available() == 4


def test_a_holder_of_more_than_8_permits_is_counted_in_the_hash_and_released_by_the_script(
    monkeypatch, raw_redis
):
    # Nine members would cost more than the script: a large weight is one
    # entry and the "+" count (the same cost for any weight), which only a
    # script lowers (a HINCRBY could create an expired HASH without a TTL).
    sem = Semaphore("quiet-not-heavy", limit=20, timeout=30)
    keys = sem.partition()
    warm_hold_times(sem)
    heavy = sem.acquire(permits=9)
    light = sem.acquire(permits=8)
    assert heavy is not None and light is not None
    assert not heavy._granted.quiet and light._granted.quiet
    assert raw_redis.zcard(keys.timeouts) == 1 + 8  # heavy's entry, light's 8 members
    assert int(raw_redis.hget(keys.holds, "+")) == 8  # heavy's permits beyond its first
    assert sem.available() == 3 and sem.acquire(permits=4) is None
    assert [h.permits for h in sem.holders()] == [9, 8]
    sent = count_round_trips(monkeypatch)
    assert heavy.release() is True
    assert light.release() is True
    assert sent == ["EVALSHA", "PIPELINE"]
    monkeypatch.undo()
    assert int(raw_redis.hget(keys.holds, "+")) == 0 and raw_redis.zcard(keys.timeouts) == 0
    assert sem.available() == 20


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_weighted_quiet_lease_gives_every_permit_back_in_one_round_trip(monkeypatch, raw_redis, twin):
    # A holder of n permits is its entry and n - 1 members of score +inf in the
    # timeouts ZSET (ZCARD: the permits held): one ZREM takes them all, and no
    # command can create a key without its TTL.
    sem = Semaphore(f"quiet-weighted-{twin}", limit=5, timeout=30)
    keys = sem.partition()
    warm_hold_times(sem, permits=3)
    lease = sem.acquire(permits=3)
    other = sem.acquire(permits=2)
    assert lease is not None and other is not None and lease._granted.quiet
    assert sem.acquire() is None  # 3 + 2 = 5: full
    assert raw_redis.zcard(keys.timeouts) == 5
    sent = _count_both_drivers(monkeypatch)
    if twin == "sync":
        assert lease.release() is True
    else:
        assert asyncio.run(lease.arelease()) is True
    assert sent == ["PIPELINE"]
    monkeypatch.undo()
    assert sem.available() == 3
    assert raw_redis.zcard(keys.timeouts) == 2
    assert not raw_redis.hexists(keys.holds, lease.identifier)
    assert not raw_redis.hexists(keys.holds, "*" + lease.identifier)
    assert [(h.identifier, h.permits) for h in sem.holders()] == [(other.identifier, 2)]
    assert lease.release() is False  # once only
    assert other.release() is True
    assert raw_redis.zcard(keys.timeouts) == 0 and sem.available() == 5


def test_a_quiet_release_of_an_expired_lease_says_false(raw_redis):
    sem = Semaphore("quiet-expired", limit=2, timeout=1)
    warm_hold_times(sem)
    lease = sem.acquire()
    assert lease is not None and lease._granted.quiet

    wait_until(lambda: server_ms(raw_redis) > lease.expires_ms, 5, message="the lease expired")
    assert raw_redis.zscore(sem.partition().timeouts, lease.identifier) is not None  # not purged yet
    assert lease.release() is False
    assert lease.lost is True
    assert raw_redis.hexists(sem.partition().holds, lease.identifier) == 0


def test_a_refreshed_quiet_lease_is_live_until_its_new_expiry(raw_redis):
    """The quiet release judges liveness by the expiry the holder was told last:
    its refresh's, not its grant's."""
    sem = Semaphore("quiet-refreshed", limit=2, timeout=2)
    warm_hold_times(sem)
    lease = sem.acquire()
    assert lease is not None and lease._granted.quiet
    granted_until = lease.expires_ms

    wait_until(lambda: server_ms(raw_redis) > lease.acquired_ms + 1000, 5, message="half the lease gone")
    assert lease.refresh() is True and lease.expires_ms > granted_until
    wait_until(lambda: server_ms(raw_redis) > granted_until, 5, message="the grant's expiry passed")
    assert lease.release() is True
    assert lease.lost is False


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_quiet_release_serves_the_waiters_that_queued_meanwhile(monkeypatch, raw_redis, twin):
    sem = Semaphore(f"quiet-serves-{twin}", limit=1, timeout=30)
    keys = sem.partition()
    warm_hold_times(sem)
    holder = sem.acquire()
    assert holder is not None and holder._granted.quiet
    threads, got = queue_waiters(sem, 2)
    sent = _count_both_drivers(monkeypatch)
    started = time.monotonic()
    if twin == "sync":
        assert holder.release() is True
    else:
        assert asyncio.run(holder.arelease()) is True
    # The plain commands, then the release script's second half: the first
    # waiter's grant was made and pushed now, not when it looks again.
    assert sent[:2] == ["PIPELINE", "EVALSHA"]
    monkeypatch.undo()
    threads[0].join(5)
    assert got[0] is not None and got[0].ticket
    assert time.monotonic() - started < 5  # its recheck would have been the holder's 30 s expiry
    assert _recorded(raw_redis, keys) == HOLD_FIRST + 1  # callers wait: their estimate's hold time
    assert got[0].release() is True
    threads[1].join(5)
    assert got[1] is not None and got[1].token > got[0].token > holder.token
    assert got[1].release() is True
    assert sem.status().waiting == 0 and raw_redis.hget(keys.holds, "w") is None


def test_a_release_cut_off_before_serving_leaves_the_permit_to_the_waiter(raw_redis):
    # The process dies after the plain commands and before serve.lua: the
    # permit is free, and the waiter takes it when it looks again, at the
    # latest when the released lease would have expired (its recheck time).
    sem = Semaphore("quiet-cut", limit=1, timeout=2)
    keys = sem.partition()
    warm_hold_times(sem)
    holder = sem.acquire()
    assert holder is not None and holder._granted.quiet
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(wait=10)))
    waiter.start()
    wait_until(lambda: sem.status().waiting == 1, 5, message="queued")
    operation = quiet_release(keys, 1, holder.identifier, holder._granted)
    pipe = next(operation)
    assert type(pipe) is Pipe
    reply = execute(connection.get_client(), pipe)
    assert reply[4]  # it found the waiters flag: serving would come next
    operation.close()  # ... and the process dies
    assert sem.holders() == []
    waiter.join(8)
    (lease,) = got
    assert lease is not None and lease.release() is True


def test_the_plain_commands_touch_only_the_partitions_lease_keys(raw_redis, redis_url):
    # Each plain command names its key (one hash slot): as a Redis user allowed
    # only the timeouts ZSET and the holds HASH, the release goes through.
    sem = Semaphore("quiet-acl", limit=2, timeout=30)
    keys = sem.partition()
    warm_hold_times(sem)
    lease = sem.acquire()
    assert lease is not None and lease._granted.quiet
    user = "quiet-acl-user"
    patterns = [f"~{glob_escape(k)}" for k in (keys.timeouts, keys.holds)]
    raw_redis.execute_command("ACL", "SETUSER", user, "on", "nopass", "+@all", "resetkeys", *patterns)
    client = redis.Redis.from_url(redis_url, username=user, password="any")
    try:
        operation = quiet_release(keys, 2, lease.identifier, lease._granted)
        request = next(operation)
        with pytest.raises(StopIteration) as done:
            operation.send(execute(client, request))
        assert done.value.value is True
    finally:
        client.close()
        raw_redis.execute_command("ACL", "DELUSER", user)
    assert sem.holders() == []
