"""Debian's Chromium driven by Playwright, for the browser tests.

The tests skip with a reason when /usr/bin/chromium is missing, unless
SEMAPHORE_REQUIRE_BROWSER=1 (set by .ci/run), which makes that a failure.
``playwright install`` is never used: the browser is the system package.
Set SEMAPHORE_SCREENSHOTS=<dir> to save the documentation's screenshots there
(``make screenshots`` does, with docs/images/).
"""

import contextlib
import os

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Generous: the suite runs on loaded 2-core machines. Expectations auto-wait up to this.
TIMEOUT_MS = 20_000


@contextlib.contextmanager
def chromium():
    """A launched Chromium (Playwright sync API), or a skip/failure when there is none."""
    if not os.path.exists(CHROMIUM):
        reason = f"{CHROMIUM} not found: `apt-get install chromium` to run the browser tests"
        if os.environ.get("SEMAPHORE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason} (SEMAPHORE_REQUIRE_BROWSER=1 makes this a failure).")
        pytest.skip(reason + ".")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)
    # Playwright's sync API keeps an asyncio loop running in this thread, so
    # Django would refuse the tests' (and pytest-django's) plain sync ORM calls.
    saved = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if saved is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = saved


@contextlib.contextmanager
def new_page(browser, **options):
    """A fresh context (no cookies) and page with the suite's timeouts."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, **options)
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def screenshot(page, filename, width=1440, selector="#content"):
    """Save a documentation screenshot when SEMAPHORE_SCREENSHOTS names a directory.

    The page is laid out ``width`` pixels wide and the picture ends where
    ``selector`` (the admin's content column by default) does.
    """
    directory = os.environ.get("SEMAPHORE_SCREENSHOTS")
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    size = page.viewport_size
    page.set_viewport_size({"width": width, "height": size["height"]})
    try:
        bottom = page.locator(selector).first.evaluate(
            "e => e.getBoundingClientRect().bottom + window.scrollY"
        )
        height = min(int(bottom) + 24, page.evaluate("document.documentElement.scrollHeight"))
        page.screenshot(
            path=os.path.join(directory, filename),
            full_page=True,
            clip={"x": 0, "y": 0, "width": width, "height": height},
        )
    finally:
        page.set_viewport_size(size)
