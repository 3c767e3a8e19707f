"""The "lua" algorithm's scripts: TTLs under mixed TIMEOUTs, declared keys, Retry-After.

* Processes that disagree on TIMEOUT (a rolling deploy that changes it) share
  one semaphore: no write may shorten a TTL, so a holder keeps its slot
  whatever TIMEOUT the others use.
* Every key a script touches is declared in KEYS (Redis Cluster needs it):
  each script runs here as a Redis ACL user allowed exactly the keys it
  declares, so an undeclared key is a NOPERM error, not a silent success.
* ``retry_after`` is an estimate from recent hold times and the queue ahead,
  never later than the earliest lease expiry.
"""

import asyncio
import dataclasses
import datetime
import json
import math
import os
import threading
import time
import uuid

import pytest
import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from django_semaphore import Semaphore, SemaphoreFull, semaphores
from django_semaphore.backend import connection
from django_semaphore.backend.keys import glob_escape
from django_semaphore.backend.scripting import Script, execute, run
from django_semaphore.engine import waiting
from django_semaphore.engine.algorithms import ALGORITHMS, AcquireRequest, Granted, Refused
from django_semaphore.engine.inspection import holders, purge, status
from django_semaphore.engine.waiting import TICKET_MS
from tests.support.helpers import (
    count_round_trips,
    expire_now,
    queue_waiters,
    run_model,
    server_ms,
    wait_until,
)
from tests.support.settings_web import WEB_SEMAPHORES

LUA = ALGORITHMS["lua"]

LONG = 30  # seconds: the long-TIMEOUT process
SHORT = 0.5  # seconds: the short-TIMEOUT process


def _pttls(raw_redis, names):
    return {name: raw_redis.pttl(name) for name in names}


def _assert_not_shortened(before, after, elapsed_ms):
    """Every TTL in ``after`` is what it was in ``before``, less the time elapsed, or longer."""
    for name, ttl in before.items():
        assert after[name] >= ttl - elapsed_ms - 5, (name, ttl, after[name])


# -- item 4: processes that disagree on TIMEOUT ------------------------------------------


@pytest.mark.parametrize("slots", [False, True], ids=["plain", "SLOTS"])
def test_a_long_timeout_holder_keeps_its_slot_while_short_timeout_callers_churn(raw_redis, slots):
    # The long holder neither releases nor refreshes while callers with a
    # TIMEOUT 60 x shorter acquire, queue, give up and release on the same
    # semaphore for several of their TTLs; the keys must keep it, and the
    # limit must hold throughout.
    long_sem = Semaphore("mixed", limit=2, timeout=LONG, slots=slots)
    short_sem = Semaphore("mixed", limit=2, timeout=SHORT, slots=slots)
    keys = long_sem.partition()
    long_lease = long_sem.acquire()
    churn_until = time.monotonic() + 4 * (SHORT + 1)  # well past the short keys' TTL (SHORT + 1 s + SHORT)
    grants = 0
    while time.monotonic() < churn_until:
        lease = short_sem.acquire()
        assert lease is not None
        grants += 1
        assert short_sem.acquire() is None  # long + one short: full, no over-admission
        assert short_sem.acquire(wait=0.01) is None  # queued, then gave up
        assert lease.release() is True
    holders = long_sem.holders()
    assert [h.identifier for h in holders] == [long_lease.identifier]
    held = (keys.timeouts, keys.holds)  # (no owners ZSET: the token lives in the record)
    for name in (*held, keys.slots) if slots else held:  # (the bitmap: SLOTS only)
        assert raw_redis.pttl(name) >= long_lease.expires_ms - int(server_ms(raw_redis)) + 1000 - 5, name
    assert long_sem.acquire() is not None
    assert short_sem.acquire() is None
    assert long_lease.refresh() is True and long_lease.release() is True
    print(f"MIXED TIMEOUT: {grants} short-TIMEOUT cycles, the {LONG}s holder kept its slot")


def test_a_short_timeout_waiter_never_shortens_the_queue_ttl(raw_redis):
    long_sem = Semaphore("mixed-queue", limit=1, timeout=LONG)
    keys = long_sem.partition()
    client = connection.get_client()
    assert long_sem.acquire() is not None
    # A long-TIMEOUT waiter takes a ticket (one acquire, not a waiting loop),
    # then a short-TIMEOUT one.
    run(client, LUA.acquire(keys, 1, AcquireRequest("long-waiter", "{}", LONG * 1000, ticket_ms=TICKET_MS)))
    before = _pttls(raw_redis, [keys.queue, keys.queue_deadlines])
    started = time.monotonic()
    run(
        client,
        LUA.acquire(keys, 1, AcquireRequest("short-waiter", "{}", int(SHORT * 1000), ticket_ms=TICKET_MS)),
    )
    after = _pttls(raw_redis, [keys.queue, keys.queue_deadlines])
    print(f"QUEUE TTL before/after a short-TIMEOUT waiter: {before} -> {after}")
    _assert_not_shortened(before, after, (time.monotonic() - started) * 1000)


def test_a_re_created_key_never_shortens_the_others_ttl(raw_redis):
    # maxmemory's volatile-* policies evict one key at a time: the holds HASH
    # can vanish while the ZSETs stay. A short-TIMEOUT acquire then rewrites
    # the TTLs; it must not cut the ones the long holder's keys have.
    long_sem = Semaphore("mixed-evicted", limit=3, timeout=LONG)
    keys = long_sem.partition()
    long_lease = long_sem.acquire()
    raw_redis.delete(keys.holds)
    names = [keys.timeouts]
    before = _pttls(raw_redis, names)
    started = time.monotonic()
    assert Semaphore("mixed-evicted", limit=3, timeout=SHORT).acquire() is not None
    after = _pttls(raw_redis, names)
    print(f"TTL before/after a short-TIMEOUT acquire re-created the HASH: {before} -> {after}")
    _assert_not_shortened(before, after, (time.monotonic() - started) * 1000)
    assert raw_redis.pttl(keys.holds) > (long_lease.expires_ms - int(server_ms(raw_redis))) + 1000 - 5


@pytest.mark.parametrize("total", [None, 4], ids=["plain", "total"])
def test_the_holds_hash_is_a_hash_table_from_its_first_grant(raw_redis, total):
    # Redis packs a HASH of up to 128 short fields as a listpack (Redis 7) or
    # a ziplist (6.2), where every HMGET, HSET and HDEL scans the fields one
    # by one: the common cycle's reads of usually missing fields scanned them
    # all. The first grant writes a value longer than Redis packs, so the
    # HASH is a hash table from then on, re-created or not.
    sem = Semaphore(f"table-{total}", limit=5, timeout=30, total=total)
    keys = sem.partition("tenant") if total else sem.partition()

    def acquire():
        return sem.acquire(key="tenant") if total else sem.acquire()

    first = acquire()
    assert first is not None
    assert raw_redis.object("encoding", keys.holds) == b"hashtable"
    for _ in range(3):  # the common case's own script, and releases
        lease = acquire()
        assert lease is not None and lease.release() is True
    assert raw_redis.object("encoding", keys.holds) == b"hashtable"
    # The field is no holder: none is listed, counted or purged for it.
    assert [h.identifier for h in sem.holders("tenant" if total else None)] == [first.identifier]
    assert sem.available("tenant" if total else None) == (total or 5) - 1
    assert sem.purge_expired() == 0
    assert first.release() is True
    # Evicted (one key at a time, by a volatile-* policy) and re-created.
    raw_redis.delete(keys.holds)
    again = acquire()
    assert again is not None
    assert raw_redis.object("encoding", keys.holds) == b"hashtable"
    assert again.release() is True


def test_queue_keys_a_refused_caller_re_creates_keep_a_ttl(raw_redis):
    # A holder's lease ran out (which wakes nobody) while W waited. The next
    # caller's acquire grants W the free permit (a direct grant), which empties
    # the queue (Redis deletes its ZSETs), and then queues that caller: the
    # ZSETs it creates again must get a TTL, or they live for ever once it dies.
    sem = Semaphore("queue-recreated", limit=1, timeout=LONG)
    keys = sem.partition()
    client = connection.get_client()

    def take_ticket(identifier):
        request = AcquireRequest(identifier, "{}", LONG * 1000, ticket_ms=TICKET_MS)
        return run(client, LUA.acquire(keys, 1, request))

    holder = sem.acquire()
    assert isinstance(take_ticket("first-waiter"), Refused)
    expire_now(raw_redis, keys.timeouts, holder.identifier)
    assert isinstance(take_ticket("newcomer"), Refused)  # the first waiter is served before it
    assert raw_redis.hexists(keys.holds, "first-waiter")  # granted its claim
    assert raw_redis.zcard(keys.queue) == 1  # the newcomer alone
    for name in (keys.queue, keys.queue_deadlines, keys.waiters):
        assert raw_redis.pttl(name) > 0, name


def test_a_refused_callers_place_leaves_out_the_waiters_its_own_acquire_served(raw_redis):
    # As above: the newcomer's acquire grants the first waiter the permit whose
    # lease ran out, then queues. Nobody is ahead of it any more: its place (and
    # Retry-After, which counts the holds ahead) must not count that waiter.
    sem = Semaphore("queue-place", limit=1, timeout=LONG)
    keys = sem.partition()
    client = connection.get_client()
    holder = sem.acquire()
    request = AcquireRequest("first-waiter", "{}", LONG * 1000, ticket_ms=TICKET_MS)
    assert run(client, LUA.acquire(keys, 1, request)).ahead == 0
    expire_now(raw_redis, keys.timeouts, holder.identifier)
    refused = run(client, LUA.acquire(keys, 1, dataclasses.replace(request, identifier="newcomer")))
    assert raw_redis.hexists(keys.holds, "first-waiter")  # served by the newcomer's acquire
    assert isinstance(refused, Refused) and refused.ahead == 0


def test_a_wake_up_list_lives_as_long_as_the_waiters_lease(raw_redis):
    # API: every key has a TTL of at least TIMEOUT + 1 s (the wake-up lists
    # had a flat 10 s). A waiter that does not read its wake-up at once (a
    # ticket taken by one acquire here) still finds it.
    sem = Semaphore("wake-ttl", limit=1, timeout=LONG)
    keys = sem.partition()
    client = connection.get_client()
    holder = sem.acquire()
    run(client, LUA.acquire(keys, 1, AcquireRequest("waiter", "{}", LONG * 1000, ticket_ms=TICKET_MS)))
    started = time.monotonic()
    assert holder.release() is True
    pttl = raw_redis.pttl(keys.wake("waiter"))
    print(f"WAKE-UP LIST TTL under TIMEOUT {LONG}s: {pttl} ms")
    assert pttl >= LONG * 1000 + 1000 - (time.monotonic() - started) * 1000 - 5


# -- item 9: every key a script touches is declared -------------------------------------


class _DeclaredKeysOnly:
    """Runs every script as a Redis user that may touch only the keys the script declares."""

    def __init__(self, raw_redis, redis_url):
        self.admin = raw_redis
        self.user = f"declared-{uuid.uuid4().hex[:8]}"
        self._set_keys(())
        self.client = redis.Redis.from_url(redis_url, username=self.user, password="any")
        self.normal = connection.get_client()
        self.scripts = []

    def _set_keys(self, keys):
        patterns = [f"~{glob_escape(k)}" for k in keys]
        self.admin.execute_command(
            "ACL", "SETUSER", self.user, "on", "nopass", "+@all", "resetkeys", *patterns
        )

    def run(self, operation):
        try:
            request = next(operation)
            while True:
                if type(request) is Script:
                    self._set_keys(request.keys)
                    self.scripts.append(request.script.name)
                    reply = execute(self.client, request)
                else:
                    reply = execute(self.normal, request)
                request = operation.send(reply)
        except StopIteration as done:
            return done.value

    def close(self):
        self.client.close()
        self.admin.execute_command("ACL", "DELUSER", self.user)


@pytest.fixture
def declared(raw_redis, redis_url):
    checker = _DeclaredKeysOnly(raw_redis, redis_url)
    yield checker
    checker.close()


def test_every_key_a_script_touches_is_declared(declared, raw_redis):
    keys = Semaphore("declared", limit=2).partition()
    check = declared.run
    # Grants, a refusal, two waiters, an acquire-side grant to a waiter (a
    # lease that expired), a release that grants a waiter its slot, a waiter
    # finding its grant, a refresh, an abandon that gives a grant back, a lost
    # refresh, a dropped waiter coming back to its place, and the readers.
    h1 = check(LUA.acquire(keys, 2, AcquireRequest("h1", "{}", 30000)))
    assert isinstance(h1, Granted)
    short = check(LUA.acquire(keys, 2, AcquireRequest("h2", "{}", 200)))
    assert isinstance(short, Granted)
    assert isinstance(
        check(LUA.acquire(keys, 2, AcquireRequest("w1", "{}", 30000, ticket_ms=TICKET_MS))), Refused
    )
    assert isinstance(
        check(LUA.acquire(keys, 2, AcquireRequest("w2", "{}", 30000, ticket_ms=TICKET_MS))), Refused
    )
    assert isinstance(check(LUA.acquire(keys, 2, AcquireRequest("nowait", "{}", 30000))), Refused)
    wait_until(lambda: int(server_ms(raw_redis)) > short.expires_ms, message="h2 expired")
    assert isinstance(
        check(LUA.acquire(keys, 2, AcquireRequest("w2", "{}", 30000, ticket_ms=TICKET_MS))), Refused
    )  # grants w1
    (grant,) = raw_redis.lrange(keys.wake("w1"), 0, -1)
    assert LUA.grant_from(grant, 1, False) is not None  # "token:acquired_ms:expires_ms:slots"
    assert isinstance(
        check(LUA.acquire(keys, 2, AcquireRequest("w1", "{}", 30000, ticket_ms=TICKET_MS))), Granted
    )  # already its
    assert check(LUA.release(keys, 2, "h1", h1)) is True  # grants w2
    (grant,) = raw_redis.lrange(keys.wake("w2"), 0, -1)
    assert LUA.grant_from(grant, 1, False) is not None
    assert check(LUA.refresh(keys, 30000, "w1"))
    check(LUA.abandon(keys, 2, "w2"))
    assert check(LUA.refresh(keys, 30000, "h2")) is None
    assert isinstance(check(LUA.acquire(keys, 2, AcquireRequest("h3", "{}", 30000))), Granted)
    w3 = check(LUA.acquire(keys, 2, AcquireRequest("w3", "{}", 30000, ticket_ms=TICKET_MS)))
    assert isinstance(
        check(LUA.acquire(keys, 2, AcquireRequest("w4", "{}", 30000, ticket_ms=TICKET_MS))), Refused
    )

    def drop_w3():  # as when its claim window ends with it stalled (queue members: "ticket:permits:id")
        for member in raw_redis.zrange(keys.queue, 0, -1):
            if member.endswith(b":w3"):
                raw_redis.zrem(keys.queue, member)
                raw_redis.zrem(keys.queue_deadlines, member)
        raw_redis.hdel(keys.waiters, "w3")

    drop_w3()
    back = check(LUA.acquire(keys, 2, AcquireRequest("w3", "{}", 30000, ticket_ms=TICKET_MS), w3.ticket))
    assert isinstance(back, Refused) and back.ahead == 0
    assert [m.rsplit(b":", 1)[1] for m in raw_redis.zrange(keys.queue, 0, -1)] == [b"w3", b"w4"]
    drop_w3()
    assert check(LUA.release(keys, 2, "h3")) is True  # grants w4, the only one queued
    back = check(LUA.acquire(keys, 2, AcquireRequest("w3", "{}", 30000, ticket_ms=TICKET_MS), w3.ticket))
    assert isinstance(back, Refused) and back.ahead == 0  # first in line again, behind no one
    check(LUA.abandon(keys, 2, "w3"))
    check(status(keys, LUA, 2, 30))
    check(holders(keys, LUA))
    check(purge(keys, LUA))
    assert {"acquire", "release", "refresh", "abandon", "wake"} <= set(declared.scripts)


# -- item 15: Retry-After is an estimate -------------------------------------------------

HOLD = 0.3  # seconds: how long the modelled view holds its slot


def _hold_a_few_times(sem, times=4, hold=HOLD):
    for _ in range(times):
        lease = sem.acquire()
        assert lease is not None
        time.sleep(hold)  # the guarded work
        assert lease.release() is True


def _model(hold_s, ahead, limit, until_expiry_s):
    """API: from the hold times and the queue ahead; never later than the earliest expiry."""
    estimate = math.ceil((ahead + 1) / limit) * hold_s
    return max(1, math.ceil(min(estimate, until_expiry_s)))


def test_retry_after_follows_recent_hold_times():
    sem = Semaphore("estimate", limit=1, timeout=60)
    _hold_a_few_times(sem)
    holder = sem.acquire()
    lease, retry_after = sem.try_acquire()
    print(f"RETRY-AFTER of a {HOLD}s hold under TIMEOUT 60: {retry_after}s")
    assert lease is None
    assert retry_after in (1, 2)  # before: 60
    with pytest.raises(SemaphoreFull) as info, sem.hold():
        pass  # pragma: no cover
    assert info.value.retry_after in (1, 2)
    assert holder.release() is True


@pytest.mark.asyncio
async def test_async_retry_after_follows_recent_hold_times():
    sem = Semaphore("aestimate", limit=2, timeout=60)
    for _ in range(4):
        lease = await sem.aacquire()
        await asyncio.sleep(HOLD)  # the guarded work
        assert await lease.arelease() is True
    holders = [await sem.aacquire(), await sem.aacquire()]
    lease, retry_after = await sem.atry_acquire()
    assert lease is None and retry_after in (1, 2)  # before: 60
    for holder in holders:
        assert await holder.arelease() is True


@pytest.mark.parametrize(("ahead", "holder_timeout"), [(0, 60), (20, 60), (20, 2)])
def test_retry_after_counts_the_queue_ahead_and_never_passes_the_earliest_expiry(ahead, holder_timeout):
    sem = Semaphore("estimate-queue", limit=1, timeout=60)
    keys = sem.partition()
    client = connection.get_client()
    _hold_a_few_times(sem)
    holder = Semaphore("estimate-queue", limit=1, timeout=holder_timeout).acquire()
    for i in range(ahead):  # waiters that took a ticket (one acquire each, no loop)
        run(client, LUA.acquire(keys, 1, AcquireRequest(f"queued-{i}", "{}", 60000, ticket_ms=30000)))
    lease, retry_after = sem.try_acquire()
    until_expiry = (holder.expires_ms - int(server_ms(client))) / 1000
    # The hold times measured on the server are HOLD plus the round trips (a loaded machine: up to 2 x).
    low, high = _model(HOLD, ahead, 1, until_expiry), _model(HOLD * 2, ahead, 1, until_expiry)
    print(f"RETRY-AFTER with {ahead} ahead, earliest expiry in {until_expiry:.1f}s: {retry_after}s")
    assert lease is None
    assert low <= retry_after <= high
    assert retry_after <= math.ceil(until_expiry)


def test_retry_after_without_any_hold_time_yet_is_the_earliest_expiry():
    sem = Semaphore("estimate-fresh", limit=1, timeout=60)
    sem.acquire()
    assert sem.try_acquire()[1] == 60


def test_a_lost_lease_or_a_force_release_records_no_hold_time():
    # Only holds that ended with a release count: a lease that expired, an
    # operator's force-release, or an acquire given back after an error say
    # nothing about how long the work takes.
    sem = Semaphore("estimate-lost", limit=1, timeout=60)
    lost = Semaphore("estimate-lost", limit=1, timeout=0.2).acquire()
    wait_until(lambda: sem.available() == 1, message="lease expired")
    assert lost.release() is False
    forced = sem.acquire()
    assert sem.force_release(forced.identifier) is True
    sem.acquire()
    assert sem.try_acquire()[1] == 60


def test_web_429_retry_after_follows_the_view_hold_time(client, settings):
    # A 0.3 s view under TIMEOUT 60: the 429's Retry-After says 1 or 2, not 60.
    settings.SEMAPHORES = {**WEB_SEMAPHORES, "web-slow": {"LIMIT": 2, "TIMEOUT": 60}}
    for _ in range(3):
        assert client.get(f"/web/slow/?sleep={HOLD}").status_code == 200
    holders = [semaphores["web-slow"].acquire(), semaphores["web-slow"].acquire()]
    response = client.get("/web/slow/?sleep=0", HTTP_ACCEPT="application/json")
    print(f"429 Retry-After of a {HOLD}s view under TIMEOUT 60: {response['Retry-After']}")
    assert response.status_code == 429
    assert response["Retry-After"] in ("1", "2")  # before: "60"
    assert response.json()["retry_after"] == int(response["Retry-After"])
    for lease in holders:
        assert lease.release() is True


# -- pay for what you use: no slot bitmap without SLOTS, the waiters flag ----------------


def test_without_slots_permits_are_counted_and_no_bitmap_is_written(raw_redis):
    sem = Semaphore("lean", limit=5, timeout=30)
    keys = sem.partition()
    three = sem.acquire(permits=3)
    two = sem.acquire(permits=2)
    assert three is not None and two is not None
    assert (three.slots, three.permits, two.slots, two.permits) == ((), 3, (), 2)
    assert sem.acquire() is None and sem.available() == 0
    assert [(h.permits, h.slots) for h in sem.holders()] == [(3, ()), (2, ())]
    assert raw_redis.exists(keys.slots) == 0  # the bitmap costs nothing without SLOTS
    assert three.release() is True
    assert sem.available() == 3
    one = sem.acquire(permits=3)
    assert one is not None and sem.acquire() is None
    assert one.release() is True and two.release() is True
    assert sem.available() == 5
    # The members standing for permits beyond one per holder left with their
    # holders: nothing leaks into the count.
    assert raw_redis.zcard(keys.timeouts) == 0


@pytest.mark.parametrize("permits", [3, 12], ids=["members", "counted"])
def test_a_weighted_holders_permits_are_tagged_in_its_record_and_given_back_on_every_path(raw_redis, permits):
    # A holder's weight ("m3": members; "12": the "+" count) is written in its
    # record, before the meta JSON, by every grant: the common case's, the
    # full acquire's and a release's direct grant to a waiter. Every way out
    # reads it there: a force-release, an expiry, status() and holders().
    sem = Semaphore(f"tagged-{permits}", limit=20, timeout=30)
    keys = sem.partition()
    tag = f"m{permits}" if permits <= 8 else str(permits)

    def record_of(lease):
        text = raw_redis.hget(keys.holds, lease.identifier).decode()
        assert not raw_redis.hexists(keys.holds, "*" + lease.identifier)
        return text

    direct = sem.acquire(permits=permits)
    assert direct is not None and f":{tag}{{" in record_of(direct)
    assert direct.release() is True
    everything = sem.acquire(permits=20)
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(permits=permits, wait=10)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not sem.waiters() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert everything.release() is True  # grants the waiter its permits
    waiter.join(10)
    [granted] = got
    assert granted is not None and f":{tag}{{" in record_of(granted)
    assert [(h.permits, h.meta["pid"]) for h in sem.holders()] == [(permits, os.getpid())]
    assert sem.status().in_use == permits and sem.available() == 20 - permits
    assert sem.force_release(granted.identifier) is True
    assert sem.available() == 20 and raw_redis.zcard(keys.timeouts) == 0
    short = Semaphore(f"tagged-{permits}", limit=20, timeout=0.2)
    lost = short.acquire(permits=permits)
    assert lost is not None and f":{tag}{{" in record_of(lost)
    time.sleep(0.3)  # its lease ends: nobody released it
    assert sem.status().in_use == 0 and sem.available() == 20
    assert sem.purge_expired() == 1 and sem.available() == 20
    assert raw_redis.zcard(keys.timeouts) == 0 and int(raw_redis.hget(keys.holds, "+") or 0) == 0


def test_the_permits_of_an_expired_weighted_holder_come_back_without_a_purge():
    short = Semaphore("lean-expiry", limit=5, timeout=0.2)
    lost = short.acquire(permits=4)
    assert lost is not None and short.acquire(permits=2) is None
    time.sleep(0.3)  # its lease ends: nobody released it
    sem = Semaphore("lean-expiry", limit=5, timeout=30)
    everything = sem.acquire(permits=5)  # the acquire purges the expired holder, all 4 permits
    assert everything is not None and sem.available() == 0
    assert lost.release() is False  # already gone: it gives back nothing twice
    assert sem.available() == 0
    assert everything.release() is True and sem.available() == 5


@pytest.mark.parametrize("slots", [False, True], ids=["plain", "SLOTS"])
def test_a_refresh_keeps_the_permits_and_the_slots(slots):
    sem = Semaphore("lean-refresh", limit=4, timeout=30, slots=slots)
    lease = sem.acquire(permits=3)
    assert lease is not None and lease.refresh() is True
    (holder,) = sem.holders()
    assert (holder.permits, holder.slots) == (3, (0, 1, 2) if slots else ())
    assert sem.acquire(permits=2) is None and sem.available() == 1
    assert lease.release() is True and sem.available() == 4


def test_the_waiters_flag_follows_the_queue(raw_redis):
    """Releases and newcomers look at the queue only while the HASH's waiters flag says it
    may hold waiters: set when one queues, cleared once the queue is empty again."""
    sem = Semaphore("lean-flag", limit=1, timeout=30)
    keys = sem.partition()
    held = sem.acquire()
    assert held is not None and raw_redis.hget(keys.holds, "w") is None
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(wait=10)))
    waiter.start()
    wait_until(lambda: len(sem.waiters()) == 1, 5, message="queued")
    assert raw_redis.hget(keys.holds, "w") == b"1"
    assert sem.acquire() is None  # a newcomer does not pass the waiter
    assert held.release() is True  # wakes the waiter
    waiter.join(10)
    (lease,) = got
    assert lease is not None
    assert raw_redis.hget(keys.holds, "w") is None  # the queue is empty again
    assert lease.release() is True
    assert sem.acquire() is not None  # the common path again


# -- direct grant: a release hands the freed permits to the head of the queue ------------


def test_a_release_grants_the_head_waiters_in_queue_order_inside_the_script(raw_redis):
    keys = Semaphore("direct", limit=2).partition()
    check = lambda op: run(connection.get_client(), op)  # noqa: E731
    first = check(LUA.acquire(keys, 2, AcquireRequest("h1", "{}", 30000)))
    second = check(LUA.acquire(keys, 2, AcquireRequest("h2", "{}", 30000)))
    for waiter in ("w1", "w2", "w3"):
        assert isinstance(
            check(
                LUA.acquire(
                    keys, 2, AcquireRequest(waiter, json.dumps({"who": waiter}), 30000, ticket_ms=TICKET_MS)
                )
            ),
            Refused,
        )
    assert check(LUA.release(keys, 2, "h1", first)) is True
    assert check(LUA.release(keys, 2, "h2", second)) is True
    # Before either waiter runs again, both are holders, with tokens in queue order, and
    # their grants wait in their wake-up lists; w3 still queues.
    held = check(holders(keys, LUA))
    assert [h.identifier for h in held] == ["w1", "w2"]
    assert held[0].token < held[1].token and held[0].meta == {"who": "w1"}
    assert held[0].expires_at < held[0].acquired_at + datetime.timedelta(seconds=1)  # a claim lease
    grants = [LUA.grant_from(raw_redis.lindex(keys.wake(w), 0), 1, False) for w in ("w1", "w2")]
    assert [g.token for g in grants] == [h.token for h in held]
    assert [m.rsplit(b":", 1)[1] for m in raw_redis.zrange(keys.queue, 0, -1)] == [b"w3"]
    # w2 gives up without ever seeing its grant: it goes to w3.
    check(LUA.abandon(keys, 2, "w2"))
    assert [h.identifier for h in check(holders(keys, LUA))] == ["w1", "w3"]
    assert raw_redis.exists(keys.wake("w2")) == 0 and raw_redis.zcard(keys.queue) == 0


def _queue(check, keys, limit, *waiters, priority=0):
    for waiter in waiters:
        request = AcquireRequest(waiter, "{}", 30000, ticket_ms=TICKET_MS, priority=priority)
        assert isinstance(check(LUA.acquire(keys, limit, request)), Refused)


def _grant_in(raw_redis, keys, waiter):
    (payload,) = raw_redis.lrange(keys.wake(waiter), 0, -1)
    return LUA.grant_from(payload, 1, False)


@pytest.mark.parametrize("limit", [1, 3])
def test_a_grant_names_the_waiters_its_release_is_likely_to_serve(declared, raw_redis, limit):
    # With equal holds, the releases serve the queue in the order the holders were
    # granted, so a holder's release serves the waiter LIMIT places behind it;
    # with LIMIT > 1, one more or one fewer of the others' releases may come
    # first, so the waiters next to it are named too.
    spread = 1 if limit > 1 else 0

    def named(queue):  # the waiters a grant to queue[0] names
        return tuple(queue[limit - spread : limit + spread + 1])

    keys = Semaphore(f"named-{limit}", limit=limit).partition()
    check = declared.run
    held = [check(LUA.acquire(keys, limit, AcquireRequest(f"h{i}", "{}", 30000))) for i in range(limit)]
    waiters = [f"w{i}" for i in range(2 * limit)]
    _queue(check, keys, limit, *waiters)
    for i, holder in enumerate(held):
        assert check(LUA.release(keys, limit, f"h{i}", holder)) is True
    for i in range(limit):
        assert _grant_in(raw_redis, keys, waiters[i]).successors == named(waiters[i:])
    assert named(waiters)[spread] == waiters[limit]  # the one LIMIT places behind
    assert LUA.grant_from(b"1:2:3:", 1, False).successors == ()  # TOTAL's grants name nobody
    # Near the end of the queue, only the waiters still in it are named.
    raw_redis.delete(keys.wake(waiters[0]))
    assert check(LUA.release(keys, limit, waiters[0])) is True  # grants w{limit}
    assert _grant_in(raw_redis, keys, waiters[limit]).successors == named(waiters[limit:])
    assert named(waiters[limit:]) == (() if limit == 1 else (waiters[-1],))


@pytest.mark.parametrize("late", [False, True], ids=["left-in-its-list", "pushed-late"])
def test_a_waiter_never_claims_with_a_stale_grant(raw_redis, late):
    # A waiter stalled past its claim window misses its grant (its claim is
    # purged, the permit goes to a newcomer); it comes back, queues again, and
    # the newcomer's release grants it again. Its wake-up list may still hold
    # the first grant, or a releasing process that stalled between its script
    # and its push delivers it only now: either way the lease the waiter ends
    # with is the second grant, whose token the server recorded, above the
    # newcomer's (fencing tokens increase).
    keys = Semaphore("stale-grant", limit=1).partition()
    client = connection.get_client()
    check = lambda op: run(client, op)  # noqa: E731
    holder = check(LUA.acquire(keys, 1, AcquireRequest("holder", "{}", 30000)))
    request = AcquireRequest("stalled", "{}", 30000, ticket_ms=TICKET_MS)
    queued = check(LUA.acquire(keys, 1, request))
    assert isinstance(queued, Refused)
    assert check(LUA.release(keys, 1, "holder", holder)) is True  # the first grant, to the stalled waiter
    (stale,) = raw_redis.lrange(keys.wake("stalled"), 0, -1)
    expire_now(raw_redis, keys.timeouts, "stalled")  # it stalls past its claim window
    newcomer = check(LUA.acquire(keys, 1, AcquireRequest("newcomer", "{}", 30000)))
    assert isinstance(newcomer, Granted)
    assert isinstance(check(LUA.acquire(keys, 1, request, queued.ticket)), Refused)  # back, it queues again
    if late:
        raw_redis.rpush(keys.wake("stalled"), stale)
    assert check(LUA.release(keys, 1, "newcomer", newcomer)) is True  # the second grant, to it
    # Its waiting loop (wait_ops): the grant it pops, its claim; if that fails, it looks again.
    woken = raw_redis.blpop([keys.wake("stalled")], 1)
    claimed = check(waiting._claim(LUA, keys, 30000, "stalled", LUA.grant_from(woken[1], 1, False)))
    if claimed is None:
        again = check(LUA.acquire(keys, 1, request, queued.ticket))
        claimed = check(waiting._claim(LUA, keys, 30000, "stalled", again))
    recorded = int(raw_redis.hget(keys.holds, "stalled").split(b":")[0])
    assert claimed.token == recorded > newcomer.token


def test_a_release_pushes_the_grant_of_the_waiter_it_names_itself(declared, raw_redis):
    keys = Semaphore("named-push", limit=1).partition()
    check = declared.run
    holder = check(LUA.acquire(keys, 1, AcquireRequest("h", "{}", 30000)))
    _queue(check, keys, 1, "w1", "w2", "w3")
    assert check(LUA.release(keys, 1, "h", holder)) is True
    assert declared.scripts[-2:] == ["release", "wake"]  # h was granted at once: it names nobody
    w1 = _grant_in(raw_redis, keys, "w1")
    assert w1.successors == ("w2",) and check(LUA.refresh(keys, 30000, "w1"))
    # w1's release names w2 and serves it: one script, which pushed w2's grant.
    assert check(LUA.release(keys, 1, "w1", w1)) is True
    assert declared.scripts[-1] == "release"
    w2 = _grant_in(raw_redis, keys, "w2")
    assert w2.token > w1.token and w2.successors == ("w3",)
    assert [h.identifier for h in check(holders(keys, LUA))] == ["w2"]
    assert check(LUA.refresh(keys, 30000, "w2"))
    # A waiter of a higher priority arrived meanwhile: the release serves it, not
    # the waiter it named, and pushes its grant with the second script as before.
    _queue(check, keys, 1, "urgent", priority=5)
    assert check(LUA.release(keys, 1, "w2", w2)) is True
    assert declared.scripts[-2:] == ["release", "wake"]
    assert _grant_in(raw_redis, keys, "urgent").token > w2.token
    assert raw_redis.exists(keys.wake("w3")) == 0
    assert [h.identifier for h in check(holders(keys, LUA))] == ["urgent"]
    # The named waiter gave up before the release: nothing is pushed to its list.
    check(LUA.abandon(keys, 1, "w3"))
    urgent = dataclasses.replace(_grant_in(raw_redis, keys, "urgent"), successors=("w3",))
    assert check(LUA.release(keys, 1, "urgent", urgent)) is True
    assert raw_redis.exists(keys.wake("w3")) == 0 and check(holders(keys, LUA)) == []


def test_a_chain_of_waiters_hands_over_with_one_round_trip_per_release(monkeypatch):
    # Each waiter's lease knows whom its release serves, so after the first
    # hand-over (from a holder granted at once) no release needs wake.lua.
    sem = Semaphore("named-chain", limit=1, timeout=30)
    first = sem.acquire()
    threads, got = queue_waiters(sem, 4)
    assert first.release() is True
    for n in range(4):
        threads[n].join(10)
        lease = got[n]
        assert lease is not None and lease.ticket
        if n < 3:
            sent = count_round_trips(monkeypatch)
            assert lease.release() is True
            assert sent == ["EVALSHA"]  # the release script alone: it pushed the next grant
            monkeypatch.undo()
    assert got[3].release() is True
    assert [got[n].token for n in range(4)] == sorted(got[n].token for n in range(4))


def test_a_granted_waiter_holds_its_own_timeout_after_one_refresh():
    sem = Semaphore("direct-claim", limit=1, timeout=30)
    held = sem.acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(wait=10)))
    waiter.start()
    wait_until(lambda: len(sem.waiters()) == 1, 5, message="queued")
    ticket = sem.waiters()[0].since
    assert held.release() is True
    waiter.join(10)
    (lease,) = got
    assert lease is not None and lease.ticket  # granted from the queue
    assert lease.expires_ms - lease.acquired_ms > 25_000  # its own TIMEOUT, not the 0.5 s claim
    (holder,) = sem.holders()
    assert holder.identifier == lease.identifier
    assert holder.acquired_at >= ticket.replace(microsecond=ticket.microsecond // 1000 * 1000)  # ms vs µs
    time.sleep(0.6)  # past the claim lease: still held
    assert lease.refresh() is True and lease.release() is True


def test_a_holder_record_no_lease_backs_is_purged_with_its_weighted_permits(raw_redis):
    # The "lua" engine keeps each holder's token in its record (no owners
    # ZSET). A record that no timeouts entry backs (a script stopped by an
    # error between its writes) is found by the purge from the records
    # themselves, and the members of its permits beyond the first leave the
    # timeouts ZSET with it. A member of that kind left without its holder's
    # entry goes too (uncounted: it was no holder).
    sem = Semaphore("orphan-record", limit=6, timeout=30)
    live = sem.acquire(permits=2)
    assert live is not None
    keys = sem.partition()
    raw_redis.hset(keys.holds, mapping={"ghost": "1:1:{}", "*ghost": "m2"})
    raw_redis.zadd(keys.timeouts, {"ghost#2": float("inf"), "stray#2": float("inf")})
    assert sem.available() == 2  # the ghost's permit beyond its first and the stray count until purged
    assert sem.purge_expired(dry_run=True) == 1
    assert raw_redis.hexists(keys.holds, "ghost")
    assert sem.purge_expired() == 1
    assert not raw_redis.hexists(keys.holds, "ghost") and not raw_redis.hexists(keys.holds, "*ghost")
    assert raw_redis.zrange(keys.timeouts, 0, -1) == [
        live.identifier.encode(),
        f"{live.identifier}#2".encode(),
    ]
    assert sem.available() == 4
    assert [h.identifier for h in sem.holders()] == [live.identifier]
    assert sem.purge_expired() == 0 and live.release() is True


def test_a_weighted_holder_granted_by_the_earlier_version_gives_its_permits_back(raw_redis):
    # Version 0.2 counted every weighted holder's permits beyond the first in
    # the "+" field (its "*" field a bare number). Holders of 2 to 8 permits
    # are members now ("*" = "m3"); one granted before the upgrade still
    # lowers the count when it is released, purged or found lost.
    sem = Semaphore("weighted-upgrade", limit=5, timeout=30)
    keys = sem.partition()
    sem.acquire().release()  # the HASH exists, with its counter and TTL
    now = int(server_ms(raw_redis))
    for ident in ("old-a", "old-b"):
        raw_redis.zadd(keys.timeouts, {ident: now + 30_000})
        raw_redis.hset(keys.holds, mapping={ident: f"{now * 1000}:{now}:{{}}", "*" + ident: 2})
    raw_redis.hset(keys.holds, "+", 2)
    assert sem.available() == 1
    new = sem.acquire(permits=1)
    assert new is not None and sem.acquire() is None
    assert sem.force_release("old-a") is True
    assert int(raw_redis.hget(keys.holds, "+")) == 1 and sem.available() == 2
    raw_redis.zadd(keys.timeouts, {"old-b": now - 1}, xx=True)  # expired
    assert sem.purge_expired() == 1
    assert int(raw_redis.hget(keys.holds, "+")) == 0 and sem.available() == 4
    assert new.release() is True and sem.available() == 5


def test_a_weighted_acquire_sent_twice_or_over_stray_members_holds_its_permits_once(raw_redis):
    # The common case adds the entry and its other permits' members in one
    # ZADD NX, and takes the grant only if all of them were new: a retry (its
    # entry and members there already) gets its grant back, and members left
    # by an interrupted operation are not counted twice.
    sem = Semaphore("weighted-once", limit=7, timeout=30)
    keys = sem.partition()
    client = connection.get_client()
    for _ in range(10):  # past the first grants, which record hold times
        sem.acquire().release()
    request = AcquireRequest("twice", "{}", 30000, permits=3)
    first = run(client, LUA.acquire(keys, 7, request))
    second = run(client, LUA.acquire(keys, 7, request))
    assert isinstance(first, Granted) and first.quiet
    assert dataclasses.replace(second, quiet=True) == first  # the same grant (by the full path)
    # A member whose holder "stray" is gone counts until sema_cleanup (or a
    # holder of that name: here, with room for it beside the member) removes it.
    raw_redis.zadd(keys.timeouts, {"stray#2": "+inf"})
    stray = run(client, LUA.acquire(keys, 7, AcquireRequest("stray", "{}", 30000, permits=3)))
    assert isinstance(stray, Granted)
    assert sorted((h.identifier, h.permits) for h in sem.holders()) == [("stray", 3), ("twice", 3)]
    assert raw_redis.zcard(keys.timeouts) == 6 and sem.available() == 1
    assert run(client, LUA.release(keys, 7, "twice", first)) is True
    assert run(client, LUA.release(keys, 7, "stray", stray)) is True
    assert raw_redis.zcard(keys.timeouts) == 0 and sem.available() == 7


def test_holders_are_listed_in_grant_order_whatever_their_expiry(raw_redis):
    # Listed from the timeouts ZSET (by expiry) and sorted by token: the
    # order they were granted in, as the owners ZSET gave it before.
    sem = Semaphore("listed", limit=3, timeout=30)
    first = sem.acquire()
    second = sem.acquire()
    third = sem.acquire()
    assert first and second and third
    assert second.refresh() is True and first.refresh() is True  # expiry order: third, second, first
    assert [h.identifier for h in sem.holders()] == [first.identifier, second.identifier, third.identifier]


def _holds_recorded(raw_redis, keys):
    return int(raw_redis.hget(keys.holds, "%") or 0) % 1024  # the packed count (HOLD_SCALE)


def test_hold_times_are_recorded_only_while_an_estimate_is_needed(raw_redis):
    # An uncontended release records its hold time only until 8 are recorded
    # (HOLD_FIRST): after that, nobody is told a Retry-After, and the release
    # spends no call on it. A refusal makes the releases record again, so the
    # refused callers' successors get an estimate from recent holds: those of
    # the leases granted after it (one granted before it was quiet, and gives
    # its permit back with plain commands, which record nothing).
    sem = Semaphore("sampled", limit=1, timeout=30)
    keys = sem.partition()
    for _ in range(20):
        lease = sem.acquire()
        assert lease is not None and lease.release() is True
    assert _holds_recorded(raw_redis, keys) == 8
    held = sem.acquire()
    assert held is not None
    assert sem.acquire() is None  # refused: the releases sample again
    assert held.release() is True
    assert _holds_recorded(raw_redis, keys) == 8
    for _ in range(3):
        lease = sem.acquire()
        assert lease is not None and lease.release() is True
    assert _holds_recorded(raw_redis, keys) == 11


@pytest.mark.parametrize("evicted", ["queue", "queue_deadlines", "waiters"])
def test_a_queue_key_evicted_alone_gets_its_ttl_back_with_the_next_waiter(raw_redis, evicted):
    # The queue keys keep their TTLs by a watermark in the waiters HASH, so a
    # waiter queued before it writes no TTL. maxmemory's volatile-* policies
    # evict one key at a time: whichever of the three vanished, the next
    # waiter re-creates it with a TTL (every key has one: TIMEOUT + 1 s at least).
    sem = Semaphore(f"evicted-{evicted}", limit=1, timeout=LONG)
    keys = sem.partition()
    client = connection.get_client()
    assert sem.acquire() is not None
    run(client, LUA.acquire(keys, 1, AcquireRequest("first", "{}", LONG * 1000, ticket_ms=TICKET_MS)))
    raw_redis.delete(getattr(keys, evicted))
    started = time.monotonic()
    run(client, LUA.acquire(keys, 1, AcquireRequest("second", "{}", LONG * 1000, ticket_ms=TICKET_MS)))
    elapsed = (time.monotonic() - started) * 1000
    ttls = _pttls(raw_redis, [keys.queue, keys.queue_deadlines, keys.waiters])
    print(f"QUEUE KEY TTLS after {evicted} was evicted and a waiter queued: {ttls}")
    for name, pttl in ttls.items():
        assert pttl >= LONG * 1000 + 1000 - elapsed - 5, name


def test_moving_the_queue_watermark_never_shortens_a_longer_ttl(raw_redis):
    # A process of the version before the queue keys' watermark lengthens their
    # TTLs without moving it: when a waiter then moves the watermark, a TTL
    # longer than the new one stays.
    sem = Semaphore("queue-mark", limit=1, timeout=SHORT)
    keys = sem.partition()
    client = connection.get_client()
    names = [keys.queue, keys.queue_deadlines, keys.waiters]
    assert sem.acquire() is not None
    run(client, LUA.acquire(keys, 1, AcquireRequest("first", "{}", int(SHORT * 1000), ticket_ms=TICKET_MS)))
    longer = TICKET_MS * 4
    for name in names:
        raw_redis.pexpire(name, longer)
    raw_redis.hset(keys.waiters, "e", int(server_ms(raw_redis)))  # a watermark that has run out
    started = time.monotonic()
    run(client, LUA.acquire(keys, 1, AcquireRequest("second", "{}", int(SHORT * 1000), ticket_ms=TICKET_MS)))
    elapsed = (time.monotonic() - started) * 1000
    ttls = _pttls(raw_redis, names)
    print(f"QUEUE KEY TTLS after the watermark moved over longer ones ({longer} ms): {ttls}")
    for name, pttl in ttls.items():
        assert pttl >= longer - elapsed - 5, name


def _script_commands(raw_redis, redis_url, call):
    """The commands scripts ran on the server during ``call()`` (MONITOR, in a thread)."""
    seen, ready, stop = [], threading.Event(), f"stop-monitor-{uuid.uuid4().hex}"
    watcher = redis.Redis.from_url(redis_url)

    def listen():
        with watcher.monitor() as monitor:
            ready.set()
            for record in monitor.listen():
                if stop in record["command"]:
                    return
                if record.get("client_type") == "lua":
                    seen.append(record["command"])

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(5)
    time.sleep(0.1)  # MONITOR is in force once its reply came (redis-py gives no event for it)
    try:
        call()
    finally:
        raw_redis.echo(stop)
        thread.join(10)
        watcher.close()
    return seen


def test_a_release_that_grants_a_waiter_keeps_the_timeouts_zset_and_its_ttl(raw_redis, redis_url):
    # The last holder's entry was removed before the grant: the timeouts ZSET was deleted,
    # and the claim entry created it again without a TTL, which cost a PEXPIREAT more
    # (8,000 of a hand-over's 736,000 server instructions).
    keys = Semaphore("handover-ttl", limit=1, timeout=30).partition()
    client = connection.get_client()
    holder = run(client, LUA.acquire(keys, 1, AcquireRequest("h", "{}", 30000)))
    assert isinstance(holder, Granted)
    queued = run(client, LUA.acquire(keys, 1, AcquireRequest("w", "{}", 30000, ticket_ms=TICKET_MS)))
    assert isinstance(queued, Refused)
    ttl = raw_redis.pttl(keys.timeouts)
    commands = _script_commands(raw_redis, redis_url, lambda: run(client, LUA.release(keys, 1, "h", holder)))
    assert not [c for c in commands if c.startswith("PEXPIREAT") and keys.timeouts in c], commands
    # The waiter holds the permit (a claim), the releaser nothing; the ZSET kept its TTL.
    assert [m.decode() for m in raw_redis.zrange(keys.timeouts, 0, -1)] == ["w"]
    assert raw_redis.pttl(keys.timeouts) >= ttl - 1_000
    assert LUA.grant_from(raw_redis.lpop(keys.wake("w")), 1, False) is not None
    assert run(client, LUA.refresh(keys, 30000, "w")) is not None
    assert run(client, LUA.release(keys, 1, "w")) is True
    assert raw_redis.exists(keys.timeouts) == 0  # the last holder gone: the ZSET with it


# -- slot numbers (SLOTS) in bulk -----------------------------------------------------------

SLOTS_LIMIT = 400


class SlotNumbers(RuleBasedStateMachine):
    """Holders of 1 to SLOTS_LIMIT permits come and go; each gets the lowest free slot numbers,
    and a release (or the purge of an expired holder) gives exactly its own back."""

    raw = None  # a plain client, set by the test

    def __init__(self):
        super().__init__()
        self.sem = Semaphore(f"slots-{uuid.uuid4().hex[:8]}", limit=SLOTS_LIMIT, timeout=60, slots=True)
        self.held = []  # leases
        self.free = set(range(SLOTS_LIMIT))

    @rule(permits=st.one_of(st.integers(1, 12), st.integers(1, SLOTS_LIMIT)))
    def acquire(self, permits):
        lease = self.sem.acquire(permits=permits)
        if permits > len(self.free):
            assert lease is None
            return
        assert lease is not None and lease.slots == tuple(sorted(self.free)[:permits]), (permits, lease.slots)
        self.free -= set(lease.slots)
        self.held.append(lease)

    @rule(index=st.integers(0, 100), expire=st.booleans())
    def give_back(self, index, expire):
        if not self.held:
            return
        lease = self.held.pop(index % len(self.held))
        if expire:  # its entry runs out, and a purge gives its slots back
            keys = self.sem.partition()
            expire_now(self.raw, keys.timeouts, lease.identifier)
            assert self.sem.purge_expired() == 1
        else:
            assert lease.release()
        self.free |= set(lease.slots)

    @invariant()
    def the_bitmap_and_the_holders_agree(self):
        keys = self.sem.partition()
        taken = set(range(SLOTS_LIMIT)) - self.free
        assert self.raw.bitcount(keys.slots) == len(taken)
        assert {h.identifier: h.slots for h in self.sem.holders()} == {
            lease.identifier: lease.slots for lease in self.held
        }

    def teardown(self):
        for lease in self.held:
            lease.release()


def test_slot_numbers_taken_and_given_back_in_bulk_match_the_model(raw_redis):
    # Weighted holders took a BITPOS and a SETBIT per slot (10,000 permits: 26 ms of the
    # server's time, 1,000,000: 4.7 s) and gave them back with a SETBIT each.
    SlotNumbers.raw = raw_redis
    run_model(SlotNumbers, 40, steps=25)


def test_a_weighted_holder_stores_its_slot_numbers_as_runs(raw_redis):
    sem = Semaphore("slot-runs", limit=1_000_000, timeout=60, slots=True)
    small = sem.acquire(permits=3)
    assert small.slots == (0, 1, 2)
    gap = sem.acquire(permits=2)
    small.release()  # 0, 1, 2 free again; 3, 4 held
    big = sem.acquire(permits=999_990)
    assert big.slots == (0, 1, 2, *range(5, 999_992))
    keys = sem.partition()
    assert raw_redis.hget(keys.holds, "@" + big.identifier) == b"0-2,5-999991"  # not a million numbers
    assert raw_redis.bitcount(keys.slots) == 999_992
    assert big.release()
    assert raw_redis.bitcount(keys.slots) == 2 and gap.slots == (3, 4)
    assert gap.release() and raw_redis.bitcount(keys.slots) == 0
