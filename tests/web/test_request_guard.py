"""RequestGuard (django_semaphore.request_guard): a request's semaphores are taken all or
none, in one global order, and given back when it is refused, interrupted or Redis fails."""

import logging
import signal

import pytest

from django_semaphore import semaphores, signals
from tests.helpers import body
from tests.servers import RedisServer
from tests.settings_web import MIDDLEWARE, WEB_SEMAPHORES


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
