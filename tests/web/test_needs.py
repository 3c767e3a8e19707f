"""What a request needs (django_semaphore.needs): per-use KEY and WAIT overrides of
``@semaphore``, as dotted paths or callables, resolved against each request."""

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.test import RequestFactory

from django_semaphore import semaphore, semaphores
from django_semaphore.web.needs import Need, mark_handled, pending_needs, resolve
from tests.support.helpers import body, close
from tests.support.settings_web import WEB_SEMAPHORES


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
