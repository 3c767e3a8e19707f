"""What a guarded request gets instead of its view (django_semaphore.responses).

Refused: the SEMAPHORE_REJECT_VIEW response.  Redis unreachable or failing:
503 when failing closed, unguarded under SEMAPHORE_FAIL_OPEN, a log line
either way, never a 500.

Each way a client can fail is a real server: a closed port (connection
refused), a listener that never answers (timeout), a Redis whose
script commands answer with an error, and a socket that answers garbage (a protocol
error).  The decorator and the middleware, sync and async, meet each.
"""

import json
import logging
import signal
import socket
import threading
import time

import pytest
from django.http import HttpResponse

from django_semaphore import semaphores
from tests.support.servers import RedisServer, free_port
from tests.support.settings_web import MIDDLEWARE, WEB_SEMAPHORES


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


@pytest.fixture
def web_middleware(settings):
    """SemaphoreMiddleware too, for the tests that go through both guards."""
    settings.MIDDLEWARE = MIDDLEWARE


# -- refused: SEMAPHORE_REJECT_VIEW ---------------------------------------------------


def custom_reject(request, exception):
    return HttpResponse(f"busy {exception.name} {exception.retry_after}", status=503)


def test_custom_reject_view(client, settings):
    settings.SEMAPHORE_REJECT_VIEW = "tests.web.test_responses.custom_reject"
    lease = semaphores["web-one"].acquire()
    response = client.get("/web/boom/")
    assert response.status_code == 503
    assert response.content.decode().startswith("busy web-one ")
    lease.release()


def reject_with_a_query(request, exception):
    """A reject view that reads the database, as one that renders a site's own page may."""
    from django.contrib.auth.models import User

    return HttpResponse(f"busy, {User.objects.count()} users", status=429)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("web_middleware")
@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/web/aslow/?sleep=0", "/web/mw/apath/?sleep=0"])
async def test_a_reject_view_may_use_the_database_under_asgi(async_client, settings, path):
    """SEMAPHORE_REJECT_VIEW runs as Django runs a sync view under ASGI (in a thread), not
    on the event loop, where a query raised SynchronousOnlyOperation: a 500, not the 429."""
    settings.SEMAPHORE_REJECT_VIEW = "tests.web.test_responses.reject_with_a_query"
    name = "web-slow" if "aslow" in path else "mw-path"
    sem = semaphores[name]
    held = [await sem.aacquire() for _ in range(sem.config.limit)]
    try:
        response = await async_client.get(path)
        assert response.status_code == 429
        assert response.content == b"busy, 0 users"
    finally:
        for lease in held:
            await lease.arelease()


def users_in_context(request):
    """A context processor that reads the database, as a project's "site settings" one may."""
    from django.contrib.auth.models import User

    return {"users": User.objects.count()}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("web_middleware")
@pytest.mark.asyncio
@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("path", ["/web/aslow/?sleep=0", "/web/mw/apath/?sleep=0"])
async def test_the_pages_render_with_context_processors_that_query_under_asgi(
    async_client, settings, path, status
):
    """The default 429 and 503 pages render in a thread under ASGI: a project's context
    processor that queries the database raised SynchronousOnlyOperation on the loop (a 500)."""
    engine = settings.TEMPLATES[0]
    processors = [*engine["OPTIONS"]["context_processors"], "tests.web.test_responses.users_in_context"]
    settings.TEMPLATES = [{**engine, "OPTIONS": {**engine["OPTIONS"], "context_processors": processors}}]
    held = []
    if status == 503:
        settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0"}
    else:
        sem = semaphores["web-slow" if "aslow" in path else "mw-path"]
        held = [await sem.aacquire() for _ in range(sem.config.limit)]
    try:
        response = await async_client.get(path)
        assert response.status_code == status
        assert response["Content-Type"].startswith("text/html")
    finally:
        for lease in held:
            await lease.arelease()


# -- Redis unreachable: fail closed or open -----------------------------------------


class FakeServer:
    """A TCP listener on loopback that accepts and then ``behaviour``: "silent" or "garbage"."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.behaviour == "garbage":
                try:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                except OSError:
                    pass

    def close(self):
        self.stopped = True
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture(params=["refused", "timeout", "error-reply", "garbage"])
def broken_redis(request, settings):
    """SEMAPHORE_REDIS pointed at a Redis that fails in one of four ways."""
    kind = request.param
    if kind == "refused":
        settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0"}
        yield kind
    elif kind == "error-reply":
        # A live Redis that answers every script call with an error reply.
        args = ["--rename-command", "EVALSHA", "EVALSHA-off", "--rename-command", "EVAL", "EVAL-off"]
        with RedisServer(args=args) as server:
            settings.SEMAPHORE_REDIS = {"URL": server.url}
            yield kind
    else:
        fake = FakeServer("silent" if kind == "timeout" else "garbage")
        settings.SEMAPHORE_REDIS = {
            "URL": f"redis://127.0.0.1:{fake.port}/0",
            "OPTIONS": {"socket_timeout": 0.5, "socket_connect_timeout": 0.5},
        }
        yield kind
        fake.close()


PATHS = ["/web/slow/?sleep=0", "/web/mw/path/"]


@pytest.mark.usefixtures("web_middleware")
@pytest.mark.parametrize("path", PATHS)
def test_fail_closed_answers_503(client, broken_redis, path, caplog):
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="django_semaphore"):
        response = client.get(path, HTTP_ACCEPT="application/json")
    assert time.monotonic() - started < 10
    assert response.status_code == 503
    assert int(response["Retry-After"]) >= 1
    assert json.loads(response.content) == {
        "error": "semaphore_unavailable",
        "retry_after": int(response["Retry-After"]),
    }
    lines = [r for r in caplog.records if r.name == "django_semaphore"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "answered 503" in lines[0].getMessage()


@pytest.mark.usefixtures("web_middleware")
@pytest.mark.parametrize("path", PATHS)
def test_fail_open_runs_the_view_unguarded(client, broken_redis, path, settings, caplog):
    settings.SEMAPHORE_FAIL_OPEN = True
    with caplog.at_level(logging.INFO, logger="django_semaphore"):
        response = client.get(path)
    assert response.status_code == 200
    assert json.loads(response.content)["leases"] == {}
    lines = [r for r in caplog.records if r.name == "django_semaphore"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "UNGUARDED" in lines[0].getMessage()


@pytest.mark.usefixtures("web_middleware")
@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["/web/aslow/?sleep=0", "/web/mw/apath/?sleep=0"])
async def test_fail_closed_async(async_client, broken_redis, path):
    response = await async_client.get(path)
    assert response.status_code == 503
    assert b"temporarily unavailable" in response.content


@pytest.mark.usefixtures("web_middleware")
@pytest.mark.asyncio
async def test_fail_open_async(async_client, broken_redis, settings):
    settings.SEMAPHORE_FAIL_OPEN = True
    response = await async_client.get("/web/aslow/?sleep=0")
    assert response.status_code == 200


@pytest.mark.usefixtures("web_middleware")
def test_fail_closed_with_the_default_alias_down(client, settings):
    """SEMAPHORE_REDIS = a django-redis alias whose server is down."""
    port = free_port()
    settings.CACHES = {
        **settings.CACHES,
        "down": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{port}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        },
    }
    settings.SEMAPHORE_REDIS = "down"
    response = client.get("/web/slow/?sleep=0")
    assert response.status_code == 503


@pytest.mark.usefixtures("web_middleware")
def test_recovers_when_redis_returns(client, settings):
    with RedisServer() as server:
        settings.SEMAPHORE_REDIS = {"URL": server.url}
        assert client.get("/web/slow/?sleep=0").status_code == 200
        server.stop()
        assert client.get("/web/slow/?sleep=0").status_code == 503
        server.start()
        assert client.get("/web/slow/?sleep=0").status_code == 200
        assert semaphores["web-slow"].available() == 2


@pytest.mark.usefixtures("web_middleware")
@pytest.mark.parametrize("path", ["/web/mw/path/", "/web/mw/apath/?sleep=0"])
def test_no_ghost_holder_after_a_hung_redis_resumes(client, settings, path):
    """A paused Redis runs the acquires it had buffered when it resumes; their
    slots are given back by the next request that reaches it (LIMIT 1 here)."""
    with RedisServer() as server:
        settings.SEMAPHORE_REDIS = {
            "URL": server.url,
            "OPTIONS": {"socket_timeout": 0.5, "socket_connect_timeout": 0.5},
        }
        assert client.get(path).status_code == 200
        server.process.send_signal(signal.SIGSTOP)
        try:
            for _ in range(3):
                assert client.get(path).status_code == 503
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert server.ping()
        response = client.get(path)
        assert response.status_code == 200
        assert semaphores["mw-path"].holders() == []
