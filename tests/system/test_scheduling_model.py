"""A Hypothesis state machine for scheduling: permits, priorities, slots, a changing limit.

The engine ("lua", a real Redis, real waiting threads) against a plain Python
model.  Rules: acquire at once (wait 0) with random permits and priority;
queue a waiter (a thread blocked in ``acquire(wait=...)``); release a holder;
expire one; lower or raise the limit (a runtime override).  The model says
who is granted: a caller is served when its permits fit in the free ones
after those of every waiter served before it (priority, then arrival), so a
waiter that does not fit blocks the ones behind it.  After every step the
waiters that the model serves must have been granted, and no other; the
queue (``waiters()``) must be the model's, in serving order; and every grant
must have kept the permits held within the limit in force when it was
made, with ``permits`` slot numbers below that limit that no other live
holder has.

Expiry is made deterministic as in tests/system/test_stateful_model.py: the
holder's expiry (its score in the timeout ZSET) moves into the server's
past, which is what the passage of TIMEOUT does to it; the engine then finds
the lease expired by the server's own clock and gives its permits and slots
back when it purges it.
"""

import itertools
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from django_semaphore import Semaphore
from django_semaphore.backend import connection
from django_semaphore.backend.keys import glob_escape
from tests.support.helpers import expire_now, run_model, wait_until

MAX_LIMIT = 5
EXAMPLES = 60
MAX_WAITERS = 4  # threads queued at once
SETTLE = 10.0  # seconds: a woken waiter claims within ms; a raised limit or an expiry within a heartbeat
_names = itertools.count()
_grants = {"immediate": 0, "queued": 0, "steps": 0}


class Holder:
    def __init__(self, lease, permits, tag):
        self.lease = lease
        self.permits = permits
        self.tag = tag
        self.expired = False


class Waiting:
    def __init__(self, future, permits, priority, seq, tag):
        self.future = future
        self.permits = permits
        self.priority = priority
        self.seq = seq
        self.tag = tag

    @property
    def order(self):
        return (-self.priority, self.seq)


class SchedulingModel(RuleBasedStateMachine):
    raw = None  # a plain client, set by the test

    def __init__(self):
        super().__init__()
        self.sem = Semaphore(f"sched-{next(_names)}", limit=MAX_LIMIT, timeout=60, slots=True)
        self.limit = MAX_LIMIT
        self.holders = []  # live (not released; expired ones are dropped)
        self.queue = []  # model waiters, any order (sorted by .order when served)
        self.seq = itertools.count()
        self.pool = ThreadPoolExecutor(MAX_WAITERS + 1)

    # -- the model -------------------------------------------------------------------

    def held(self):
        return sum(h.permits for h in self.holders)

    def fits(self, permits, priority, ahead_of=None):
        """Would a caller of ``permits`` and ``priority`` be served now (ahead: the
        waiters served before it: its own predecessors, or for a newcomer every
        waiter of its priority or a higher one)?"""
        if ahead_of is None:
            ahead = [w for w in self.queue if w.priority >= priority]
        else:
            ahead = [w for w in self.queue if w.order < ahead_of.order]
        return self.limit - self.held() - sum(w.permits for w in ahead) >= permits

    def check_grant(self, lease, permits, tag):
        """A grant the model allowed: its slots, then it counts as held."""
        assert lease is not None, f"{tag}: refused although its permits fit"
        assert lease.permits == permits and len(lease.slots) == permits
        assert len(set(lease.slots)) == permits
        assert all(0 <= slot < self.limit for slot in lease.slots), (lease.slots, self.limit)
        taken = {slot for h in self.holders for slot in h.lease.slots}
        assert not taken & set(lease.slots), (tag, lease.slots, taken)
        assert self.held() + permits <= self.limit
        self.holders.append(Holder(lease, permits, tag))

    def settle(self):
        """Serve the model's queue, then wait for the engine to have done the same."""
        served = []
        for waiter in sorted(self.queue, key=lambda w: w.order):
            if not self.fits(waiter.permits, waiter.priority, ahead_of=waiter):
                break  # it blocks the ones behind it
            served.append(waiter)
            self.queue.remove(waiter)
            # Granted: its permits count from now on (the next one's fit includes them).
            self.holders.append(Holder(None, waiter.permits, waiter.tag))
        self.holders = [h for h in self.holders if h.lease is not None]
        for waiter in served:
            lease = waiter.future.result(timeout=SETTLE)
            self.check_grant(lease, waiter.permits, waiter.tag)
            _grants["queued"] += 1
        expected = [(w.tag, w.priority, w.permits) for w in sorted(self.queue, key=lambda w: w.order)]

        def queue_agrees():
            seen = [(w.meta.get("tag"), w.priority, w.permits) for w in self.sem.waiters()]
            return seen == expected

        wait_until(queue_agrees, timeout=SETTLE, message=f"the queue {expected}")
        for waiter in self.queue:
            assert not waiter.future.done(), f"{waiter.tag} was served out of turn"

    # -- rules -----------------------------------------------------------------------------

    @rule(permits=st.integers(1, MAX_LIMIT), priority=st.integers(-2, 2))
    def acquire(self, permits, priority):
        if permits > self.limit:
            # More than a limit lowered at runtime (LIMIT is MAX_LIMIT): refused at
            # once, reason "full", never queued (a ValueError is for above LIMIT).
            lease, retry_after = self.sem.try_acquire(wait=0, permits=permits, priority=priority)
            assert lease is None and retry_after.reason == "full"
            return
        expected = self.fits(permits, priority)
        lease = self.sem.acquire(wait=0, permits=permits, priority=priority)
        if expected:
            self.check_grant(lease, permits, "now")
            _grants["immediate"] += 1
        else:
            assert lease is None, "granted although its permits did not fit"
        self.settle()

    @precondition(lambda self: len(self.queue) < MAX_WAITERS)
    @rule(permits=st.integers(1, MAX_LIMIT), priority=st.integers(-2, 2))
    def wait(self, permits, priority):
        if permits > self.limit:  # could never fit by waiting: refused at once, not queued
            started = time.monotonic()
            lease, retry_after = self.sem.try_acquire(wait=120, permits=permits, priority=priority)
            assert lease is None and retry_after.reason == "full"
            assert time.monotonic() - started < SETTLE
            self.settle()
            return
        seq = next(self.seq)
        tag = f"w{seq}"
        now = self.fits(permits, priority)
        future = self.pool.submit(
            self.sem.acquire, wait=120, permits=permits, priority=priority, meta={"tag": tag}
        )
        if now:
            self.check_grant(future.result(timeout=SETTLE), permits, tag)
            _grants["immediate"] += 1
        else:
            self.queue.append(Waiting(future, permits, priority, seq, tag))
        self.settle()

    @precondition(lambda self: self.holders)
    @rule(index=st.integers(0, 100))
    def release(self, index):
        holder = self.holders.pop(index % len(self.holders))
        assert holder.lease.release() is True
        self.settle()

    @precondition(lambda self: self.holders)
    @rule(index=st.integers(0, 100))
    def expire(self, index):
        """TIMEOUT passes for this holder only: its expiry moves into the server's past."""
        holder = self.holders.pop(index % len(self.holders))
        assert expire_now(self.raw, holder.lease.keys.timeouts, holder.lease.identifier) == 0
        self.settle()
        assert holder.lease.release() is False  # lost; its permits came back without it

    @rule(limit=st.integers(1, MAX_LIMIT))
    def set_limit(self, limit):
        self.sem.override(limit=limit)
        self.limit = limit
        self.settle()

    @invariant()
    def figures_agree(self):
        _grants["steps"] += 1
        assert self.sem.available() == max(0, self.limit - self.held())
        holders = self.sem.holders()
        assert sorted(h.identifier for h in holders) == sorted(h.lease.identifier for h in self.holders)
        assert {h.identifier: h.slots for h in holders} == {
            h.lease.identifier: h.lease.slots for h in self.holders
        }

    @invariant()
    def every_key_expires(self):
        # Every key has a TTL (API: Redis keys): the holder keys keep theirs by
        # the holds HASH's watermark, the queue keys by the waiters HASH's,
        # each set when a key is (re-)created; the wake-up lists by the push.
        timeouts = self.sem.partition().timeouts
        for key in self.raw.scan_iter(match=glob_escape(timeouts[:-1]) + "*", count=1000):
            assert self.raw.pttl(key) != -1, key

    def teardown(self):
        try:
            self.sem.clear_override()
            self.limit = MAX_LIMIT
            while self.holders or self.queue:
                for holder in self.holders:
                    holder.lease.release()
                self.holders = []
                self.settle()
        finally:
            self.pool.shutdown(wait=False)
            connection.reset()


@pytest.mark.slow
def test_scheduling_matches_the_model(raw_redis):
    SchedulingModel.raw = raw_redis
    run_model(SchedulingModel, EXAMPLES)
    print(
        f"SCHEDULING MODEL: {EXAMPLES} examples, {_grants['steps']} checked states, "
        f"{_grants['immediate']} immediate and {_grants['queued']} queued grants"
    )
