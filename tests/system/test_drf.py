"""Django REST framework: guarded APIView and ViewSet, by decorator and by middleware."""

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from django.urls import include, path
from django.utils.decorators import method_decorator
from rest_framework import routers, viewsets
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from django_semaphore import semaphore, semaphores

RELEASE = threading.Event()  # the live-server test's slow view waits for this
ENTERED = threading.Event()


def leases_of(request):
    return {name: lease.token for name, lease in getattr(request, "semaphore_leases", {}).items()}


@method_decorator(semaphore("drf-api"), name="dispatch")
class ReportView(APIView):
    renderer_classes = [JSONRenderer]

    def get(self, request):
        return Response({"leases": leases_of(request)})

    def post(self, request):
        return Response({"got": request.data, "leases": leases_of(request)}, status=201)


@method_decorator(semaphore("drf-viewset"), name="dispatch")
class ItemViewSet(viewsets.ViewSet):
    renderer_classes = [JSONRenderer]

    def list(self, request):
        return Response({"items": [1, 2], "leases": leases_of(request)})

    def retrieve(self, request, pk=None):
        return Response({"item": pk, "leases": leases_of(request)})


class MiddlewareGuardedView(APIView):
    """No decorator: SemaphoreMiddleware guards it by PATHS."""

    renderer_classes = [JSONRenderer]

    def get(self, request):
        return Response({"leases": leases_of(request)})


@method_decorator(semaphore("drf-slow"), name="dispatch")
class SlowView(APIView):
    renderer_classes = [JSONRenderer]

    def get(self, request):
        ENTERED.set()
        RELEASE.wait(20)
        return Response({"done": True})


router = routers.SimpleRouter()
router.register("items", ItemViewSet, basename="item")

# This module is also the URLconf of its tests (pytest.mark.urls below).
urlpatterns = [
    path("drf/report/", ReportView.as_view()),
    path("drf/mw/guarded/", MiddlewareGuardedView.as_view(), name="drf-mw"),
    path("drf/slow/", SlowView.as_view()),
    path("drf/", include(router.urls)),
]

pytestmark = pytest.mark.urls(__name__)

JSON = {"HTTP_ACCEPT": "application/json"}


@pytest.fixture(autouse=True)
def drf_settings(settings):
    settings.SEMAPHORES = {
        "drf-api": {"LIMIT": 1, "TIMEOUT": 5},
        "drf-viewset": {"LIMIT": 1, "TIMEOUT": 7},
        "drf-mw": {"LIMIT": 1, "TIMEOUT": 5, "PATHS": [r"^/drf/mw/"]},
        "drf-slow": {"LIMIT": 1, "TIMEOUT": 5},
    }
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django_semaphore.middleware.SemaphoreMiddleware"]


def assert_refused(response, name, timeout):
    assert response.status_code == 429
    body = json.loads(response.content)
    assert body == {"error": "semaphore_full", "semaphore": name, "retry_after": body["retry_after"]}
    assert 1 <= body["retry_after"] <= timeout
    assert response["Retry-After"] == str(body["retry_after"])
    assert response["Content-Type"].startswith("application/json")


def test_api_view_with_method_decorator(client):
    response = client.get("/drf/report/", **JSON)
    assert response.status_code == 200 and set(response.json()["leases"]) == {"drf-api"}
    response = client.post("/drf/report/", {"a": 1}, content_type="application/json", **JSON)
    assert response.status_code == 201 and response.json()["got"] == {"a": 1}
    assert semaphores["drf-api"].available() == 1

    held = semaphores["drf-api"].acquire()
    assert_refused(client.get("/drf/report/", **JSON), "drf-api", 5)
    assert_refused(client.post("/drf/report/", {}, content_type="application/json", **JSON), "drf-api", 5)
    held.release()
    assert client.get("/drf/report/", **JSON).status_code == 200


def test_viewset_routes_share_the_guard(client):
    assert client.get("/drf/items/", **JSON).json()["items"] == [1, 2]
    assert client.get("/drf/items/7/", **JSON).json()["item"] == "7"
    held = semaphores["drf-viewset"].acquire()
    assert_refused(client.get("/drf/items/", **JSON), "drf-viewset", 7)
    assert_refused(client.get("/drf/items/7/", **JSON), "drf-viewset", 7)
    held.release()
    assert set(client.get("/drf/items/7/", **JSON).json()["leases"]) == {"drf-viewset"}


def test_api_view_guarded_by_the_middleware(client):
    assert set(client.get("/drf/mw/guarded/", **JSON).json()["leases"]) == {"drf-mw"}
    held = semaphores["drf-mw"].acquire()
    assert_refused(client.get("/drf/mw/guarded/", **JSON), "drf-mw", 5)
    held.release()
    assert semaphores["drf-mw"].available() == 1


def test_drf_api_client_gets_the_same_refusal():
    from rest_framework.test import APIClient

    api = APIClient()
    api.credentials(HTTP_ACCEPT="application/json")
    held = semaphores["drf-api"].acquire()
    assert_refused(api.get("/drf/report/"), "drf-api", 5)
    held.release()
    assert api.get("/drf/report/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_concurrent_http_requests_to_a_drf_view(live_server):
    """Two real HTTP requests at once: the second is refused while the first holds the slot."""
    ENTERED.clear()
    RELEASE.clear()
    url = live_server.url + "/drf/slow/"
    result = {}

    def first():
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "application/json"})) as r:
            result["first"] = (r.status, json.loads(r.read()))

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert ENTERED.wait(10)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "application/json"}))
        assert refused.value.code == 429
        body = json.loads(refused.value.read())
        assert body["error"] == "semaphore_full" and body["semaphore"] == "drf-slow"
        assert refused.value.headers["Retry-After"] == str(body["retry_after"])
    finally:
        RELEASE.set()
        thread.join(20)
    assert result["first"] == (200, {"done": True})
    # The server releases the slot once the response has been sent, which
    # may be just after the client has read it.
    deadline = time.monotonic() + 10
    while semaphores["drf-slow"].available() != 1:
        assert time.monotonic() < deadline, "slot not released after the response"
        time.sleep(0.01)
