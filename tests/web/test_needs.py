"""What a request needs (django_semaphore.needs): per-use KEY and WAIT overrides of
``@semaphore``, as dotted paths or callables, resolved against each request."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.test import RequestFactory

from django_semaphore import semaphore, semaphores
from django_semaphore.web.needs import Need, mark_handled, pending_needs, resolve
from tests.support.helpers import body, close
from tests.support.settings_web import MIDDLEWARE, WEB_SEMAPHORES


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


def test_key_and_wait_overrides_and_dotted_paths(client):
    response = client.get("/web/override/", REMOTE_ADDR="4.4.4.4")
    assert body(response)["leases"]["web-one"]["key"] == "4.4.4.4"
    response = client.get("/web/dotted/?tenant=blue")
    assert body(response)["leases"]["web-one"]["key"] == "blue"
    held = semaphores["web-one"].acquire(key="blue")
    assert client.get("/web/dotted/?tenant=blue").status_code == 429
    assert client.get("/web/dotted/?tenant=red").status_code == 200
    held.release()


def test_callable_key():
    seen = []

    @semaphore("web-one", key=lambda request: request.GET["k"])
    def view(request):
        seen.append(request.semaphore_leases["web-one"].key)
        return HttpResponse("ok")

    response = view(RequestFactory().get("/?k=abc"))
    close(response)
    assert seen == ["abc"]
    assert semaphores["web-one"].available() == 1


def test_resolve_gives_the_needs_in_one_global_order_once_each():
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.5")
    needs = [Need("web-ip"), Need("pair-y", wait=0.5), Need("pair-x"), Need("pair-x", wait=3)]
    items = resolve(request, needs)
    assert [(i.semaphore.name, i.key, i.wait) for i in items] == [
        ("pair-x", None, 20),  # the first need of pair-x counts; WAIT from its settings
        ("pair-y", None, 0.5),  # a per-use WAIT
        ("web-ip", "10.0.0.5", 0),  # KEY "ip": the request's address
    ]


def test_a_need_taken_care_of_is_not_taken_again():
    request = RequestFactory().get("/")
    x, y = Need("pair-x"), Need("pair-y")
    assert pending_needs(request, [x, y]) == [x, y]
    mark_handled(request, [x])  # by the middleware, or an outer decorator
    assert pending_needs(request, [x, y]) == [y]
    assert pending_needs(RequestFactory().get("/"), [x, y]) == [x, y]  # per request


def test_a_bad_key_override_is_reported_like_the_system_check():
    need = Need("web-one", key="nope")
    with pytest.raises(ImproperlyConfigured, match=r"SEMAPHORES\['web-one'\]\['KEY'\].*E006"):
        resolve(RequestFactory().get("/"), [need])


# -- KEY, PERMITS and PRIORITY callables of the project's under ASGI ------------------------------


def _users():
    from django.contrib.auth.models import User

    return User.objects.count()


def tenant_from_the_database(request):
    """A KEY that queries, as one reading the user's profile (request.user.profile.tenant_id) does."""
    return f"tenant-{_users()}"


def permits_from_the_database(request):
    return 1 + _users()


def priority_from_the_database(request):
    return _users()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("option", ["KEY", "PERMITS", "PRIORITY"])
@pytest.mark.parametrize("path", ["/web/aslow/?sleep=0", "/web/mw/path/"])
async def test_project_callables_may_query_the_database_under_asgi(async_client, settings, option, path):
    """They run in a thread, as Django runs sync code under ASGI: on the event loop a query
    raised SynchronousOnlyOperation, and every guarded request answered 500 (the middleware
    guards sync views on the loop too)."""
    settings.MIDDLEWARE = MIDDLEWARE
    name = "web-slow" if "aslow" in path else "mw-path"
    func = {"KEY": tenant_from_the_database, "PERMITS": permits_from_the_database}.get(
        option, priority_from_the_database
    )
    settings.SEMAPHORES = {**WEB_SEMAPHORES, name: {**WEB_SEMAPHORES[name], option: func}}
    response = await async_client.get(path)
    assert response.status_code == 200
    lease = body(response)["leases"][name]
    assert lease["key"] == ("tenant-0" if option == "KEY" else None)
    assert lease["permits"] == 1


# -- a KEY function returning None ---------------------------------------------------------------


def tenant_or_none(request):
    """A KEY function of the project's that gives None when the header is missing."""
    return request.headers.get("X-Tenant")


NONE_KEY_MESSAGE = (
    r"KEY function tests\.web\.test_needs\.tenant_or_none of semaphore '(web-slow|mw-path)' returned None"
)


@pytest.mark.parametrize("path", ["/web/slow/?sleep=0", "/web/mw/path/"])
def test_a_key_function_returning_none_is_a_programming_error(client, settings, path):
    """Not one partition "None" shared by every request without the header (so a missing
    `return` made a per-tenant limit one global limit, silently): a TypeError naming the
    semaphore and the function, a 500 in Django's error log, and no slot taken."""
    settings.MIDDLEWARE = MIDDLEWARE
    name = "mw-path" if "mw" in path else "web-slow"
    settings.SEMAPHORES = {**WEB_SEMAPHORES, name: {**WEB_SEMAPHORES[name], "KEY": tenant_or_none}}
    response = client.get(path, headers={"X-Tenant": "blue"})
    assert body(response)["leases"][name]["key"] == "blue"
    with pytest.raises(TypeError, match=NONE_KEY_MESSAGE):
        client.get(path)
    assert semaphores[name].holders(key="None") == semaphores[name].holders() == []


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/web/aslow/?sleep=0", "/web/mw/path/"])
async def test_a_key_function_returning_none_is_a_programming_error_under_asgi(async_client, settings, path):
    settings.MIDDLEWARE = MIDDLEWARE
    name = "mw-path" if "mw" in path else "web-slow"
    settings.SEMAPHORES = {**WEB_SEMAPHORES, name: {**WEB_SEMAPHORES[name], "KEY": tenant_or_none}}
    with pytest.raises(TypeError, match=NONE_KEY_MESSAGE):
        await async_client.get(path)
    assert await semaphores[name].aholders(key="None") == await semaphores[name].aholders() == []


def test_a_key_override_returning_none_is_a_programming_error():
    @semaphore("web-one", key=lambda request: None)
    def view(request):
        return HttpResponse("ok")

    with pytest.raises(TypeError, match=r"KEY function .*<lambda> of semaphore 'web-one' returned None"):
        view(RequestFactory().get("/"))
    assert semaphores["web-one"].holders(key="None") == []
