"""The admin's runtime control in a real browser (Debian's Chromium via Playwright, on the
live_server): an operator sets a limit on a semaphore's page, sees it in force, and finds the
change in the semaphore's history. Takes docs/images/admin-runtime-control.png when
SEMAPHORE_SCREENSHOTS is set (``make screenshots``)."""

import threading

import pytest
from django.contrib.auth.models import Permission, User

from django_semaphore import semaphores
from django_semaphore.runtime import stats
from django_semaphore.runtime.control import Effective
from tests.support.browser import chromium, new_page, screenshot
from tests.support.helpers import release_all, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PAGE = "/admin/django_semaphore/semaphore/reports/"
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = {
        "reports": {"LIMIT": 3, "TIMEOUT": 60},
        "exports": {"LIMIT": 2, "TIMEOUT": 60, "MODE": "dry_run"},
    }


def _operator():
    user = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    for codename in ("view_semaphore", "change_semaphore"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


@pytest.fixture
def busy():
    """ "reports" full with three holders, one caller queueing, a refusal and two hold times."""
    reports = semaphores["reports"]
    for i in range(2):  # two leases released: hold times for p50 / p95
        lease = reports.acquire(meta={"job": f"warm-up-{i}"})
        lease.release()
    held = [
        reports.acquire(meta={"user": name, "method": "GET", "path": path, "remote_addr": addr})
        for name, path, addr in (
            ("alice", "/reports/q3/", "10.0.0.11"),
            ("bob", "/reports/export/", "10.0.0.12"),
            ("carol", "/reports/q4/", "10.0.0.13"),
        )
    ]
    assert all(held)
    assert reports.acquire(wait=0) is None  # refused
    got = []
    waiter = threading.Thread(
        target=lambda: got.append(
            reports.acquire(wait=60, meta={"user": "dave", "method": "POST", "path": "/reports/annual/"})
        )
    )
    waiter.start()
    try:
        wait_until(reports.waiters, message="dave queueing")
        wait_until(
            lambda: (r := stats.recent(reports)).refused >= 1 and r.samples >= 2,
            message="the refusal and hold times flushed to Redis",
        )
        yield held
    finally:
        reports.clear_override()
        release_all(held, waiter, got)


def test_operator_sets_a_limit_and_finds_it_in_the_history(browser, live_server, busy):
    from playwright.sync_api import expect

    _operator()
    with new_page(browser) as page:
        page.goto(f"{live_server.url}/admin/login/?next={PAGE}")
        page.fill("#id_username", "operator")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        expect(page).to_have_url(f"{live_server.url}{PAGE}")

        in_force = page.locator("#sema-in-force")
        expect(in_force.locator(".sema-effective-limit")).to_have_text("3")
        expect(in_force.locator(".sema-source")).to_have_text("settings")
        expect(page.locator("#sema-recent .sema-refused")).to_have_text("1")
        expect(page.locator("tr.sema-waiter .field-user")).to_have_text("dave")

        form = page.locator("#sema-control")
        expect(form.get_by_label("Limit")).to_have_value("3")
        form.get_by_label("Limit").fill("2")
        form.get_by_role("button", name="Apply to every process").click()

        expect(page.locator(".messagelist")).to_contain_text("Set limit 3 -> 2, mode enforce -> enforce.")
        expect(in_force.locator(".sema-effective-limit")).to_have_text("2")
        expect(in_force.locator(".sema-source")).to_have_text("override")
        expect(page.locator("#sema-control").get_by_label("Limit")).to_have_value("2")
        assert semaphores["reports"].effective() == Effective(2, "enforce", "override")
        # Lowering the limit evicts nobody: the three holders are still listed.
        expect(page.locator("tr.sema-holder")).to_have_count(3)
        screenshot(page, "admin-runtime-control.png")

        page.get_by_role("link", name="History").click()
        expect(page).to_have_url(f"{live_server.url}{PAGE}history/")
        rows = page.locator("#change-history tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("operator")
        expect(rows.first).to_contain_text("Set limit 3 -> 2, mode enforce -> enforce.")

        page.goto(f"{live_server.url}/admin/")
        expect(page.locator("#recent-actions-module")).to_contain_text("reports")
