"""What the web layer logs: refusals and Redis failures once per burst at
WARNING under ``django_semaphore`` (the rest at DEBUG), never an ERROR line or
an error e-mail per request from ``django.request``, and request data in a log
line escaped so that a client cannot forge lines or send terminal escapes.

Real requests through Django's test client (the full handler, middleware and
``django.request`` logging included) against the test's Redis, or a closed
port for "Redis down"; e-mails land in the locmem outbox.
"""

import logging
from urllib.parse import quote

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils.log import AdminEmailHandler

from django_semaphore import semaphore, semaphores
from django_semaphore.runtime import bursts
from tests.support.servers import free_port
from tests.support.settings_web import MIDDLEWARE, WEB_SEMAPHORES

BURST = 201


@pytest.fixture(autouse=True)
def web_settings(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES
    settings.MIDDLEWARE = MIDDLEWARE
    settings.ADMINS = [("Ops", "ops@example.com")]


@pytest.fixture
def redis_down(settings):
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0"}


def records(caplog, name):
    return [r for r in caplog.records if r.name == name]


def levels(caplog, name="django_semaphore"):
    found = {}
    for record in records(caplog, name):
        found[record.levelname] = found.get(record.levelname, 0) + 1
    return found


def test_the_admin_email_handler_is_on_django_request():
    # The e-mail tests below mean something only if Django's default
    # 'mail_admins' handler would mail an ERROR logged by django.request.
    handlers = logging.getLogger("django").handlers
    assert any(isinstance(h, AdminEmailHandler) for h in handlers)
    assert logging.getLogger("django.request").propagate


@pytest.mark.parametrize("path", ["/web/slow/?sleep=0", "/web/mw/path/"])
def test_redis_down_sends_no_error_email_and_logs_one_warning(client, redis_down, mailoutbox, caplog, path):
    with caplog.at_level(logging.DEBUG):
        codes = {client.get(path).status_code for _ in range(BURST)}
    assert codes == {503}
    print(f"\n{BURST} requests, Redis down: {len(mailoutbox)} e-mails, django_semaphore {levels(caplog)}")
    assert len(mailoutbox) == 0  # before: 201 (one "Service Unavailable" e-mail per request)
    assert records(caplog, "django.request") == []  # before: 201 ERROR lines
    ours = [r for r in records(caplog, "django_semaphore") if "Redis unreachable" in r.getMessage()]
    assert len(ours) == BURST  # one line per request ...
    assert [r.levelname for r in ours] == ["WARNING"] + ["DEBUG"] * (BURST - 1)  # before: ERROR, then DEBUG
    (warning,) = [r for r in records(caplog, "django_semaphore") if r.levelno >= logging.WARNING]
    assert "answered 503" in warning.getMessage()  # ... and the one WARNING of the burst


def test_a_new_failure_burst_warns_again_after_redis_answers(client, settings, caplog):
    from tests.support.servers import RedisServer

    with RedisServer() as server, caplog.at_level(logging.DEBUG, logger="django_semaphore"):
        settings.SEMAPHORE_REDIS = {"URL": server.url}
        assert client.get("/web/slow/?sleep=0").status_code == 200
        server.stop()
        for _ in range(3):
            assert client.get("/web/slow/?sleep=0").status_code == 503
        server.start()
        assert client.get("/web/slow/?sleep=0").status_code == 200
        server.stop()
        assert client.get("/web/slow/?sleep=0").status_code == 503
    warnings = [r.getMessage() for r in records(caplog, "django_semaphore") if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and all("answered 503" in w for w in warnings), warnings
    recovered = [
        r.getMessage() for r in records(caplog, "django_semaphore") if "answers again after" in r.getMessage()
    ]
    assert len(recovered) == 1 and "3 failed requests" in recovered[0], recovered


@pytest.mark.parametrize("path", ["/web/boom/", "/web/mw/path/"])
def test_refusals_log_one_warning_per_burst_and_nothing_in_django_request(client, caplog, path):
    name = "web-one" if path == "/web/boom/" else "mw-path"
    held = semaphores[name].acquire()
    with caplog.at_level(logging.DEBUG):
        codes = {client.get(path).status_code for _ in range(50)}
    held.release()
    assert codes == {429}
    print(
        f"\n50 refusals: django_semaphore {levels(caplog)}, django.request {levels(caplog, 'django.request')}"
    )
    assert records(caplog, "django.request") == []  # before: 50 "Too Many Requests" WARNING lines
    assert levels(caplog) == {"WARNING": 1, "DEBUG": 49}  # before: 50 INFO
    (warning,) = [r for r in records(caplog, "django_semaphore") if r.levelno == logging.WARNING]
    assert f"semaphore {name!r} is full" in warning.getMessage()


def test_refusal_bursts_are_per_semaphore_and_end_after_a_quiet_period(client, caplog, monkeypatch):
    held = [semaphores["web-one"].acquire(), semaphores["mw-path"].acquire()]
    clock = [1000.0]
    monkeypatch.setattr(bursts, "_now", lambda: clock[0])
    with caplog.at_level(logging.DEBUG, logger="django_semaphore"):
        for _ in range(3):
            client.get("/web/boom/")
            client.get("/web/mw/path/")
        clock[0] += bursts.REFUSAL_QUIET - 1  # still the same burst
        client.get("/web/boom/")
        clock[0] += bursts.REFUSAL_QUIET + 1  # quiet long enough: a new burst
        client.get("/web/boom/")
    for lease in held:
        lease.release()
    warned = [r.getMessage() for r in records(caplog, "django_semaphore") if r.levelno == logging.WARNING]
    assert [("'web-one'" in m, "'mw-path'" in m) for m in warned] == [
        (True, False),
        (False, True),
        (True, False),
    ]


def test_a_long_refusal_burst_warns_again_with_a_count(client, caplog, monkeypatch):
    held = semaphores["web-one"].acquire()
    clock = [1000.0]
    monkeypatch.setattr(bursts, "_now", lambda: clock[0])
    with caplog.at_level(logging.DEBUG, logger="django_semaphore"):
        for _ in range(int(bursts.BURST_REPEAT) + 5):  # one refusal a second, never quiet
            client.get("/web/boom/")
            clock[0] += 1
    held.release()
    warned = [r.getMessage() for r in records(caplog, "django_semaphore") if r.levelno == logging.WARNING]
    assert len(warned) == 2, warned
    assert f"{int(bursts.BURST_REPEAT) - 1} more refusals" in warned[1]


# -- request data in log lines ------------------------------------------------------------------

EVIL_PATH = "/report\nWARNING forged line\r\x1b[31m\x00\u2028end\\"


def _one_line(message):
    for bad in ("\n", "\r", "\x1b", "\x00", "\u2028"):
        assert bad not in message, (bad, message)


@semaphore("web-one")
def guarded(request):
    return HttpResponse("ok")


def test_refusal_line_escapes_control_characters_in_the_path(caplog):
    held = semaphores["web-one"].acquire()
    request = RequestFactory().get(quote(EVIL_PATH))  # as a client sends it: percent-encoded
    assert request.path == EVIL_PATH
    with caplog.at_level(logging.DEBUG, logger="django_semaphore"):
        response = guarded(request)
    held.release()
    assert response.status_code == 429
    (line,) = [r.getMessage() for r in records(caplog, "django_semaphore")]
    _one_line(line)  # before: the path went in raw, "\n" starting a forged line
    assert "/report\\nWARNING forged line\\r\\x1b[31m\\x00\\u2028end\\\\" in line, line


def test_failure_line_escapes_control_characters_in_the_path(redis_down, caplog):
    request = RequestFactory().get(quote(EVIL_PATH))
    assert request.path == EVIL_PATH
    with caplog.at_level(logging.DEBUG, logger="django_semaphore"):
        response = guarded(request)
    assert response.status_code == 503
    (line,) = [r.getMessage() for r in records(caplog, "django_semaphore")]
    _one_line(line)
    assert "/report\\nWARNING forged line\\r\\x1b[31m" in line, line


def test_refusal_line_escapes_header_key_values(client, caplog):
    held = semaphores["web-header"].acquire(key="evil\n\x1b[2J")
    with caplog.at_level(logging.DEBUG, logger="django_semaphore"):
        response = client.get("/web/header/", HTTP_X_TENANT="evil\n\x1b[2J")
    held.release()
    assert response.status_code == 429
    (line,) = [r.getMessage() for r in records(caplog, "django_semaphore")]
    _one_line(line)
    assert "evil\\n\\x1b[2J" in line, line


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("/plain/path/", "/plain/path/"),
        ("/caf\u00e9/\u65e5\u672c", "/caf\u00e9/\u65e5\u672c"),  # printable non-ASCII stays readable
        ("a\tb", "a\\tb"),
        ("a\x7fb\x85c", "a\\x7fb\\x85c"),
        ("back\\slash", "back\\\\slash"),  # escaped too, so "\\n" in a line always means an escape
        ("\u202etxt.exe", "\\u202etxt.exe"),  # bidi override: not shown raw
    ],
)
def test_printable(text, escaped):
    assert bursts.printable(text) == escaped
