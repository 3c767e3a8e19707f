"""A Hypothesis state machine for TOTAL's fair share between partitions.

The engine (the TOTAL scripts on a real Redis) against a reference model of
the policy in shared/API.md "Fair share across partitions": each partition
holds at most LIMIT permits and the name at most TOTAL; freed permits go to
a waiter whose partition has room, higher priority first, then round robin
between the partitions (the one served least recently first; one never
served, or not since it last held nothing, before any other; ties by the
arrival of the partition's first waiter), then first come, first served
within a partition; the first waiter so chosen that does not fit in the free
permits stops the grants (a large request is not starved); a partition at
its LIMIT is skipped.  A newcomer is admitted at once only if that policy,
with it queued last in its partition, grants it now.

Rules: acquire (at once, or queueing with a ticket: the algorithm's own
call, so that every grant of a step is read from the server's fencing
tokens, in order, not from threads' timing), release, a waiter gives up, a
lease expires (its score moves into the server's past, then the operator's
purge removes it), and an expired lease's holder refreshes or releases it
late.  After every step, the holders and their grant order (by
token) and the waiters must be the model's, and no partition may hold more
than LIMIT nor the name more than TOTAL.
"""

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_semaphore import Semaphore
from django_semaphore.backend import connection
from django_semaphore.backend.keys import key_hash
from django_semaphore.backend.scripting import run
from django_semaphore.engine.algorithms import AcquireRequest, Granted, algorithm_for
from django_semaphore.engine.semaphore import new_identifier
from tests.support.helpers import expire_now

LIMIT = 2
TOTAL = 3
PARTS = ("a", "b", "c", "d")
TIMEOUT_MS = 60_000
TICKET_MS = 600_000  # queued waiters keep their tickets for the whole example
_names = itertools.count()


class Entry:
    def __init__(self, ident, part, permits, priority, ticket):
        self.ident, self.part, self.permits, self.priority, self.ticket = (
            ident,
            part,
            permits,
            priority,
            ticket,
        )


class TotalModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.sem = Semaphore(f"total-model-{next(_names)}", limit=LIMIT, total=TOTAL, timeout=60)
        self.algorithm = algorithm_for(self.sem.config)
        self.client = connection.get_client()
        self.holders = {}  # ident -> Entry
        self.queue = []  # Entry, arrival order
        self.last = {}  # part -> token of its last grant, while it holds permits
        self.seq = {}  # part -> "served" of its ready entry, while it has waiters
        self.arrivals = itertools.count()
        self.tokens = itertools.count(1)
        self.expected_order = []  # idents granted in this step, in order
        self.lost = []  # (ident, part) of the leases that expired and were purged

    # -- the reference model ----------------------------------------------------------

    def held(self, part=None):
        return sum(e.permits for e in self.holders.values() if part is None or e.part == part)

    def head(self, part):
        mine = [e for e in self.queue if e.part == part]
        return min(mine, key=lambda e: (-e.priority, e.ticket)) if mine else None

    def ready(self, part, served=None):
        if self.head(part) is None:
            self.seq.pop(part, None)
        elif served is not None:
            self.seq[part] = served
        elif part not in self.seq:
            self.seq[part] = self.last.get(part, 0)

    def grant(self, entry):
        token = next(self.tokens)
        self.holders[entry.ident] = entry
        self.last[entry.part] = token
        self.expected_order.append(entry.ident)
        return token

    def walk(self):
        while TOTAL - self.held() > 0:
            free = TOTAL - self.held()
            parts = [p for p in PARTS if self.head(p) is not None]
            parts.sort(key=lambda p: (-self.head(p).priority, self.seq[p], self.head(p).ticket, key_hash(p)))
            chosen = None
            for part in parts:
                head = self.head(part)
                if self.held(part) + head.permits <= LIMIT:
                    if head.permits > free:
                        return
                    chosen = head
                    break
            if chosen is None:
                return
            self.queue.remove(chosen)
            token = self.grant(chosen)
            self.ready(chosen.part, token)

    def drop(self, ident):
        entry = self.holders.pop(ident)
        if self.held(entry.part) == 0:
            self.last.pop(entry.part, None)

    # -- driving the engine ------------------------------------------------------------

    def holders_by_token(self):
        return {h.identifier: h.token for h in self.sem.holders()}

    def check_step(self, before):
        """The holders now are the model's, and those granted in this step came in its order."""
        after = self.holders_by_token()
        assert set(after) == set(self.holders)
        new = sorted((ident for ident in after if ident not in before), key=after.get)
        assert new == [i for i in self.expected_order if i in after]
        for ident in new:
            if ident in {e.ident for e in self.holders.values()} and ident in self.waiting_idents:
                # A waiter granted by another's call holds a claim lease: it
                # claims it with its first refresh, as a woken waiter does.
                keys = self.sem.partition(self.holders[ident].part)
                assert run(self.client, self.algorithm.refresh(keys, TIMEOUT_MS, ident)) is not None
        self.waiting_idents = {e.ident for e in self.queue}
        self.expected_order = []

    waiting_idents: set = set()

    @rule(
        part=st.sampled_from(PARTS),
        permits=st.integers(1, 2),
        priority=st.sampled_from([0, 0, 1, 5]),
        queue=st.booleans(),
    )
    def acquire(self, part, permits, priority, queue):
        before = self.holders_by_token()
        keys = self.sem.partition(part)
        ident = keys.part + "/" + new_identifier()
        request = AcquireRequest(
            ident, "{}", TIMEOUT_MS, 1.0 if queue else 0, TICKET_MS if queue else 0, False, permits, priority
        )
        outcome = run(self.client, self.algorithm.acquire(keys, LIMIT, request))
        # The model: admitted at once with nobody waiting and room, else by the policy.
        entry = Entry(ident, part, permits, priority, next(self.arrivals))
        if not self.queue and self.held(part) + permits <= LIMIT and self.held() + permits <= TOTAL:
            self.grant(entry)
        else:
            self.queue.append(entry)
            self.ready(part)
            self.walk()
            if ident not in self.holders and not queue:
                self.queue.remove(entry)
                self.ready(part)
        assert isinstance(outcome, Granted) == (ident in self.holders)
        self.check_step(before)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release(self, data):
        before = self.holders_by_token()
        ident = data.draw(st.sampled_from(sorted(self.holders)))
        keys = self.sem.partition(self.holders[ident].part)
        assert run(self.client, self.algorithm.release(keys, LIMIT, ident))
        self.drop(ident)
        if self.queue:
            self.walk()
        self.check_step(before)

    @precondition(lambda self: self.queue)
    @rule(data=st.data())
    def give_up(self, data):
        before = self.holders_by_token()
        entry = data.draw(st.sampled_from(self.queue))
        run(self.client, self.algorithm.abandon(self.sem.partition(entry.part), LIMIT, entry.ident))
        self.queue.remove(entry)
        self.ready(entry.part)
        self.walk()
        self.check_step(before)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def expire(self, data):
        before = self.holders_by_token()
        ident = data.draw(st.sampled_from(sorted(self.holders)))
        keys = self.sem.partition(self.holders[ident].part)
        expire_now(self.client, keys.timeouts, ident)
        assert self.sem.purge_expired() == 1
        self.lost.append((ident, self.holders[ident].part))
        self.drop(ident)
        before.pop(ident)
        self.check_step(before)

    @precondition(lambda self: self.lost)
    @rule(data=st.data(), release=st.booleans())
    def lost_lease_comes_back(self, data, release):
        # Its holder (or its watchdog) refreshes or releases it late: refused, and its
        # permits are not given back again (the purge gave them back).  The release
        # still serves the waiters that fit in the permits free now (a purge does not).
        before = self.holders_by_token()
        ident, part = data.draw(st.sampled_from(self.lost))
        keys = self.sem.partition(part)
        if release:
            assert run(self.client, self.algorithm.release(keys, LIMIT, ident)) is False
            if self.queue:
                self.walk()
        else:
            assert run(self.client, self.algorithm.refresh(keys, TIMEOUT_MS, ident)) is None
        self.check_step(before)

    @invariant()
    def within_limit_and_total(self):
        for part in PARTS:
            assert self.sem.status(part).in_use == self.held(part) <= LIMIT
        assert self.sem.status().in_use == self.held() <= TOTAL
        assert sorted(w.identifier for w in self.sem.waiters()) == sorted(e.ident for e in self.queue)


def test_total_fair_share_matches_the_model():
    run_state_machine_as_test(
        TotalModel,
        settings=settings(
            max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
