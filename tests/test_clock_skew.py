"""A process whose clock is an hour off can neither steal a slot nor evict a holder.

The default "lua" algorithm reads the time from the Redis server (``TIME``)
inside its scripts.  The Redis in Action variants use the client's clock, as
the seeds do; the last tests document what a wrong clock does to them.
"""

import datetime
import json
import subprocess
import sys

import pytest

from django_semaphore import Semaphore

pytestmark = pytest.mark.slow

HOUR = 3600


def skewed(env, offsets, **command):
    """Run one skewed worker per offset, concurrently; their JSON reports in order."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.workers.skewed", str(offset), json.dumps(command)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for offset in offsets
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out))
    return reports


def test_skewed_clocks_cannot_steal_or_evict_lua(subprocess_env):
    command = {"name": "skew", "limit": 2, "timeout": 30, "algorithm": "lua"}
    sem = Semaphore("skew", limit=2, timeout=30)
    mine = [sem.acquire(), sem.acquire()]
    ids = [lease.identifier for lease in mine]

    ahead, behind = skewed(subprocess_env, [HOUR, -HOUR], **command)
    for report in (ahead, behind):
        assert report["token"] is None  # no slot stolen
        assert report["purged"] == 0  # nothing evicted as "expired"
        assert report["holders"] == ids
    assert [h.identifier for h in sem.holders()] == ids
    assert all(lease.refresh() for lease in mine)

    # With a free slot, a skewed process gets it on server time, and still evicts nobody.
    mine[0].release()
    (ahead,) = skewed(subprocess_env, [HOUR], **command)
    assert ahead["token"] is not None and ahead["token"] > mine[1].token
    assert ahead["holders"] == [mine[1].identifier, ahead["identifier"]]
    expires = datetime.datetime.fromtimestamp(ahead["expires_ms"] / 1000, datetime.timezone.utc)
    expected = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=30)
    assert abs(expires - expected) < datetime.timedelta(seconds=60)  # not an hour off
    (behind,) = skewed(subprocess_env, [-HOUR], **command)
    assert behind["token"] is None
    assert behind["holders"] == [mine[1].identifier, ahead["identifier"]]
    assert mine[1].refresh() is True
    assert sem.available() == 0


def test_skewed_clock_cannot_expire_a_lua_lease_early(subprocess_env):
    # The skewed process's refresh, acquire and purge never shorten others' leases.
    sem = Semaphore("skew-short", limit=1, timeout=30)
    lease = sem.acquire()
    before = sem.holders()[0].expires_at
    skewed(subprocess_env, [HOUR, -HOUR], name="skew-short", limit=1, timeout=1, algorithm="lua")
    (holder,) = sem.holders()
    assert holder.identifier == lease.identifier and holder.expires_at == before
    assert lease.release() is True


# -- the Redis in Action variants trust the client clock ------------------------------


@pytest.mark.parametrize("algorithm", ["basic", "fair", "fair_locked"])
def test_clock_ahead_evicts_holders_of_client_clock_variants(subprocess_env, algorithm):
    """Documented weakness (system check W001 for basic/fair; see the README)."""
    sem = Semaphore("skew-" + algorithm, limit=2, timeout=30, algorithm=algorithm)
    mine = [sem.acquire(), sem.acquire()]
    (ahead,) = skewed(
        subprocess_env, [HOUR], name=sem.name, limit=2, timeout=30, algorithm=algorithm, purge=False
    )
    # The hour-ahead process saw both leases as expired, purged them and took a slot.
    assert ahead["token"] is not None
    assert ahead["holders"] == [ahead["identifier"]]
    assert [lease.refresh() for lease in mine] == [False, False]


def test_clock_behind_steals_a_slot_from_basic(subprocess_env):
    """Documented weakness: "basic" ranks by client time, so a slow clock jumps the queue."""
    sem = Semaphore("skew-basic", limit=2, timeout=30, algorithm="basic")
    mine = [sem.acquire(), sem.acquire()]
    (behind,) = skewed(
        subprocess_env, [-HOUR], name=sem.name, limit=2, timeout=30, algorithm="basic", purge=False
    )
    assert behind["token"] is not None
    # Three processes believe they hold a LIMIT 2 semaphore; the thief's entry
    # is invisible to holders() because, on server time, it expired an hour ago.
    assert [lease.refresh() for lease in mine] == [True, True]
    assert [h.identifier for h in sem.holders()] == [lease.identifier for lease in mine]
