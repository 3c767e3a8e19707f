"""A process whose clock is an hour off can neither steal a slot nor evict a holder.

The default "lua" algorithm reads the time from the Redis server (``TIME``)
inside its scripts.  The Redis in Action variants use the client's clock, as
the seeds do; the tests in the middle document what a wrong clock does to
them.  The last ones check that each entry is judged by the clock that wrote
it: status(), holders(), purge_expired() and sema_cleanup judge a seed
variant's holders on the client's clock, so app clocks that lag Redis's do
not make a live holder look expired.
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
            [sys.executable, "-m", "tests.support.workers.skewed", str(offset), json.dumps(command)],
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
    expires = datetime.datetime.fromtimestamp(ahead["expires_ms"] / 1000, datetime.UTC)
    expected = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)
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
    # is invisible to holders() because, on our clock, it expired an hour ago
    # (our refreshes have already purged it: the seeds purge on every write).
    assert [lease.refresh() for lease in mine] == [True, True]
    assert [h.identifier for h in sem.holders()] == [lease.identifier for lease in mine]


# -- one clock: a seed entry is judged by the clock that wrote it ------------------------------

LAG = 30  # seconds the app's clocks are behind Redis's


@pytest.mark.parametrize("configured", [True, False], ids=["in-SEMAPHORES", "not-in-SEMAPHORES"])
@pytest.mark.parametrize("algorithm", ["basic", "fair", "fair_locked"])
def test_a_live_seed_holder_survives_inspection_when_app_clocks_lag_redis(
    subprocess_env, raw_redis, algorithm, configured
):
    """App clocks 30 s behind Redis's; a lease of 20 s, live on the clock that wrote it.

    On Redis's clock that lease ended 10 s before it began.  Before the fix
    the inspection scripts judged it by Redis's TIME: status() and holders()
    did not count it, and purge_expired() and sema_cleanup removed it while
    it was held.  A semaphore that is no longer in SEMAPHORES (algorithm
    unknown) is judged by the earlier of the two clocks: never early.
    """
    name = f"lag-{algorithm}"
    (report,) = skewed(
        subprocess_env,
        [-LAG],
        name=name,
        limit=2,
        timeout=20,
        algorithm=algorithm,
        configured=configured,
        inspect=True,
    )
    print(report)
    assert report["token"] is not None
    me = report["identifier"]
    assert report["holders_before"] == [me]
    assert report["in_use"] == 1 and report["available"] == 1
    assert report["cleanup_dry_run"] == 0
    assert report["purged"] == 0
    assert report["cleanup"] == 0
    assert report["holders"] == [me]
    keys = Semaphore(name, limit=2).partition()
    assert raw_redis.zscore(keys.timeouts, me) is not None
    assert raw_redis.hget(keys.holds, me) is not None


def test_cleanup_of_an_unconfigured_semaphore_waits_for_both_clocks(subprocess_env):
    """Algorithm unknown (not in SEMAPHORES): an entry goes once it has ended on both clocks.

    A "lua" lease of 20 s (server time) inspected by sema_cleanup on an app
    clock 30 s ahead: judged by that clock alone it would have ended 10 s ago.
    """
    (report,) = skewed(
        subprocess_env, [LAG], name="ahead-lua", limit=2, timeout=20, algorithm="lua", inspect=True
    )
    assert report["token"] is not None
    assert report["cleanup_dry_run"] == 0 and report["cleanup"] == 0
    assert report["holders"] == [report["identifier"]]
