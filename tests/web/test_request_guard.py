"""RequestGuard (django_semaphore.request_guard): a request's semaphores are taken all or
none, in one global order, and given back when it is refused, interrupted or Redis fails."""

import logging
import signal
import weakref

import pytest

from django_semaphore import semaphores, signals
from tests.support.helpers import body
from tests.support.servers import RedisServer
from tests.support.settings_web import MIDDLEWARE, WEB_SEMAPHORES


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


@pytest.fixture
def web_middleware(settings):
    """SemaphoreMiddleware too, for the tests that go through both guards."""
    settings.MIDDLEWARE = MIDDLEWARE


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


def _in_a_finalizer(frame):
    while frame is not None:
        if frame.f_code.co_filename == weakref.__file__:
            return True
        frame = frame.f_back
    return False


def test_interrupted_while_waiting_gives_back_what_it_holds(client, raw_redis):
    """Ctrl-C (KeyboardInterrupt) while the request holds pair-x and waits for pair-y:
    pair-x is released on the way out, not left to expire after TIMEOUT."""
    x, y = semaphores["pair-x"], semaphores["pair-y"]  # both LIMIT 1, WAIT 20
    blocker = y.acquire()
    queue = y.partition().queue
    interrupted = []

    def interrupt(signum, frame):
        # Only once the request waits in pair-y's queue (so it holds pair-x), and not while
        # a garbage-collection finalizer runs (a response's, weakref.finalize): Python
        # swallows an exception raised there, and the request would go on waiting.
        if interrupted or _in_a_finalizer(frame) or not raw_redis.zcard(queue):
            return
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


@pytest.mark.usefixtures("web_middleware")
def test_redis_lost_during_the_view_still_answers(client, settings, caplog):
    """Redis dies after the grant: the release fails, is logged, and the response stands."""
    with RedisServer() as server:
        settings.SEMAPHORE_REDIS = {"URL": server.url}

        def kill(sender, **kwargs):
            server.stop()

        signals.acquired.connect(kill)
        try:
            with caplog.at_level(logging.WARNING, logger="django_semaphore"):
                response = client.get("/web/slow/?sleep=0")
        finally:
            signals.acquired.disconnect(kill)
    assert response.status_code == 200
    assert any("Could not release" in r.getMessage() for r in caplog.records)


# -- enter and aenter: one flow, two drivers ----------------------------------------------------------


def _interrupt(monkeypatch, error, when):
    """Make the first request for which ``when(request)`` is true raise ``error`` in both drivers."""
    from django_semaphore.backend import scripting

    execute, aexecute = scripting.execute, scripting.aexecute

    def interrupted(client, request):
        if when(request):
            raise error()
        return execute(client, request)

    async def ainterrupted(client, request):
        if when(request):
            raise error()
        return await aexecute(client, request)

    monkeypatch.setattr(scripting, "execute", interrupted)
    monkeypatch.setattr(scripting, "aexecute", ainterrupted)


async def _enter_scenario(twin, settings, monkeypatch):
    """One twin's run of the scenario below: what it saw."""
    import asyncio
    import time

    import redis as redis_py
    from django.test import RequestFactory

    from django_semaphore.backend import scripting
    from django_semaphore.web.needs import Need, pending_needs
    from django_semaphore.web.request_guard import RequestGuard

    x, y = f"guard-x-{twin}", f"guard-y-{twin}"
    settings.SEMAPHORES = {
        x: {"LIMIT": 1, "TIMEOUT": 30},
        y: {"LIMIT": 1, "TIMEOUT": 30},
    }
    sx, sy = semaphores[x], semaphores[y]
    log = []

    async def enter(y_wait=None):
        request = RequestFactory().get("/guarded/", HTTP_ACCEPT="application/json")
        needs = pending_needs(request, [Need(y, wait=y_wait), Need(x)])  # x is taken first: name order
        guard = RequestGuard(request, needs)
        response = await guard.aenter() if twin == "async" else guard.enter()
        held = sorted(name.removesuffix(f"-{twin}") for name in getattr(request, "semaphore_leases", {}))
        return guard, response, held

    def state():
        return sx.available(), sy.available(), sy.status().waiting

    guard, response, held = await enter()
    log.append(("both free", response, held, state()))
    await guard.arelease() if twin == "async" else guard.release()
    log.append(("released", state()))

    blocker = sy.acquire()
    _, response, held = await enter()
    log.append(("refused", response.status_code, held, state()))

    started = time.monotonic()
    _, response, held = await enter(y_wait=0.3)
    log.append(("refused after waiting", response.status_code, time.monotonic() - started >= 0.29, state()))

    error = KeyboardInterrupt if twin == "sync" else asyncio.CancelledError
    with monkeypatch.context() as patch:
        _interrupt(patch, error, lambda r: type(r) is scripting.Command and r.args[0] == "BLPOP")
        with pytest.raises(error):
            await enter(y_wait=10)
    log.append(("interrupted while waiting", state()))
    blocker.release()

    def acquiring_y(request):
        return (
            type(request) is scripting.Script and request.script.name == "acquire" and y in str(request.keys)
        )

    with monkeypatch.context() as patch:
        _interrupt(patch, redis_py.ConnectionError, acquiring_y)
        _, response, held = await enter()
    log.append(("Redis fails", response.status_code, held, state()))
    return log


@pytest.mark.asyncio
async def test_enter_and_aenter_go_through_the_same_scenario_alike(settings, monkeypatch):
    """The same scenario through each twin: both semaphores taken; the second one refused at
    once and after waiting (the first given back); interrupted (sync) or cancelled (async)
    while waiting for the second (the first given back, no ticket left); Redis failing
    (503, the first given back)."""
    seen = {}
    for twin in ("sync", "async"):
        seen[twin] = await _enter_scenario(twin, settings, monkeypatch)
    assert seen["sync"] == seen["async"]
    assert seen["sync"] == [
        ("both free", None, ["guard-x", "guard-y"], (0, 0, 0)),
        ("released", (1, 1, 0)),
        ("refused", 429, [], (1, 0, 0)),
        ("refused after waiting", 429, True, (1, 0, 0)),
        ("interrupted while waiting", (1, 0, 0)),
        ("Redis fails", 503, [], (1, 1, 0)),
    ]
