"""Boot-time validation: a SEMAPHORES entry that fails a system check makes the
app refuse to start, under every server, with ImproperlyConfigured naming the
entry and the check id, instead of a server that boots and answers 500s.

gunicorn and uvicorn run no system checks, so the refusal comes from
``AppConfig.ready()``.  Each server is a real subprocess on a free port, started
with DJANGO_SETTINGS_MODULE=tests.support.settings_bad; the test waits for it to exit
(or to answer, which fails the test).
"""

import os
import subprocess
import sys
import time

import httpx
import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from django_semaphore.config import settings as conf
from tests.support.servers import free_port, stop_process
from tests.support.settings_web import WEB_SEMAPHORES

pytestmark = pytest.mark.slow

BOOT_TIMEOUT = 60.0  # seconds for a server to exit or answer (a loaded 2-core machine)


def gunicorn(port):
    return [
        sys.executable,
        "-m",
        "gunicorn",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        "1",
        "--timeout",
        "60",
        "django.core.wsgi:get_wsgi_application()",
    ]


def uvicorn(port):
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "django.core.asgi:get_asgi_application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def runserver(port):
    return [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"]


def check(port):
    return [sys.executable, "-m", "django", "check"]


def boot(command, env, settings_module):
    """Start ``command``; return (exit code or None, status of GET /web/hello/ or None, stderr).

    Polls until the process exits or answers HTTP, within BOOT_TIMEOUT.
    """
    port = free_port()
    env = {**env, "DJANGO_SETTINGS_MODULE": settings_module}
    process = subprocess.Popen(
        command(port), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=env["ROOT"]
    )
    status = None
    try:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/web/hello/", timeout=2.0).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.1)  # not listening yet, or listening without a worker to answer
    finally:
        if process.poll() is None:
            stop_process(process, grace=10)
            code = None  # still running when served or at the deadline
        else:
            code = process.returncode
        stderr = process.stderr.read().decode(errors="replace")
    return code, status, stderr


@pytest.fixture
def env(subprocess_env):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**subprocess_env, "ROOT": root}


@pytest.mark.parametrize("command", [gunicorn, uvicorn, runserver, check], ids=lambda c: c.__name__)
def test_a_bad_entry_stops_the_server_from_starting(env, command):
    code, status, stderr = boot(command, env, "tests.support.settings_bad")
    print(f"{command.__name__}: exit code {code}, GET /web/hello/ -> {status}")
    assert status is None, f"served {status} (before the fix: gunicorn and uvicorn answered 500)"
    assert code not in (None, 0), stderr
    assert "ImproperlyConfigured" in stderr, stderr
    assert "SEMAPHORES['broken']" in stderr and "django_semaphore.E003" in stderr, stderr
    assert "SEMAPHORES['typo']" in stderr and "django_semaphore.E011" in stderr, stderr


@pytest.mark.parametrize("command", [gunicorn, uvicorn], ids=lambda c: c.__name__)
def test_the_same_servers_start_with_good_settings(env, command):
    # The rig's control: with tests.support.settings_web the same command serves.
    code, status, stderr = boot(command, env, "tests.support.settings_web")
    assert (code, status) == (None, 200), stderr


# -- in process ----------------------------------------------------------------------------------


def test_ready_lists_every_error_with_entry_id_message_and_hint(settings):
    settings.SEMAPHORES = {**WEB_SEMAPHORES, "broken": {"LIMIT": 0}, "typo": {"LIMIT": 2, "TIMOUT": 5}}
    settings.SEMAPHORE_FAIL_OPEN = "no"
    with pytest.raises(ImproperlyConfigured) as info:
        apps.get_app_config("django_semaphore").ready()
    text = str(info.value)
    print(text)
    lines = text.splitlines()
    assert "3 errors" in lines[0]
    assert lines[1].startswith("- SEMAPHORE_FAIL_OPEN (django_semaphore.E015): SEMAPHORE_FAIL_OPEN is 'no'")
    assert lines[2].startswith(
        "- SEMAPHORES['broken'] (django_semaphore.E003): SEMAPHORES['broken']['LIMIT'] is 0"
    )
    assert lines[3].startswith("- SEMAPHORES['typo'] (django_semaphore.E011): ")
    assert all("HINT: " in line for line in lines[1:4])


def test_warnings_do_not_stop_the_app(settings):
    settings.SEMAPHORES = {**WEB_SEMAPHORES, "old": {"LIMIT": 2, "ALGORITHM": "basic"}}  # W001
    apps.get_app_config("django_semaphore").ready()
    assert [p.id for p in conf.validated().all_problems()] == ["django_semaphore.W001"]


def test_silenced_checks_do_not_stop_the_app(settings):
    settings.SEMAPHORES = {**WEB_SEMAPHORES, "broken": {"LIMIT": 0}}
    settings.SILENCED_SYSTEM_CHECKS = ["django_semaphore.E003"]
    apps.get_app_config("django_semaphore").ready()


def test_test_settings_pass():
    assert conf.validated().boot_errors() == []
