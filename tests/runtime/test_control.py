"""Runtime control (django_semaphore.control): overrides of LIMIT and MODE, the
configuration in force, and how every process applies a change, on a real Redis."""

import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from django_semaphore import Semaphore, SemaphoreBackendError, SemaphoreFull, semaphores, signals
from django_semaphore.backend import connection
from django_semaphore.backend.keys import control_key
from django_semaphore.backend.scripting import run
from django_semaphore.runtime import control
from tests.support.helpers import HOSTILE_LIMITS, count_round_trips, wait_until
from tests.support.servers import RedisServer, redis_server_binary

SEED_ALGORITHMS = ("fair_locked", "fair", "basic")


@pytest.fixture
def changes():
    seen = []

    def receiver(sender, **kwargs):
        seen.append(kwargs)

    signals.config_changed.connect(receiver, weak=False)
    yield seen
    signals.config_changed.disconnect(receiver)


def stored(raw_redis, key_prefix, name):
    raw = raw_redis.hget(control_key(key_prefix), name)
    return None if raw is None else json.loads(raw)


# -- override / clear / effective ------------------------------------------------------


def test_override_clear_and_effective(raw_redis, key_prefix, changes):
    sem = semaphores["reports"]
    assert sem.effective() == control.Effective(2, "enforce", "settings")
    assert sem.override(limit=5) == (5, "enforce", "override", None)
    # Only the given values change: a mode override keeps the limit override.
    assert sem.override(mode="dry_run", user="alice") == (5, "dry_run", "override", None)
    assert sem.effective() == (5, "dry_run", "override", None)
    data = stored(raw_redis, key_prefix, "reports")
    assert data["limit"] == 5 and data["mode"] == "dry_run" and data["by"] == "alice"
    assert abs(data["at"] / 1000 - time.time()) < 60
    assert raw_redis.ttl(control_key(key_prefix)) == -1  # configuration: no TTL
    assert sem.override(limit=1) == (1, "dry_run", "override", None)
    assert sem.clear_override() == (2, "enforce", "settings", None)
    assert stored(raw_redis, key_prefix, "reports") is None
    assert sem.effective(fresh=True) == (2, "enforce", "settings", None)
    assert [(c["limit"], c["mode"], c["user"]) for c in changes] == [
        (5, "enforce", None),
        (5, "dry_run", "alice"),
        (1, "dry_run", None),
        (2, "enforce", None),
    ]
    assert all(c["semaphore"] == sem for c in changes)


@pytest.mark.asyncio
async def test_async_twins(changes):
    sem = Semaphore("actl", limit=3, timeout=5)
    assert await sem.aeffective() == (3, "enforce", "settings", None)
    assert await sem.aoverride(mode="off") == (3, "off", "override", None)
    assert await sem.aoverride(limit=0) == (0, "off", "override", None)
    assert await sem.aeffective(fresh=True) == (0, "off", "override", None)
    assert await sem.aclear_override() == (3, "enforce", "settings", None)
    assert [c["mode"] for c in changes] == ["off", "off", "enforce"]


def test_the_user_is_recorded_by_username(raw_redis, key_prefix, django_user_model):
    user = django_user_model(username="operator")
    semaphores["reports"].override(limit=1, user=user)
    assert stored(raw_redis, key_prefix, "reports")["by"] == "operator"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"limit": -1},
        {"limit": True},
        {"limit": 1.5},
        {"limit": "3"},
        {"mode": "enforcing"},
        {"mode": None, "limit": None},
        {"limit": 2, "mode": "OFF"},
    ],
)
def test_bad_values_raise_and_write_nothing(kwargs, raw_redis, key_prefix, changes):
    sem = semaphores["reports"]
    with pytest.raises(ValueError):
        sem.override(**kwargs)
    assert raw_redis.exists(control_key(key_prefix)) == 0
    assert changes == []
    assert sem.effective() == (2, "enforce", "settings", None)


def test_a_bad_value_keeps_an_earlier_override(raw_redis, key_prefix):
    sem = semaphores["reports"]
    sem.override(limit=4)
    before = stored(raw_redis, key_prefix, "reports")
    with pytest.raises(ValueError):
        sem.override(limit=4, mode="nope")
    assert stored(raw_redis, key_prefix, "reports") == before


def _limit_id(value):
    return repr(value)[:24]


@pytest.mark.parametrize("limit", HOSTILE_LIMITS, ids=_limit_id)
def test_a_limit_outside_0_to_a_million_is_refused_and_nothing_is_written(
    limit, raw_redis, key_prefix, changes
):
    """10**20 used to be stored as -2**63 (and read as "no limit override": the settings'
    limit), 2**53 + 1 as 2**53: refused now, the earlier override untouched, and a
    mode given with it is not applied either."""
    sem = semaphores["reports"]
    sem.override(limit=1, mode="dry_run")
    before = stored(raw_redis, key_prefix, "reports")
    with pytest.raises(ValueError, match="from 0 to 1,000,000"):
        sem.override(limit=limit)
    with pytest.raises(ValueError, match="from 0 to 1,000,000"):
        sem.override(limit=limit, mode="enforce")
    assert stored(raw_redis, key_prefix, "reports") == before
    assert sem.effective(fresh=True) == (1, "dry_run", "override", None)
    assert len(changes) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("limit", HOSTILE_LIMITS, ids=_limit_id)
async def test_aoverride_refuses_the_same_limits(limit, raw_redis, key_prefix, changes):
    sem = Semaphore("alimits", limit=3, timeout=5)
    with pytest.raises(ValueError, match="from 0 to 1,000,000"):
        await sem.aoverride(limit=limit, mode="dry_run")
    assert raw_redis.exists(control_key(key_prefix)) == 0
    assert await sem.aeffective(fresh=True) == (3, "enforce", "settings", None)
    assert changes == []


def test_a_million_is_the_largest_limit(raw_redis, key_prefix):
    sem = semaphores["reports"]
    assert sem.override(limit=10**6) == (10**6, "enforce", "override", None)
    assert stored(raw_redis, key_prefix, "reports")["limit"] == 10**6
    assert sem.effective(fresh=True) == (10**6, "enforce", "override", None)
    assert sem.override(limit=0) == (0, "enforce", "override", None)


@pytest.mark.asyncio
async def test_aoverride_takes_a_million():
    sem = Semaphore("amillion", limit=3, timeout=5)
    assert await sem.aoverride(limit=10**6) == (10**6, "enforce", "override", None)
    assert await sem.aeffective(fresh=True) == (10**6, "enforce", "override", None)


@pytest.mark.parametrize(
    ("raw", "read"),
    [
        ("99999999999999999999999", 10**6),
        ("1000001", 10**6),
        ("1e300", 10**6),
        ("-9223372036854775808", 0),  # what `sema_set --limit 99999999999999999999999` used to store
        ("-1", 0),
    ],
)
def test_a_stored_limit_out_of_range_is_clamped_never_dropped(raw, read, raw_redis, key_prefix):
    """A limit out of 0..1,000,000 found in the HASH (written by hand, or by an older
    version) is read as the nearest bound, by every process and by the script that
    merges the next change into it: never as "no limit override" (the settings' limit)."""
    value = f'{{"limit":{raw},"mode":"dry_run","at":0,"by":"someone"}}'
    raw_redis.hset(control_key(key_prefix), "reports", value)
    sem = semaphores["reports"]
    assert sem.effective(fresh=True) == (read, "dry_run", "override", None)
    assert sem.override(mode="enforce") == (read, "enforce", "override", None)
    assert stored(raw_redis, key_prefix, "reports")["limit"] == read
    assert sem.effective(fresh=True) == (read, "enforce", "override", None)


@pytest.mark.parametrize("limit", [10**6 + 1, 10**20, -1])
def test_the_script_itself_refuses_a_limit_out_of_range(limit, raw_redis, key_prefix):
    """Below the Python checks, the script that writes the override refuses a limit out
    of range: nothing is written (and nothing stored is changed)."""
    sem = semaphores["reports"]
    sem.override(limit=1, mode="dry_run")
    before = stored(raw_redis, key_prefix, "reports")
    client = connection.get_client()
    with pytest.raises(SemaphoreBackendError, match="limit"):
        run(client, control.write(sem.config, control.Change(limit, "enforce"), None, False))
    assert stored(raw_redis, key_prefix, "reports") == before


@pytest.mark.parametrize(
    "persistence", [(), ("--appendonly", "yes", "--appendfsync", "always")], ids=["no-persistence", "aof"]
)
def test_an_override_outlives_a_redis_restart_only_with_persistence(persistence, settings):
    """Overrides live in Redis only (docs/runtime-control.rst): a server that persists
    nothing forgets an incident's pause when it restarts, and every process goes back to
    the settings; check --deploy warns about it (W006, tests/test_checks.py)."""
    if not redis_server_binary():
        pytest.skip("no redis-server binary")
    with RedisServer(args=persistence) as server:
        settings.SEMAPHORE_REDIS = {"URL": server.url, "OPTIONS": {"socket_timeout": 2.0}}
        try:
            sem = semaphores["reports"]
            assert sem.override(limit=0) == (0, "enforce", "override", None)
            server.restart()
            connection.reset()
            after = (0, "enforce", "override", None) if persistence else (2, "enforce", "settings", None)
            assert sem.effective(fresh=True) == after
        finally:
            connection.reset()


def test_an_override_by_a_redis_user_without_dangerous_commands_is_applied_and_reported(
    own_redis, settings, changes
):
    """A least-privilege Redis user ("+@all -@dangerous") may not run INFO, which the write
    used to look for replicas to WAIT for: the override was written (the semaphore paused
    in every process), yet override() raised SemaphoreBackendError, so sema_set and the
    admin reported a failure, and no config_changed signal (nor LogEntry) was sent."""
    admin = redis.Redis.from_url(own_redis.url)
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@dangerous")
    settings.SEMAPHORE_REDIS = {
        "URL": f"redis://app:pw@127.0.0.1:{own_redis.port}/0",
        "OPTIONS": {"socket_timeout": 2.0},
    }
    connection.reset()
    sem = semaphores["reports"]
    lease = sem.acquire()  # the user can do everything else the app does
    assert lease is not None and lease.release()
    assert sem.override(limit=0) == control.Effective(0, "enforce", "override")
    assert [(c["limit"], c["mode"]) for c in changes] == [(0, "enforce")]
    assert sem.clear_override() == control.Effective(2, "enforce", "settings")
    assert sem.effective(fresh=True) == control.Effective(2, "enforce", "settings")


def test_unknown_semaphore_is_improperly_configured(raw_redis, key_prefix):
    with pytest.raises(ImproperlyConfigured):
        Semaphore("nope").override(limit=1)
    with pytest.raises(ImproperlyConfigured):
        Semaphore("nope").effective()
    assert raw_redis.exists(control_key(key_prefix)) == 0


def test_a_malformed_stored_value_is_ignored(raw_redis, key_prefix):
    raw_redis.hset(control_key(key_prefix), "reports", "{not json")
    sem = semaphores["reports"]
    assert sem.effective(fresh=True) == (2, "enforce", "settings", None)
    assert sem.override(mode="dry_run") == (2, "dry_run", "override", None)  # written over


# -- TOTAL --------------------------------------------------------------------------------

#: A configured semaphore with TOTAL (it needs KEY in settings) and one without.
TOTAL_SEMAPHORES = {
    "reports": {"LIMIT": 2, "TIMEOUT": 5},
    "exports": {"LIMIT": 2, "TIMEOUT": 5, "KEY": "user", "TOTAL": 8},
}


@pytest.fixture
def with_total(settings):
    settings.SEMAPHORES = TOTAL_SEMAPHORES
    return semaphores["exports"]


def test_effective_total_is_none_without_total():
    sem = semaphores["reports"]
    assert sem.config.total is None
    assert sem.effective().total is None
    assert sem.override(limit=1).total is None
    assert sem.effective(fresh=True) == (1, "enforce", "override", None)
    assert control.total_in_force(sem.config) is None
    assert Semaphore("nototal", limit=2).effective().total is None


def test_override_total_round_trips_through_redis_and_the_cache(with_total, raw_redis, key_prefix, changes):
    sem = with_total
    assert sem.effective() == (2, "enforce", "settings", 8)
    assert sem.override(total=5) == (2, "enforce", "override", 5)
    data = stored(raw_redis, key_prefix, "exports")
    assert (data["limit"], data["mode"], data["total"]) == (None, None, 5)
    assert control.total_in_force(sem.config) == 5
    assert sem.effective(fresh=True) == (2, "enforce", "override", 5)
    control.cache().clear()  # as a brand-new worker: read back from Redis
    assert sem.effective() == (2, "enforce", "override", 5)
    assert control.total_in_force(sem.config) == 5
    # Only the values given change, both ways.
    assert sem.override(limit=1) == (1, "enforce", "override", 5)
    assert sem.override(total=3, user="alice") == (1, "enforce", "override", 3)
    assert sem.override(mode="dry_run") == (1, "dry_run", "override", 3)
    data = stored(raw_redis, key_prefix, "exports")
    assert (data["limit"], data["mode"], data["total"], data["by"]) == (1, "dry_run", 3, "")
    assert sem.effective(fresh=True) == (1, "dry_run", "override", 3)
    # clear_override: TOTAL from settings again.
    assert sem.clear_override() == (2, "enforce", "settings", 8)
    assert stored(raw_redis, key_prefix, "exports") is None
    assert control.total_in_force(sem.config) == 8
    assert sem.effective(fresh=True) == (2, "enforce", "settings", 8)
    assert [(c["limit"], c["mode"], c["total"], c["user"]) for c in changes] == [
        (2, "enforce", 5, None),
        (1, "enforce", 5, None),
        (1, "enforce", 3, "alice"),
        (1, "dry_run", 3, None),
        (2, "enforce", 8, None),
    ]


def test_zero_and_a_million_are_totals(with_total, raw_redis, key_prefix):
    sem = with_total
    assert sem.override(total=0).total == 0
    assert sem.override(total=10**6).total == 10**6
    assert stored(raw_redis, key_prefix, "exports")["total"] == 10**6
    assert sem.effective(fresh=True).total == 10**6


@pytest.mark.asyncio
async def test_async_twins_take_a_total(changes):
    sem = Semaphore("atotal", limit=2, timeout=5, total=6)  # ad hoc: no KEY needed
    assert await sem.aeffective() == (2, "enforce", "settings", 6)
    assert await sem.aoverride(total=4) == (2, "enforce", "override", 4)
    assert await sem.aoverride(limit=1) == (1, "enforce", "override", 4)
    assert await sem.aeffective(fresh=True) == (1, "enforce", "override", 4)
    assert await sem.aclear_override() == (2, "enforce", "settings", 6)
    assert [c["total"] for c in changes] == [4, 4, 6]


def test_an_override_of_only_the_total_is_an_override(with_total, raw_redis, key_prefix):
    assert control.parse('{"total": 5}') == control.Override(total=5)
    assert control.parse('{"limit": null, "mode": null, "total": null}') is None
    raw_redis.hset(control_key(key_prefix), "exports", '{"limit":null,"mode":null,"total":4,"at":0,"by":"x"}')
    assert with_total.effective(fresh=True) == (2, "enforce", "override", 4)


def test_a_stored_total_applies_only_to_a_semaphore_with_total(raw_redis, key_prefix):
    """A total left in Redis for a semaphore whose settings dropped TOTAL: no total, and
    alone no override in force; with a limit beside it, the limit applies."""
    sem = semaphores["reports"]
    raw_redis.hset(control_key(key_prefix), "reports", '{"limit":null,"mode":null,"total":4,"at":0,"by":""}')
    assert sem.effective(fresh=True) == (2, "enforce", "settings", None)
    raw_redis.hset(control_key(key_prefix), "reports", '{"limit":1,"mode":null,"total":4,"at":0,"by":""}')
    assert sem.effective(fresh=True) == (1, "enforce", "override", None)


@pytest.mark.parametrize("total", HOSTILE_LIMITS, ids=_limit_id)
def test_a_bad_total_is_refused_and_nothing_is_written(total, with_total, raw_redis, key_prefix, changes):
    sem = with_total
    sem.override(limit=1, total=6)
    before = stored(raw_redis, key_prefix, "exports")
    with pytest.raises(ValueError, match="total must be an int from 0 to 1,000,000"):
        sem.override(total=total)
    with pytest.raises(ValueError, match="total must be"):
        sem.override(limit=2, mode="dry_run", total=total)  # neither is applied
    assert stored(raw_redis, key_prefix, "exports") == before
    assert sem.effective(fresh=True) == (1, "enforce", "override", 6)
    assert len(changes) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("total", [-1, 1.5, True, "3", 10**6 + 1], ids=_limit_id)
async def test_aoverride_refuses_the_same_totals(total, raw_redis, key_prefix, changes):
    sem = Semaphore("atotals", limit=3, timeout=5, total=6)
    with pytest.raises(ValueError, match="total must be"):
        await sem.aoverride(total=total, mode="dry_run")
    assert raw_redis.exists(control_key(key_prefix)) == 0
    assert await sem.aeffective(fresh=True) == (3, "enforce", "settings", 6)
    assert changes == []


@pytest.mark.parametrize("make", [lambda: semaphores["reports"], lambda: Semaphore("plain", limit=2)])
def test_a_total_for_a_semaphore_without_total_is_refused(make, raw_redis, key_prefix, changes):
    sem = make()
    for kwargs in ({"total": 4}, {"total": 4, "limit": 1}, {"total": 0, "mode": "dry_run"}):
        with pytest.raises(ValueError, match=f"semaphore '{sem.name}' has no TOTAL"):
            sem.override(**kwargs)
    assert raw_redis.exists(control_key(key_prefix)) == 0
    assert sem.effective(fresh=True) == (2, "enforce", "settings", None)
    assert changes == []


def test_validate_and_change():
    config = Semaphore("v", limit=2, total=4).config
    control.validate(None, None, 3, config)
    control.validate(1, None, None, config)
    control.validate(None, "off", None, None)
    with pytest.raises(ValueError, match="Give a limit, a mode or a total"):
        control.validate(None, None, None, config)
    with pytest.raises(ValueError, match="has no TOTAL"):
        control.validate(None, None, 3, Semaphore("w", limit=2).config)
    assert control.Change(1, "off", 3) == control.Change(limit=1, mode="off", total=3)
    assert not control.Change(1).clear and control.CLEAR.clear
    assert (control.CLEAR.limit, control.CLEAR.mode, control.CLEAR.total) == (None, None, None)


@pytest.mark.parametrize("total", [10**6 + 1, 10**20, -1])
def test_the_script_itself_refuses_a_total_out_of_range(total, with_total, raw_redis, key_prefix):
    sem = with_total
    sem.override(total=5, mode="dry_run")
    before = stored(raw_redis, key_prefix, "exports")
    client = connection.get_client()
    with pytest.raises(SemaphoreBackendError, match="total"):
        run(client, control.write(sem.config, control.Change(limit=1, total=total), None, False))
    assert stored(raw_redis, key_prefix, "exports") == before


@pytest.mark.parametrize(
    ("raw", "read"), [("99999999999999999999999", 10**6), ("1e300", 10**6), ("-1", 0), ("2.5", 2)]
)
def test_a_stored_total_out_of_range_is_clamped_never_dropped(raw, read, with_total, raw_redis, key_prefix):
    value = f'{{"limit":null,"mode":"dry_run","total":{raw},"at":0,"by":"someone"}}'
    raw_redis.hset(control_key(key_prefix), "exports", value)
    sem = with_total
    assert sem.effective(fresh=True) == (2, "dry_run", "override", read)
    assert sem.override(mode="enforce") == (2, "enforce", "override", read)
    assert stored(raw_redis, key_prefix, "exports")["total"] == read


def test_total_in_force_never_talks_to_redis(with_total, main_thread_commands):
    sem = with_total
    sem.override(total=3)
    control.cache().clear()
    main_thread_commands.clear()
    assert control.total_in_force(sem.config) == 8  # not read yet: the settings' (and polled from now on)
    assert main_thread_commands == []
    wait_until(lambda: control.total_in_force(sem.config) == 3, message="the poller read the override")
    assert main_thread_commands == []


def test_override_total_on_every_backend(backend, settings):
    settings.SEMAPHORES = TOTAL_SEMAPHORES
    sem = semaphores["exports"]
    assert sem.override(total=3) == (2, "enforce", "override", 3)
    control.cache().clear()
    assert sem.effective() == (2, "enforce", "override", 3)  # read back from Redis
    control.cache().tick()
    assert sem.effective(fresh=True) == (2, "enforce", "override", 3)
    assert sem.clear_override() == (2, "enforce", "settings", 8)


# -- what the limit in force does ------------------------------------------------------


@pytest.mark.parametrize("algorithm", ("lua", *SEED_ALGORITHMS))
def test_limit_zero_pauses(algorithm, received):
    sem = Semaphore("pause", limit=2, timeout=5, algorithm=algorithm)
    sem.override(limit=0)
    started = time.monotonic()
    lease, retry_after = sem.try_acquire(wait=5)  # refused at once, without waiting
    assert lease is None and retry_after.reason == "paused" and retry_after >= 1
    assert time.monotonic() - started < 1
    with pytest.raises(SemaphoreFull) as caught, sem.hold():
        pass
    assert caught.value.reason == "paused" and "paused" in str(caught.value)
    assert [kw["dry_run"] for name, kw in received if name == "refused"] == [False, False]
    sem.clear_override()
    assert sem.acquire() is not None


def test_a_waiter_that_gives_up_while_paused_is_told_paused():
    sem = Semaphore("pausewait", limit=1, timeout=10)
    holder = sem.acquire()
    result = {}

    def wait():
        result["outcome"] = sem.try_acquire(wait=2.5)

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: sem.status().waiting == 1, message="waiter queued")
    assert [w.meta["pid"] for w in sem.waiters()]  # meta kept while it waits
    sem.override(limit=0)
    thread.join(10)
    lease, retry_after = result["outcome"]
    assert lease is None and retry_after.reason == "paused"
    assert sem.waiters() == []
    holder.release()


def test_reasons_full_and_timeout():
    sem = Semaphore("reasons", limit=1, timeout=10)
    sem.acquire()
    assert sem.try_acquire()[1].reason == "full"
    assert sem.try_acquire(wait=0.1)[1].reason == "timeout"
    with pytest.raises(SemaphoreFull) as caught, sem.hold(wait=0.1):
        pass
    assert caught.value.reason == "timeout"


def test_lowering_the_limit_never_evicts_a_holder():
    sem = Semaphore("lower", limit=3, timeout=10)
    leases = [sem.acquire() for _ in range(3)]
    assert all(leases)
    sem.override(limit=1)
    assert len(sem.holders()) == 3
    assert all(lease.refresh() for lease in leases)
    assert sem.status().limit == 1 and sem.available() == 0
    assert sem.acquire() is None
    leases[0].release()
    leases[1].release()
    assert sem.acquire() is None  # in use 1, limit 1
    leases[2].release()
    assert sem.acquire() is not None  # in use below the new limit


def test_raising_the_limit_admits_more():
    sem = Semaphore("raise", limit=1, timeout=10)
    assert sem.acquire() and sem.acquire() is None
    sem.override(limit=3)
    assert sem.acquire() and sem.acquire() and sem.acquire() is None


def test_a_waiter_is_served_when_the_limit_is_raised():
    sem = Semaphore("raisewait", limit=1, timeout=10)
    sem.acquire()
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("lease", sem.acquire(wait=5)))
    thread.start()
    wait_until(lambda: sem.status().waiting == 1, message="waiter queued")
    started = time.monotonic()
    sem.override(limit=2)
    thread.join(10)
    assert result["lease"] is not None
    assert time.monotonic() - started < 2  # the waiter looks again within its heartbeat


# -- dry run ------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ("lua", *SEED_ALGORITHMS))
@pytest.mark.parametrize("how", ("settings", "override", "off"))
def test_dry_run_admits_over_the_limit(algorithm, how, received):
    mode = "dry_run" if how == "settings" else "enforce"
    sem = Semaphore(f"dry-{how}", limit=1, timeout=10, algorithm=algorithm, mode=mode)
    if how == "override":
        sem.override(mode="dry_run")
    if how == "off":
        sem.override(mode="off")  # a direct acquire behaves as in "dry_run"
    first = sem.acquire()
    started = time.monotonic()
    over = [sem.acquire(wait=5) for _ in range(2)]  # never waits
    assert time.monotonic() - started < 2
    assert first.over_limit is False
    assert all(lease is not None and lease.over_limit for lease in over)
    assert len(sem.holders()) == 3  # in use above the limit
    assert sem.status().in_use == 3
    refused = [kw for name, kw in received if name == "refused"]
    assert [kw["dry_run"] for kw in refused] == [True, True]
    assert {kw["semaphore"] for kw in refused} == {sem}
    for lease in (first, *over):
        assert lease.release() is True
    sem.override(mode="enforce")
    assert sem.acquire() is not None and sem.acquire() is None  # enforced again


def test_dry_run_with_a_paused_limit_admits_everyone():
    sem = Semaphore("drypause", limit=2, timeout=10)
    sem.override(limit=0, mode="dry_run")
    lease = sem.acquire()
    assert lease is not None and lease.over_limit


def test_leases_from_before_a_dry_run_are_not_over_the_limit():
    sem = Semaphore("drymix", limit=2, timeout=10)
    a = sem.acquire()
    sem.override(mode="dry_run")
    b, c = sem.acquire(), sem.acquire()
    assert (a.over_limit, b.over_limit, c.over_limit) == (False, False, True)


# -- round trips --------------------------------------------------------------------------


@pytest.fixture
def main_thread_commands(monkeypatch):
    """The round trips the main thread makes (the scheduler's thread is left out)."""
    return count_round_trips(monkeypatch)


def _commands_per_acquire(sem, sent, n=20):
    before = len(sent)
    for _ in range(n):
        lease = sem.acquire()
        assert lease is not None
        lease.release()
    releases_and_acquires = len(sent) - before
    return releases_and_acquires / n / 2


def test_no_extra_round_trip_per_acquire(main_thread_commands, capsys):
    sem = Semaphore("trips", limit=3, timeout=10)
    sem.acquire().release()  # the first use reads the overrides once
    plain = _commands_per_acquire(sem, main_thread_commands)
    sem.override(limit=2, mode="enforce")
    main_thread_commands.clear()
    overridden = _commands_per_acquire(sem, main_thread_commands)
    assert plain == overridden == 1.0
    # Scripts, and a quiet release's plain commands: no read of the overrides.
    assert set(main_thread_commands) <= {"EVALSHA", "PIPELINE"}
    # Refused and dry-run over-limit acquires: one round trip too ("lua").
    holders = [sem.acquire(), sem.acquire()]
    main_thread_commands.clear()
    assert sem.acquire() is None
    sem.override(mode="dry_run")
    before = len(main_thread_commands)
    assert sem.acquire().over_limit
    assert main_thread_commands[before:] == ["EVALSHA"]
    assert all(holders)
    with capsys.disabled():
        print(f"\nCONTROL FIGURES commands per acquire: {plain} without override, {overridden} with")


def test_a_new_process_cache_reads_the_overrides_once(main_thread_commands):
    semaphores["reports"].override(limit=1)
    control.cache().clear()  # as a brand-new worker
    sem = semaphores["reports"]
    main_thread_commands.clear()
    assert sem.acquire() is not None and sem.acquire() is None  # the pause-like limit is seen at once
    assert main_thread_commands == ["HGETALL", "EVALSHA", "EVALSHA"]


@pytest.mark.parametrize("algorithm", SEED_ALGORITHMS)
def test_seed_dry_run_costs_round_trips_only_over_the_limit(algorithm, main_thread_commands):
    sem = Semaphore(f"seedtrips-{algorithm}", limit=1, timeout=10, algorithm=algorithm, mode="dry_run")
    sem.acquire()  # within the limit (and the overrides read once)
    main_thread_commands.clear()
    assert sem.override(limit=2).limit == 2
    main_thread_commands.clear()
    assert sem.acquire().over_limit is False  # within the limit
    within = len(main_thread_commands)
    main_thread_commands.clear()
    assert sem.acquire().over_limit is True  # refused, then granted with an unbounded limit
    over = len(main_thread_commands)
    assert over > within


# -- other processes --------------------------------------------------------------------

WATCHER = textwrap.dedent(
    """
    import sys, time
    import django
    django.setup()
    from django_semaphore import semaphores
    sem = semaphores["reports"]
    last, refused = None, None
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        effective = sem.effective()
        if effective != last:
            last = effective
            print("effective", effective.limit, effective.mode, effective.source, time.time(), flush=True)
        lease, retry_after = sem.try_acquire()
        if lease is not None:
            lease.release()
        reason = None if lease is not None else retry_after.reason
        if reason != refused:
            refused = reason
            print("refused", reason, time.time(), flush=True)
        time.sleep(0.005)
    """
)


class Watchers:
    def __init__(self, env, n):
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", WATCHER],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]
        self.lines = [[] for _ in range(n)]
        self.cond = threading.Condition()
        self.threads = [threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(n)]
        for thread in self.threads:
            thread.start()

    def _read(self, i):
        for line in self.procs[i].stdout:
            with self.cond:
                self.lines[i].append(line.split())
                self.cond.notify_all()

    def wait_for(self, match, timeout=20.0):
        """For each process, the first line matching ``match`` (a predicate), waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [next((line for line in lines if match(line)), None) for lines in self.lines]
                if all(found):
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    errors = [p.stderr.read() if p.poll() is not None else "" for p in self.procs]
                    raise AssertionError(f"not every process saw it: {self.lines} {errors}")
                self.cond.wait(remaining)

    def stop(self):
        for proc in self.procs:
            proc.kill()
            proc.wait()


def test_every_process_applies_a_change_within_a_second(subprocess_env, capsys):
    watchers = Watchers(subprocess_env, 3)
    try:
        watchers.wait_for(lambda line: line[0] == "ready")
        watchers.wait_for(lambda line: line[:4] == ["effective", "2", "enforce", "settings"])
        sem = semaphores["reports"]
        latencies = {}

        changed_at = time.time()
        sem.override(limit=0)
        seen = watchers.wait_for(lambda line: line[:3] == ["effective", "0", "enforce"])
        latencies["pause (effective)"] = [float(line[4]) - changed_at for line in seen]
        seen = watchers.wait_for(lambda line: line[:2] == ["refused", "paused"])
        latencies["pause (refused 'paused')"] = [float(line[2]) - changed_at for line in seen]

        changed_at = time.time()
        sem.override(mode="dry_run")
        seen = watchers.wait_for(lambda line: line[:3] == ["effective", "0", "dry_run"])
        latencies["mode"] = [float(line[4]) - changed_at for line in seen]

        changed_at = time.time()
        sem.clear_override()
        seen = watchers.wait_for(
            lambda line: line[0] == "effective" and line[3] == "settings" and float(line[4]) > changed_at
        )
        latencies["clear"] = [float(line[4]) - changed_at for line in seen]
    finally:
        watchers.stop()
    with capsys.disabled():
        figures = {k: [round(v, 3) for v in vs] for k, vs in latencies.items()}
        print("\nCONTROL FIGURES within-1-s latencies (s):", figures)
    for values in latencies.values():
        assert all(0 <= v < 1.0 for v in values), latencies


def test_the_poller_keeps_the_last_overrides_when_redis_fails(own_redis, settings, caplog):
    """Redis stops: the poll fails, the overrides known stay in force, one WARNING
    for the burst, and no backend_failed (a background poll is no caller's operation)."""
    sem = Semaphore("keep", limit=3, timeout=5)
    sem.override(limit=1)
    assert sem.effective() == (1, "enforce", "override", None)
    cache = control.cache()
    failures = []

    def receiver(sender, **kwargs):
        failures.append(kwargs)

    own_redis.stop()
    signals.backend_failed.connect(receiver, weak=False)
    try:
        with caplog.at_level("WARNING", logger="django_semaphore"):
            cache.tick()
            cache.tick()
    finally:
        signals.backend_failed.disconnect(receiver)
    assert cache.state(settings.SEMAPHORE_KEY_PREFIX).snapshot.overrides["keep"].limit == 1
    assert sem.effective() == (1, "enforce", "override", None)
    warnings = [r for r in caplog.records if "runtime overrides" in r.getMessage()]
    assert len(warnings) == 1  # once per burst
    assert f"127.0.0.1:{own_redis.port}" in warnings[0].getMessage()
    assert failures == []
    # Redis is back, empty (no persistence here): the next poll reads again and
    # finds no override any more.
    own_redis.start()
    cache.tick()
    assert sem.effective() == (3, "enforce", "settings", None)


def test_the_configuration_in_force_is_never_a_stale_answer(raw_redis, key_prefix, settings):
    """Each process works out a name's configuration in force once per snapshot of the
    overrides (every acquire and release asks): a change written by another process,
    new settings for the name, SEMAPHORE_ENABLED, and more names than it remembers
    each give the answer a fresh read would."""
    settings.SEMAPHORES = {**settings.SEMAPHORES, "memo": {"LIMIT": 2, "TIMEOUT": 5}}
    sem = semaphores["memo"]
    cache = control.cache()
    assert sem.effective() == (2, "enforce", "settings", None)
    assert control.cached(sem.config) == (2, "enforce", "settings", None)
    # Another process's override: this one sees it at its next poll.
    override = json.dumps({"limit": 7, "mode": None, "at": 1, "by": "x"})
    raw_redis.hset(control_key(key_prefix), "memo", override)
    assert sem.effective() == (2, "enforce", "settings", None)  # not polled yet: the cache's
    cache.tick()
    assert sem.effective() == (7, "enforce", "override", None)
    assert control.cached(sem.config) == (7, "enforce", "override", None)
    # New settings for the name (a new config): its mode, with the override's limit.
    settings.SEMAPHORES = {**settings.SEMAPHORES, "memo": {"LIMIT": 2, "TIMEOUT": 5, "MODE": "dry_run"}}
    assert sem.effective() == (7, "dry_run", "override", None)
    settings.SEMAPHORE_ENABLED = False
    assert sem.effective().mode == "off" and control.cached(sem.config).mode == "off"
    settings.SEMAPHORE_ENABLED = True
    assert sem.effective() == (7, "dry_run", "override", None)
    raw_redis.hdel(control_key(key_prefix), "memo")
    cache.tick()
    assert control.cached(sem.config) == (2, "dry_run", "settings", None)
    # More names than one snapshot remembers: each still gets its own.
    many = [Semaphore(f"memo-{n}", limit=n % 50 + 1, timeout=5) for n in range(control.RESOLVED_MAX + 10)]
    for _ in range(2):
        assert [s.effective().limit for s in many] == [n % 50 + 1 for n in range(len(many))]
    state = cache.state(key_prefix)
    assert state is not None and 0 < len(state.resolved) <= control.RESOLVED_MAX


# -- off and SEMAPHORE_ENABLED ---------------------------------------------------------


UNREACHABLE = {"URL": "redis://127.0.0.1:1/0", "OPTIONS": {"socket_connect_timeout": 0.5}}


@pytest.fixture
def unreachable(settings):
    failures = []

    def receiver(sender, **kwargs):
        failures.append(kwargs)

    signals.backend_failed.connect(receiver, weak=False)
    yield settings, failures
    signals.backend_failed.disconnect(receiver)
    connection.reset()


WEB = {
    "web-one": {"LIMIT": 1, "TIMEOUT": 5},
    "mw": {"LIMIT": 1, "TIMEOUT": 5, "PATHS": [r"^/web/hello/"]},
}


@pytest.mark.parametrize("how", ("mode_off", "disabled"))
def test_guards_pass_through_without_redis(how, unreachable, client):
    settings, failures = unreachable
    if how == "mode_off":
        settings.SEMAPHORES = {name: {**entry, "MODE": "off"} for name, entry in WEB.items()}
    else:
        settings.SEMAPHORES = WEB
        settings.SEMAPHORE_ENABLED = False
    settings.SEMAPHORE_REDIS = UNREACHABLE
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django_semaphore.middleware.SemaphoreMiddleware"]
    calls = []

    @semaphores["web-one"]
    def work(x):
        calls.append(x)
        return x * 2

    assert work(21) == 42 and calls == [21]
    assert client.get("/web/mw/pair/deco/").status_code == 200  # @semaphore("web-one")
    assert client.get("/web/hello/").status_code == 200  # the middleware's PATHS
    assert failures == []
    # A direct acquire talks to Redis (and behaves as in "dry_run" when it answers).
    with pytest.raises(SemaphoreBackendError):
        semaphores["web-one"].acquire()


@pytest.mark.asyncio
async def test_async_guard_passes_through_without_redis(unreachable):
    settings, failures = unreachable
    settings.SEMAPHORE_ENABLED = False
    settings.SEMAPHORE_REDIS = UNREACHABLE

    @Semaphore("aoff", limit=1, timeout=5)
    async def work():
        return "ran"

    assert await work() == "ran"
    assert failures == []


def test_enabled_false_makes_the_mode_off():
    sem = Semaphore("disabled", limit=1, timeout=5)
    from django.test import override_settings

    with override_settings(SEMAPHORE_ENABLED=False):
        assert sem.effective().mode == "off"
        assert sem.passes_through()
        a, b = sem.acquire(), sem.acquire()  # direct acquires: as in "dry_run"
        assert a and b and b.over_limit
    assert sem.effective().mode == "enforce" and not sem.passes_through()


def test_an_override_turns_a_guard_off_and_on(raw_redis):
    sem = Semaphore("flip", limit=1, timeout=5)
    runs = []

    @sem
    def work():
        runs.append(len(sem.holders()))

    work()
    sem.override(mode="off")
    work()
    sem.override(mode="enforce")
    work()
    assert runs == [1, 0, 1]


# -- settings -------------------------------------------------------------------------------


def test_ad_hoc_mode_is_validated():
    assert Semaphore("m", limit=1, mode="dry_run").config.mode == "dry_run"
    with pytest.raises(ValueError, match="MODE"):
        Semaphore("m", limit=1, mode="dryrun")


def test_mode_and_enabled_checks(settings):
    from django_semaphore.checks import check_settings

    settings.SEMAPHORES = {"x": {"LIMIT": 1, "MODE": "shadow"}, "y": {"LIMIT": 1, "MODE": "dry_run"}}
    settings.SEMAPHORE_ENABLED = "yes"
    messages = {m.id: m for m in check_settings()}
    assert set(messages) == {"django_semaphore.E018", "django_semaphore.E019"}
    assert "'shadow'" in messages["django_semaphore.E018"].msg and messages["django_semaphore.E018"].hint
    assert messages["django_semaphore.E019"].hint


# -- waiters -------------------------------------------------------------------------------


def test_waiters_in_serving_order_with_meta():
    sem = Semaphore("queue", limit=1, timeout=10)
    holder = sem.acquire()
    threads = []
    for n in range(3):
        thread = threading.Thread(target=sem.acquire, kwargs={"wait": 3, "meta": {"n": n}})
        thread.start()
        threads.append(thread)
        wait_until(lambda n=n: sem.status().waiting == n + 1, message="waiter queued")
    waiters = sem.waiters()
    assert [w.meta["n"] for w in waiters] == [0, 1, 2]
    assert all(w.priority == 0 and w.permits == 1 for w in waiters)
    assert [w.since for w in waiters] == sorted(w.since for w in waiters)
    assert abs(waiters[0].since.timestamp() - time.time()) < 30
    holder.release()
    for thread in threads:
        thread.join(10)
    assert sem.waiters() == []


@pytest.mark.asyncio
async def test_awaiters_and_seed_variants():
    assert await Semaphore("aw", limit=1, timeout=5).awaiters() == []
    assert Semaphore("seedw", limit=1, timeout=5, algorithm="fair").waiters() == []


# -- cluster and sentinel ----------------------------------------------------------------


def test_override_on_every_backend(backend):
    sem = Semaphore("everywhere", limit=2, timeout=5)
    assert sem.override(limit=0) == (0, "enforce", "override", None)
    assert sem.try_acquire()[1].reason == "paused"
    control.cache().clear()
    assert sem.effective() == (0, "enforce", "override", None)  # read back from Redis
    sem.override(limit=1, mode="dry_run")
    assert sem.acquire().over_limit is False and sem.acquire().over_limit is True
    control.cache().tick()  # the poller's pipeline (overrides + stats) on this backend
    assert sem.effective(fresh=True) == (1, "dry_run", "override", None)
    assert sem.clear_override() == (2, "enforce", "settings", None)


@pytest.mark.slow
def test_an_override_survives_a_sentinel_failover(redis_sentinel, settings):
    from tests.system.test_sentinel import sentinel_cache

    settings.CACHES = {**settings.CACHES, "sentinel": sentinel_cache(redis_sentinel)}
    settings.SEMAPHORE_REDIS = "sentinel"
    try:
        sem = Semaphore("failover", limit=3, timeout=5)
        assert sem.override(limit=0, mode="dry_run") == (0, "dry_run", "override", None)
        redis_sentinel.failover()
        connection.reset()
        wait_until(lambda: _fresh_or_none(sem) is not None, timeout=20, message="the new primary answering")
        assert sem.effective(fresh=True) == (0, "dry_run", "override", None)
    finally:
        connection.reset()


def _fresh_or_none(sem):
    try:
        return sem.effective(fresh=True)
    except Exception:
        return None
