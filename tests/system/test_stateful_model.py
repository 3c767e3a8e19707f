"""A Hypothesis state machine: the engine against a plain Python model.

Rules acquire, release, refresh (sync and async) and expire leases; every
answer the engine gives is compared with the model's, and after every step
the holders, the free slots and the lease_lost signals must agree.  Expiry is
made deterministic by moving a chosen holder's expiry (its score in the
timeout ZSET) into the server's past, which is exactly what the passage of
TIMEOUT does to it.
"""

import asyncio
import itertools

import pytest
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from django_semaphore import Semaphore, signals
from django_semaphore.backend import connection
from tests.support.helpers import expire_now, run_model

LIMIT = 3
_names = itertools.count()


class ModelLease:
    """What the model knows of one lease."""

    def __init__(self, lease):
        self.lease = lease
        self.expired = False  # Redis considers it ended (its expiry is in the past)
        self.done = False  # release() was called
        self.lost = False  # lease_lost was sent
        self.live = True  # counted among the holders
        self.in_redis = True  # its entries may still be stored (an acquire may purge them)

    def __repr__(self):
        return f"<lease {self.lease.token}>"


class SemaphoreModel(RuleBasedStateMachine):
    raw = None  # a plain client to the backend, set by the test

    leases = Bundle("leases")

    def __init__(self):
        super().__init__()
        self.sem = Semaphore(f"model-{next(_names)}", limit=LIMIT, timeout=60)
        self.model = []
        self.last_token = 0
        self.lost_seen = []
        self.loop = asyncio.new_event_loop()

        def on_lost(sender, lease, **kwargs):
            self.lost_seen.append(lease.identifier)

        self.on_lost = on_lost
        signals.lease_lost.connect(on_lost, weak=False)

    def teardown(self):
        signals.lease_lost.disconnect(self.on_lost)

        async def close():
            await connection.get_async_client().aclose()

        self.loop.run_until_complete(close())
        self.loop.close()
        connection.reset()

    def live(self):
        return [m for m in self.model if m.live]

    def _granted(self, lease):
        if len(self.live()) < LIMIT:
            assert lease is not None, "refused although a slot was free"
            assert lease.token > self.last_token
            self.last_token = lease.token
            entry = ModelLease(lease)
            self.model.append(entry)
            return entry
        assert lease is None, "granted although every slot was taken"
        return None

    @rule(target=leases)
    def acquire(self):
        return self._granted(self.sem.acquire()) or "refused"

    @rule(target=leases)
    def aacquire(self):
        return self._granted(self.loop.run_until_complete(self.sem.aacquire())) or "refused"

    def _release(self, entry, answer):
        if entry == "refused":
            return
        expected = not entry.done and not entry.expired
        assert answer is expected, (entry, answer)
        if not entry.done and not expected:
            entry.lost = True
        entry.done = True
        entry.live = False
        entry.in_redis = False

    @rule(entry=leases)
    def release(self, entry):
        if entry != "refused":
            self._release(entry, entry.lease.release())

    @rule(entry=leases)
    def arelease(self, entry):
        if entry != "refused":
            self._release(entry, self.loop.run_until_complete(entry.lease.arelease()))

    def _refresh(self, entry, answer):
        expected = not entry.done and not entry.lost and not entry.expired
        assert answer is expected, (entry, answer)
        if not answer and not entry.done and not entry.lost:
            entry.lost = True
            entry.live = False
            entry.in_redis = False

    @rule(entry=leases)
    def refresh(self, entry):
        if entry != "refused":
            self._refresh(entry, entry.lease.refresh())

    @rule(entry=leases)
    def arefresh(self, entry):
        if entry != "refused":
            self._refresh(entry, self.loop.run_until_complete(entry.lease.arefresh()))

    @rule(entry=leases)
    def expire(self, entry):
        """TIMEOUT passes for this holder only: its expiry moves into the server's past."""
        if entry == "refused" or not entry.live:
            return
        assert expire_now(self.raw, entry.lease.keys.timeouts, entry.lease.identifier) == 0
        entry.expired = True
        entry.live = False

    @rule()
    def purge(self):
        stale = [m for m in self.model if m.expired and m.in_redis]
        assert 0 <= self.sem.purge_expired() <= len(stale)
        for m in stale:
            m.in_redis = False
        assert self.sem.purge_expired() == 0

    @invariant()
    def holders_agree(self):
        live = self.live()
        holders = self.sem.holders()
        assert [h.identifier for h in holders] == [m.lease.identifier for m in live]
        assert [h.token for h in holders] == [m.lease.token for m in live]
        assert self.sem.available() == LIMIT - len(live)

    @invariant()
    def lost_signals_agree(self):
        assert sorted(self.lost_seen) == sorted(m.lease.identifier for m in self.model if m.lost)


@pytest.mark.slow
def test_engine_matches_the_model(backend, backend_redis):
    SemaphoreModel.raw = backend_redis
    run_model(SemaphoreModel, 40)
