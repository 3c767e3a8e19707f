"""manage.py sema_set: runtime overrides from the terminal, against the real Redis (single and Cluster)."""

import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_semaphore import semaphores, signals
from django_semaphore.control import Effective
from django_semaphore.keys import control_key

# Every test runs on a single server and on a Redis Cluster (tests/fixtures_redis.py).
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


BAD = {
    "unknown semaphore": (
        ("nope", "--limit", "1"),
        "Unknown semaphore 'nope'. SEMAPHORES has: 'reports', 'exports'.",
    ),
    "negative limit": (("reports", "--limit", "-1"), "--limit must be a whole number >= 0"),
    "non-integer limit": (("reports", "--limit", "2.5"), "--limit must be a whole number >= 0"),
    "word limit": (("reports", "--limit", "many"), "not 'many'"),
    "unknown mode": (
        ("reports", "--mode", "loud"),
        "--mode must be one of enforce, dry_run, off, not 'loud'.",
    ),
    "good limit, unknown mode": (("reports", "--limit", "1", "--mode", "2"), "--mode must be one of"),
    "no option": (("reports",), "Nothing to do: give --limit N, --mode MODE, or --clear."),
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


def test_from_the_command_line_with_exit_code_2(subprocess_env):
    """The real manage.py: a clear message on stderr and exit code 2, nothing on stdout."""
    # --skip-checks: tests.urls guards views with entries only the web tests define (E027).
    command = [sys.executable, "-m", "django", "sema_set", "reports", "--limit", "-3", "--skip-checks"]
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--limit must be a whole number >= 0 (0 pauses the semaphore), not -3." in done.stderr
    assert done.stdout == ""
    ok = subprocess.run(
        [sys.executable, "-m", "django", "sema_set", "reports", "--mode", "dry_run", "--skip-checks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "reports: limit 2 -> 2, mode enforce -> dry_run (source settings -> override).\n"
