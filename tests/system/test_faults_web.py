"""The web layer when Redis stops answering: a real redis-server, SIGSTOPped.

A stopped server accepts nothing and answers nothing, the way a hung or
partitioned Redis does: fail closed must answer 503 within the socket timeout,
fail open must run the view and log one warning per failure burst (not one per
request), and a new burst after Redis came back is logged again.
"""

import logging
import signal
import time

import pytest

from tests.support.settings_web import MIDDLEWARE, WEB_SEMAPHORES

SOCKET_TIMEOUT = 2.0
PATHS = ["/web/slow/?sleep=0", "/web/mw/path/"]


@pytest.fixture
def stoppable_redis(own_redis, settings):
    """The test's own Redis behind SEMAPHORE_REDIS, with a 1 s socket timeout; SIGSTOP/SIGCONT."""
    settings.SEMAPHORES = WEB_SEMAPHORES
    settings.MIDDLEWARE = MIDDLEWARE
    settings.SEMAPHORE_REDIS = {
        "URL": own_redis.url,
        "OPTIONS": {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": SOCKET_TIMEOUT},
    }
    stopped = []

    def stop():
        own_redis.process.send_signal(signal.SIGSTOP)
        stopped.append(True)

    def resume():
        own_redis.process.send_signal(signal.SIGCONT)
        stopped.clear()

    own_redis.stop_serving, own_redis.resume_serving = stop, resume
    yield own_redis
    if stopped:
        resume()


def _warnings(caplog):
    return [r for r in caplog.records if r.name == "django_semaphore" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("path", PATHS)
def test_fail_closed_503_within_the_socket_timeout(client, stoppable_redis, path):
    assert client.get(path).status_code == 200  # connected, scripts loaded
    stoppable_redis.stop_serving()
    for _ in range(2):
        started = time.monotonic()
        response = client.get(path)
        elapsed = time.monotonic() - started
        assert response.status_code == 503
        assert int(response["Retry-After"]) >= 1
        # One timed-out attempt (timeouts are not retried), with slack for a loaded machine.
        assert elapsed < SOCKET_TIMEOUT + 1.5, elapsed
        print(f"FAIL CLOSED: 503 after {elapsed:.2f}s (socket timeout {SOCKET_TIMEOUT}s)")
    stoppable_redis.resume_serving()
    # The acquires that timed out were still queued in Redis and ran when it
    # resumed; the engine gives their slots back on its next call, so the
    # next request is served at once.
    assert client.get(path).status_code == 200


@pytest.mark.parametrize("path", PATHS)
def test_fail_open_logs_once_per_failure_burst(client, stoppable_redis, path, settings, caplog):
    settings.SEMAPHORE_FAIL_OPEN = True
    assert client.get(path).status_code == 200
    with caplog.at_level(logging.INFO, logger="django_semaphore"):
        stoppable_redis.stop_serving()
        for _ in range(4):
            assert client.get(path).status_code == 200  # the view ran, unguarded
        first_burst = _warnings(caplog)
        stoppable_redis.resume_serving()
        assert client.get(path).status_code == 200  # Redis answers again: the burst ends
        stoppable_redis.stop_serving()
        for _ in range(3):
            assert client.get(path).status_code == 200
        both_bursts = _warnings(caplog)
    assert len(first_burst) == 1, [r.getMessage() for r in first_burst]
    assert "UNGUARDED" in first_burst[0].getMessage()
    assert len(both_bursts) == 2, [r.getMessage() for r in both_bursts]
