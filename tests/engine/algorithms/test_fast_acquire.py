"""The common case's own script: a partition whose last acquire was granted by
the common case (room, nobody waiting) acquires next with acquire_fast.lua, two
keys and four arguments, and it keeps every promise of acquire.lua's common case.

* It writes what acquire.lua writes: the entry and its expiry, the record
  (token, grant time, meta), the fair counter, a weighted holder's members.
* Whenever anything is unusual it says so before writing anything
  (callers wait, no room, the TTL watermark must move, the HASH is gone, the
  clock is behind the counter, the identifier is there already), and
  acquire.lua decides: the caller gets the same outcome as without it.
* A partition seen for the first time, or whose last acquire was not the
  common case's, goes straight to acquire.lua: a refusal costs one round trip.
"""

import asyncio
import os

import pytest

from django_semaphore import Semaphore
from django_semaphore.backend import connection, scripting
from django_semaphore.backend.scripting import Script
from django_semaphore.engine.algorithms import ALGORITHMS, AcquireRequest
from django_semaphore.engine.algorithms.lua import FAST_ACQUIRE, MEMBERS_MAX, fast_acquire
from tests.support.helpers import lease_keys_state, scripts_run

LUA = ALGORITHMS["lua"]


def _fast(sem, identifier, permits=1):
    """Run acquire_fast.lua alone for ``sem``'s partition: the grant, or None."""
    config = sem.config
    request = AcquireRequest(identifier, '{"who":"test"}', config.timeout_ms, permits=permits)
    operation = fast_acquire(sem.partition(), config.limit, request)
    request_sent = next(operation)
    assert request_sent.script is FAST_ACQUIRE
    reply = scripting.execute(connection.get_client(), request_sent)
    try:
        operation.send(reply)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("fast_acquire asked for a second request")


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_partition_granted_by_the_common_case_acquires_next_with_the_fast_script(
    backend, monkeypatch, twin
):
    sem = Semaphore(f"fast-next-{twin}-{backend}", limit=3, timeout=30)
    ran = scripts_run(monkeypatch)

    async def both():
        if twin == "sync":
            return [sem.acquire() for _ in range(3)]
        return [await sem.aacquire() for _ in range(3)]

    leases = asyncio.run(both())
    assert all(lease is not None for lease in leases)
    # New (its HASH did not exist: acquire.lua's full path), then the common
    # case (acquire.lua), then the fast script.
    assert ran == ["acquire", "acquire", "acquire_fast"]
    tokens = [lease.token for lease in leases]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    for lease in leases:
        lease.release()


def test_the_fast_script_writes_what_acquire_lua_writes(raw_redis, monkeypatch):
    sem = Semaphore("fast-writes", limit=5, timeout=30)
    keys = sem.partition()
    first, second = sem.acquire(), sem.acquire()  # acquire.lua: full path, then its common case
    ran = scripts_run(monkeypatch)
    third = sem.acquire(meta={"job": 7})
    assert ran == ["acquire_fast"]
    for lease in (second, third):
        record = raw_redis.hget(keys.holds, lease.identifier).decode()
        token, acquired, meta = record.split(":", 2)
        assert int(token) == lease.token
        assert raw_redis.zscore(keys.timeouts, lease.identifier) == int(acquired) + 30_000
        assert lease.expires_ms == int(acquired) + 30_000  # the same expiry the lease keeps
    assert '"job":7' in raw_redis.hget(keys.holds, third.identifier).decode().split(":", 2)[2]
    assert int(raw_redis.hget(keys.holds, "#")) == third.token  # the fair counter
    assert third.token > second.token > first.token
    assert [h.identifier for h in sem.holders()] == [first.identifier, second.identifier, third.identifier]
    for lease in (first, second, third):
        assert lease.release() is True
    assert raw_redis.zcard(keys.timeouts) == 0


def test_a_weighted_grant_of_up_to_8_permits_is_members_and_given_back_whole(raw_redis, monkeypatch):
    sem = Semaphore("fast-weighted", limit=10, timeout=30)
    keys = sem.partition()
    sem.acquire().release()
    sem.acquire().release()
    ran = scripts_run(monkeypatch)
    lease = sem.acquire(permits=3)
    assert ran == ["acquire_fast"] and lease.permits == 3
    members = raw_redis.zrange(keys.timeouts, 0, -1, withscores=True)
    assert sorted(members) == sorted(
        [
            (lease.identifier.encode(), raw_redis.zscore(keys.timeouts, lease.identifier)),
            (f"{lease.identifier}#2".encode(), float("inf")),
            (f"{lease.identifier}#3".encode(), float("inf")),
        ]
    )
    # Its weight is tagged in its record, before the meta JSON: one field per
    # holder to write and to delete, whatever its weight.
    record = raw_redis.hget(keys.holds, lease.identifier).decode()
    assert record.startswith(f"{lease.token}:") and ":m3{" in record
    assert not raw_redis.hexists(keys.holds, "*" + lease.identifier)
    [holder] = sem.holders()
    assert holder.permits == 3 and holder.meta["pid"] == os.getpid()
    assert sem.available() == 7
    assert lease.release() is True
    assert raw_redis.zcard(keys.timeouts) == 0 and sem.available() == 10


def _prepared(name, **kwargs):
    """A semaphore whose partition the common case granted (its HASH whole), with one holder."""
    sem = Semaphore(name, timeout=30, **kwargs)
    sem.acquire().release()
    holder = sem.acquire()
    assert holder is not None
    return sem, holder


@pytest.mark.parametrize(
    "case",
    [
        "callers wait",
        "no room",
        "watermark short",
        "hash gone",
        "clock behind the counter",
        "identifier there",
    ],
)
def test_anything_unusual_falls_through_before_writing_and_acquire_lua_decides(raw_redis, case):
    sem, holder = _prepared(f"fast-unusual-{case.replace(' ', '-')}", limit=2)
    keys = sem.partition()
    identifier = "newcomer"
    if case == "callers wait":
        raw_redis.hset(keys.holds, "w", "1")
    elif case == "no room":
        other = sem.acquire()
        assert other is not None
    elif case == "watermark short":
        raw_redis.hset(keys.holds, "e", 1)
    elif case == "hash gone":
        raw_redis.delete(keys.holds)
    elif case == "clock behind the counter":
        raw_redis.hset(keys.holds, "#", "9999999999999998")
    elif case == "identifier there":
        identifier = holder.identifier
    before = lease_keys_state(raw_redis, keys)
    assert _fast(sem, identifier) is None
    assert lease_keys_state(raw_redis, keys) == before  # nothing written
    # The engine's acquire gets acquire.lua's outcome.
    if case == "no room":
        assert sem.acquire() is None
    elif case == "identifier there":
        # A retried acquire gets the same lease back (acquire.lua's held_again).
        request = AcquireRequest(identifier, "{}", sem.config.timeout_ms)
        outcome = scripting.run(connection.get_client(), LUA.acquire(keys, sem.config.limit, request))
        assert outcome.token == holder.token
    else:
        lease = sem.acquire()
        assert lease is not None
        if case == "clock behind the counter":
            assert lease.token == 9999999999999999  # the counter plus one: tokens only increase
        if case == "watermark short":
            assert int(raw_redis.hget(keys.holds, "e")) > lease.expires_ms  # moved
        lease.release()


def test_a_grant_of_the_last_permit_or_a_refusal_takes_the_partition_off(backend, monkeypatch):
    sem = Semaphore(f"fast-refusal-{backend}", limit=2, timeout=30)
    timeouts = sem.partition().timeouts
    sem.acquire().release()
    sem.acquire().release()  # the common case, a permit left: the next acquire tries the fast script
    ran = scripts_run(monkeypatch)
    first = sem.acquire()  # a permit left
    second = sem.acquire()  # the last one: the partition goes off
    assert sem.acquire() is None  # straight to acquire.lua: one round trip
    assert ran == ["acquire_fast", "acquire_fast", "acquire"]
    # As if another process had taken the last permit after this one's grant
    # left it free: the fast script says no room, acquire.lua refuses, and
    # the next acquire goes straight to acquire.lua.
    LUA._fast[timeouts] = None
    ran.clear()
    assert sem.acquire() is None
    assert sem.acquire() is None
    assert ran == ["acquire_fast", "acquire", "acquire"]
    second.release()
    first.release()
    ran.clear()
    leases = [sem.acquire(), sem.acquire()]  # acquire.lua's common case puts it back on
    assert ran == ["acquire", "acquire_fast"]
    for lease in leases:
        lease.release()


def test_requests_the_common_case_cannot_serve_go_to_acquire_lua(backend, monkeypatch):
    sem = Semaphore(f"fast-not-for-these-{backend}", limit=20, timeout=30, slots=True)
    sem.acquire().release()
    sem.acquire().release()
    ran = scripts_run(monkeypatch)
    numbered = sem.acquire()
    assert numbered.slots == (0,)
    heavy = sem.acquire(permits=9)  # more than 8: counted in the HASH
    assert heavy is not None
    assert ran == ["acquire", "acquire"]
    numbered.release()
    heavy.release()


def test_the_client_and_the_scripts_agree_on_the_most_permits_kept_as_members():
    assert f"local MEMBERS_MAX = {MEMBERS_MAX}\n" in FAST_ACQUIRE.source


@pytest.mark.parametrize(
    "tail",
    [f"m{MEMBERS_MAX + 1}{{}}", "m1{}", "m10{}", "mx{}", "m2", "m", "x{}", ""],
    ids=["above-members-max", "one", "two-digits", "not-a-digit", "no-meta", "bare", "other", "empty"],
)
def test_the_fast_script_leaves_any_other_permits_tag_to_acquire_lua(raw_redis, tail):
    # A weighted request's permits travel as its record's tag before the meta
    # ("m3{...}", one digit, at most MEMBERS_MAX). Anything else (which this
    # client never sends) is not the common case's: nothing is written.
    sem = Semaphore(f"fast-tags-{len(tail)}-{tail[:2]}", limit=20, timeout=30)
    keys = sem.partition()
    sem.acquire().release()
    sem.acquire().release()  # the partition is the common case's
    before = lease_keys_state(raw_redis, keys)
    args = (sem.config.limit, sem.config.timeout_ms, "someone", tail)
    sent = Script(FAST_ACQUIRE, (keys.main[0], keys.main[2]), args)
    reply = scripting.execute(connection.get_client(), sent)
    assert not reply
    assert lease_keys_state(raw_redis, keys) == before  # nothing written
