"""manage.py sema_set: runtime overrides from the terminal, against the real Redis (single and Cluster)."""

import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_semaphore import semaphores, signals
from django_semaphore.backend.keys import control_key
from django_semaphore.runtime.control import Effective
from tests.support.helpers import HOSTILE_LIMIT_TEXTS

# Every test runs on a single server and on a Redis Cluster (tests/support/fixtures_redis.py).
pytestmark = pytest.mark.usefixtures("backend")

SEMAPHORES = {
    "reports": {"LIMIT": 5, "TIMEOUT": 30},
    "exports": {"LIMIT": 1, "TIMEOUT": 30, "MODE": "dry_run"},
}


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = SEMAPHORES


@pytest.fixture
def stored(backend_redis, key_prefix):
    """The control HASH as Redis has it now: {name: raw JSON}."""

    def read():
        return {k.decode(): v.decode() for k, v in backend_redis.hgetall(control_key(key_prefix)).items()}

    return read


@pytest.fixture
def changes():
    """The config_changed signals sent meanwhile: (name, limit, mode, user)."""
    seen = []

    def receiver(sender, semaphore, limit, mode, user, **kwargs):
        seen.append((semaphore.name, limit, mode, user))

    signals.config_changed.connect(receiver, weak=False)
    yield seen
    signals.config_changed.disconnect(receiver)


def run(*args):
    out = StringIO()
    call_command("sema_set", *args, stdout=out, stderr=StringIO())
    return out.getvalue().splitlines()


def test_limit_prints_old_and_new_and_every_process_sees_it(stored, changes):
    assert run("reports", "--limit", "2") == [
        "reports: limit 5 -> 2, mode enforce -> enforce (source settings -> override)."
    ]
    assert semaphores["reports"].effective() == Effective(2, "enforce", "override")
    assert list(stored()) == ["reports"]
    assert changes == [("reports", 2, "enforce", None)]


def test_mode_keeps_an_earlier_limit_override(stored):
    run("reports", "--limit", "3")
    assert run("reports", "--mode", "dry_run") == [
        "reports: limit 3 -> 3, mode enforce -> dry_run (source override -> override)."
    ]
    assert semaphores["reports"].effective() == Effective(3, "dry_run", "override")


def test_limit_and_mode_together_and_zero_pauses():
    assert run("reports", "--limit", "0", "--mode", "enforce") == [
        "reports: limit 5 -> 0, mode enforce -> enforce (source settings -> override)."
    ]
    assert semaphores["reports"].acquire() is None  # paused: nobody gets a slot


def test_clear_goes_back_to_settings(stored, changes):
    run("exports", "--limit", "4", "--mode", "enforce")
    assert run("exports", "--clear") == [
        "exports: limit 4 -> 1, mode enforce -> dry_run (source override -> settings)."
    ]
    assert semaphores["exports"].effective() == Effective(1, "dry_run", "settings")
    assert stored() == {}
    assert changes == [("exports", 4, "enforce", None), ("exports", 1, "dry_run", None)]


LIMIT_ERROR = "--limit must be a whole number from 0 to 1,000,000 (0 pauses the semaphore)"
BAD = {
    "unknown semaphore": (
        ("nope", "--limit", "1"),
        "Unknown semaphore 'nope'. SEMAPHORES has: 'reports', 'exports'.",
    ),
    "negative limit": (("reports", "--limit", "-1"), LIMIT_ERROR),
    "non-integer limit": (("reports", "--limit", "2.5"), LIMIT_ERROR),
    "word limit": (("reports", "--limit", "many"), "not 'many'"),
    "unknown mode": (
        ("reports", "--mode", "loud"),
        "--mode must be one of enforce, dry_run, off, not 'loud'.",
    ),
    "good limit, unknown mode": (("reports", "--limit", "1", "--mode", "2"), "--mode must be one of"),
    "no option": (("reports",), "Nothing to do: give --limit N, --mode MODE, --total N, or --clear."),
    "clear with limit": (("reports", "--clear", "--limit", "1"), "--clear removes the whole override"),
    "clear with mode": (("reports", "--clear", "--mode", "off"), "--clear removes the whole override"),
}


@pytest.mark.parametrize(("args", "message"), BAD.values(), ids=BAD.keys())
def test_bad_arguments_are_a_command_error_and_write_nothing(args, message, stored, changes):
    run("exports", "--limit", "3")  # an override that must survive the bad call untouched
    before = stored()
    with pytest.raises(CommandError) as info:
        run(*args)
    assert message in str(info.value)
    assert info.value.returncode == 2
    assert stored() == before
    assert semaphores["reports"].effective() == Effective(5, "enforce", "settings")
    assert semaphores["exports"].effective() == Effective(3, "dry_run", "override")
    assert len(changes) == 1


@pytest.mark.parametrize("text", HOSTILE_LIMIT_TEXTS, ids=lambda text: repr(text)[:24])
def test_a_limit_that_is_not_ascii_digits_up_to_a_million_writes_nothing(text, stored, changes):
    """Not Python's lenient int(): "١٢" used to be stored as 12, "1_000" as 1000, " 7 " as 7,
    and 10**20 as -2**63 (read back as the settings' limit); with --mode, neither is applied."""
    run("exports", "--limit", "3")
    before = stored()
    for args in (("--limit", text), ("--limit", text, "--mode", "enforce")):
        with pytest.raises(CommandError) as info:
            run("exports", *args)
        assert LIMIT_ERROR in str(info.value)
        assert len(str(info.value)) < 200  # a 5,000-digit limit is not echoed whole
        assert info.value.returncode == 2
    assert stored() == before
    assert semaphores["exports"].effective() == Effective(3, "dry_run", "override")
    assert len(changes) == 1


def test_a_million_is_the_largest_limit_and_leading_zeros_are_digits(stored):
    assert run("reports", "--limit", "1000000") == [
        "reports: limit 5 -> 1000000, mode enforce -> enforce (source settings -> override)."
    ]
    assert run("reports", "--limit", "007") == [
        "reports: limit 1000000 -> 7, mode enforce -> enforce (source override -> override)."
    ]


def test_from_the_command_line_with_exit_code_2(subprocess_env):
    """The real manage.py: a clear message on stderr and exit code 2, nothing on stdout."""
    # --skip-checks: tests.support.urls guards views with entries only the web tests define (E027).
    command = [sys.executable, "-m", "django", "sema_set", "reports", "--limit", "-3", "--skip-checks"]
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.support.settings"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"{LIMIT_ERROR}, not '-3'." in done.stderr
    assert done.stdout == ""
    huge = subprocess.run(
        [*command[:-3], "--limit", "99999999999999999999999", "--mode", "dry_run", "--skip-checks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert huge.returncode == 2, huge.stderr
    assert LIMIT_ERROR in huge.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "django", "sema_set", "reports", "--mode", "dry_run", "--skip-checks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "reports: limit 2 -> 2, mode enforce -> dry_run (source settings -> override).\n"


# -- --total --------------------------------------------------------------------------------

WITH_TOTAL = {**SEMAPHORES, "shared": {"LIMIT": 2, "TIMEOUT": 30, "KEY": "user", "TOTAL": 8}}


@pytest.fixture
def with_total(settings):
    settings.SEMAPHORES = WITH_TOTAL


@pytest.fixture
def total_changes():
    """The config_changed signals sent meanwhile: (name, limit, mode, total)."""
    seen = []

    def receiver(sender, semaphore, limit, mode, total, **kwargs):
        seen.append((semaphore.name, limit, mode, total))

    signals.config_changed.connect(receiver, weak=False)
    yield seen
    signals.config_changed.disconnect(receiver)


def test_total_prints_the_total_and_keeps_the_limit(with_total, stored, total_changes):
    assert run("shared", "--total", "4") == [
        "shared: limit 2 -> 2, mode enforce -> enforce, total 8 -> 4 (source settings -> override)."
    ]
    assert semaphores["shared"].effective() == Effective(2, "enforce", "override", 4)
    assert run("shared", "--limit", "1") == [
        "shared: limit 2 -> 1, mode enforce -> enforce, total 4 -> 4 (source override -> override)."
    ]
    assert run("shared", "--total", "0", "--mode", "dry_run") == [
        "shared: limit 1 -> 1, mode enforce -> dry_run, total 4 -> 0 (source override -> override)."
    ]
    assert run("shared", "--clear") == [
        "shared: limit 1 -> 2, mode dry_run -> enforce, total 0 -> 8 (source override -> settings)."
    ]
    assert stored() == {}
    assert total_changes == [
        ("shared", 2, "enforce", 4),
        ("shared", 1, "enforce", 4),
        ("shared", 1, "dry_run", 0),
        ("shared", 2, "enforce", 8),
    ]


def test_without_total_the_output_has_no_total(with_total):
    assert run("reports", "--limit", "2") == [
        "reports: limit 5 -> 2, mode enforce -> enforce (source settings -> override)."
    ]


TOTAL_ERROR = "--total must be a whole number from 0 to 1,000,000"
BAD_TOTAL = {
    "negative total": (("shared", "--total", "-1"), TOTAL_ERROR),
    "non-integer total": (("shared", "--total", "2.5"), TOTAL_ERROR),
    "huge total": (("shared", "--total", "1000001"), TOTAL_ERROR),
    "bad total, good limit": (("shared", "--limit", "1", "--total", "x"), TOTAL_ERROR),
    "good total, bad mode": (("shared", "--total", "3", "--mode", "loud"), "--mode must be one of"),
    "no TOTAL": (("reports", "--total", "3"), "--total: semaphore 'reports' has no TOTAL"),
    "no TOTAL, with a limit": (
        ("exports", "--total", "3", "--limit", "1"),
        "semaphore 'exports' has no TOTAL",
    ),
    "clear with total": (("shared", "--clear", "--total", "1"), "--clear removes the whole override"),
}


@pytest.mark.parametrize(("args", "message"), BAD_TOTAL.values(), ids=BAD_TOTAL.keys())
def test_a_bad_total_is_a_command_error_and_writes_nothing(args, message, with_total, stored, total_changes):
    run("shared", "--total", "5")  # an override that must survive the bad call untouched
    before = stored()
    with pytest.raises(CommandError) as info:
        run(*args)
    assert message in str(info.value)
    assert info.value.returncode == 2
    assert stored() == before
    assert semaphores["shared"].effective() == Effective(2, "enforce", "override", 5)
    assert semaphores["reports"].effective() == Effective(5, "enforce", "settings")
    assert semaphores["exports"].effective() == Effective(1, "dry_run", "settings")
    assert len(total_changes) == 1


@pytest.mark.parametrize("text", HOSTILE_LIMIT_TEXTS, ids=lambda text: repr(text)[:24])
def test_a_total_that_is_not_ascii_digits_up_to_a_million_writes_nothing(text, with_total, stored):
    before = stored()
    with pytest.raises(CommandError) as info:
        run("shared", "--total", text)
    assert TOTAL_ERROR in str(info.value) and len(str(info.value)) < 200
    assert stored() == before
