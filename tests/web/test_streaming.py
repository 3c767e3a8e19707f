"""Holding a request's semaphores until its response is closed (django_semaphore.streaming):
a streaming response holds its slot until the last byte; an unclosed one lets it expire."""

import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.http import HttpResponse, StreamingHttpResponse
from django.test import RequestFactory

from django_semaphore import semaphore, semaphores, signals
from django_semaphore.engine import watchdog
from tests.support.helpers import wait_until
from tests.support.settings_web import MIDDLEWARE, WEB_SEMAPHORES
from tests.support.views import gate_key


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


@pytest.fixture
def released():
    names = []

    def receiver(sender, lease, held, **kwargs):
        names.append((lease.name, held))

    signals.released.connect(receiver)
    yield names
    signals.released.disconnect(receiver)


def test_streaming_response_holds_the_slot_until_closed(client, raw_redis):
    sem = semaphores["web-one"]
    response = client.get("/web/stream/", REMOTE_ADDR="10.1.2.3")
    assert response.status_code == 200
    chunks = iter(response.streaming_content)
    assert next(chunks) == b"first\n"
    assert sem.available() == 0
    (holder,) = sem.holders()
    assert holder.meta["method"] == "GET"
    assert holder.meta["path"] == "/web/stream/"
    assert holder.meta["remote_addr"] == "10.1.2.3"
    assert holder.meta["user"] is None
    assert client.get("/web/stream/").status_code == 429
    raw_redis.rpush(gate_key("stream"), "go")
    assert list(chunks) == [b"second\n"]  # exhausting the stream closes the response
    assert sem.available() == 1


@pytest.mark.asyncio
async def test_async_streaming_response_holds_the_slot_until_closed(async_client, raw_redis):
    sem = semaphores["web-one"]
    response = await async_client.get("/web/astream/")
    chunks = aiter(response.streaming_content)
    assert await anext(chunks) == b"first\n"
    assert await sem.aavailable() == 0
    assert (await async_client.get("/web/astream/")).status_code == 429
    raw_redis.rpush(gate_key("astream"), "go")
    assert [chunk async for chunk in chunks] == [b"second\n"]
    assert await sem.aavailable() == 1


def test_an_async_view_under_wsgi_keeps_renewing_while_its_stream_is_sent():
    """Under WSGI an async view runs in an event loop that ends when it returns; its lease
    used to be renewed on that loop only, so a stream outlasting TIMEOUT lost its slot
    while being sent (another request got it)."""
    sem = semaphores["web-short"]  # TIMEOUT 1 s, AUTO_REFRESH
    captured = []

    @semaphore("web-short")
    async def view(request):
        captured.append(request.semaphore_leases["web-short"])

        def chunks():
            yield b"first\n"
            time.sleep(2.5)
            yield b"second\n"

        return StreamingHttpResponse(chunks())

    # As Django's WSGIHandler runs an async view: async_to_sync, a loop of its own.
    response = async_to_sync(view)(RequestFactory().get("/"))
    assert list(response) == [b"first\n", b"second\n"]
    assert sem.available() == 0  # still held after 2.5 TIMEOUTs
    response.close()
    assert sem.available() == 1
    assert captured[0].released and not captured[0].lost


def test_an_unclosed_response_gives_back_its_slot_when_collected():
    """A response dropped without close() (a view called directly; under ASGI, a sync view
    whose client went away) gives its slot back once collected, from the watchdog's
    releaser thread: before, its renewals stopped and the slot expired after TIMEOUT."""
    captured = []

    @semaphore("web-one")  # TIMEOUT 5 s (WEB_TIMEOUT), AUTO_REFRESH on
    def view(request):
        captured.append(request.semaphore_leases["web-one"])
        return HttpResponse("ok")

    response = view(RequestFactory().get("/"))
    assert response.status_code == 200
    sem = semaphores["web-one"]
    assert sem.available() == 0
    del response  # no cycle: collected now, in this thread
    wait_until(lambda: captured[0].released, timeout=4, message="the slot given back, before TIMEOUT")
    assert sem.available() == 1 and not captured[0].lost


def test_a_give_back_queued_and_a_close_at_once_release_once(released):
    """The finalizer's give-back (on the releaser thread) and a close (or the end of the
    request's task) may come together: one release, one ``released`` signal."""

    @semaphore("web-one")
    def view(request):
        return HttpResponse("ok")

    for _ in range(20):
        response = view(RequestFactory().get("/"))
        (release,) = response._resource_closers
        watchdog.release_later(release)  # as the finalizer does, while ...
        response.close()  # ... the server closes it
        done = threading.Event()
        watchdog.release_later(done.set)  # the releaser runs what it is given in order
        assert done.wait(10)
        assert semaphores["web-one"].available() == 1
    assert released == [("web-one", True)] * 20


def _etag_view(request):
    return HttpResponse("hello", headers={"ETag": '"v1"'})


@pytest.mark.parametrize("guard", ["decorator", "middleware"])
def test_a_304_from_conditional_get_middleware_gives_back_the_slot(client, settings, guard):
    """ConditionalGetMiddleware answers a revalidation (If-None-Match) with a new 304
    response and drops the guarded one unclosed: its slot stayed taken until TIMEOUT, so
    the next request got 429 (a browser revalidates on every reload)."""
    from django.middleware.http import ConditionalGetMiddleware

    sem = semaphores["web-one"]  # LIMIT 1, TIMEOUT 5 s
    if guard == "decorator":
        handler = ConditionalGetMiddleware(semaphore("web-one")(_etag_view))

        def get(**headers):
            return handler(RequestFactory().get("/", **headers))
    else:
        settings.SEMAPHORES = {
            **WEB_SEMAPHORES,
            "web-one": {**WEB_SEMAPHORES["web-one"], "PATHS": [r"^/web/hello/"]},
        }
        settings.MIDDLEWARE = ["django.middleware.http.ConditionalGetMiddleware", *MIDDLEWARE]

        def get(**headers):
            return client.get("/web/hello/", **headers)

    first = get()
    assert first.status_code == 200
    first.close()
    not_modified = get(HTTP_IF_NONE_MATCH=first["ETag"])
    assert not_modified.status_code == 304
    not_modified.close()  # as the server does once it has sent it (the test client did already)
    wait_until(lambda: sem.available() == 1, timeout=2, message="the slot back after the 304")
    response = get()
    assert response.status_code == 200
    response.close()
