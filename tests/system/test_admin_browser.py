"""The admin pages in a real browser: Debian's Chromium via Playwright, on pytest-django's live_server."""

import re
import threading

import pytest
from django.contrib.auth.models import Permission, User

from django_semaphore import semaphores
from django_semaphore.admin import SemaphoreAdmin
from django_semaphore.backend.keys import key_hash
from tests.support.browser import chromium, new_page, screenshot
from tests.support.helpers import release_all, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIST_PATH = "/admin/django_semaphore/semaphore/"
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = {
        "reports": {"LIMIT": 4, "TIMEOUT": 60},
        "per-user": {"LIMIT": 1, "TIMEOUT": 60, "KEY": "user"},
        "api": {"LIMIT": 5, "TIMEOUT": 60, "PATHS": [r"^/api/"]},
    }


def _user(username, *perms, superuser=False):
    if superuser:
        return User.objects.create_superuser(username, password=PASSWORD)
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def _login(page, live_server, username, next_path="/admin/"):
    page.goto(f"{live_server.url}/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")


@pytest.fixture
def holders():
    """Holders as the web layer records them: three on "reports", one per-user partition, one "api"."""
    reports = semaphores["reports"]
    leases = [
        reports.acquire(
            meta={"user": "alice", "method": "GET", "path": "/reports/q3/", "remote_addr": "10.0.0.11"}
        ),
        reports.acquire(
            meta={"user": "bob", "method": "POST", "path": "/reports/export/", "remote_addr": "10.0.0.12"}
        ),
        reports.acquire(
            meta={"user": "carol", "method": "GET", "path": "/reports/q4/", "remote_addr": "10.0.0.13"}
        ),
        semaphores["per-user"].acquire(
            key="user:42", meta={"user": "dave", "method": "GET", "path": "/me/", "remote_addr": "10.0.0.14"}
        ),
        semaphores["api"].acquire(
            meta={"method": "PUT", "path": "/api/items/7/", "remote_addr": "10.0.0.15"}
        ),
    ]
    assert all(leases)
    yield leases
    for lease in leases:
        lease.release()


def test_login_find_semaphores_see_holders_and_force_release(browser, live_server, holders):
    from playwright.sync_api import expect

    _user("admin", superuser=True)
    alice, bob, carol, dave, api = holders
    with new_page(browser) as page:
        _login(page, live_server, "admin")
        expect(page).to_have_url(f"{live_server.url}/admin/")
        page.locator("tr.model-semaphore").get_by_role("link", name="Semaphores", exact=True).click()
        expect(page).to_have_url(f"{live_server.url}{LIST_PATH}")

        reports_row = page.locator('tbody[data-semaphore="reports"] tr').first
        expect(reports_row.locator(".field-in_use")).to_have_text("3")
        expect(reports_row.locator(".field-free")).to_have_text("1")
        expect(reports_row.locator(".sema-pct")).to_have_text("75%")
        per_user = page.locator('tbody[data-semaphore="per-user"]')
        expect(per_user.locator(".field-partition")).to_have_text("user:42")
        screenshot(page, "admin-semaphores.png")

        page.get_by_role("link", name="reports", exact=True).click()
        expect(page).to_have_url(f"{live_server.url}{LIST_PATH}reports/")
        rows = page.locator("tr.sema-holder")
        expect(rows).to_have_count(3)
        # Token order, with the web layer's meta and the engine's host and pid.
        expect(rows.locator(".field-token")).to_have_text(
            [str(alice.token), str(bob.token), str(carol.token)]
        )
        expect(rows.locator(".field-user")).to_have_text(["alice", "bob", "carol"])
        meta = rows.nth(1).locator(".field-meta")
        expect(meta.locator("dt")).to_have_text(["method", "path", "remote_addr", "host", "pid"])
        expect(meta.locator('[data-key="method"] dd')).to_have_text("POST")
        expect(meta.locator('[data-key="path"] dd')).to_have_text("/reports/export/")
        expect(meta.locator('[data-key="remote_addr"] dd')).to_have_text("10.0.0.12")
        expect(meta.locator('[data-key="host"] dd')).to_have_text(bob_host(bob))
        expect(meta.locator('[data-key="pid"] dd')).to_have_text(re.compile(r"^\d+$"))
        expect(rows.nth(1).locator(".field-expires_in")).to_have_text(re.compile(r"^\d+ s$"))
        for lease in holders:
            assert lease.identifier not in page.content()
        screenshot(page, "admin-holders.png")

        rows.filter(has_text="bob").get_by_role("button", name="Force release").click()
        expect(page.locator(".messagelist")).to_contain_text(f"Released token {bob.token}")
        expect(rows).to_have_count(2)
        expect(rows.locator(".field-user")).to_have_text(["alice", "carol"])
        assert [h.token for h in semaphores["reports"].holders()] == [alice.token, carol.token]
        assert bob.refresh() is False

        # The admin's history knows who did it.
        page.goto(f"{live_server.url}/admin/")
        expect(page.locator("#recent-actions-module")).to_contain_text("reports")


# TOTAL: at most 2 exports per user, 3 across all users.
EXPORTS = {"LIMIT": 2, "TIMEOUT": 60, "KEY": "user", "TOTAL": 3, "WAIT": 60}


@pytest.fixture
def exports(settings):
    """ "exports" with its total reached: alice holds 2, bob 1, and carol waits (her
    partition has room, the total has none); released at the end."""
    settings.SEMAPHORES = {**settings.SEMAPHORES, "exports": EXPORTS}
    sem = semaphores["exports"]

    def web(user, path):
        return {"user": user, "method": "POST", "path": path, "remote_addr": "10.0.0.21"}

    held = [
        sem.acquire(key="alice", meta=web("alice", "/exports/orders.csv")),
        sem.acquire(key="alice", meta=web("alice", "/exports/invoices.csv")),
        sem.acquire(key="bob", meta=web("bob", "/exports/customers.csv")),
    ]
    assert all(held)
    got = []
    waiter = threading.Thread(
        target=lambda: got.append(sem.acquire(key="carol", wait=60, meta=web("carol", "/exports/stock.csv")))
    )
    waiter.start()
    try:
        wait_until(lambda: sem.waiters("carol"), message="carol queueing")
        yield held, got
    finally:
        sem.clear_override()
        release_all(held, waiter, got)


def test_a_total_name_shows_its_total_above_its_partitions_and_serves_the_waiter(
    browser, live_server, exports
):
    from playwright.sync_api import expect

    held, got = exports
    alice_first = held[0]
    _user("admin", superuser=True)
    with new_page(browser) as page:
        _login(page, live_server, "admin", LIST_PATH)
        group = page.locator('tbody[data-semaphore="exports"]')
        total_row = group.locator("tr.sema-total")
        expect(total_row.locator(".field-partition")).to_have_text("total all partitions")
        expect(total_row.locator(".field-limit")).to_have_text("3")
        expect(total_row.locator(".field-in_use")).to_have_text("3")
        expect(total_row.locator(".field-waiting")).to_have_text("1")
        expect(total_row.locator(".sema-pct")).to_have_text("100%")
        # Then each partition against its LIMIT: never the whole name's keys as a partition.
        partitions = group.locator("tr[data-partition]")
        expect(partitions.locator(".field-partition")).to_have_text(["alice", "bob", "carol"])
        expect(partitions.locator(".field-limit")).to_have_text(["2", "2", "2"])
        expect(partitions.locator(".field-in_use")).to_have_text(["2", "1", "0"])
        expect(partitions.locator(".field-free")).to_have_text(["0", "0", "0"])
        expect(group.locator('[data-partition="+"]')).to_have_count(0)

        group.get_by_role("link", name="exports", exact=True).click()
        expect(page).to_have_url(f"{live_server.url}{LIST_PATH}exports/")
        total = page.locator("#sema-total")
        expect(total.locator(".sema-bar")).to_have_attribute("aria-valuemax", "3")
        expect(total.locator(".sema-pct")).to_have_text("100%")
        expect(total).to_contain_text("3 of 3 in use · 0 free · 1 waiting, all partitions together")
        expect(page.locator("#sema-in-force .sema-effective-total")).to_have_text("3")
        blocks = page.locator("section.sema-partition-block")
        expect(blocks.locator(".sema-partition-title").first).to_contain_text("alice")
        expect(blocks).to_have_count(3)
        # The total's bar comes first, above the partitions.
        above = page.evaluate(
            "() => document.querySelector('#sema-total').getBoundingClientRect().bottom"
            " <= document.querySelector('section.sema-partition-block').getBoundingClientRect().top"
        )
        assert above
        alice, bob, carol = blocks.nth(0), blocks.nth(1), blocks.nth(2)
        expect(alice.locator("tr.sema-holder .field-token")).to_have_text(
            [str(held[0].token), str(held[1].token)]
        )
        expect(alice.locator(".sema-figures-text")).to_contain_text("2 of 2 in use")
        expect(bob.locator(".sema-figures-text")).to_contain_text("total reached")
        expect(carol.locator("tr.sema-waiter .field-user")).to_have_text("carol")
        expect(carol.locator('tr.sema-waiter [data-key="path"] dd')).to_have_text("/exports/stock.csv")
        for lease in held:
            assert lease.identifier not in page.content()
        screenshot(page, "admin-total.png")

        # An operator frees one of alice's permits: it goes to carol, whose partition has room.
        alice.locator("tr.sema-holder").first.get_by_role("button", name="Force release").click()
        expect(page.locator(".messagelist")).to_contain_text(f"Released token {alice_first.token}")
        wait_until(lambda: got and got[0] is not None, message="carol served")
        page.reload()
        for user in ("alice", "bob", "carol"):  # one holder each (listed in key hash order)
            block = page.locator(f'section.sema-partition-block[data-partition="{key_hash(user)}"]')
            expect(block.locator("tr.sema-holder .field-user")).to_have_text(user)
        expect(page.locator("tr.sema-waiter")).to_have_count(0)
        expect(page.locator("#sema-total")).to_contain_text("3 of 3 in use · 0 free · 0 waiting")
        assert alice_first.refresh() is False

        # Runtime control of the total: every process admits up to 4 from now on.
        form = page.locator("#sema-control")
        expect(form.get_by_label("Total")).to_have_value("3")
        form.get_by_label("Total").fill("4")
        form.get_by_role("button", name="Apply to every process").click()
        expect(page.locator(".messagelist")).to_contain_text(
            "Set limit 2 -> 2, mode enforce -> enforce, total 3 -> 4."
        )
        expect(page.locator("#sema-in-force .sema-effective-total")).to_have_text("4")
        expect(page.locator("#sema-total")).to_contain_text("3 of 4 in use · 1 free")
        assert semaphores["exports"].effective().total == 4


def bob_host(lease):
    return semaphores["reports"].holders()[1].meta["host"]


def test_figures_refresh_without_a_reload(browser, live_server, holders, monkeypatch):
    from playwright.sync_api import expect

    monkeypatch.setattr(SemaphoreAdmin, "refresh_interval", 1)  # seconds; the default is 3
    _user("admin", superuser=True)
    with new_page(browser) as page:
        _login(page, live_server, "admin", LIST_PATH + "reports/")
        rows = page.locator("tr.sema-holder")
        expect(rows).to_have_count(3)
        page.evaluate("window.notReloaded = true")

        holders[0].release()
        expect(rows).to_have_count(2)
        expect(page.locator(".sema-figures")).to_contain_text("2 of 4 in use")
        newcomer = semaphores["reports"].acquire(meta={"user": "erin", "method": "GET", "path": "/x/"})
        try:
            expect(rows.last.locator(".field-user")).to_have_text("erin")
            expect(rows.last.locator(".field-token")).to_have_text(str(newcomer.token))
        finally:
            newcomer.release()
        assert page.evaluate("window.notReloaded") is True

        page.goto(live_server.url + LIST_PATH)
        cell = page.locator('tbody[data-semaphore="reports"] .field-in_use')
        expect(cell).to_have_text("2")
        page.evaluate("window.notReloaded = true")
        holders[1].release()
        expect(cell).to_have_text("1")
        assert page.evaluate("window.notReloaded") is True


def test_a_refresh_never_moves_another_holder_under_the_button_aimed_at(
    browser, live_server, holders, monkeypatch
):
    """The figures refresh while the operator aims at a Force release button: when a holder
    above left meanwhile, the refresh moved the next holder's row (and button) under the
    pointer, and the click released that one instead (carol, not bob). A refresh waits
    while a button of the figures is hovered or focused."""
    from playwright.sync_api import expect

    monkeypatch.setattr(SemaphoreAdmin, "refresh_interval", 0.5)  # seconds; the default is 3
    _user("admin", superuser=True)
    alice, bob, carol = holders[:3]
    with new_page(browser) as page:
        _login(page, live_server, "admin", LIST_PATH + "reports/")
        rows = page.locator("tr.sema-holder")
        expect(rows).to_have_count(3)
        box = rows.nth(1).get_by_role("button", name="Force release").bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(x, y)  # the operator aims at bob's button
        alice.release()  # meanwhile, the first holder leaves
        page.wait_for_timeout(2000)  # several refreshes are due
        page.mouse.down()
        page.mouse.up()
        expect(page.locator(".messagelist")).to_contain_text(f"Released token {bob.token}")
        assert [h.token for h in semaphores["reports"].holders()] == [carol.token]
        # Once the pointer is elsewhere the figures refresh again.
        page.mouse.move(0, 0)
        carol.release()
        expect(rows).to_have_count(0)
        expect(page.locator(".sema-figures")).to_contain_text("0 of 4 in use")


def test_view_only_user_sees_holders_but_no_buttons_or_identifiers(browser, live_server, holders):
    from playwright.sync_api import expect

    _user("viewer", "view_semaphore")
    with new_page(browser) as page:
        _login(page, live_server, "viewer")
        page.locator("tr.model-semaphore").get_by_role("link", name="Semaphores", exact=True).click()
        page.get_by_role("link", name="reports", exact=True).click()
        expect(page.locator("tr.sema-holder .field-user")).to_have_text(["alice", "bob", "carol"])
        expect(page.locator("#content-main").get_by_role("button")).to_have_count(0)
        html = page.content()
        for lease in holders:
            assert lease.identifier not in html
        status = page.request.get(f"{live_server.url}{LIST_PATH}reports/status.json")
        assert status.ok and all(lease.identifier not in status.text() for lease in holders)


def test_staff_without_view_permission(browser, live_server, holders):
    from playwright.sync_api import expect

    _user("staff")
    with new_page(browser) as page:
        _login(page, live_server, "staff")
        expect(page).to_have_url(f"{live_server.url}/admin/")
        expect(page.locator("tr.model-semaphore")).to_have_count(0)
        expect(page.locator("#content-main")).to_contain_text("You don’t have permission")
        response = page.goto(live_server.url + LIST_PATH)
        assert response.status == 403
        response = page.goto(f"{live_server.url}{LIST_PATH}reports/")
        assert response.status == 403
        assert all(lease.identifier not in page.content() for lease in holders)


def test_anonymous_is_sent_to_the_login_page(browser, live_server):
    from playwright.sync_api import expect

    with new_page(browser) as page:
        page.goto(f"{live_server.url}{LIST_PATH}reports/")
        expect(page).to_have_url(
            re.compile(r"/admin/login/\?next=/admin/django_semaphore/semaphore/reports/$")
        )
        expect(page.locator("#id_username")).to_be_visible()


@pytest.mark.django_db(transaction=False)
def test_a_missing_browser_skips_locally_and_fails_in_ci(monkeypatch):
    from tests.support import browser

    monkeypatch.setattr(browser, "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv("SEMAPHORE_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"), browser.chromium():
        pass
    monkeypatch.setenv("SEMAPHORE_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="SEMAPHORE_REQUIRE_BROWSER=1"), browser.chromium():
        pass


# Every box from the holder table up to the page: none may need a horizontal scrollbar.
OVERFLOW_JS = """(selector) => {
    const table = document.querySelector(selector);
    const boxes = [];
    for (let e = table.parentElement; e; e = e.parentElement) {
        boxes.push({
            box: e.id ? '#' + e.id : e.tagName.toLowerCase() + '.' + [...e.classList].join('.'),
            overflow: e.scrollWidth - e.clientWidth,
        });
    }
    const columns = [...table.querySelectorAll('thead th')].map(
        th => th.textContent.trim() + ' ' + Math.round(th.getBoundingClientRect().width));
    return {table: Math.round(table.getBoundingClientRect().width), columns, boxes};
}"""


@pytest.mark.parametrize("width", [1280, 1024, 768, 390])
def test_holder_table_fits_its_container(browser, live_server, holders, width):
    """No horizontal overflow at a common desktop width and narrower ones, with long meta values."""
    from playwright.sync_api import expect

    _user("admin", superuser=True)
    long_meta = {
        "job": "nightly-report",
        "path": "/reports/" + "very-long-segment/" * 20,
        "trace": "x" * 400,
        "query": "&".join(f"filter{n}=value{n}" for n in range(40)),
        **{f"extra_{n}": f"value number {n}" for n in range(12)},
    }
    extra = semaphores["reports"].acquire(meta=long_meta)
    assert extra
    try:
        with new_page(browser) as page:
            page.set_viewport_size({"width": width, "height": 800})
            _login(page, live_server, "admin", LIST_PATH + "reports/")
            expect(page.locator("tr.sema-holder")).to_have_count(4)
            page.wait_for_load_state("load")  # every stylesheet and script applied
            measured = page.evaluate(OVERFLOW_JS, "table.sema-holders")
            print(f"viewport {width}px:", measured)
            worst = max(measured["boxes"], key=lambda b: b["overflow"])
            assert worst["overflow"] <= 0, f"{worst['box']} overflows by {worst['overflow']} px: {measured}"
    finally:
        extra.release()


@pytest.mark.parametrize("width", [1280, 768, 390])
def test_list_page_never_scrolls_sideways(browser, live_server, holders, width):
    """The list page's table may scroll inside its own box (as Django's changelists do), the page never."""
    from playwright.sync_api import expect

    _user("admin", superuser=True)
    with new_page(browser) as page:
        page.set_viewport_size({"width": width, "height": 800})
        _login(page, live_server, "admin", LIST_PATH)
        expect(page.locator("tbody.sema-group")).to_have_count(3)
        page.wait_for_load_state("load")
        measured = page.evaluate(OVERFLOW_JS, "table.sema-table")
        print(f"viewport {width}px:", measured)
        outside = [b for b in measured["boxes"] if not b["box"].startswith("div.results")]
        worst = max(outside, key=lambda b: b["overflow"])
        assert worst["overflow"] <= 0, f"{worst['box']} overflows by {worst['overflow']} px: {measured}"
