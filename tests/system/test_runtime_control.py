"""Runtime control from the operator's side: the admin form, its LogEntry and history, the
waiters and five-minute figures, and the Prometheus gauges — Django's test client against
the real Redis (single server and Cluster).

The browser version of the admin form is tests/system/test_runtime_control_browser.py.
"""

import html as html_lib
import json
import re
import threading
from html.parser import HTMLParser

import pytest
from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import include, path
from prometheus_client.parser import text_string_to_metric_families

from django_semaphore import semaphores, signals
from django_semaphore.backend import connection
from django_semaphore.backend.keys import control_key
from django_semaphore.config import settings as conf
from django_semaphore.models import Semaphore as SemaphoreModel
from django_semaphore.ops import metrics
from django_semaphore.runtime import adaptive, stats
from django_semaphore.runtime.control import Effective
from tests.support.helpers import HOSTILE_LIMIT_TEXTS, wait_until

# This module is also the URLconf of its tests: the admin and the metrics endpoint.
urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics/", include("django_semaphore.metrics.urls")),
]

pytestmark = [pytest.mark.usefixtures("backend"), pytest.mark.urls(__name__)]

LIST_URL = "/admin/django_semaphore/semaphore/"
PAGE = LIST_URL + "reports/"
SEMAPHORES = {
    "reports": {"LIMIT": 2, "TIMEOUT": 30, "WAIT": 0},
    "exports": {"LIMIT": 1, "TIMEOUT": 30, "MODE": "dry_run"},
}


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = SEMAPHORES


def _staff(username, *perms):
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


@pytest.fixture
def viewer(db):
    return _staff("viewer", "view_semaphore")


@pytest.fixture
def changer(db):
    return _staff("changer", "view_semaphore", "change_semaphore")


@pytest.fixture
def changes():
    """The config_changed signals sent meanwhile: (name, limit, mode, user)."""
    seen = []

    def receiver(sender, semaphore, limit, mode, user, **kwargs):
        seen.append((semaphore.name, limit, mode, user))

    signals.config_changed.connect(receiver, weak=False)
    yield seen
    signals.config_changed.disconnect(receiver)


def _client(user, **options):
    client = Client(**options)
    client.force_login(user)
    return client


def _text(response):
    """The page's text without tags and with runs of white space collapsed."""
    html = response.content.decode()
    return html_lib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def _effective():
    return semaphores["reports"].effective()


SETTINGS = Effective(2, "enforce", "settings")

# -- the form ---------------------------------------------------------------------------


def test_view_only_user_sees_the_values_in_force_but_no_form(viewer):
    semaphores["reports"].override(limit=1)
    response = _client(viewer).get(PAGE)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="sema-effective-limit">1' in html
    assert 'data-source="override"' in html
    assert 'id="sema-control"' not in html
    assert 'name="limit"' not in html


def test_post_without_change_permission_is_403_and_writes_nothing(viewer, changes):
    response = _client(viewer).post(PAGE, {"limit": "1", "mode": "dry_run"})
    assert response.status_code == 403
    response = _client(viewer).post(PAGE, {"clear": "1"})
    assert response.status_code == 403
    assert _effective() == SETTINGS
    assert changes == [] and not LogEntry.objects.exists()


def test_anonymous_post_goes_to_the_login_page(db):
    response = Client().post(PAGE, {"limit": "1", "mode": "enforce"})
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    assert _effective() == SETTINGS


def test_csrf_is_enforced(changer):
    client = _client(changer, enforce_csrf_checks=True)
    assert client.post(PAGE, {"limit": "1", "mode": "enforce"}).status_code == 403
    assert _effective() == SETTINGS
    page = client.get(PAGE)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    response = client.post(PAGE, {"limit": "1", "mode": "enforce", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert _effective() == Effective(1, "enforce", "override")


LIMIT_ERROR = "Limit must be a whole number from 0 to 1,000,000 (0 pauses the semaphore)"
BAD_FORMS = {
    "not a number": ({"limit": "two", "mode": "enforce"}, LIMIT_ERROR),
    "a fraction": ({"limit": "1.5", "mode": "enforce"}, LIMIT_ERROR),
    "negative": ({"limit": "-1", "mode": "enforce"}, LIMIT_ERROR),
    "no limit": ({"limit": "", "mode": "enforce"}, "This field is required."),
    "unknown mode": (
        {"limit": "1", "mode": "loud"},
        "Select a valid choice. loud is not one of the available choices.",
    ),
}


@pytest.mark.parametrize(("data", "error"), BAD_FORMS.values(), ids=BAD_FORMS.keys())
def test_bad_input_is_a_form_error_and_writes_nothing(changer, changes, data, error):
    response = _client(changer).post(PAGE, data)
    assert response.status_code == 200
    assert error in _text(response)
    assert 'class="errorlist' in response.content.decode()
    assert _effective() == SETTINGS
    assert changes == [] and not LogEntry.objects.exists()


@pytest.mark.parametrize("text", [t for t in HOSTILE_LIMIT_TEXTS if t], ids=lambda text: repr(text)[:24])
def test_a_limit_that_is_not_ascii_digits_up_to_a_million_is_a_form_error(changer, changes, text):
    """The same rule as sema_set's: "١٢", "1_000", "+3", " 7 " and 10**20 used to pass
    IntegerField (the last stored as -2**63); the mode posted with them is not applied."""
    response = _client(changer).post(PAGE, {"limit": text, "mode": "dry_run"})
    assert response.status_code == 200
    assert LIMIT_ERROR in _text(response)
    assert 'class="errorlist' in response.content.decode()
    assert "9" * 100 not in _text(response)  # a 5,000-digit limit is not echoed whole
    assert _effective() == SETTINGS
    assert changes == [] and not LogEntry.objects.exists()


def test_a_million_is_the_largest_limit_the_form_takes(changer):
    response = _client(changer).post(PAGE, {"limit": "1000000", "mode": "enforce"})
    assert response.status_code == 302
    assert _effective() == Effective(10**6, "enforce", "override")
    field = re.search(r'<input[^>]*name="limit"[^>]*>', _client(changer).get(PAGE).content.decode()).group(0)
    assert 'min="0"' in field and 'max="1000000"' in field and 'value="1000000"' in field


def test_a_change_is_applied_logged_and_in_the_history(changer, changes):
    client = _client(changer)
    response = client.post(PAGE, {"limit": "1", "mode": "dry_run"})
    assert response.status_code == 302 and response["Location"] == PAGE
    assert _effective() == Effective(1, "dry_run", "override")
    assert changes == [("reports", 1, "dry_run", changer)]

    entry = LogEntry.objects.get()
    assert entry.user == changer and entry.action_flag == CHANGE
    assert entry.content_type == ContentType.objects.get_for_model(SemaphoreModel)
    assert entry.object_id == "reports" and entry.object_repr == "reports"
    assert entry.get_change_message() == "Set limit 2 -> 1, mode enforce -> dry_run."
    assert entry.get_admin_url() == PAGE

    page = client.get(PAGE)
    assert "“reports”: Set limit 2 -> 1, mode enforce -> dry_run." in _text(page)
    html = page.content.decode()
    assert 'class="sema-effective-limit">1' in html and 'class="sema-effective-mode">dry_run' in html
    assert 'name="clear"' in html  # an override is in force: it can be cleared

    history = client.get(PAGE + "history/")
    assert history.status_code == 200
    text = _text(history)
    assert "Change history: reports" in text
    assert "changer" in text and "Set limit 2 -> 1, mode enforce -> dry_run." in text
    recent = re.search(r'id="recent-actions-module".*?</div>', client.get("/admin/").content.decode(), re.S)
    assert f'href="{PAGE}">reports</a>' in recent.group(0)  # the index's recent actions


def test_only_the_fields_changed_are_overridden(changer, settings):
    client = _client(changer)
    client.post(PAGE, {"limit": "2", "mode": "dry_run"})  # the limit as settings have it
    assert _effective() == Effective(2, "dry_run", "override")
    settings.SEMAPHORES = {**SEMAPHORES, "reports": {**SEMAPHORES["reports"], "LIMIT": 3}}
    assert _effective() == Effective(3, "dry_run", "override")  # LIMIT still rules the limit
    assert LogEntry.objects.get().get_change_message() == "Set limit 2 -> 2, mode enforce -> dry_run."


def test_nothing_changed_writes_nothing(changer, changes):
    response = _client(changer).post(PAGE, {"limit": "2", "mode": "enforce"}, follow=True)
    assert "Nothing changed: limit 2 and mode enforce are already in force." in _text(response)
    assert _effective() == SETTINGS and changes == [] and not LogEntry.objects.exists()


def test_clear_override_button(changer, changes):
    client = _client(changer)
    client.post(PAGE, {"limit": "0", "mode": "enforce"})
    # The button ignores the fields, even invalid ones.
    response = client.post(PAGE, {"clear": "Clear override", "limit": "x"}, follow=True)
    assert "“reports”: Cleared the override: limit 0 -> 2, mode enforce -> enforce." in _text(response)
    assert _effective() == SETTINGS
    assert changes == [("reports", 0, "enforce", changer), ("reports", 2, "enforce", changer)]
    assert [e.get_change_message() for e in LogEntry.objects.order_by("pk")] == [
        "Set limit 2 -> 0, mode enforce -> enforce.",
        "Cleared the override: limit 0 -> 2, mode enforce -> enforce.",
    ]
    assert 'name="clear"' not in response.content.decode()
    again = client.post(PAGE, {"clear": "1"}, follow=True)
    assert "“reports” has no override to clear." in _text(again)
    assert LogEntry.objects.count() == 2


def test_the_history_of_an_unknown_semaphore_is_404_or_redirect(changer):
    response = _client(changer).get(LIST_URL + "nope/history/")
    assert response.status_code in (302, 404)
    assert _client(changer).post(LIST_URL + "nope/", {"limit": "1", "mode": "enforce"}).status_code == 404


def test_the_history_needs_the_view_permission(db):
    staff = _staff("staff")
    assert _client(staff).get(PAGE + "history/").status_code == 403


# -- waiters and the last five minutes ------------------------------------------------------


@pytest.fixture
def full_with_a_waiter():
    """ "reports" full (2 holders) and one caller queueing with meta; released at the end."""
    reports = semaphores["reports"]
    held = [reports.acquire(meta={"user": "alice"}), reports.acquire(meta={"user": "bob"})]
    assert all(held)
    got = []
    waiter = threading.Thread(
        target=lambda: got.append(reports.acquire(wait=20, meta={"job": "nightly-export", "user": "carol"}))
    )
    waiter.start()
    try:
        wait_until(reports.waiters, message="a waiter in the queue")
        yield held, got
    finally:
        held[0].release()
        waiter.join(20)
        for lease in [*held, *got]:
            if lease:
                lease.release()


def test_the_page_and_its_json_show_waiters_refusals_and_hold_times(viewer, full_with_a_waiter):
    held, _ = full_with_a_waiter
    reports = semaphores["reports"]
    assert reports.acquire(wait=0) is None  # a refusal, counted by this process
    wait_until(lambda: stats.recent(reports).refused >= 1, message="the refusal flushed to Redis")

    client = _client(viewer)
    page = client.get(PAGE)
    html, text = page.content.decode(), _text(page)
    assert html.count('class="sema-waiter"') == 1
    assert 'data-key="job"' in html and "nightly-export" in html and "carol" in html
    assert re.search(r'class="sema-waiting-count">1<', html)
    assert re.search(r'class="sema-refused">1<', html)
    assert "1 waiter, in serving order" in text

    status = client.get(PAGE + "status.json").json()
    assert status["limit"] == 2 and status["mode"] == "enforce" and status["source"] == "settings"
    assert status["settings"] == {"limit": 2, "mode": "enforce", "total": None}
    assert status["total"] is None and status["all_partitions"] is None  # no TOTAL
    assert status["waiting"] == 1
    assert status["recent"]["refused"] == 1 and status["recent"]["window_seconds"] == 300
    (partition,) = status["partitions"]
    (waiting,) = partition["waiters"]
    assert waiting["meta"]["job"] == "nightly-export" and waiting["permits"] == 1
    assert "identifier" not in waiting
    assert all(lease.identifier not in page.content.decode() for lease in held)

    listing = client.get(LIST_URL)
    row = re.search(
        r'<tbody class="sema-group" data-semaphore="reports">.*?</tbody>', listing.content.decode(), re.S
    )
    assert re.search(r'class="field-refused sema-num"[^>]*>1<', row.group(0))
    assert "every process: 2 in use · 1 waiting · last 5 minutes: 1 refused" in _text(listing)
    data = client.get(LIST_URL + "status.json").json()
    reports_data = next(s for s in data["semaphores"] if s["name"] == "reports")
    assert reports_data["recent"]["refused"] == 1 and reports_data["waiting"] == 1
    assert data["totals"]["waiting"] == 1 and data["totals"]["refused"] == 1

    # A lease released: its hold time shows up (p50 / p95 over every process's recent leases).
    held[1].release()
    wait_until(lambda: stats.recent(reports).samples >= 1, message="the hold time flushed")
    page = client.get(PAGE)
    # (ms, or s with one decimal when a loaded machine held it over a second)
    hold = r"\d+(?:\.\d)? m?s"
    assert re.search(rf'class="sema-hold">\s*{hold} / {hold}', page.content.decode()), _text(page)


def test_the_list_shows_modes_overrides_and_dry_run_refusals(viewer):
    exports = semaphores["exports"]  # MODE "dry_run" in settings, LIMIT 1
    leases = [exports.acquire(), exports.acquire()]
    assert all(leases) and leases[1].over_limit
    semaphores["reports"].override(limit=0)
    try:
        wait_until(lambda: stats.recent(exports).dry_run_refused >= 1, message="the would-be refusal flushed")
        html = _client(viewer).get(LIST_URL).content.decode()
        exports_row = re.search(r'data-semaphore="exports">.*?</tbody>', html, re.S).group(0)
        reports_row = re.search(r'data-semaphore="reports">.*?</tbody>', html, re.S).group(0)
        assert re.search(r'class="field-mode"[^>]*data-source="settings">dry_run', exports_row)
        assert re.search(r'class="field-dry_run_refused sema-num"[^>]*>1<', exports_row)
        assert "override" in reports_row and "paused" in reports_row
        assert "1 override in force" in html
    finally:
        for lease in leases:
            lease.release()


# -- Prometheus -----------------------------------------------------------------------------


def scrape(client):
    response = client.get("/metrics/")
    assert response.status_code == 200, response.content
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def test_metrics_give_the_mode_effective_limit_override_and_dry_run_refusals(client):
    metrics.install()
    before = scrape(client)
    assert value(before, "django_semaphore_effective_limit", semaphore="reports") == 2
    assert value(before, "django_semaphore_limit", semaphore="reports") == 2
    assert value(before, "django_semaphore_override", semaphore="reports") == 0
    assert [
        value(before, "django_semaphore_mode", semaphore="reports", mode=m)
        for m in ("enforce", "dry_run", "off")
    ] == [1, 0, 0]
    assert value(before, "django_semaphore_mode", semaphore="exports", mode="dry_run") == 1

    semaphores["reports"].override(limit=5, mode="off")
    exports = semaphores["exports"]
    leases = [exports.acquire(), exports.acquire(), exports.acquire()]  # LIMIT 1: two would-be refusals
    try:
        after = scrape(client)
    finally:
        for lease in leases:
            lease.release()
    assert value(after, "django_semaphore_effective_limit", semaphore="reports") == 5
    assert value(after, "django_semaphore_limit", semaphore="reports") == 2  # settings
    assert value(after, "django_semaphore_override", semaphore="reports") == 1
    assert [
        value(after, "django_semaphore_mode", semaphore="reports", mode=m)
        for m in ("enforce", "dry_run", "off")
    ] == [0, 0, 1]

    def delta(name):
        return (value(after, name, semaphore="exports") or 0) - (
            value(before, name, semaphore="exports") or 0
        )

    assert delta("django_semaphore_dry_run_refusals_total") == 2
    assert delta("django_semaphore_refusals_total") == 0  # admitted: not refused
    assert delta("django_semaphore_acquisitions_total") == 3


# -- TOTAL: the form's total field --------------------------------------------------------------

EXPORTS_PAGE = LIST_URL + "exports-total/"


@pytest.fixture
def with_total(settings):
    settings.SEMAPHORES = {
        **SEMAPHORES,
        "exports-total": {"LIMIT": 2, "TIMEOUT": 30, "KEY": "user", "TOTAL": 3},
    }
    sem = semaphores["exports-total"]
    yield sem
    sem.clear_override()


def _field(html, name):
    found = re.search(rf'<input[^>]*name="{name}"[^>]*>', html)
    return found.group(0) if found else None


def test_the_form_has_a_total_field_for_a_semaphore_with_total_only(changer, with_total):
    client = _client(changer)
    html = client.get(EXPORTS_PAGE).content.decode()
    field = _field(html, "total")
    assert 'value="3"' in field and 'min="0"' in field and 'max="1000000"' in field
    assert "Permits across all partitions together" in html
    assert _field(client.get(PAGE).content.decode(), "total") is None  # "reports" has no TOTAL


def test_a_total_change_is_applied_logged_and_shown(changer, with_total, changes):
    client = _client(changer)
    response = client.post(EXPORTS_PAGE, {"limit": "2", "mode": "enforce", "total": "5"})
    assert response.status_code == 302 and response["Location"] == EXPORTS_PAGE
    assert with_total.effective() == Effective(2, "enforce", "override", 5)
    assert changes == [("exports-total", 2, "enforce", changer)]
    message = "Set limit 2 -> 2, mode enforce -> enforce, total 3 -> 5."
    entry = LogEntry.objects.get()
    assert entry.object_id == "exports-total" and entry.get_change_message() == message
    page = client.get(EXPORTS_PAGE)
    assert f"“exports-total”: {message}" in _text(page)
    html = page.content.decode()
    assert 'class="sema-effective-total">5<' in html and 'data-total="5"' in html
    assert 'value="5"' in _field(html, "total")
    assert "settings: LIMIT 2, TOTAL 3, MODE enforce" in html
    # In the list too: the override, with what settings say.
    listing = _client(changer).get(LIST_URL).content.decode()
    row = re.search(r'data-semaphore="exports-total">.*?</tbody>', listing, re.S).group(0)
    assert "settings: LIMIT 2, TOTAL 3, MODE enforce" in row and 'data-total="5"' in row

    # Only the fields changed are overridden: a new mode keeps the total override.
    client.post(EXPORTS_PAGE, {"limit": "2", "mode": "dry_run", "total": "5"})
    assert with_total.effective() == Effective(2, "dry_run", "override", 5)
    response = client.post(EXPORTS_PAGE, {"limit": "2", "mode": "dry_run", "total": "5"}, follow=True)
    assert "Nothing changed: limit 2, mode dry_run and total 5 are already in force." in _text(response)

    response = client.post(EXPORTS_PAGE, {"clear": "1"}, follow=True)
    assert "Cleared the override: limit 2 -> 2, mode dry_run -> enforce, total 5 -> 3." in _text(response)
    assert with_total.effective() == Effective(2, "enforce", "settings", 3)
    assert LogEntry.objects.count() == 3


@pytest.mark.parametrize(
    ("total", "error"),
    [
        ("", "This field is required."),
        ("three", "Total must be a whole number from 0 to 1,000,000"),
        ("-1", "Total must be a whole number from 0 to 1,000,000"),
        ("1_000", "Total must be a whole number from 0 to 1,000,000"),
        ("1000001", "Total must be a whole number from 0 to 1,000,000"),
    ],
)
def test_a_bad_total_is_a_form_error_and_writes_nothing(changer, with_total, changes, total, error):
    response = _client(changer).post(EXPORTS_PAGE, {"limit": "1", "mode": "dry_run", "total": total})
    assert response.status_code == 200
    assert error in _text(response)
    assert 'class="errorlist' in response.content.decode()
    assert with_total.effective() == Effective(2, "enforce", "settings", 3)
    assert changes == [] and not LogEntry.objects.exists()


def test_an_engine_refusal_becomes_a_form_error(changer, with_total, changes, monkeypatch):
    """What the engine's own validation refuses is shown on the form, and nothing is written."""

    def refuse(*args, **kwargs):
        raise ValueError("total must be an int from 0 to 1,000,000, not 'x'.")

    monkeypatch.setattr(type(with_total), "override", refuse)
    response = _client(changer).post(EXPORTS_PAGE, {"limit": "2", "mode": "enforce", "total": "4"})
    assert response.status_code == 200
    assert "total must be an int from 0 to 1,000,000" in _text(response)
    assert with_total.effective() == Effective(2, "enforce", "settings", 3)
    assert not LogEntry.objects.exists()


def test_a_total_posted_for_a_semaphore_without_total_is_ignored(changer, with_total):
    response = _client(changer).post(PAGE, {"limit": "1", "mode": "enforce", "total": "9"})
    assert response.status_code == 302
    assert _effective() == Effective(1, "enforce", "override")
    assert LogEntry.objects.get().get_change_message() == "Set limit 2 -> 1, mode enforce -> enforce."
    semaphores["reports"].clear_override()


def test_metrics_give_the_effective_total(client, with_total):
    metrics.install()
    samples = scrape(client)
    assert value(samples, "django_semaphore_effective_total", semaphore="exports-total") == 3
    assert value(samples, "django_semaphore_effective_total", semaphore="reports") is None  # no TOTAL
    with_total.override(total=7)
    wait_until(lambda: with_total.effective().total == 7, message="the override applied")
    samples = scrape(client)
    assert value(samples, "django_semaphore_effective_total", semaphore="exports-total") == 7
    assert value(samples, "django_semaphore_override", semaphore="exports-total") == 1


# -- the form as the operator saw it ------------------------------------------------------------


class _ControlForm(HTMLParser):
    """What a browser submits from the page's runtime control form, untouched: every
    input (hidden ones included) and each select's selected option."""

    def __init__(self):
        super().__init__()
        self.data, self._inside, self._select = {}, False, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self._inside = attrs.get("id") == "sema-control"
        elif self._inside and tag == "input" and attrs.get("type") != "submit" and attrs.get("name"):
            self.data[attrs["name"]] = attrs.get("value") or ""
        elif self._inside and tag == "select":
            self._select = attrs["name"]
        elif self._inside and tag == "option" and self._select and "selected" in attrs:
            self.data[self._select] = attrs["value"]

    def handle_endtag(self, tag):
        if tag == "form":
            self._inside = False
        elif tag == "select":
            self._select = None


def _form_as_shown(client, url):
    parser = _ControlForm()
    parser.feed(client.get(url).content.decode())
    assert "limit" in parser.data and "mode" in parser.data, parser.data
    return parser.data


def test_a_field_left_as_shown_keeps_a_change_made_meanwhile(changer, changes):
    """The form posts every field. A field the operator left as the page showed it is not
    applied: another operator's pause made while the page was open (sema_set --limit 0) is
    not undone by a change of the mode only, nor their mode by a change of the limit only."""
    client = _client(changer)
    shown = _form_as_shown(client, PAGE)  # limit 2, mode enforce
    semaphores["reports"].override(limit=0)  # meanwhile, elsewhere: paused
    response = client.post(PAGE, {**shown, "mode": "dry_run"})
    assert response.status_code == 302
    assert _effective() == Effective(0, "dry_run", "override")  # still paused
    assert LogEntry.objects.get().get_change_message() == "Set limit 0 -> 0, mode enforce -> dry_run."

    shown = _form_as_shown(client, PAGE)  # limit 0, mode dry_run
    semaphores["reports"].override(mode="off")  # meanwhile, elsewhere
    client.post(PAGE, {**shown, "limit": "1"})
    assert _effective() == Effective(1, "off", "override")  # the mode stays "off"

    # Applied as shown after a change elsewhere: nothing is written, and the page says why.
    shown = _form_as_shown(client, PAGE)  # limit 1, mode off
    semaphores["reports"].override(limit=2)
    response = client.post(PAGE, shown, follow=True)
    assert "Nothing changed: limit 2 and mode off are already in force." in _text(response)
    assert "The values in force changed since this page was shown: it shows them now." in _text(response)
    assert _form_as_shown(client, PAGE)["limit"] == "2"
    assert LogEntry.objects.count() == 2


def test_a_mode_change_does_not_pin_an_adaptive_limit_that_moved(changer, settings):
    """On an adaptive semaphore, the limit shown is the controller's of that moment: a mode
    change posted after the controller moved it must not pin the old limit as an override."""
    settings.SEMAPHORES = {
        **SEMAPHORES,
        "elastic": {"LIMIT": 3, "TIMEOUT": 30, "ADAPTIVE": {"MIN": 1, "MAX": 8}},
    }
    elastic = semaphores["elastic"]
    client = _client(changer)
    shown = _form_as_shown(client, LIST_URL + "elastic/")
    assert shown["limit"] == "3"
    prefix = conf.setting("SEMAPHORE_KEY_PREFIX")
    state = {
        "limit": 5,
        "base": 20.0,
        "mean": 21.0,
        "dir": 1,
        "at": 1,
        "n": 0,
        "p": 0,
        "settle": 0,
        "probe": 0,
    }
    connection.get_client().hset(control_key(prefix), adaptive.state_field("elastic"), json.dumps(state))
    wait_until(lambda: elastic.effective().limit == 5, message="the controller's new limit applied")
    client.post(LIST_URL + "elastic/", {**shown, "mode": "dry_run"})
    try:
        assert elastic.effective() == Effective(5, "dry_run", "override")
        elastic.override(mode="enforce")
        assert elastic.effective().limit == 5  # no limit override: still the controller's
    finally:
        elastic.clear_override()
