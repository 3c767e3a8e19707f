"""The default 429 and 503 pages in a real browser (Chromium via Playwright on live_server)."""

import pytest

from django_semaphore import semaphores
from tests.support.browser import chromium, new_page, screenshot
from tests.support.servers import free_port
from tests.support.settings_web import WEB_SEMAPHORES

pytestmark = pytest.mark.browser


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


def test_429_page_in_a_browser(browser, live_server):
    from playwright.sync_api import expect

    held = semaphores["web-one"].acquire()
    try:
        with new_page(browser) as page:
            response = page.goto(f"{live_server.url}/web/boom/")
            assert response.status == 429
            assert 1 <= int(response.headers["retry-after"]) <= 5
            expect(page).to_have_title("Too many requests")
            expect(page.locator("h1")).to_have_text("This page is busy right now.")
            expect(page.locator(".retry")).to_contain_text("Try again in")
            card = page.locator("main").bounding_box()
            assert 300 < card["width"] <= 32 * 16 + 1  # a centred card, not a full-width dump
            screenshot(page, "429.png", width=900, selector="main")
    finally:
        held.release()


def test_503_page_in_a_browser(browser, live_server, settings):
    from playwright.sync_api import expect

    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0"}
    with new_page(browser) as page:
        response = page.goto(f"{live_server.url}/web/slow/?sleep=0")
        assert response.status == 503
        expect(page).to_have_title("Service unavailable")
        expect(page.locator("h1")).to_have_text("This page is temporarily unavailable.")
