"""@semaphore (django_semaphore.decorators) with Django's test clients: sync and async
function views and class-based views get their leases, exceptions release at once."""

import threading

import pytest
from asgiref.sync import async_to_sync
from django.http import JsonResponse

from django_semaphore import semaphores, signals
from tests.support.helpers import body
from tests.support.settings_web import WEB_SEMAPHORES
from tests.support.views import probe_keys


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


# -- the basics --------------------------------------------------------------------


def test_sync_view_gets_its_lease_and_releases_it(client, events):
    response = client.get("/web/slow/?sleep=0")
    assert response.status_code == 200
    lease = body(response)["leases"]["web-slow"]
    assert lease["token"] > 0 and lease["lost"] is False
    assert semaphores["web-slow"].available() == 2
    assert [name for name, _ in events] == ["acquired", "released"]  # once each, by the core


@pytest.mark.asyncio
async def test_async_view_is_awaited_on_the_event_loop(async_client, events):
    loop_thread = threading.get_ident()
    threads = []

    def where(sender, **kwargs):
        threads.append(threading.get_ident())

    signals.acquired.connect(where)
    try:
        response = await async_client.get("/web/aslow/?sleep=0")
    finally:
        signals.acquired.disconnect(where)
    assert response.status_code == 200
    assert "web-slow" in body(response)["leases"]
    assert threads == [loop_thread]  # acquired with the asyncio client, not in a thread
    assert await semaphores["web-slow"].aavailable() == 2


def test_class_based_view(client):
    response = client.get("/web/cbv/?sleep=0")
    assert response.status_code == 200
    assert "web-slow" in body(response)["leases"]
    held = [semaphores["web-slow"].acquire() for _ in range(2)]
    response = client.get("/web/cbv/?sleep=0")
    assert response.status_code == 429
    for lease in held:
        lease.release()


@pytest.mark.asyncio
async def test_async_class_based_view(async_client):
    response = await async_client.get("/web/acbv/?sleep=0")
    assert response.status_code == 200
    assert "web-slow" in body(response)["leases"]
    held = [await semaphores["web-slow"].aacquire() for _ in range(2)]
    response = await async_client.get("/web/acbv/?sleep=0")
    assert response.status_code == 429
    for lease in held:
        await lease.arelease()


def test_decorator_keeps_the_view_name_and_declares_its_needs():
    from tests.support import views

    assert views.slow.__name__ == "slow"
    assert [need.name for need in views.pair_xy.semaphore_needs] == ["pair-x", "pair-y"]


# -- exceptions --------------------------------------------------------------------


def test_exception_in_the_view_releases_at_once(client, events):
    client.raise_request_exception = False
    response = client.get("/web/boom/")
    assert response.status_code == 500
    assert semaphores["web-one"].available() == 1
    assert [name for name, _ in events] == ["acquired", "released"]


@pytest.mark.asyncio
async def test_exception_in_an_async_view_releases_at_once(async_client):
    with pytest.raises(ValueError):
        await async_client.get("/web/aboom/")
    assert await semaphores["web-one"].aavailable() == 1


# -- the test views' own rig ---------------------------------------------------------


def test_probe_keys_are_under_the_prefix(key_prefix):
    assert all(key.startswith(key_prefix + ":") for key in probe_keys("x"))


# -- permits and priority per request ------------------------------------------------


def test_permits_and_priority_come_from_the_decorator_or_the_settings(client):
    sem = semaphores["web-weighted"]  # LIMIT 4, PERMITS 2 in tests/support/settings_web.py
    response = client.get("/web/weighted/?permits=3")
    assert response.status_code == 200
    lease = body(response)["leases"]["web-weighted"]
    assert lease["permits"] == 3 and lease["slots"] == [0, 1, 2]
    assert body(client.get("/web/weighted-settings/"))["leases"]["web-weighted"]["permits"] == 2
    held = sem.acquire(permits=3)
    try:
        assert client.get("/web/weighted-settings/").status_code == 429  # 2 > 1 free
        fits = body(client.get("/web/weighted/?permits=1"))["leases"]["web-weighted"]
        assert fits["slots"] == [3]
    finally:
        held.release()
    assert sem.available() == 4


@pytest.mark.asyncio
async def test_async_views_take_the_permits_too(async_client):
    response = await async_client.get("/web/weighted/?permits=4&vip=1")
    assert response.status_code == 200
    assert body(response)["leases"]["web-weighted"]["slots"] == [0, 1, 2, 3]


# -- TOTAL: a partition with room, a name without ----------------------------------------


def test_a_tenant_with_room_is_refused_429_when_the_total_is_reached(client, events):
    sem = semaphores["web-total"]
    held = [sem.acquire(key="a"), sem.acquire(key="b")]
    assert all(held) and sem.available() == 0
    response = client.get("/web/total/", HTTP_X_TENANT="c", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert [kwargs["retry_after"].reason for name, kwargs in events if name == "refused"] == ["total"]
    held[0].release()
    response = client.get("/web/total/", HTTP_X_TENANT="c")
    assert response.status_code == 200
    assert body(response)["leases"]["web-total"]["token"] > 0
    held[1].release()
    assert sem.available() == 2


# -- guards that pass through: SEMAPHORE_ENABLED = False, MODE "off" ---------------------------


@pytest.fixture(params=["disabled", "off"])
def passing_through(request, settings):
    if request.param == "disabled":
        settings.SEMAPHORE_ENABLED = False
    else:
        settings.SEMAPHORES = {**WEB_SEMAPHORES, "web-one": {"LIMIT": 1, "MODE": "off"}}
    return request.param


@pytest.mark.usefixtures("passing_through")
def test_a_view_that_passes_through_finds_no_leases_rather_than_no_attribute():
    """The view reads request.semaphore_leases as with fail open: empty, not an AttributeError (a 500)."""
    from django.test import RequestFactory

    from django_semaphore import semaphore

    @semaphore("web-one")
    def view(request):
        return JsonResponse({"leases": sorted(request.semaphore_leases)})

    @semaphore("web-one")
    async def aview(request):
        return JsonResponse({"leases": sorted(request.semaphore_leases)})

    held = semaphores["web-one"].acquire()  # a guard that touched Redis would refuse
    try:
        assert body(view(RequestFactory().get("/"))) == {"leases": []}
        assert body(async_to_sync(aview)(RequestFactory().get("/"))) == {"leases": []}
    finally:
        held.release()
