"""@semaphore with Django's test clients: responses, leases, partitions, signals, logging."""

import gc
import json
import logging
import signal
import threading

import pytest
from django.contrib.auth.models import User
from django.core.signals import request_finished
from django.db import close_old_connections
from django.http import HttpResponse
from django.test import RequestFactory

from django_semaphore import SemaphoreFull, semaphore, semaphores, signals
from django_semaphore.views import prefers_json, rejected
from tests.helpers import wait_until
from tests.settings_web import WEB_SEMAPHORES
from tests.views import gate_key, probe_keys


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


@pytest.fixture
def events():
    """Every signal sent during the test: (signal name, kwargs)."""
    seen = []
    receivers = {}
    for name in ("acquired", "refused", "released", "lease_lost"):

        def receiver(sender, _name=name, **kwargs):
            seen.append((_name, kwargs))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver)
    yield seen
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def body(response):
    return json.loads(response.content)


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
    from tests import views

    assert views.slow.__name__ == "slow"
    assert [need.name for need in views.pair_xy.semaphore_needs] == ["pair-x", "pair-y"]


# -- refusals ------------------------------------------------------------------------


def test_refusal_is_429_html_with_retry_after(client, events, caplog):
    lease = semaphores["web-one"].acquire()
    with caplog.at_level(logging.INFO, logger="django_semaphore"):
        response = client.get("/web/boom/", HTTP_ACCEPT="text/html,application/xhtml+xml,*/*;q=0.8")
    assert response.status_code == 429
    assert response["Content-Type"].startswith("text/html")
    assert 1 <= int(response["Retry-After"]) <= 5
    assert b"Too many requests" in response.content
    assert "Accept" in response["Vary"]
    refusals = [r for r in caplog.records if r.name == "django_semaphore"]
    assert len(refusals) == 1 and "Refused GET /web/boom/" in refusals[0].getMessage()
    assert [name for name, _ in events] == ["acquired", "refused"]
    lease.release()


def test_refusal_is_json_when_the_client_prefers_it(client):
    lease = semaphores["web-one"].acquire()
    response = client.get("/web/boom/", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert body(response) == {
        "error": "semaphore_full",
        "semaphore": "web-one",
        "retry_after": int(response["Retry-After"]),
    }
    lease.release()


@pytest.mark.parametrize(
    ("accept", "json_wanted"),
    [
        ("", False),
        ("*/*", False),
        ("application/json", True),
        ("application/json, text/plain, */*", True),  # axios
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", False),  # a browser
        ("text/html, application/json;q=0.9", False),
        ("text/html;q=0.5, application/json", True),
        ("application/*", True),
        ("application/json;q=0", False),
        ("text/*;q=0.3, application/json;q=0.4", True),
        ("application/json;q=0.5, */*", False),
        ("garbage", False),
        ("application/json;q=abc, text/html", False),
    ],
)
def test_accept_negotiation_uses_q_values(accept, json_wanted):
    request = RequestFactory().get("/", HTTP_ACCEPT=accept) if accept else RequestFactory().get("/")
    assert prefers_json(request) is json_wanted


def test_retry_after_is_at_least_one_second():
    request = RequestFactory().get("/")
    response = rejected(request, SemaphoreFull("x", retry_after=0))
    assert response["Retry-After"] == "1"


def custom_reject(request, exception):
    return HttpResponse(f"busy {exception.name} {exception.retry_after}", status=503)


def test_custom_reject_view(client, settings):
    settings.SEMAPHORE_REJECT_VIEW = "tests.test_web_decorator.custom_reject"
    lease = semaphores["web-one"].acquire()
    response = client.get("/web/boom/")
    assert response.status_code == 503
    assert response.content.decode().startswith("busy web-one ")
    lease.release()


def test_template_is_overridable(client, settings, tmp_path):
    (tmp_path / "django_semaphore").mkdir()
    (tmp_path / "django_semaphore" / "429.html").write_text("Slow down, {{ retry_after }}s")
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [str(tmp_path)]}]
    lease = semaphores["web-one"].acquire()
    response = client.get("/web/boom/")
    assert response.status_code == 429
    assert response.content.decode() == f"Slow down, {response['Retry-After']}s"
    lease.release()


# -- exceptions and streaming ------------------------------------------------------------


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


# -- partitions -------------------------------------------------------------------------------


def test_ip_partition_ignores_x_forwarded_for(client):
    held = semaphores["web-ip"].acquire(key="1.2.3.4")
    assert client.get("/web/ip/", REMOTE_ADDR="1.2.3.4").status_code == 429
    spoofed = client.get("/web/ip/", REMOTE_ADDR="5.6.7.8", HTTP_X_FORWARDED_FOR="1.2.3.4")
    assert spoofed.status_code == 200
    assert body(spoofed)["leases"]["web-ip"]["key"] == "5.6.7.8"
    # and the header cannot get a held address through either
    sneaky = client.get("/web/ip/", REMOTE_ADDR="1.2.3.4", HTTP_X_FORWARDED_FOR="9.9.9.9")
    assert sneaky.status_code == 429
    held.release()


@pytest.mark.django_db
def test_user_partition(client):
    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    held = semaphores["web-user"].acquire(key=str(alice.pk))
    client.force_login(alice)
    assert client.get("/web/user/").status_code == 429
    client.force_login(bob)
    response = client.get("/web/user/")
    assert response.status_code == 200
    assert body(response)["leases"]["web-user"]["key"] == str(bob.pk)
    client.logout()
    anonymous = client.get("/web/user/", REMOTE_ADDR="7.7.7.7")
    assert body(anonymous)["leases"]["web-user"]["key"] == "7.7.7.7"
    held.release()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_user_partition_in_an_async_view(async_client):
    from asgiref.sync import sync_to_async

    alice = await sync_to_async(User.objects.create_user)("alice")
    if hasattr(async_client, "aforce_login"):
        await async_client.aforce_login(alice)
    else:  # Django < 5.0
        await sync_to_async(async_client.force_login)(alice)
    response = await async_client.get("/web/auser/")
    assert response.status_code == 200
    assert body(response)["leases"]["web-user"]["key"] == str(alice.pk)
    held = await semaphores["web-user"].aacquire(key=str(alice.pk))
    assert (await async_client.get("/web/auser/")).status_code == 429
    await held.arelease()


def test_header_partition_and_missing_header(client):
    acme = client.get("/web/header/", HTTP_X_TENANT="acme")
    assert body(acme)["leases"]["web-header"]["key"] == "acme"  # the raw header value
    missing = client.get("/web/header/")
    assert missing.status_code == 200
    assert body(missing)["leases"]["web-header"]["key"] == ""
    held = semaphores["web-header"].acquire(key="")
    assert client.get("/web/header/").status_code == 429
    assert client.get("/web/header/", HTTP_X_TENANT="").status_code == 429  # empty is missing
    assert client.get("/web/header/", HTTP_X_TENANT="acme").status_code == 200
    held.release()


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


def close(response):
    """Close like a server would, without request_finished touching the test database."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


# -- stacking -------------------------------------------------------------------------------


def test_stacked_decorators_refused_leave_nothing_held(client, settings):
    settings.SEMAPHORES = {
        **WEB_SEMAPHORES,
        "pair-x": {"LIMIT": 1, "TIMEOUT": 5},
        "pair-y": {"LIMIT": 1, "TIMEOUT": 5},
    }
    held = semaphores["pair-y"].acquire()
    response = client.get("/web/pair/xy/?sleep=0", HTTP_ACCEPT="application/json")
    assert response.status_code == 429
    assert body(response)["semaphore"] == "pair-y"
    assert semaphores["pair-x"].available() == 1  # taken first (global order), then given back
    held.release()
    response = client.get("/web/pair/yx/?sleep=0")
    assert response.status_code == 200
    assert sorted(body(response)["leases"]) == ["pair-x", "pair-y"]


def test_interrupted_while_waiting_gives_back_what_it_holds(client, raw_redis):
    """Ctrl-C (KeyboardInterrupt) while the request holds pair-x and waits for pair-y:
    pair-x is released on the way out, not left to expire after TIMEOUT."""
    x, y = semaphores["pair-x"], semaphores["pair-y"]  # both LIMIT 1, WAIT 20
    blocker = y.acquire()
    queue = y.partition().queue
    interrupted = []

    def interrupt(signum, frame):
        # Only once the request waits in pair-y's queue (so it holds pair-x).
        if not interrupted and raw_redis.zcard(queue):
            interrupted.append(x.available())
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    try:
        with pytest.raises(KeyboardInterrupt):
            client.get("/web/pair/xy/?sleep=0")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupted == [0]  # pair-x was held when the interrupt came
    assert x.available() == 1  # before: 0, until its TIMEOUT
    assert y.status().waiting == 0
    assert [h.identifier for h in y.holders()] == [blocker.identifier]
    blocker.release()


def test_probe_keys_are_under_the_prefix(key_prefix):
    assert all(key.startswith(key_prefix + ":") for key in probe_keys("x"))


def test_unclosed_response_stops_renewing_when_collected():
    """A response dropped without close() (a view called directly) lets its slot expire."""
    captured = []

    @semaphore("web-short")  # TIMEOUT 1 s, AUTO_REFRESH on
    def view(request):
        captured.append(request.semaphore_leases["web-short"])
        return HttpResponse("ok")

    response = view(RequestFactory().get("/"))
    assert response.status_code == 200
    del response
    gc.collect()
    sem = semaphores["web-short"]
    wait_until(lambda: sem.available() == 1, timeout=15, message="abandoned lease expired")
    assert not captured[0].released
