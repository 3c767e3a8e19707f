"""Validating the settings (django_semaphore.validation): raw values in, SemaphoreConfig
objects and Problems out, without reading Django's settings or talking to Redis.

The system checks built on these (tests/test_checks.py) go through Django; these
call the validators directly.
"""

import re

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_semaphore import Semaphore
from django_semaphore.config import key_functions
from django_semaphore.config import settings as conf
from django_semaphore.config.validation import (
    ENTRY_DEFAULTS,
    MAX_LIMIT,
    Problem,
    checked_limit,
    is_limit,
    limit_from_text,
    resolve_key,
    validate,
    validate_entry,
    validate_key_prefix,
    validate_redis,
)
from tests.support.helpers import HOSTILE_LIMIT_TEXTS, HOSTILE_LIMITS

CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}}


def ids(problems):
    return [p.id.rsplit(".", 1)[1] for p in problems]


def test_an_entry_with_only_a_limit_gets_every_default():
    config, problems = validate_entry("reports", {"LIMIT": 2})
    assert problems == []
    assert (config.name, config.limit) == ("reports", 2)
    assert config.timeout == ENTRY_DEFAULTS["TIMEOUT"]
    assert config.timeout_ms == ENTRY_DEFAULTS["TIMEOUT"] * 1000
    assert config.wait == ENTRY_DEFAULTS["WAIT"]
    assert config.key is None and config.algorithm == "lua" and config.auto_refresh is True
    assert (config.paths, config.url_names, config.methods) == ((), frozenset(), None)


def test_a_bad_entry_gets_no_config_and_every_problem_in_check_order():
    config, problems = validate_entry("bad", {"LIMT": 3, "TIMEOUT": -1, "WAIT": "1"})
    assert config is None
    assert ids(problems) == ["E011", "E003", "E004", "E005"]
    assert all(not p.warning and "SEMAPHORES['bad']" in p.msg and p.hint for p in problems)


def test_adaptive_problems_come_after_priority_and_before_the_algorithm_support():
    config, problems = validate_entry(
        "bad", {"LIMIT": 2, "PRIORITY": 1.5, "ALGORITHM": "fair_locked", "ADAPTIVE": {"MIN": 1}}
    )
    assert config is None
    assert ids(problems) == ["E021", "E024", "E023"]
    assert "has no MAX" in problems[1].msg and "SEMAPHORES['bad']['ADAPTIVE']" in problems[1].msg


def test_adaptive_gets_its_defaults_and_a_limit_outside_its_bounds_is_a_warning():
    config, problems = validate_entry("api", {"LIMIT": 20, "ADAPTIVE": {"MIN": 2, "MAX": 8}})
    assert ids(problems) == ["W005"] and "starts at 8" in problems[0].msg
    assert config.adaptive.min == 2 and config.adaptive.max == 8
    assert (config.adaptive.interval, config.adaptive.tolerance, config.adaptive.min_samples) == (
        1.0,
        1.25,
        10,
    )
    assert config.adaptive.clamp(20) == 8 and config.adaptive.clamp(0) == 2
    assert validate_entry("fixed", {"LIMIT": 2})[0].adaptive is None


@pytest.mark.parametrize("value", [True, False])
def test_slots_true_or_false_is_kept_on_the_config(value):
    config, problems = validate_entry("gpus", {"LIMIT": 4, "SLOTS": value})
    assert problems == [] and config.slots is value
    assert ENTRY_DEFAULTS["SLOTS"] is False
    assert validate_entry("gpus", {"LIMIT": 4})[0].slots is False


@pytest.mark.parametrize("value", [1, 0, "yes", "True", None, [True]])
def test_slots_other_than_a_bool_is_e028(value):
    config, problems = validate_entry("gpus", {"LIMIT": 4, "SLOTS": value})
    assert config is None
    assert ids(problems) == ["E028"]
    assert "SEMAPHORES['gpus']['SLOTS']" in problems[0].msg and "True or False" in problems[0].msg
    assert "lease.slots" in problems[0].hint


@pytest.mark.parametrize("algorithm", ["fair_locked", "fair", "basic"])
def test_slots_true_needs_lua_and_false_goes_with_a_seed_variant(algorithm):
    config, problems = validate_entry("gpus", {"LIMIT": 4, "ALGORITHM": algorithm, "SLOTS": True})
    assert config is None
    assert ids(problems)[-1] == "E023" and "SLOTS" in problems[-1].msg
    config, problems = validate_entry("gpus", {"LIMIT": 4, "ALGORITHM": algorithm, "SLOTS": False})
    assert config is not None and config.slots is False
    assert "E023" not in ids(problems)


def test_slots_problems_come_after_adaptive_and_before_the_algorithm_support():
    config, problems = validate_entry("bad", {"LIMIT": 2, "ALGORITHM": "fair", "ADAPTIVE": 5, "SLOTS": "yes"})
    assert config is None
    assert ids(problems) == ["W001", "E024", "E028", "E023"]
    assert "ADAPTIVE, SLOTS" in problems[-1].msg


def test_an_ad_hoc_semaphore_validates_slots():
    assert Semaphore("x", limit=2, slots=True).config.slots is True
    assert Semaphore("x", limit=2).config.slots is False
    assert Semaphore("x", limit=2, algorithm="basic", slots=False).config.slots is False
    for bad in ("yes", 1, 0, None):
        with pytest.raises(ValueError, match="SLOTS"):
            Semaphore("x", limit=2, slots=bad)
    with pytest.raises(ValueError, match="SLOTS.*does not support"):
        Semaphore("x", limit=2, slots=True, algorithm="basic")


def test_a_warning_keeps_the_config():
    config, problems = validate_entry("loose", {"LIMIT": 2, "ALGORITHM": "basic"})
    assert config is not None and config.algorithm == "basic"
    assert ids(problems) == ["W001"] and problems[0].warning


def test_a_lease_shorter_than_a_millisecond_is_still_one():
    config, _ = validate_entry("tiny", {"LIMIT": 1, "TIMEOUT": 0.0001})
    assert config.timeout_ms == 1


def test_every_kind_of_key_resolves_to_a_function_of_the_request():
    def own(request):
        return "mine"

    assert resolve_key("k", None) == (None, [])
    assert resolve_key("k", "ip") == (key_functions.by_ip, [])
    assert resolve_key("k", "user") == (key_functions.by_user, [])
    assert resolve_key("k", "header:X-Tenant") == (key_functions.ByHeader("x-tenant"), [])
    assert resolve_key("k", "django_semaphore.config.key_functions.by_ip") == (key_functions.by_ip, [])
    assert resolve_key("k", own) == (own, [])
    for bad, check in [("nope", "E006"), ("header: ", "E006"), (5, "E006"), ("no_such.module.key", "E007")]:
        func, problems = resolve_key("k", bad)
        assert func is None and ids(problems) == [check], bad


def test_validate_keeps_global_and_entry_problems_apart():
    values = {
        **conf.DEFAULTS,
        "SEMAPHORE_KEY_PREFIX": "",
        "SEMAPHORES": {"good": {"LIMIT": 1}, "bad": {"LIMIT": 0}},
    }
    report = validate(values, CACHES)
    assert list(report.configs) == ["good"]
    assert ids(report.problems[None]) == ["E014"]
    assert ids(report.problems["bad"]) == ["E003"]
    assert report.problems["good"] == []


def test_a_problem_raised_carries_its_message_hint_and_id():
    problem = Problem("django_semaphore.E003", "SEMAPHORES['x'] has no LIMIT.", "Set LIMIT.")
    exc = problem.as_exception()
    assert isinstance(exc, ImproperlyConfigured)
    assert str(exc) == "SEMAPHORES['x'] has no LIMIT. HINT: Set LIMIT. (django_semaphore.E003)"


# -- limits -------------------------------------------------------------------------------


def _limit_id(value):
    return repr(value)[:24]


def test_every_limit_is_bounded_by_one_constant():
    assert MAX_LIMIT == 1_000_000
    assert is_limit(0) and is_limit(MAX_LIMIT) and not is_limit(MAX_LIMIT + 1)
    assert is_limit(1, 1) and not is_limit(0, 1)
    assert checked_limit(0) == 0 and checked_limit(MAX_LIMIT) == MAX_LIMIT


@pytest.mark.parametrize("value", HOSTILE_LIMITS, ids=_limit_id)
def test_checked_limit_takes_ints_from_0_to_a_million_only(value):
    assert not is_limit(value)
    with pytest.raises(ValueError, match="limit must be an int from 0 to 1,000,000"):
        checked_limit(value)


@pytest.mark.parametrize("text", HOSTILE_LIMIT_TEXTS, ids=_limit_id)
def test_limit_from_text_takes_ascii_digits_up_to_a_million_only(text):
    with pytest.raises(ValueError, match="--limit must be a whole number from 0 to 1,000,000") as info:
        limit_from_text(text, what="--limit")
    assert len(str(info.value)) < 200  # a 5,000-digit number is not echoed whole


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("7", 7), ("007", 7), ("1000000", MAX_LIMIT)])
def test_limit_from_text_reads_plain_digits(text, value):
    assert limit_from_text(text) == value


@pytest.mark.parametrize("value", [None, 7, 7.0, b"7"], ids=_limit_id)
def test_limit_from_text_wants_a_str(value):
    with pytest.raises(ValueError):
        limit_from_text(value)


# -- TOTAL --------------------------------------------------------------------------------

KEYED = {"LIMIT": 2, "KEY": "user"}


def test_total_with_key_is_kept_on_the_config():
    config, problems = validate_entry("exports", {**KEYED, "TOTAL": 8})
    assert problems == [] and config.total == 8
    assert validate_entry("exports", {**KEYED, "TOTAL": MAX_LIMIT})[0].total == MAX_LIMIT
    assert validate_entry("exports", {**KEYED, "TOTAL": 1})[0].total == 1  # below LIMIT: allowed
    assert ENTRY_DEFAULTS["TOTAL"] is None
    assert validate_entry("exports", KEYED)[0].total is None
    assert validate_entry("exports", {**KEYED, "TOTAL": None})[0].total is None


@pytest.mark.parametrize("value", [0, -1, 1.5, 8.0, True, False, "8", 10**6 + 1, 10**20, [8]], ids=_limit_id)
def test_total_not_an_int_from_1_to_a_million_is_e029(value):
    config, problems = validate_entry("exports", {**KEYED, "TOTAL": value})
    assert config is None
    assert ids(problems) == ["E029"]
    assert "SEMAPHORES['exports']['TOTAL']" in problems[0].msg
    assert "from 1 to 1,000,000" in problems[0].msg and "TOTAL" in problems[0].hint
    assert len(problems[0].msg) < 200  # a huge number is not echoed whole


def test_total_without_key_is_e030_in_settings_but_not_ad_hoc():
    config, problems = validate_entry("exports", {"LIMIT": 2, "TOTAL": 8})
    assert config is None
    assert ids(problems) == ["E030"]
    assert "SEMAPHORES['exports'] sets TOTAL (8) without KEY" in problems[0].msg
    assert "partitions that KEY makes" in problems[0].hint
    # An ad-hoc Semaphore's partitions are the key= values passed to acquire.
    config, problems = validate_entry("exports", {"LIMIT": 2, "TOTAL": 8}, ad_hoc=True)
    assert problems == [] and config.total == 8
    # A bad TOTAL is E029 either way (and not E030 on top).
    assert ids(validate_entry("exports", {"LIMIT": 2, "TOTAL": 0})[1]) == ["E029"]
    assert ids(validate_entry("exports", {"LIMIT": 2, "TOTAL": 0}, ad_hoc=True)[1]) == ["E029"]


def test_a_bad_key_with_total_is_reported_once():
    config, problems = validate_entry("exports", {"LIMIT": 2, "KEY": "nope", "TOTAL": 8})
    assert config is None and ids(problems) == ["E006"]  # not E030: a KEY was meant


@pytest.mark.parametrize("algorithm", ["fair_locked", "fair", "basic"])
def test_total_with_a_seed_variant_is_e023(algorithm):
    config, problems = validate_entry("exports", {**KEYED, "ALGORITHM": algorithm, "TOTAL": 8})
    assert config is None
    assert ids(problems)[-1] == "E023"
    assert "sets TOTAL, which ALGORITHM" in problems[-1].msg and "TOTAL" in problems[-1].hint
    config, problems = validate_entry("exports", {**KEYED, "ALGORITHM": algorithm, "TOTAL": None})
    assert config is not None and "E023" not in ids(problems)


def test_permits_above_total_can_never_be_granted():
    config, problems = validate_entry("exports", {"LIMIT": 4, "KEY": "user", "TOTAL": 2, "PERMITS": 3})
    assert config is None
    assert ids(problems) == ["E020"]
    assert "SEMAPHORES['exports']['PERMITS'] is 3, more than TOTAL (2)" in problems[0].msg
    assert "could never be granted" in problems[0].msg and "TOTAL" in problems[0].hint
    config, problems = validate_entry("exports", {"LIMIT": 4, "KEY": "user", "TOTAL": 2, "PERMITS": 2})
    assert problems == [] and config.permits == 2
    # A callable is judged per request, and a bad TOTAL bounds nothing.
    assert validate_entry("exports", {**KEYED, "TOTAL": 1, "PERMITS": lambda request: 2})[1] == []
    assert ids(validate_entry("exports", {**KEYED, "TOTAL": 0, "PERMITS": 2})[1]) == ["E029"]


def test_total_problems_come_after_slots_and_before_the_algorithm_support():
    config, problems = validate_entry(
        "bad", {"LIMIT": 2, "KEY": "ip", "ALGORITHM": "fair", "SLOTS": "yes", "TOTAL": 0}
    )
    assert config is None
    assert ids(problems) == ["W001", "E028", "E029", "E023"]
    assert "SLOTS, TOTAL" in problems[-1].msg


def test_an_ad_hoc_semaphore_takes_total_without_key():
    assert Semaphore("x", limit=2, total=8).config.total == 8
    assert Semaphore("x", limit=2).config.total is None
    for bad in (0, -1, 1.5, True, "8", 10**6 + 1):
        with pytest.raises(ValueError, match="TOTAL"):
            Semaphore("x", limit=2, total=bad)
    with pytest.raises(ValueError, match="TOTAL.*does not support"):
        Semaphore("x", limit=2, total=8, algorithm="fair")
    with pytest.raises(ValueError, match="more than TOTAL"):
        Semaphore("x", limit=4, total=2, permits=3)


def test_an_entry_with_a_bad_total_stops_the_app(settings):
    from django_semaphore.apps import refuse_bad_settings

    settings.SEMAPHORES = {
        "reports": {"LIMIT": 2},
        "nokey": {"LIMIT": 2, "TOTAL": 8},
        "zero": {**KEYED, "TOTAL": 0},
    }
    with pytest.raises(ImproperlyConfigured) as info:
        refuse_bad_settings()
    lines = str(info.value).splitlines()
    assert "2 errors" in lines[0] and "refuses to start" in lines[0]
    assert lines[1].startswith("- SEMAPHORES['nokey'] (django_semaphore.E030): ")
    assert lines[2].startswith("- SEMAPHORES['zero'] (django_semaphore.E029): ")
    settings.SILENCED_SYSTEM_CHECKS = ["django_semaphore.E029", "django_semaphore.E030"]
    refuse_bad_settings()  # silenced: it starts (and the entries raise when used)
    with pytest.raises(ImproperlyConfigured, match="E030"):
        conf.get_config("nokey")


def test_paths_take_str_regexes_compiled_or_not_and_refuse_bytes():
    config, problems = validate_entry("p", {"LIMIT": 1, "PATHS": [r"^/a/", re.compile(r"^/b/")]})
    assert problems == [] and [p.pattern for p in config.paths] == ["^/a/", "^/b/"]
    for bad in (b"^/a/", re.compile(b"^/a/"), bytearray(b"^/a/")):
        config, problems = validate_entry("p", {"LIMIT": 1, "PATHS": [bad]})
        assert config is None and ids(problems) == ["E010"]


@pytest.mark.parametrize(
    "value",
    [
        {"URL": "redis://localhost:6379/0", "OPTIONS": {"socket_timeout": 2, "health_check_interval": 0}},
        {"URL": "rediss://localhost:6380/0", "OPTIONS": {"ssl_cert_reqs": "required"}},
        {"URL": "unix:///tmp/redis.sock?db=1", "OPTIONS": {"socket_timeout": None}},
        {"URL": "redis://localhost:7000", "CLUSTER": True, "OPTIONS": {"read_from_replicas": True}},
    ],
)
def test_redis_urls_and_options_redis_py_takes_pass_without_connecting(value):
    assert ids(validate_redis(value, {})) == []


def test_the_key_prefix_is_measured_in_utf8_bytes():
    assert validate_key_prefix("é" * 32) == []  # 64 bytes
    assert ids(validate_key_prefix("é" * 32 + "x")) == ["E014"]  # 65 bytes, 33 characters
    assert validate_key_prefix("x" * 64) == []
