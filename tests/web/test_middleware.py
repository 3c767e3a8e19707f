"""SemaphoreMiddleware: PATHS, URL_NAMES, METHODS, all-or-none, sync and async."""

import json
import logging
import threading

import pytest

from django_semaphore import semaphores, signals
from django_semaphore.web.middleware import SemaphoreMiddleware
from tests.support.settings_web import MIDDLEWARE, WEB_SEMAPHORES


@pytest.fixture(autouse=True)
def web_settings(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES
    settings.MIDDLEWARE = MIDDLEWARE
    assert MIDDLEWARE[-1] == "django_semaphore.middleware.SemaphoreMiddleware"


def leases(response):
    return sorted(json.loads(response.content)["leases"])


def test_is_sync_and_async_capable():
    assert SemaphoreMiddleware.sync_capable and SemaphoreMiddleware.async_capable


def test_paths_rule(client):
    assert leases(client.get("/web/mw/path/")) == ["mw-path"]
    held = semaphores["mw-path"].acquire()
    assert client.get("/web/mw/path/").status_code == 429
    assert client.get("/web/mw/none/").status_code == 200  # matches no rule
    held.release()
    assert semaphores["mw-path"].available() == 1


def test_url_names_rule_uses_the_namespaced_name(client):
    assert leases(client.get("/web/mw/named/")) == ["mw-name"]
    held = semaphores["mw-name"].acquire()
    response = client.get("/web/mw/named/", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert json.loads(response.content)["semaphore"] == "mw-name"
    held.release()


def test_methods_rule(client):
    assert leases(client.get("/web/mw/post/")) == []
    held = semaphores["mw-post"].acquire()
    assert client.get("/web/mw/post/").status_code == 200
    assert client.post("/web/mw/post/").status_code == 429
    held.release()
    assert leases(client.post("/web/mw/post/")) == ["mw-post"]


def test_unresolved_path_is_not_guarded(client):
    held = semaphores["mw-path"].acquire()
    assert client.get("/web/mw/path/nothing-here/").status_code == 404
    held.release()


def test_several_rules_all_or_none(client):
    assert leases(client.get("/web/mw/pair/")) == ["mw-a", "mw-b"]
    held = semaphores["mw-b"].acquire()
    assert client.get("/web/mw/pair/").status_code == 429
    assert semaphores["mw-a"].available() == 1  # mw-a was taken first, then given back
    held.release()
    held = semaphores["mw-a"].acquire()
    assert client.get("/web/mw/pair/").status_code == 429
    assert semaphores["mw-b"].available() == 1  # never taken
    assert client.get("/web/mw/b-only/").status_code == 200
    held.release()


def test_middleware_and_decorator_take_all_together(client):
    events = []

    def on_acquired(sender, semaphore, **kwargs):
        events.append(semaphore.name)

    signals.acquired.connect(on_acquired)
    try:
        assert leases(client.get("/web/mw/pair/deco/")) == ["mw-a", "mw-b", "web-one"]
        assert events == ["mw-a", "mw-b", "web-one"]  # one step, in global order, each once
        held = semaphores["web-one"].acquire()
        response = client.get("/web/mw/pair/deco/")
        assert response.status_code == 429
        assert semaphores["mw-a"].available() == 1
        assert semaphores["mw-b"].available() == 1
        held.release()
    finally:
        signals.acquired.disconnect(on_acquired)


def test_decorator_alone_when_no_rule_matches(client):
    assert leases(client.get("/web/slow/?sleep=0")) == ["web-slow"]


def test_exception_in_a_guarded_view_releases(client, settings):
    settings.SEMAPHORES = {**WEB_SEMAPHORES, "mw-boom": {"LIMIT": 1, "PATHS": [r"^/web/a?boom/"]}}
    client.raise_request_exception = False
    assert client.get("/web/boom/").status_code == 500
    assert semaphores["mw-boom"].available() == 1
    assert semaphores["web-one"].available() == 1


@pytest.mark.asyncio
async def test_async_stack(async_client, settings):
    threads = []

    def where(sender, **kwargs):
        threads.append(threading.get_ident())

    signals.acquired.connect(where)
    try:
        response = await async_client.get("/web/mw/apath/?sleep=0")
    finally:
        signals.acquired.disconnect(where)
    assert response.status_code == 200
    assert leases(response) == ["mw-path"]
    assert threads == [threading.get_ident()]  # on the event loop, not in a thread
    held = await semaphores["mw-path"].aacquire()
    assert (await async_client.get("/web/mw/apath/?sleep=0")).status_code == 429
    await held.arelease()
    response = await async_client.get("/web/mw/pair/deco/")
    assert leases(response) == ["mw-a", "mw-b", "web-one"]
    assert await semaphores["web-one"].aavailable() == 1


@pytest.mark.asyncio
async def test_async_exception_releases(async_client, settings):
    settings.SEMAPHORES = {**WEB_SEMAPHORES, "mw-boom": {"LIMIT": 1, "PATHS": [r"^/web/a?boom/"]}}
    with pytest.raises(ValueError):
        await async_client.get("/web/aboom/")
    assert await semaphores["mw-boom"].aavailable() == 1
    assert await semaphores["web-one"].aavailable() == 1


def test_refusal_logged_once(client, caplog):
    held = semaphores["mw-path"].acquire()
    with caplog.at_level(logging.INFO, logger="django_semaphore"):
        client.get("/web/mw/path/")
    lines = [r.getMessage() for r in caplog.records if r.name == "django_semaphore"]
    assert len(lines) == 1 and "'mw-path'" in lines[0]
    held.release()


def test_permits_are_read_per_request(client, settings):
    # PERMITS as a dotted path (request) -> int: ?permits=n
    settings.SEMAPHORES = {
        **WEB_SEMAPHORES,
        "mw-path": {
            "LIMIT": 3,
            "TIMEOUT": 30,
            "PATHS": [r"^/web/mw/a?path/"],
            "PERMITS": "tests.support.views.permits_of",
        },
    }
    sem = semaphores["mw-path"]
    held = sem.acquire(permits=2)
    try:
        assert client.get("/web/mw/path/?permits=2").status_code == 429  # 2 > 1 free
        assert client.get("/web/mw/path/?permits=1").status_code == 200
    finally:
        held.release()
    assert client.get("/web/mw/path/?permits=3").status_code == 200
    assert sem.available() == 3


def test_head_is_guarded_with_get(client, settings):
    """Django runs the GET view for HEAD (View.head defaults to get): METHODS ["GET"]
    guards HEAD too, else a flood of HEAD requests ran the guarded view unguarded."""
    settings.SEMAPHORES = {
        **WEB_SEMAPHORES,
        "mw-path": {"LIMIT": 1, "TIMEOUT": 5, "PATHS": [r"^/web/mw/path/"], "METHODS": ["GET"]},
    }
    assert client.head("/web/mw/path/").status_code == 200
    held = semaphores["mw-path"].acquire()
    try:
        assert client.get("/web/mw/path/").status_code == 429
        assert client.head("/web/mw/path/").status_code == 429
        assert client.options("/web/mw/path/").status_code == 200  # not listed
    finally:
        held.release()
