"""The responses sent instead of a guarded view (django_semaphore.views): the 429 page
or JSON body with Retry-After, content negotiation, the overridable template."""

import logging

import pytest
from django.test import RequestFactory

from django_semaphore import SemaphoreFull, semaphores
from django_semaphore.web.views import prefers_json, rejected
from tests.support.helpers import body
from tests.support.settings_web import WEB_SEMAPHORES


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


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


def test_template_is_overridable(client, settings, tmp_path):
    (tmp_path / "django_semaphore").mkdir()
    (tmp_path / "django_semaphore" / "429.html").write_text("Slow down, {{ retry_after }}s")
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [str(tmp_path)]}]
    lease = semaphores["web-one"].acquire()
    response = client.get("/web/boom/")
    assert response.status_code == 429
    assert response.content.decode() == f"Slow down, {response['Retry-After']}s"
    lease.release()
