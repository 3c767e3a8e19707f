"""What each option costs per uncontended acquire+release cycle, beside a plain semaphore.

For every option a semaphore can set (and the arguments a call can pass), the
Redis commands it runs per cycle -- those the client sends and those its scripts
run inside (``redis.call``), as INFO commandstats counts them -- and the server
microseconds of the commands the client sends.  Each option is measured in
pairs with a plain semaphore whose order alternates; the figure is the median
of the pairs' ratios (a batch's cost depends a little on what ran just before it).

Pay for what you use: an option a semaphore does not set costs it nothing, and
one it sets costs at most 1.1 x a plain cycle (SLOTS, slot numbers per holder,
is priced as it is).
"""

import uuid

from django_semaphore import Semaphore
from django_semaphore.backend import connection

from .common import median
from .rediscost import _run_calls, _usec, sent_usec

BATCH = 10

#: name -> (Semaphore keywords, acquire keywords).
OPTIONS = {
    "PERMITS 2": ({}, {"permits": 2}),
    "PRIORITY 5": ({}, {"priority": 5}),
    "MAX_WAITERS 10": ({"max_waiters": 10}, {}),
    "MODE dry_run": ({"mode": "dry_run"}, {}),
    "ADAPTIVE": ({"adaptive": {"MIN": 1, "MAX": 64}}, {}),
    "KEY (a partition)": ({}, {"key": "alice"}),
    "SLOTS": ({"slots": True}, {}),
}
#: The options held to the pay-for-what-you-use bound (SLOTS is priced, not bounded).
BOUNDED = ("PERMITS 2", "PRIORITY 5", "MAX_WAITERS 10", "MODE dry_run", "ADAPTIVE", "KEY (a partition)")


def _batch(client, sem, kwargs):
    """(server usec of the commands sent, Redis commands run) per cycle, over one batch."""
    before = _usec(client)
    for _ in range(BATCH):
        lease = sem.acquire(**kwargs)
        if lease is None:
            raise RuntimeError(f"{sem.name}: refused with nobody else using it")
        lease.release()
    after = _usec(client)
    return sent_usec(after, before) / BATCH, _run_calls(after, before) / BATCH


def measure(rounds=60):
    client = connection.get_client()
    tag = uuid.uuid4().hex[:6]
    plain = Semaphore(f"opt-plain-{tag}", limit=5, timeout=60)
    sems = {
        name: Semaphore(f"opt-{i}-{tag}", limit=5, timeout=60, **sem_kw)
        for i, (name, (sem_kw, _)) in enumerate(OPTIONS.items())
    }
    for sem, (_, kw) in zip(sems.values(), OPTIONS.values(), strict=True):
        for _ in range(20):
            plain.acquire().release()
            sem.acquire(**kw).release()
    plain_usec, plain_calls, result = [], [], {}
    for name, sem in sems.items():
        kw = OPTIONS[name][1]
        pairs = []
        calls = []
        for r in range(rounds):
            if r % 2:
                o, p = _batch(client, sem, kw), _batch(client, plain, {})
            else:
                p, o = _batch(client, plain, {}), _batch(client, sem, kw)
            pairs.append((p[0], o[0]))
            calls.append(o[1])
            plain_usec.append(p[0])
            plain_calls.append(p[1])
        result[name] = {
            "usec": median([o for _, o in pairs]),
            "calls": median(calls),
            "vs_plain": median([o / p for p, o in pairs if p]),
        }
    return {"plain": {"usec": median(plain_usec), "calls": median(plain_calls)}, "options": result}
