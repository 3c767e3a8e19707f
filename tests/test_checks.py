"""System checks: each bad setting is reported with its id and a hint, and
``ImproperlyConfigured`` carries the same words when it is used anyway."""

import contextlib
import math
import re
import sys
import time
from fractions import Fraction

import pytest
import redis
from django.core.checks import Error, Info, Warning, run_checks
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse

from django_semaphore import Semaphore, semaphore, semaphores
from django_semaphore.backend import connection
from tests.support.helpers import HOSTILE_LIMITS
from tests.support.servers import RedisServer, free_port, redis_server_binary

GOOD = {"LIMIT": 2, "TIMEOUT": 5}


@pytest.fixture(autouse=True)
def _unguarded_urls(settings):
    # tests.support.urls guards views with entries these tests' SEMAPHORES lack (E027 would
    # report them in every run_checks); the E027 tests set their own URLconf.
    settings.ROOT_URLCONF = "tests.support.urls_unguarded"


def ours(**kwargs):
    return [m for m in run_checks(**kwargs) if (m.id or "").startswith("django_semaphore.")]


def entry(**options):
    return {"SEMAPHORES": {"bad": {**GOOD, **options}}}


ENTRY_CASES = [
    ("E002", {"SEMAPHORES": {"bad": 5}}),
    ("E002", {"SEMAPHORES": {"bad": [("LIMIT", 2)]}}),
    ("E003", entry(LIMIT=0)),
    ("E003", entry(LIMIT=-1)),
    ("E003", entry(LIMIT="2")),
    ("E003", entry(LIMIT=True)),
    ("E003", entry(LIMIT=1.5)),
    ("E003", {"SEMAPHORES": {"bad": {"TIMEOUT": 5}}}),
    ("E004", entry(TIMEOUT=0)),
    ("E004", entry(TIMEOUT=-5)),
    ("E004", entry(TIMEOUT="60")),
    ("E004", entry(TIMEOUT=math.nan)),
    ("E004", entry(TIMEOUT=None)),
    ("E004", entry(TIMEOUT=math.inf)),  # used to pass, then fail every acquire (OverflowError)
    ("E004", entry(TIMEOUT=1e300)),
    ("E004", entry(TIMEOUT=365 * 24 * 3600 + 1)),
    ("E005", entry(WAIT=-1)),
    ("E005", entry(WAIT="1")),
    # Used to pass, then fail every guarded request (OverflowError, TypeError): a 500.
    ("E005", entry(WAIT=10**400)),
    ("E005", entry(WAIT=math.inf)),
    ("E005", entry(WAIT=math.nan)),
    ("E005", entry(WAIT=365 * 24 * 3600 + 1)),
    ("E005", entry(WAIT=Fraction(1, 3))),
    ("E005", entry(WAIT=True)),
    ("E006", entry(KEY="nope")),
    ("E006", entry(KEY=5)),
    ("E006", entry(KEY="header:")),
    ("E007", entry(KEY="no_such_module.key_func")),
    ("E007", entry(KEY="django_semaphore.config.settings.DEFAULTS")),
    ("E008", entry(ALGORITHM="redlock")),
    ("E008", entry(ALGORITHM=None)),
    ("E009", entry(AUTO_REFRESH="yes")),
    ("E010", entry(PATHS="^/api/")),
    ("E010", entry(PATHS=["("])),
    # Used to pass, then fail every request through the middleware (a 500).
    ("E010", entry(PATHS=[b"^/api/"])),
    ("E010", entry(PATHS=[re.compile(b"^/api/")])),
    ("E010", entry(PATHS=[5])),
    ("E011", entry(LIMT=3)),
    ("E012", entry(URL_NAMES="reports:export")),
    ("E012", entry(URL_NAMES=[""])),
    ("E013", entry(METHODS="POST")),
    ("E013", entry(METHODS=["FETCH"])),
    ("E020", entry(PERMITS=0)),
    ("E020", entry(PERMITS=3)),  # above LIMIT 2
    ("E020", entry(PERMITS=True)),
    ("E020", entry(PERMITS="two")),
    ("E020", entry(PERMITS="no_such_module.permits")),
    ("E021", entry(PRIORITY=1.5)),
    ("E021", entry(PRIORITY="no_such_module.priority")),
    ("E021", entry(PRIORITY=2**53)),  # used to pass, then fail every acquire (ValueError)
    ("E021", entry(PRIORITY=-(2**53))),
    ("E022", entry(MAX_WAITERS=-1)),
    ("E022", entry(MAX_WAITERS="5")),
    ("E023", entry(ALGORITHM="fair_locked", PERMITS=2)),
    ("E023", entry(ALGORITHM="fair_locked", PRIORITY=1)),
    ("E023", entry(ALGORITHM="fair_locked", MAX_WAITERS=0)),
    ("E023", entry(ALGORITHM="fair_locked", ADAPTIVE={"MIN": 1, "MAX": 4})),
    ("E023", entry(ALGORITHM="fair_locked", SLOTS=True)),
    ("E024", entry(ADAPTIVE=5)),
    ("E024", entry(ADAPTIVE={"MIN": 1})),
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "STEP": 2})),
    ("E024", entry(ADAPTIVE={"MIN": 1.5, "MAX": 4})),
    ("E024", entry(ADAPTIVE={"MIN": True, "MAX": 4})),
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "INTERVAL": 0})),
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "INTERVAL": math.inf})),
    # Used to pass, then crash the control job at every tick (OverflowError).
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "INTERVAL": 1e308})),
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "INTERVAL": 10**400})),
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "PROBE_INTERVAL": 1e308})),
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "PROBE_INTERVAL": 365 * 24 * 3600 + 1})),
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "PROBE_INTERVAL": math.nan})),
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "TOLERANCE": 1})),
    ("E024", entry(ADAPTIVE={"MIN": 1, "MAX": 4, "MIN_SAMPLES": 0})),
    ("E025", entry(ADAPTIVE={"MIN": 3, "MAX": 2})),
    ("E026", entry(ADAPTIVE={"MIN": 0, "MAX": 2})),
    ("E026", entry(ADAPTIVE={"MIN": -2, "MAX": -1})),
    ("E028", entry(SLOTS=1)),
    ("E028", entry(SLOTS=0)),
    ("E028", entry(SLOTS="yes")),
    ("E028", entry(SLOTS=None)),
    ("E029", entry(KEY="user", TOTAL=0)),
    ("E029", entry(KEY="user", TOTAL=-1)),
    ("E029", entry(KEY="user", TOTAL=1.5)),
    ("E029", entry(KEY="user", TOTAL=True)),
    ("E029", entry(KEY="user", TOTAL="8")),
    ("E029", entry(KEY="user", TOTAL=10**6 + 1)),
    ("E030", entry(TOTAL=8)),  # without KEY
    ("E023", entry(ALGORITHM="fair_locked", KEY="user", TOTAL=8)),
    ("E020", entry(KEY="user", TOTAL=1, PERMITS=2)),  # above TOTAL 1
    ("E031", entry(KEY="user", TOTAL=8, SLOTS=True)),
]
GLOBAL_CASES = [
    ("E001", {"SEMAPHORES": ["reports"]}),
    ("E002", {"SEMAPHORES": {"": GOOD}}),
    ("E002", {"SEMAPHORES": {1: GOOD}}),
    ("E014", {"SEMAPHORE_KEY_PREFIX": ""}),
    ("E014", {"SEMAPHORE_KEY_PREFIX": "a{b}"}),
    ("E014", {"SEMAPHORE_KEY_PREFIX": "has space"}),
    ("E014", {"SEMAPHORE_KEY_PREFIX": "glob*"}),
    ("E014", {"SEMAPHORE_KEY_PREFIX": "x" * 65}),
    ("E014", {"SEMAPHORE_KEY_PREFIX": "é" * 33}),  # 66 bytes: used to pass (33 characters)
    ("E014", {"SEMAPHORE_KEY_PREFIX": "\U0001f512" * 17}),  # 68 bytes
    ("E014", {"SEMAPHORE_KEY_PREFIX": "a\ud800"}),  # not UTF-8 at all
    ("E014", {"SEMAPHORE_KEY_PREFIX": 5}),
    ("E015", {"SEMAPHORE_FAIL_OPEN": "no"}),
    ("E016", {"SEMAPHORE_REJECT_VIEW": "no_such_module.view"}),
    ("E016", {"SEMAPHORE_REJECT_VIEW": "django_semaphore.config.settings.DEFAULTS"}),
    ("E017", {"SEMAPHORE_REDIS": "nocache"}),
    ("E017", {"SEMAPHORE_REDIS": 42}),
    ("E017", {"SEMAPHORE_REDIS": {"URL": "http://localhost:6379"}}),
    ("E017", {"SEMAPHORE_REDIS": {"URL": "redis://localhost", "CLUSTER": "yes"}}),
    ("E017", {"SEMAPHORE_REDIS": {"URL": "redis://localhost", "PORT": 1}}),
    # Used to pass, then fail every call with a TypeError / ValueError (a 500, even fail-open).
    ("E017", {"SEMAPHORE_REDIS": {"URL": "redis://localhost", "OPTIONS": {"bogus": 1}}}),
    ("E017", {"SEMAPHORE_REDIS": {"URL": "redis://localhost", "OPTIONS": {"socket_timeout": "abc"}}}),
    ("E017", {"SEMAPHORE_REDIS": {"URL": "redis://localhost", "OPTIONS": {"socket_connect_timeout": 0}}}),
    ("E017", {"SEMAPHORE_REDIS": {"URL": "redis://localhost:99999/0"}}),
    ("E017", {"SEMAPHORE_REDIS": {"URL": "redis://localhost/0?socket_timeout=abc"}}),
    ("E017", {"SEMAPHORE_REDIS": {"URL": "redis://[::1/0"}}),
    (
        "E017",
        {
            "SEMAPHORE_REDIS": {
                "URL": "redis://localhost",
                "CLUSTER": True,
                "OPTIONS": {"socket_timeout": "x"},
            }
        },
    ),
    (
        "E017",
        {
            "SEMAPHORE_REDIS": "locmem",
            "CACHES": {
                "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            },
        },
    ),
    # A django-redis alias whose client shards keys over several servers: used to pass,
    # then every call raised NotImplementedError (a 500, even fail-open).
    *(
        (
            "E017",
            {
                "SEMAPHORE_REDIS": "sharded",
                "CACHES": {
                    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
                    "sharded": {
                        "BACKEND": "django_redis.cache.RedisCache",
                        "LOCATION": ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0"],
                        "OPTIONS": {"CLIENT_CLASS": client_class},
                    },
                },
            },
        )
        for client_class in ("django_redis.client.ShardClient",)
    ),
]


def _apply(settings, overrides):
    for name, value in overrides.items():
        setattr(settings, name, value)


def _case_id(case):
    return case[0]


def test_the_test_settings_are_clean():
    assert ours() == []


@pytest.mark.parametrize("case", ENTRY_CASES + GLOBAL_CASES, ids=_case_id)
def test_each_bad_setting_is_reported(settings, case):
    check_id, overrides = case
    _apply(settings, overrides)
    messages = ours()
    assert [m.id for m in messages] == [f"django_semaphore.{check_id}"]
    (message,) = messages
    assert isinstance(message, Error)
    assert message.hint and message.msg
    assert "SEMAPHORE" in message.msg  # names the setting to fix


@pytest.mark.parametrize("case", ENTRY_CASES, ids=_case_id)
def test_using_a_bad_entry_raises_with_the_same_words(settings, case):
    _, overrides = case
    _apply(settings, overrides)
    (message,) = ours()
    for use in (lambda: semaphores["bad"], lambda: Semaphore("bad").acquire()):
        with pytest.raises(ImproperlyConfigured) as info:
            use()
        assert message.msg in str(info.value)
        assert message.hint in str(info.value)
        assert message.id in str(info.value)


@pytest.mark.parametrize("case", [c for c in GLOBAL_CASES if c[0] in ("E014", "E017")], ids=_case_id)
def test_using_a_bad_connection_setting_raises_with_the_same_words(settings, case):
    _, overrides = case
    _apply(settings, overrides)
    (message,) = ours()
    with pytest.raises(ImproperlyConfigured) as info:
        Semaphore("adhoc", limit=1).acquire()
    assert message.msg in str(info.value) and message.hint in str(info.value)


def _limit_id(value):
    return repr(value)[:24]


@pytest.mark.parametrize("limit", HOSTILE_LIMITS, ids=_limit_id)
def test_a_limit_above_a_million_or_not_an_int_is_e003_naming_the_bound(settings, limit):
    _apply(settings, entry(LIMIT=limit))
    (message,) = ours()
    assert message.id == "django_semaphore.E003"
    assert "1,000,000" in message.msg and "1,000,000" in message.hint


@pytest.mark.parametrize(
    "bounds",
    [
        {"MIN": 1, "MAX": 10**6 + 1},
        {"MIN": 1, "MAX": 10**20},
        {"MIN": 2**63 - 1, "MAX": 2**63 - 1},
        {"MIN": 2**53 + 1, "MAX": 2**53 + 1},
        {"MIN": -1, "MAX": 4},
    ],
    ids=_limit_id,
)
def test_adaptive_bounds_above_a_million_are_e026_naming_the_bound(settings, bounds):
    _apply(settings, entry(ADAPTIVE=bounds))
    (message,) = ours()
    assert message.id == "django_semaphore.E026"
    assert "1,000,000" in message.msg and "1,000,000" in message.hint


@pytest.mark.parametrize("bound", [1.5, "3", True, "١٢", "1_000", "+3", " 7 ", ""], ids=_limit_id)
def test_adaptive_bounds_that_are_not_ints_are_e024(settings, bound):
    for bounds in ({"MIN": bound, "MAX": 4}, {"MIN": 1, "MAX": bound}):
        _apply(settings, entry(ADAPTIVE=bounds))
        assert [m.id for m in ours()] == ["django_semaphore.E024"]


def test_a_million_is_the_largest_limit_and_adaptive_max(settings):
    settings.SEMAPHORES = {
        "wide": {"LIMIT": 10**6},
        "adaptive": {"LIMIT": 10**6, "ADAPTIVE": {"MIN": 10**6, "MAX": 10**6}},
    }
    assert ours() == []
    assert semaphores["wide"].effective() == (10**6, "enforce", "settings", None)


@pytest.mark.parametrize("algorithm", ["basic", "fair"])
def test_over_admitting_algorithms_get_a_warning(settings, algorithm):
    settings.SEMAPHORES = {"loose": {"LIMIT": 2, "ALGORITHM": algorithm}}
    (message,) = ours()
    assert isinstance(message, Warning)
    assert message.id == "django_semaphore.W001"
    assert algorithm in message.msg and "lua" in message.hint
    # A warning does not stop the semaphore from working.
    assert semaphores["loose"].acquire() is not None


def test_a_limit_outside_the_adaptive_bounds_gets_a_warning_saying_where_it_starts(settings):
    settings.SEMAPHORES = {"api": {"LIMIT": 2, "ADAPTIVE": {"MIN": 3, "MAX": 8}}}
    (message,) = ours()
    assert isinstance(message, Warning)
    assert message.id == "django_semaphore.W005"
    assert "starts at 3" in message.msg and "MIN" in message.hint
    assert semaphores["api"].effective() == (3, "enforce", "adaptive", None)  # it still works


def test_an_adaptive_entry_within_its_bounds_is_clean(settings):
    settings.SEMAPHORES = {
        "api": {"LIMIT": 4, "ADAPTIVE": {"MIN": 1, "MAX": 8}},
        "all": {
            "LIMIT": 4,
            "ADAPTIVE": {"MIN": 4, "MAX": 4, "INTERVAL": 2, "TOLERANCE": 1.5, "MIN_SAMPLES": 1},
        },
        "none": {"LIMIT": 4, "ADAPTIVE": None},
    }
    assert ours() == []


@pytest.mark.parametrize("algorithm", ["lua", "fair_locked"])
def test_correct_algorithms_get_no_warning(settings, algorithm):
    settings.SEMAPHORES = {"tight": {"LIMIT": 2, "ALGORITHM": algorithm}}
    assert ours() == []


def test_several_problems_are_all_reported(settings):
    settings.SEMAPHORES = {
        "a": {"LIMIT": 0, "TIMEOUT": -1},
        "b": {"LIMIT": 1, "ALGORITHM": "basic"},
        "c": {"LIMIT": 1},
    }
    settings.SEMAPHORE_FAIL_OPEN = 1
    ids = sorted(m.id for m in ours())
    assert ids == [
        "django_semaphore.E003",
        "django_semaphore.E004",
        "django_semaphore.E015",
        "django_semaphore.W001",
    ]
    assert semaphores["c"].acquire() is not None  # good entries keep working


def test_callable_and_dotted_keys_are_accepted(settings):
    settings.SEMAPHORES = {
        "a": {"LIMIT": 1, "KEY": lambda request: "k"},
        "b": {"LIMIT": 1, "KEY": "django_semaphore.config.key_functions.by_ip"},
        "c": {"LIMIT": 1, "KEY": "header:X-Api-Key"},
        "d": {"LIMIT": 1, "KEY": "user"},
    }
    assert ours() == []


# -- no Redis in checks, except deploy checks -----------------------------------------------


def test_checks_do_not_talk_to_redis(settings):
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0"}
    started = time.monotonic()
    assert ours() == []
    assert time.monotonic() - started < 5


def test_deploy_check_reports_an_unreachable_redis(settings):
    port = free_port()
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{port}/0"}
    ids = [m.id for m in ours(include_deployment_checks=True)]
    assert "django_semaphore.W003" in ids


def test_deploy_check_wants_socket_timeouts_on_the_alias(settings, redis_url):
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}}
    messages = but_persistence(ours(include_deployment_checks=True))
    assert [m.id for m in messages] == ["django_semaphore.W002"]
    assert "SOCKET_CONNECT_TIMEOUT" in messages[0].hint


def test_deploy_checks_pass_with_the_test_settings():
    """But for W006: the session's throwaway server persists nothing, on purpose."""
    assert [m.id for m in ours(include_deployment_checks=True)] == [PERSISTENCE]


PERSISTENCE = "django_semaphore.W006"


def but_persistence(messages):
    """``messages`` without W006 (the test servers persist nothing unless a test asks)."""
    return [m for m in messages if m.id != PERSISTENCE]


# -- maxmemory-policy (deploy) --------------------------------------------------------


@contextlib.contextmanager
def redis_with(*args):
    """A redis-server of this test's own started with ``args``; the cached clients are dropped after."""
    if not redis_server_binary():
        pytest.skip("no redis-server binary")
    with RedisServer(args=args) as server:
        try:
            yield server
        finally:
            connection.reset()


def policy_messages(**kwargs):
    return [m for m in ours(include_deployment_checks=True) if m.id in EVICTION_IDS]


EVICTION_IDS = ("django_semaphore.W004", "django_semaphore.I001")


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "allkeys-lfu", "volatile-ttl"])
def test_deploy_check_warns_when_redis_may_evict_holders(settings, policy):
    with redis_with("--maxmemory-policy", policy) as server:
        settings.SEMAPHORE_REDIS = {"URL": server.url}
        messages = but_persistence(ours(include_deployment_checks=True))
    print([(m.id, m.msg, m.hint) for m in messages])
    assert [m.id for m in messages] == ["django_semaphore.W004"]
    (message,) = messages
    assert isinstance(message, Warning)
    assert repr(policy) in message.msg and "noeviction" in message.hint
    assert "SEMAPHORE_REDIS" in message.hint


def test_deploy_check_warns_for_the_cache_alias_too(settings):
    """The default SEMAPHORE_REDIS ("default") shares the cache's Redis, typically run with an LRU policy."""
    with redis_with("--maxmemory-policy", "allkeys-lru", "--maxmemory", "100mb") as server:
        settings.CACHES = {
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": server.url,
                "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
            }
        }
        settings.SEMAPHORE_REDIS = "default"
        messages = but_persistence(ours(include_deployment_checks=True))
    assert [m.id for m in messages] == ["django_semaphore.W004"]
    assert "CACHES['default']" in messages[0].msg


def test_deploy_check_is_quiet_with_noeviction(settings):
    with redis_with("--maxmemory-policy", "noeviction", "--maxmemory", "100mb") as server:
        settings.SEMAPHORE_REDIS = {"URL": server.url}
        assert but_persistence(ours(include_deployment_checks=True)) == []


@pytest.mark.parametrize("how", ["renamed", "acl"])
def test_deploy_check_without_config_access_is_an_info_not_a_crash(settings, how):
    """Managed Redis often refuses CONFIG: say so (an info), never fail or crash `check --deploy`."""
    args = ("--maxmemory-policy", "allkeys-lru")
    if how == "renamed":
        args += ("--rename-command", "CONFIG", "CONFIG-disabled-here")
    with redis_with(*args) as server:
        url = server.url
        if how == "acl":
            with redis.Redis(port=server.port) as admin:
                admin.acl_setuser(
                    "app", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"]
                )
            url = f"redis://app:pw@127.0.0.1:{server.port}/0"
        settings.SEMAPHORE_REDIS = {"URL": url}
        messages = ours(include_deployment_checks=True)
        assert Semaphore("still-works", limit=1).acquire() is not None
    print([(m.id, m.msg, m.hint) for m in messages])
    assert [m.id for m in messages] == ["django_semaphore.I001"]
    (message,) = messages
    assert isinstance(message, Info)
    assert "maxmemory-policy" in message.msg and "noeviction" in message.hint


def test_deploy_check_reads_every_cluster_primary(settings, redis_cluster):
    node = redis_cluster.nodes[1]
    settings.SEMAPHORE_REDIS = {"URL": redis_cluster.url, "CLUSTER": True}
    with redis.Redis(port=node.port) as admin:
        assert admin.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert policy_messages() == []
        admin.config_set("maxmemory-policy", "volatile-lru")
        try:
            messages = but_persistence(ours(include_deployment_checks=True))
        finally:  # the session's cluster: put it back as it was
            admin.config_set("maxmemory-policy", "noeviction")
            connection.reset()
    print([(m.id, m.msg) for m in messages])
    assert [m.id for m in messages] == ["django_semaphore.W004"]
    assert f"'volatile-lru' on 127.0.0.1:{node.port}" in messages[0].msg
    for other in redis_cluster.nodes:
        if other is not node:
            assert f":{other.port}" not in messages[0].msg


@pytest.mark.parametrize("cluster", [False, True])
def test_deploy_check_on_an_unreachable_redis_reports_it_once(settings, cluster):
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0", "CLUSTER": cluster}
    assert [m.id for m in ours(include_deployment_checks=True)] == ["django_semaphore.W003"]


# -- persistence (deploy) ------------------------------------------------------------


def persistence_messages():
    return [m for m in ours(include_deployment_checks=True) if m.id == PERSISTENCE]


def test_deploy_check_warns_when_redis_persists_nothing(settings):
    """A restart of such a server forgets every override, an incident's pause included."""
    with redis_with() as server:  # save "" and appendonly no
        settings.SEMAPHORE_REDIS = {"URL": server.url}
        messages = ours(include_deployment_checks=True)
    print([(m.id, m.msg, m.hint) for m in messages])
    assert [m.id for m in messages] == [PERSISTENCE]
    (message,) = messages
    assert isinstance(message, Warning)
    assert "SEMAPHORE_REDIS" in message.msg and "override" in message.msg
    assert "appendonly yes" in message.hint and "save" in message.hint


def test_the_persistence_warning_names_the_cache_alias(settings):
    with redis_with() as server:
        settings.CACHES = {
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": server.url,
                "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
            }
        }
        settings.SEMAPHORE_REDIS = "default"
        (message,) = persistence_messages()
    assert "CACHES['default']" in message.msg


@pytest.mark.parametrize(
    "args",
    # Each save point its own "--save SECONDS CHANGES": Redis 6.2 ignores a quoted
    # "3600 1" and a line of several points (7.0 splits both), and ran without any.
    [
        ("--appendonly", "yes"),
        ("--save", "3600", "1"),
        ("--save", "900", "1", "--save", "300", "10", "--appendonly", "yes"),
    ],
    ids=["aof", "rdb", "both"],
)
def test_deploy_check_is_quiet_when_redis_persists(settings, args):
    with redis_with(*args) as server:
        settings.SEMAPHORE_REDIS = {"URL": server.url}
        with redis.Redis.from_url(server.url, decode_responses=True) as client:
            config = client.config_get("save") | client.config_get("appendonly")
        assert config["save"] or config["appendonly"] == "yes"  # the server persists, as asked
        assert ours(include_deployment_checks=True) == []


@pytest.mark.parametrize("how", ["renamed", "acl"])
def test_persistence_without_config_access_is_not_a_warning_or_a_crash(settings, how):
    """A managed Redis that refuses CONFIG: nothing said about persistence (I001 already
    says CONFIG cannot be read)."""
    args = ()
    if how == "renamed":
        args += ("--rename-command", "CONFIG", "CONFIG-disabled-here")
    with redis_with(*args) as server:
        url = server.url
        if how == "acl":
            with redis.Redis(port=server.port) as admin:
                admin.acl_setuser(
                    "app", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"]
                )
            url = f"redis://app:pw@127.0.0.1:{server.port}/0"
        settings.SEMAPHORE_REDIS = {"URL": url}
        messages = ours(include_deployment_checks=True)
    assert [m.id for m in messages] == ["django_semaphore.I001"]


def test_persistence_is_read_from_every_cluster_primary(settings, redis_cluster):
    node = redis_cluster.nodes[1]
    settings.SEMAPHORE_REDIS = {"URL": redis_cluster.url, "CLUSTER": True}
    (message,) = persistence_messages()
    for each in redis_cluster.nodes:
        assert f"127.0.0.1:{each.port}" in message.msg
    with redis.Redis(port=node.port) as admin:
        admin.config_set("save", "3600 1")
        try:
            (message,) = persistence_messages()
        finally:  # the session's cluster: put it back as it was
            admin.config_set("save", "")
            connection.reset()
    assert f":{node.port}" not in message.msg
    for other in redis_cluster.nodes:
        if other is not node:
            assert f"127.0.0.1:{other.port}" in message.msg


def test_scheduling_options_accept_ints_callables_and_dotted_paths(settings):
    settings.SEMAPHORES = {
        "ints": {**GOOD, "PERMITS": 2, "PRIORITY": -3, "MAX_WAITERS": 0},
        "callables": {**GOOD, "PERMITS": lambda request: 1, "PRIORITY": lambda request: 5},
        "dotted": {
            **GOOD,
            "PERMITS": "tests.support.views.permits_of",
            "PRIORITY": "tests.support.views.priority_of",
        },
        "defaults": {**GOOD, "ALGORITHM": "fair_locked", "PERMITS": 1, "PRIORITY": 0, "MAX_WAITERS": None},
    }
    assert ours() == []
    config = semaphores["ints"].config
    assert (config.permits, config.priority, config.max_waiters) == (2, -3, 0)


def test_slots_is_a_bool_and_false_goes_with_any_algorithm(settings):
    settings.SEMAPHORES = {
        "numbered": {**GOOD, "SLOTS": True},
        "plain": {**GOOD, "SLOTS": False},
        "seed": {**GOOD, "ALGORITHM": "fair_locked", "SLOTS": False},
        "default": GOOD,
    }
    assert ours() == []
    assert semaphores["numbered"].config.slots is True
    assert [semaphores[name].config.slots for name in ("plain", "seed", "default")] == [False] * 3


# -- E027: the @semaphore views of the URLconf ---------------------------------------------------


def _where_and_what(message):
    """("<view> (URL '<route>')", the first word after the colon) of an E027 message."""
    where = message.msg.split(" has ")[0].replace("The view tests.support.urls_checks.", "")
    return where, message.msg.split("...): ", 1)[1].split(" ")[0]


def test_every_guarded_view_of_the_urlconf_is_checked_against_its_entry(settings):
    settings.SEMAPHORES = {
        "chk": {"LIMIT": 4, "TIMEOUT": 5},
        "chk-seed": {"LIMIT": 4, "ALGORITHM": "fair_locked"},
    }
    settings.ROOT_URLCONF = "tests.support.urls_checks"
    messages = ours()
    assert {m.id for m in messages} == {"django_semaphore.E027"}
    assert all(isinstance(m, Error) and m.hint for m in messages)
    assert sorted(_where_and_what(m) for m in messages) == [
        ("Guarded (URL 'cbv/')", "SEMAPHORES"),  # once per URL, named by its class
        ("ok (URL 'bad-key/')", "key='no.such.module.key'"),
        ("ok (URL 'bad-priority/')", "priority='no.such.module.func'"),
        ("ok (URL 'nested/deep/')", "permits='no.such.module.permits'"),  # under include()
        ("ok (URL 'seed/')", "permits=2"),  # a seed algorithm has no permits
        ("ok (URL 'too-many/')", "permits=5"),
        ("ok (URL 'unknown/')", "SEMAPHORES"),
    ]
    (limit,) = [m for m in messages if "too-many" in m.msg]
    assert "LIMIT 4" in limit.msg and limit.hint == "Ask for at most LIMIT permits, or raise LIMIT."
    assert ours(tags=["urls"]) == messages  # Django's urls tag runs it


def _view(request):
    return HttpResponse("ok")


@pytest.mark.parametrize(
    ("arguments", "refused"),
    [
        ({"wait": 10**400}, "wait=100000000000000000000000000000…00000 is refused: it must be a number"),
        ({"wait": math.nan}, "wait=nan is refused: it must be a number"),
        ({"wait": Fraction(1, 2)}, "wait=Fraction(1, 2) is refused: it must be a number"),
        ({"wait": True}, "wait=True is refused"),
        ({"permits": 0}, "permits=0 is refused (SEMAPHORES['chk']['PERMITS'] is 0; it must be from 1"),
        ({"permits": "two"}, "permits='two' is refused (SEMAPHORES['chk']['PERMITS'] is 'two', which is not"),
        ({"priority": 2**53}, "priority=9007199254740992 is refused (SEMAPHORES['chk']['PRIORITY'] is"),
        (
            {"key": "header:"},
            "key='header:' is refused (SEMAPHORES['chk']['KEY'] is 'header:', which names no",
        ),
        (
            {"key": "userr"},
            "key='userr' is refused (SEMAPHORES['chk']['KEY'] is 'userr', which is not a known",
        ),
        ({"key": 3}, "key=3 is refused"),
    ],
)
def test_an_argument_no_entry_accepts_is_refused_when_the_decorator_is_applied(settings, arguments, refused):
    """Not at each request: gunicorn and uvicorn run no system checks, so with E027 alone
    every request to the view was a 500 (a ValueError for wait=10**400) while the server
    ran on.  The message is E027's; the entry need not exist yet (nothing here reads it)."""
    settings.SEMAPHORES = {}
    with pytest.raises(ImproperlyConfigured) as info:
        semaphore("chk", **arguments)
    message = str(info.value)
    assert message.startswith(f"@semaphore('chk', ...): {refused}")
    assert " HINT: " in message and message.endswith("(django_semaphore.E027)")


def test_a_urlconf_with_a_refused_argument_does_not_load(client, settings):
    """What a server sees at its first request: the URLconf's import raises, with the message."""
    settings.SEMAPHORES = {"chk": {"LIMIT": 1}}
    settings.ROOT_URLCONF = "tests.support.urls_bad_wait"
    with pytest.raises(ImproperlyConfigured, match=r"@semaphore\('chk', ...\): wait=1000.* is refused"):
        client.get("/huge-wait/")
    assert "tests.support.urls_bad_wait" not in sys.modules


@pytest.mark.parametrize("arguments", [{"key": "tests.support.urls_checks.later"}, {"permits": "a.b"}])
def test_a_dotted_path_is_not_imported_when_the_decorator_is_applied(arguments):
    """The view's own module may name a function it defines below the view."""
    assert semaphore("chk", **arguments)(_view)


def test_guarded_views_of_good_entries_pass(settings):
    settings.SEMAPHORES = {
        "chk": {"LIMIT": 1, "TIMEOUT": 5, "ADAPTIVE": {"MIN": 1, "MAX": 8}},  # permits=5: within MAX
        "chk-missing": {"LIMIT": 1},
        "chk-missing-cbv": {"LIMIT": 1},
        "chk-seed": {"LIMIT": 4},
    }
    settings.ROOT_URLCONF = "tests.support.urls_checks"
    # Left: the three arguments no entry accepts.
    assert sorted(_where_and_what(m)[0] for m in ours()) == [
        "ok (URL 'bad-key/')",
        "ok (URL 'bad-priority/')",
        "ok (URL 'nested/deep/')",
    ]


def test_guarded_views_are_not_checked_while_the_settings_are_bad(settings):
    settings.SEMAPHORES = {"chk": {"LIMIT": 0}}
    settings.ROOT_URLCONF = "tests.support.urls_checks"
    assert {m.id for m in ours()} == {"django_semaphore.E003"}


def test_permits_of_an_adaptive_entry_are_checked_against_its_max(settings):
    settings.SEMAPHORES = {
        "chk": {"LIMIT": 1, "ADAPTIVE": {"MIN": 1, "MAX": 4}},  # the limit moves up to 4
        "chk-missing": {"LIMIT": 1},
        "chk-missing-cbv": {"LIMIT": 1},
        "chk-seed": {"LIMIT": 4},
    }
    settings.ROOT_URLCONF = "tests.support.urls_checks"
    (too_many,) = [m for m in ours() if "too-many" in m.msg]
    assert "permits=5 is more than the entry's ADAPTIVE's MAX 4" in too_many.msg
    assert too_many.hint == "Ask for at most ADAPTIVE's MAX permits, or raise ADAPTIVE's MAX."


def test_permits_of_a_total_entry_are_checked_against_its_total(settings):
    settings.SEMAPHORES = {
        "chk": {"LIMIT": 8, "KEY": "ip", "TOTAL": 4},  # permits=5: within LIMIT, above TOTAL
        "chk-missing": {"LIMIT": 1},
        "chk-missing-cbv": {"LIMIT": 1},
        "chk-seed": {"LIMIT": 4},
    }
    settings.ROOT_URLCONF = "tests.support.urls_checks"
    (too_many,) = [m for m in ours() if "too-many" in m.msg]
    assert "permits=5 is more than the entry's TOTAL 4" in too_many.msg
    assert too_many.hint == "Ask for at most TOTAL permits, or raise TOTAL."
