"""The admin pages, through Django's test client against the real Redis.

The browser tests (tests/system/test_admin_browser.py) drive the same pages in
Chromium; these cover permissions, JSON, LogEntry and error paths fast, and
SemaphoreAdmin registered on an AdminSite of one's own.
"""

import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time
from html.parser import HTMLParser

import pytest
from django.contrib.admin import AdminSite
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from django.urls import path, reverse
from django.utils import timezone as django_timezone

from django_semaphore import admin as admin_module
from django_semaphore import semaphores
from django_semaphore.admin import SemaphoreAdmin
from django_semaphore.backend import connection
from django_semaphore.backend.keys import control_key, key_hash, name_hash
from django_semaphore.backend.scripting import run
from django_semaphore.config import settings as conf
from django_semaphore.models import Semaphore
from django_semaphore.runtime import adaptive
from tests.support.helpers import wait_until, wait_until_expired

LIST_URL = "/admin/django_semaphore/semaphore/"
SEMAPHORES = {
    "reports": {"LIMIT": 2, "TIMEOUT": 30},
    "per-user": {"LIMIT": 1, "TIMEOUT": 30, "KEY": "user"},
}


# Every test but test_custom_site (at the end) runs on a single server and on a
# Redis Cluster (its ``backend`` mark, tests/support/fixtures_redis.py), except those
# that talk to the single server directly.


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
def leases():
    """Two holders of "reports" and one of per-user partition "user:7", with web-layer meta."""
    reports = semaphores["reports"]
    alice = {"user": "alice", "method": "GET", "path": "/report/1", "remote_addr": "10.0.0.1"}
    bob = {"user": "bob", "method": "POST", "path": "/report/2", "remote_addr": "10.0.0.2"}
    held = [
        reports.acquire(meta=alice),
        reports.acquire(meta=bob),
        semaphores["per-user"].acquire(key="user:7", meta={"user": "carol", "method": "GET", "path": "/me"}),
    ]
    assert all(held)
    yield held
    for lease in held:
        lease.release()


@pytest.mark.usefixtures("backend")
def test_anonymous_is_sent_to_login(client):
    response = client.get(LIST_URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert client.get(LIST_URL + "status.json").status_code == 302
    assert client.post(LIST_URL + "reports/release/", {"partition": "_", "token": "1"}).status_code == 302


@pytest.mark.usefixtures("backend")
def test_staff_without_permission_gets_403_and_no_index_entry(client, db):
    client.force_login(_staff("nobody"))
    assert client.get(LIST_URL).status_code == 403
    assert client.get(LIST_URL + "reports/").status_code == 403
    assert client.get(LIST_URL + "status.json").status_code == 403
    assert client.get(LIST_URL + "reports/status.json").status_code == 403
    index = client.get("/admin/")
    assert index.status_code == 200
    assert LIST_URL not in index.content.decode()


@pytest.mark.usefixtures("backend")
def test_list_page_figures(client, viewer, leases):
    client.force_login(viewer)
    index = client.get("/admin/").content.decode()
    assert LIST_URL in index and "Semaphores" in index
    assert "/admin/django_semaphore/semaphore/add/" not in index

    html = client.get(LIST_URL).content.decode()
    assert 'data-semaphore="reports"' in html and 'data-semaphore="per-user"' in html
    assert "user:7" in html  # the partition's label comes from its holder's meta
    data = client.get(LIST_URL + "status.json").json()
    by_name = {s["name"]: s for s in data["semaphores"]}
    assert by_name["reports"]["partitions"] == [
        {
            "partition": "_",
            "label": "",
            "limit": 2,
            "in_use": 2,
            "free": 0,
            "waiting": 0,
            "utilisation": 100,
        }
    ]
    (partition,) = by_name["per-user"]["partitions"]
    assert partition["partition"] == key_hash("user:7")
    assert (partition["label"], partition["in_use"], partition["free"]) == ("user:7", 1, 0)
    assert by_name["per-user"]["partitioned_by"] == "per user"
    assert 'data-partition="_"' in data["html"]


@pytest.mark.usefixtures("backend")
def test_view_only_user_sees_meta_but_no_identifier_and_no_button(client, viewer, leases):
    client.force_login(viewer)
    response = client.get(LIST_URL + "reports/")
    html = response.content.decode()
    assert response.status_code == 200
    for expected in ("alice", "bob", "/report/1", "10.0.0.2", "POST"):
        assert expected in html
    assert html.index(f'data-token="{leases[0].token}"') < html.index(f'data-token="{leases[1].token}"')
    assert "Force release" not in html and "Purge expired" not in html
    data = client.get(LIST_URL + "reports/status.json").json()
    body = client.get(LIST_URL + "reports/status.json").content.decode()
    assert [h["token"] for h in data["partitions"][0]["holders"]] == [leases[0].token, leases[1].token]
    assert data["partitions"][0]["holders"][0]["meta"]["user"] == "alice"
    for lease in leases:
        assert lease.identifier not in html
        assert lease.identifier not in body
    # POSTs need the change permission.
    response = client.post(LIST_URL + "reports/release/", {"partition": "_", "token": leases[0].token})
    assert response.status_code == 403
    assert client.post(LIST_URL + "reports/purge/").status_code == 403
    assert len(semaphores["reports"].holders()) == 2


@pytest.mark.usefixtures("backend")
def test_change_user_force_releases_by_token_and_it_is_logged(client, changer, leases):
    client.force_login(changer)
    html = client.get(LIST_URL + "reports/").content.decode()
    assert html.count("Force release</button>") == 2 and "Purge expired entries" in html
    for lease in leases:
        assert lease.identifier not in html
    response = client.post(LIST_URL + "reports/release/", {"partition": "_", "token": leases[0].token})
    assert response.status_code == 302 and response["Location"] == LIST_URL + "reports/"
    assert [h.token for h in semaphores["reports"].holders()] == [leases[1].token]
    assert leases[0].refresh() is False  # the holder learns it lost the slot
    entry = LogEntry.objects.get()
    assert (entry.action_flag, entry.object_id, entry.user_id) == (CHANGE, "reports", changer.pk)
    assert f"token {leases[0].token}" in entry.get_change_message()
    assert "alice" in entry.get_change_message()
    assert entry.get_admin_url() == LIST_URL + "reports/"
    page = client.get(response["Location"]).content.decode()
    assert f"Released token {leases[0].token}" in page
    assert f'data-token="{leases[0].token}"' not in page

    # Again: nothing to release, a warning, no second log entry.
    client.post(LIST_URL + "reports/release/", {"partition": "_", "token": leases[0].token})
    assert LogEntry.objects.count() == 1
    assert "no longer holds a slot" in client.get(LIST_URL + "reports/").content.decode()


@pytest.mark.usefixtures("backend")
def test_force_release_in_a_partition(client, changer, leases):
    client.force_login(changer)
    partition = key_hash("user:7")
    url = LIST_URL + f"per-user/?partition={partition}"
    html = client.get(url).content.decode()
    assert "carol" in html and "alice" not in html
    # The token of a "reports" holder means nothing in this partition.
    client.post(LIST_URL + f"per-user/release/?partition={partition}", {"partition": partition, "token": 999})
    assert len(semaphores["per-user"].holders(key="user:7")) == 1
    response = client.post(
        LIST_URL + f"per-user/release/?partition={partition}",
        {"partition": partition, "token": leases[2].token},
    )
    assert response["Location"] == url
    assert semaphores["per-user"].holders(key="user:7") == []
    assert len(semaphores["reports"].holders()) == 2


@pytest.mark.usefixtures("backend")
def test_bad_requests(client, changer, leases):
    client.force_login(changer)
    assert client.get(LIST_URL + "nope/").status_code == 404
    assert client.get(LIST_URL + "reports/?partition=zz").status_code == 404
    assert client.get(LIST_URL + "reports/release/").status_code == 405
    response = client.post(LIST_URL + "reports/release/", {"partition": "../x", "token": "1"}, follow=True)
    assert "named no holder" in response.content.decode()
    assert len(semaphores["reports"].holders()) == 2


@pytest.mark.usefixtures("backend")
def test_csrf_is_enforced(changer, leases):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(changer)
    response = client.post(LIST_URL + "reports/release/", {"partition": "_", "token": leases[0].token})
    assert response.status_code == 403
    assert len(semaphores["reports"].holders()) == 2


@pytest.mark.usefixtures("backend")
def test_purge_expired_button(client, changer, settings, raw_redis):
    settings.SEMAPHORES = {"reports": {"LIMIT": 2, "TIMEOUT": 30}, "quick": {"LIMIT": 2, "TIMEOUT": 0.2}}
    live = semaphores["reports"].acquire()
    quick = semaphores["quick"]
    assert quick.acquire() and quick.acquire()
    keys = quick.partition()
    wait_until_expired(raw_redis, keys)
    client.force_login(changer)
    response = client.post(LIST_URL + "quick/purge/", follow=True)
    assert "Removed 2 expired entries from “quick”." in response.content.decode()
    assert raw_redis.zcard(keys.timeouts) == 0
    assert [h.token for h in semaphores["reports"].holders()] == [live.token]
    assert LogEntry.objects.filter(object_id="quick").count() == 1


@pytest.mark.usefixtures("backend")
def test_redis_down_shows_an_error_not_a_500(client, viewer, settings):
    from tests.support.servers import free_port

    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0"}
    client.force_login(viewer)
    response = client.get(LIST_URL)
    assert response.status_code == 200
    assert "failed" in response.content.decode()
    assert client.get(LIST_URL + "reports/status.json").json()["error"]


@pytest.mark.usefixtures("backend")
def test_reverse_names(db):
    assert reverse("admin:django_semaphore_semaphore_changelist") == LIST_URL
    assert reverse("admin:django_semaphore_semaphore_change", args=["reports"]) == LIST_URL + "reports/"


@pytest.mark.usefixtures("backend")
def test_user_pk_in_meta_is_shown_with_the_username(client, viewer):
    lease = semaphores["reports"].acquire(meta={"user": str(viewer.pk), "method": "GET", "path": "/x/"})
    try:
        client.force_login(viewer)
        html = client.get(LIST_URL + "reports/").content.decode()
    finally:
        lease.release()
    assert f'>viewer <span class="sema-muted">({viewer.pk})</span></td>' in html


class _SkewedTimezone:
    """django.utils.timezone as the admin sees it, on a clock ``offset`` seconds off."""

    def __init__(self, offset):
        self.offset = datetime.timedelta(seconds=offset)

    def now(self):
        return django_timezone.now() + self.offset

    def __getattr__(self, name):
        return getattr(django_timezone, name)


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("offset", [120, -120], ids=["ahead", "behind"])
def test_expires_in_and_waited_are_on_the_clock_that_wrote_them(
    client, viewer, settings, monkeypatch, offset
):
    """A "lua" lease's expiry and a waiter's arrival are Redis server times: the page counted
    them against the web server's clock, so with that clock 2 minutes ahead of Redis every
    live holder said "Expires in 0 s" (behind: 150 s for a 30 s lease)."""
    settings.SEMAPHORES = {"quick": {"LIMIT": 1, "TIMEOUT": 30, "WAIT": 20}}
    quick = semaphores["quick"]
    held = quick.acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(quick.acquire()))
    waiter.start()
    try:
        wait_until(quick.waiters, message="a waiter in the queue")
        monkeypatch.setattr(admin_module, "timezone", _SkewedTimezone(offset))
        client.force_login(viewer)
        html = client.get(LIST_URL + "quick/").content.decode()
        data = client.get(LIST_URL + "quick/status.json").json()
    finally:
        held.release()
        waiter.join(20)
        for lease in got:
            lease.release()
    expires_in = int(re.search(r'class="field-expires_in[^>]*>(\d+) s<', html).group(1))
    waited = int(re.search(r'class="field-waited[^>]*>(\d+) s<', html).group(1))
    assert 25 <= expires_in <= 30 and 0 <= waited <= 5, (expires_in, waited)
    (partition,) = data["partitions"]
    assert 25 <= partition["holders"][0]["expires_in"] <= 30
    assert 0 <= partition["waiters"][0]["waited"] <= 5


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("algorithm", ["lua", "fair"])
def test_a_project_without_time_zones_sees_its_holders(client, viewer, settings, algorithm):
    """USE_TZ = False (projects started before Django 5.0 often keep it): timezone.now() is
    naive, and subtracting it from a holder's aware expiry raised TypeError: a semaphore's
    page and its JSON answered 500 as soon as it had a holder."""
    settings.SEMAPHORES = {"quick": {"LIMIT": 1, "TIMEOUT": 30, "ALGORITHM": algorithm}}
    client.force_login(viewer)
    settings.USE_TZ = False
    lease = semaphores["quick"].acquire(meta={"job": "nightly"})
    try:
        page = client.get(LIST_URL + "quick/")
        status = client.get(LIST_URL + "quick/status.json")
    finally:
        lease.release()
    assert page.status_code == 200 and status.status_code == 200
    expires_in = int(re.search(r'class="field-expires_in[^>]*>(\d+) s<', page.content.decode()).group(1))
    assert 25 <= expires_in <= 30
    assert 25 <= status.json()["partitions"][0]["holders"][0]["expires_in"] <= 30


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("user", ["99999999999999999999", -(10**30)], ids=["20 digits", "-10**30"])
def test_a_user_meta_beyond_the_databases_integers_is_shown_not_a_500(client, viewer, user):
    """A caller's meta "user" (an external account number, say) too large for the
    database's integers made the username lookup raise OverflowError on SQLite: the
    semaphore's page and its JSON answered 500 for as long as that holder lived."""
    reports = semaphores["reports"]
    held = [reports.acquire(meta={"user": user}), reports.acquire(meta={"user": str(viewer.pk)})]
    try:
        client.force_login(viewer)
        page = client.get(LIST_URL + "reports/")
        status = client.get(LIST_URL + "reports/status.json")
    finally:
        for lease in held:
            lease.release()
    assert page.status_code == 200 and status.status_code == 200
    html = page.content.decode()
    assert f'<td class="field-user" data-label="User">{user}</td>' in html
    assert f'>viewer <span class="sema-muted">({viewer.pk})</span></td>' in html  # the others' names too
    assert status.json()["partitions"][0]["holders"][0]["meta"]["user"] == user


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("backend", ["cluster"], indirect=True)
def test_pages_on_a_cluster(client, changer, backend):
    per_user = semaphores["per-user"]
    held = {n: per_user.acquire(key=f"user:{n}", meta={"user": str(n)}) for n in range(8)}
    try:
        client.force_login(changer)
        data = client.get(LIST_URL + "status.json").json()
        partitions = {s["name"]: s["partitions"] for s in data["semaphores"]}["per-user"]
        assert sorted(p["label"] for p in partitions) == sorted(f"user:{n}" for n in range(8))
        assert all(p["in_use"] == 1 for p in partitions)
        target = key_hash("user:5")
        form = {"partition": target, "token": held[5].token}
        client.post(LIST_URL + f"per-user/release/?partition={target}", form)
        assert per_user.holders(key="user:5") == []
        assert len(per_user.holders(key="user:4")) == 1
    finally:
        for lease in held.values():
            lease.release()


@pytest.mark.usefixtures("backend")
def test_a_semaphore_with_bad_settings_shows_its_error(client, viewer, settings):
    settings.SEMAPHORES = {**SEMAPHORES, "broken": {"LIMIT": 0}}
    client.force_login(viewer)
    html = client.get(LIST_URL).content.decode()
    assert "SEMAPHORES[&#x27;broken&#x27;][&#x27;LIMIT&#x27;] is 0" in html
    assert 'data-semaphore="reports"' in html


@pytest.mark.usefixtures("backend")
def test_waiting_callers_are_counted(client, viewer, settings):
    settings.SEMAPHORES = {**SEMAPHORES, "queued": {"LIMIT": 1, "TIMEOUT": 30, "WAIT": 30}}
    queued = semaphores["queued"]
    holder = queued.acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(queued.acquire()))
    waiter.start()
    try:
        client.force_login(viewer)
        deadline = time.monotonic() + 30
        while True:  # until the waiter has queued (it shows in Redis, not in a sleep)
            data = client.get(LIST_URL + "status.json").json()
            (partition,) = {s["name"]: s for s in data["semaphores"]}["queued"]["partitions"]
            if partition["waiting"] == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert (partition["in_use"], partition["free"], partition["waiting"]) == (1, 0, 1)
        assert "1 of 1 in use · 0 free · 1 waiting" in client.get(LIST_URL + "queued/").content.decode()
    finally:
        holder.release()
        waiter.join(30)
    assert got and got[0] is not None
    got[0].release()


# -- ad-hoc semaphores (no SEMAPHORES entry) ---------------------------------------


AD_HOC_HOLDER = """
import sys

import django

django.setup()
from django_semaphore import Semaphore

lease = Semaphore("crawler", limit=3, timeout=30).acquire(key="example.com", meta={"job": "crawl-42"})
print(lease.token, flush=True)
sys.stdin.read()  # until the test closes it
print(lease.release(), flush=True)
"""


@pytest.fixture
def ad_hoc_holder(subprocess_env):
    """Another process holding a slot of ad-hoc semaphore "crawler" (limit 3) until ``done()``."""
    process = subprocess.Popen(
        [sys.executable, "-c", AD_HOC_HOLDER],
        env=subprocess_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    token = int(process.stdout.readline())

    def done():
        process.stdin.close()
        assert process.stdout.readline().strip() == "True"
        process.wait(10)

    yield token, done
    if process.poll() is None:
        process.kill()
        process.wait(10)


def _group(html, name):
    """The list page's rows of semaphore ``name`` (its tbody)."""
    start = html.index(f'data-semaphore="{name}"')
    return html[start : html.index("</tbody>", start)]


@pytest.mark.usefixtures("backend")
def test_an_ad_hoc_semaphore_held_by_another_process_is_listed_with_a_page(client, changer, ad_hoc_holder):
    token, done = ad_hoc_holder
    client.force_login(changer)

    def listed():
        html = client.get(LIST_URL).content.decode()
        return html if 'data-semaphore="crawler"' in html else None

    html = wait_until(listed, 10, message="crawler listed")  # the other process's poller records it
    assert html.index('data-semaphore="reports"') < html.index('data-semaphore="crawler"')
    group = _group(html, "crawler")
    assert "ad hoc" in group and "example.com" in group and LIST_URL + "crawler/" in group
    data = {s["name"]: s for s in client.get(LIST_URL + "status.json").json()["semaphores"]}
    assert data["crawler"]["ad_hoc"] is True and data["reports"]["ad_hoc"] is False
    (partition,) = data["crawler"]["partitions"]
    assert (partition["label"], partition["limit"], partition["in_use"]) == ("example.com", 3, 1)

    page = client.get(LIST_URL + "crawler/")
    detail = page.content.decode()
    assert page.status_code == 200 and f'data-token="{token}"' in detail and "crawl-42" in detail
    assert "ad hoc" in detail
    assert 'id="sema-control"' not in detail  # sema_set refuses it: no runtime control form
    assert client.post(LIST_URL + "crawler/", {"limit": 1, "mode": "enforce"}).status_code == 404
    detail_json = client.get(LIST_URL + "crawler/status.json").json()
    assert [h["token"] for p in detail_json["partitions"] for h in p["holders"]] == [token]

    done()  # released: no live partition, no line
    assert 'data-semaphore="crawler"' not in client.get(LIST_URL).content.decode()


@pytest.mark.usefixtures("backend")
def test_an_ad_hoc_holder_can_be_force_released(client, changer):
    from django_semaphore import Semaphore as Sem
    from django_semaphore.runtime import adhoc, stats

    adhoc.forget()
    crawler = Sem("crawler", limit=2, timeout=30)
    lease = crawler.acquire()
    stats.flush()
    client.force_login(changer)
    response = client.post(LIST_URL + "crawler/release/", {"partition": "_", "token": lease.token})
    assert response.status_code == 302 and response["Location"] == LIST_URL + "crawler/"
    assert crawler.holders() == [] and lease.refresh() is False
    assert LogEntry.objects.get().object_id == "crawler"
    history = client.get(LIST_URL + "crawler/history/")
    assert history.status_code == 200 and f"Force-released token {lease.token}" in history.content.decode()


@pytest.mark.usefixtures("backend")
def test_ad_hoc_semaphores_beyond_the_maximum_are_said_to_be_left_out(client, viewer, monkeypatch):
    """The list shows MAX_AD_HOC ad-hoc semaphores (by name); the others in use were left out
    without a word, and out of the totals line, so an operator looking for one found nothing."""
    from django_semaphore import Semaphore as Sem
    from django_semaphore.ops import monitor
    from django_semaphore.runtime import adhoc, stats

    monkeypatch.setattr(monitor, "MAX_AD_HOC", 1)
    adhoc.forget()
    held = [Sem(name, limit=2, timeout=30).acquire() for name in ("adhoc-a", "adhoc-b")]
    stats.flush()
    client.force_login(viewer)
    try:
        html = client.get(LIST_URL).content.decode()
        data = client.get(LIST_URL + "status.json").json()
    finally:
        for lease in held:
            lease.release()
    assert 'data-semaphore="adhoc-a"' in html and 'data-semaphore="adhoc-b"' not in html
    assert "1 more ad-hoc semaphore in use is not listed (nor counted above)" in html
    assert data["totals"]["ad_hoc_not_listed"] == 1


@pytest.mark.usefixtures("backend")
def test_a_hostile_ad_hoc_name_is_escaped_and_cut(client, viewer):
    from django_semaphore import Semaphore as Sem
    from django_semaphore.runtime import adhoc, stats

    adhoc.forget()
    name = '<b id="x">bold</b>"\'' + "y" * 20_000
    lease = Sem(name, limit=1, timeout=30).acquire()
    stats.flush()
    try:
        client.force_login(viewer)
        html = client.get(LIST_URL).content.decode()
        digest_page = client.get(LIST_URL + f"{name_hash(name)}/")
    finally:
        lease.release()
    assert '<b id="x">' not in html and "&lt;b id=&quot;x&quot;&gt;bold&lt;/b&gt;" in html
    assert "y" * (adhoc.MAX_NAME_CHARS + 1) not in html and len(html) < 60_000
    assert digest_page.status_code == 200 and "&lt;b id=&quot;x&quot;&gt;" in digest_page.content.decode()


HOSTILE_NAMES = [
    "\ud800",
    "nul\0byte",
    "line\nbreak",
    "a/b",
    "{",
    "_5F",
    "%2F",
    "ünïcødé 🚦",
    " ",
    "..",
    "x" * 300,
]


@pytest.mark.usefixtures("backend")
def test_every_hostile_ad_hoc_name_is_listed_and_its_page_opens(client, changer):
    import html as html_module
    import re

    from django_semaphore import Semaphore as Sem
    from django_semaphore.runtime import adhoc, stats

    adhoc.forget()
    held = [Sem(name, limit=2, timeout=30).acquire(meta={"n": n}) for n, name in enumerate(HOSTILE_NAMES)]
    stats.flush()
    try:
        client.force_login(changer)
        html = client.get(LIST_URL).content.decode()
        links = {
            html_module.unescape(href)
            for href in re.findall(r'<a href="(/admin/django_semaphore/semaphore/[^"?]+/)">', html)
        }
        pages = {link: client.get(link) for link in links}
    finally:
        for lease in held:
            lease.release()
    ad_hoc_links = links - {LIST_URL + name + "/" for name in SEMAPHORES}
    assert len(ad_hoc_links) == len(HOSTILE_NAMES)
    for link, page in pages.items():
        assert page.status_code == 200, link
    shown = [
        re.findall(r'data-key="n"><dt>n</dt><dd>(\d+)</dd>', pages[link].content.decode())
        for link in ad_hoc_links
    ]
    assert sorted(int(n) for found in shown for n in found) == list(
        range(len(HOSTILE_NAMES))
    )  # one holder each


# -- every meta key and value -------------------------------------------------------


class _HolderRow(HTMLParser):
    """The meta items of one holder row: [(key, shown text, title or None)], and the row's text."""

    def __init__(self, token):
        super().__init__()
        self.token = str(token)
        self.depth = 0  # > 0 while inside the row
        self.items = []
        self.text = []
        self._field = None  # "dt" or "dd" while inside one of an item

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and attrs.get("data-token") == self.token:
            self.depth = 1
        elif self.depth and tag == "tr":
            self.depth += 1
        if not self.depth:
            return
        if tag == "div" and "sema-meta-item" in (attrs.get("class") or "").split():
            self.items.append([attrs.get("data-key"), "", "", None])
        elif tag in ("dt", "dd") and self.items:
            self._field = tag
            if tag == "dd":
                self.items[-1][3] = attrs.get("title")

    def handle_endtag(self, tag):
        if self.depth and tag == "tr":
            self.depth -= 1
        if tag in ("dt", "dd"):
            self._field = None

    def handle_data(self, data):
        if not self.depth:
            return
        self.text.append(data)
        if self._field == "dt":
            self.items[-1][1] += data
        elif self._field == "dd":
            self.items[-1][2] += data


def holder_row(html, token):
    """{key: (dt text, dd text, dd title)} of the holder row with this token, and the row's text."""
    parser = _HolderRow(token)
    parser.feed(html)
    assert parser.text, f"no holder row with token {token}"
    return {key: (dt, dd, title) for key, dt, dd, title in parser.items}, "".join(parser.text)


@pytest.mark.usefixtures("backend")
def test_every_meta_key_and_value_is_shown_in_the_holder_row(client, viewer):
    meta = {
        "job": "nightly-report",
        "method": "POST",
        "path": "/reports/export/",
        "remote_addr": "10.0.0.9",
        "attempt": 3,
        "tags": ["eu", "daily"],
        "dry": None,
        "options": {"format": "csv"},
    }
    lease = semaphores["reports"].acquire(meta=meta)
    try:
        client.force_login(viewer)
        html = client.get(LIST_URL + "reports/").content.decode()
        fragment = client.get(LIST_URL + "reports/status.json").json()["html"]
    finally:
        lease.release()
    for page in (html, fragment):  # the page and the fragment the refresh script swaps in
        items, text = holder_row(page, lease.token)
        print({k: v[1] for k, v in items.items()})
        assert "nightly-report" in text
        expected = {
            "job": "nightly-report",
            "method": "POST",
            "path": "/reports/export/",
            "remote_addr": "10.0.0.9",
            "attempt": "3",
            "tags": '["eu", "daily"]',
            "dry": "null",
            "options": '{"format": "csv"}',
            "host": _host(),
            "pid": str(os.getpid()),
        }
        assert {key: dd for key, (dt, dd, title) in items.items()} == expected
        assert all(dt == key for key, (dt, dd, title) in items.items())
        # The web layer's keys first, then the engine's, then the caller's own in name order.
        assert list(items) == [
            "method",
            "path",
            "remote_addr",
            "host",
            "pid",
            "attempt",
            "dry",
            "job",
            "options",
            "tags",
        ]


def _host():
    import socket

    return socket.gethostname()


@pytest.mark.usefixtures("backend")
def test_partition_key_and_user_are_shown_too(client, viewer):
    lease = semaphores["per-user"].acquire(key="user:7", meta={"user": str(viewer.pk), "job": "sync"})
    try:
        client.force_login(viewer)
        html = client.get(LIST_URL + f"per-user/?partition={key_hash('user:7')}").content.decode()
    finally:
        lease.release()
    items, text = holder_row(html, lease.token)
    assert items["key"][1] == "user:7" and items["job"][1] == "sync"
    assert "user" not in items  # it has a column of its own, with the username
    assert f"viewer ({viewer.pk})" in " ".join(text.split())


HOSTILE_KEY = '<script>alert("k")</script>'
HOSTILE_VALUE = "<img src=x onerror=alert(1)>\"'&"


@pytest.mark.usefixtures("backend")
def test_hostile_and_long_meta_is_escaped_and_bounded(client, viewer):
    long_value = "v" * 5000 + "-END"
    long_key = "k" * 300
    meta = {HOSTILE_KEY: HOSTILE_VALUE, "long": long_value, long_key: "x", "path": "/" + "p" * 2000}
    lease = semaphores["reports"].acquire(meta=meta)
    try:
        client.force_login(viewer)
        html = client.get(LIST_URL + "reports/").content.decode()
    finally:
        lease.release()
    assert "<script>" not in html and "<img" not in html
    items, text = holder_row(html, lease.token)
    print(f"page {len(html)} bytes; shown lengths:", {k[:12]: len(v[1]) for k, v in items.items()})
    # The parser unescapes: what the browser shows is the original text.
    assert items[HOSTILE_KEY][1] == HOSTILE_VALUE
    # Long values are cut short on the page; the full value is in the title (a tooltip).
    dt, dd, title = items["long"]
    assert len(dd) <= 80 and dd.endswith("…") and "-END" not in dd
    assert title == long_value
    assert len(items["path"][1]) <= 80 and items["path"][2] == meta["path"]
    assert len(items[long_key][0]) <= 40
    # Short values need no tooltip.
    assert items[HOSTILE_KEY][2] is None


# -- SemaphoreAdmin on a custom AdminSite (this module is also that test's URLconf) -------------


class OpsSite(AdminSite):
    site_header = "Ops console"
    site_title = "Ops"


ops_site = OpsSite(name="ops")
ops_site.register(Semaphore, SemaphoreAdmin)

urlpatterns = [path("ops/", ops_site.urls)]


@pytest.fixture
def ops_semaphores(settings):
    settings.SEMAPHORES = {"reports": {"LIMIT": 2, "TIMEOUT": 30}}


@pytest.mark.urls(__name__)
@pytest.mark.usefixtures("ops_semaphores")
def test_custom_site(client, db):
    assert client.get("/ops/django_semaphore/semaphore/").status_code == 302
    client.force_login(User.objects.create_superuser("root", password="pw"))
    lease = semaphores["reports"].acquire(meta={"user": "alice"})
    try:
        index = client.get("/ops/").content.decode()
        assert "Ops console" in index and "/ops/django_semaphore/semaphore/" in index
        listing = client.get("/ops/django_semaphore/semaphore/").content.decode()
        assert "Ops console" in listing  # each_context of this site, not admin.site
        assert 'href="/ops/"' in listing and 'href="/ops/django_semaphore/semaphore/reports/"' in listing
        detail = client.get("/ops/django_semaphore/semaphore/reports/").content.decode()
        assert "alice" in detail and 'action="/ops/django_semaphore/semaphore/reports/release/"' in detail
        response = client.post(
            "/ops/django_semaphore/semaphore/reports/release/", {"partition": "_", "token": lease.token}
        )
        assert response["Location"] == "/ops/django_semaphore/semaphore/reports/"
        assert semaphores["reports"].holders() == []
        assert client.get("/ops/django_semaphore/semaphore/status.json").json()["semaphores"][0]["name"] == (
            "reports"
        )
    finally:
        lease.release()


# -- scheduling: permits and slots per holder, waiters in serving order ----------------


@pytest.mark.usefixtures("backend")
def test_permits_slots_and_waiters_in_serving_order(client, viewer, settings, monkeypatch):
    settings.SEMAPHORES = {**SEMAPHORES, "gpus": {"LIMIT": 4, "TIMEOUT": 30, "SLOTS": True}}
    gpus = semaphores["gpus"]
    big = gpus.acquire(permits=3, meta={"job": "train"})
    small = gpus.acquire(permits=1, meta={"job": "eval"})
    got = []
    waiters = [
        threading.Thread(target=lambda: got.append(gpus.acquire(wait=30, permits=2, meta={"tag": "low"}))),
        threading.Thread(
            target=lambda: got.append(gpus.acquire(wait=30, permits=1, priority=9, meta={"tag": "high"}))
        ),
    ]
    try:
        for count, thread in enumerate(waiters, 1):
            thread.start()
            deadline = time.monotonic() + 30
            while len(gpus.waiters()) < count:  # queued in Redis, in arrival order
                assert time.monotonic() < deadline, "the waiter never queued"
                time.sleep(0.02)
        client.force_login(viewer)
        html = client.get(LIST_URL + "gpus/").content.decode()
        _, big_row = holder_row(html, big.token)
        _, small_row = holder_row(html, small.token)
        assert big.slots == (0, 1, 2) and "0, 1, 2" in big_row and "train" in big_row
        assert small.slots == (3,) and "3" in small_row
        # Serving order: priority first (the later "high" one), then arrival.
        assert html.index("high") < html.index("low")
        assert html.count('class="sema-waiter"') == 2
        assert "4 of 4 in use · 0 free · 2 waiting" in html
        data = client.get(LIST_URL + "gpus/status.json").json()
        (partition,) = data["partitions"]
        assert [(h["permits"], h["slots"]) for h in partition["holders"]] == [(3, [0, 1, 2]), (1, [3])]
        assert [(w["meta"]["tag"], w["priority"], w["permits"]) for w in partition["waiters"]] == [
            ("high", 9, 1),
            ("low", 0, 2),
        ]
        # The list of waiters is cut (MAX_WAITERS_SHOWN, 50): it says so, it used to stop short.
        from django_semaphore.ops import monitor

        monkeypatch.setattr(monitor, "MAX_WAITERS_SHOWN", 1)
        html = client.get(LIST_URL + "gpus/").content.decode()
        assert html.count('class="sema-waiter"') == 1 and "1 more waiter not shown" in html
    finally:
        big.release()
        small.release()
        for thread in waiters:
            thread.join(30)
    assert len(got) == 2 and all(got)
    for lease in got:
        lease.release()


def test_an_adaptive_limit_is_shown_as_such(client, changer, settings):
    """The page says where the limit in force comes from: "adaptive" while the controller
    drives it, "override" once an operator sets one, and "adaptive" again after a clear."""
    settings.SEMAPHORES = {
        **SEMAPHORES,
        "elastic": {"LIMIT": 3, "TIMEOUT": 30, "ADAPTIVE": {"MIN": 1, "MAX": 8}},
    }
    elastic = semaphores["elastic"]
    client.force_login(changer)

    def source():
        html = client.get(LIST_URL + "elastic/").content.decode()
        start = html.index('class="sema-source"')
        return html[start : html.index("</dd>", start)]

    assert elastic.effective().source == "adaptive"
    assert "sema-tag-adaptive" in source() and "adaptive" in source()
    page = client.get(LIST_URL + "elastic/").content.decode()
    assert "between 1 and 8" in page and "baseline hold" not in page  # nothing measured yet
    prefix = conf.setting("SEMAPHORE_KEY_PREFIX")
    step = run(connection.get_client(), adaptive.adapt(prefix, elastic.config, 10 * 42.0, 10, 0))
    assert step.status == "interval"  # the controller's first window: the state exists
    data = client.get(LIST_URL + "elastic/status.json").json()
    assert data["adaptive"] == {
        "min": 1,
        "max": 8,
        "limit": 3,
        "baseline_ms": 0,
        "mean_ms": 0,
        "probing": False,
    }
    # The controller in a probe, having measured a baseline before (its state as stored).
    state = {
        "limit": 3,
        "base": 20.0,
        "mean": 25.0,
        "dir": -1,
        "at": 1,
        "n": 0,
        "p": 0,
        "settle": 1,
        "probe": 1,
    }
    connection.get_client().hset(control_key(prefix), adaptive.state_field("elastic"), json.dumps(state))
    page = client.get(LIST_URL + "elastic/").content.decode()
    assert "baseline hold 20 ms, last window 25 ms" in page and "probing" in page
    assert 'data-source="adaptive"' in client.get(LIST_URL).content.decode()
    elastic.override(limit=2)
    try:
        assert "sema-tag-override" in source() and "sema-tag-adaptive" not in source()
    finally:
        elastic.clear_override()
    assert "sema-tag-adaptive" in source()


@pytest.mark.usefixtures("backend")
def test_an_action_goes_back_to_the_partition_it_was_taken_on(client, changer, settings):
    # Issue 26.12: the redirect used the admin's quote(): "?partition=_" came back as "_5F" (404).
    settings.SEMAPHORES = {"quick": {"LIMIT": 2, "TIMEOUT": 30}}
    semaphores["quick"].acquire()
    client.force_login(changer)
    response = client.post(LIST_URL + "quick/purge/?partition=_")
    assert response["Location"] == LIST_URL + "quick/?partition=_"
    assert client.get(response["Location"]).status_code == 200
    # A hostile value is URL-encoded and stays on this site (no open redirect, no extra parameter).
    response = client.post(LIST_URL + "quick/purge/?partition=" + "%2F%2Fevil.example%26x%3D1")
    assert response["Location"] == LIST_URL + "quick/?partition=%2F%2Fevil.example%26x%3D1"
    page = client.get(LIST_URL + "quick/?partition=_").content.decode()
    assert "partition=_" in page and "partition=_5F" not in page


@pytest.mark.usefixtures("backend")
def test_every_live_partition_can_be_reached_a_page_at_a_time(client, changer, settings, monkeypatch):
    """The list and the semaphore's page show the busiest max_partitions partitions; the others
    were only counted ("3 more partitions not shown"), with no way to open them: a holder in
    one of them could not be seen or force-released from the admin. Pages (?page=N) list them."""
    settings.SEMAPHORES = {"per-ip": {"LIMIT": 3, "TIMEOUT": 30, "KEY": "ip"}}
    monkeypatch.setattr(SemaphoreAdmin, "max_partitions", 2)
    per_ip = semaphores["per-ip"]
    # Busiest first: 10.0.0.1 (3 held), 10.0.0.2 (2), then three of 1, by key hash.
    held = [per_ip.acquire(key=f"10.0.0.{n}") for n, count in [(1, 3), (2, 2)] for _ in range(count)]
    ones = {f"10.0.0.{n}": per_ip.acquire(key=f"10.0.0.{n}", meta={"job": f"job-{n}"}) for n in (3, 4, 5)}
    held += ones.values()
    last = sorted(ones, key=key_hash)[-1]  # the quietest partition: on page 3
    client.force_login(changer)
    try:
        listing = client.get(LIST_URL).content.decode()
        assert "3 more partitions not shown" in listing
        assert f'href="{LIST_URL}per-ip/?page=2"' in listing

        page = client.get(LIST_URL + "per-ip/").content.decode()
        assert re.findall(r'data-partition="([^"]+)"', page) == [key_hash("10.0.0.1"), key_hash("10.0.0.2")]
        assert "Partitions 1–2 of 5" in page and 'href="?page=2"' in page

        page3 = client.get(LIST_URL + "per-ip/?page=3")
        html = page3.content.decode()
        assert re.findall(r'data-partition="([^"]+)"', html) == [key_hash(last)]
        assert "Partitions 5–5 of 5" in html and 'href="?page=2"' in html and "?page=4" not in html
        assert f"job-{last[-1]}" in html
        status = client.get(LIST_URL + "per-ip/status.json?page=3").json()
        assert [p["partition"] for p in status["partitions"]] == [key_hash(last)]
        assert status["waiting"] == 0 and status["hidden_partitions"] == 4

        lease = ones[last]
        response = client.post(
            LIST_URL + "per-ip/release/?page=3", {"partition": key_hash(last), "token": str(lease.token)}
        )
        assert response["Location"] == LIST_URL + "per-ip/?page=3"  # back where it was taken
        assert lease.refresh() is False
        assert client.get(LIST_URL + "per-ip/?page=x").status_code == 404
    finally:
        for lease in held:
            lease.release()


# -- TOTAL: the whole name's use above its partitions ------------------------------------------

TOTAL_SEMAPHORES = {**SEMAPHORES, "exports": {"LIMIT": 2, "TIMEOUT": 30, "KEY": "user", "TOTAL": 3}}


@pytest.fixture
def exports(settings):
    """ "exports" (LIMIT 2 per user, TOTAL 3): erin holds 2, frank 1; released at the end."""
    settings.SEMAPHORES = TOTAL_SEMAPHORES
    sem = semaphores["exports"]
    held = [
        sem.acquire(key="erin", meta={"user": "erin", "method": "POST", "path": "/export/1"}),
        sem.acquire(key="erin", meta={"user": "erin", "method": "POST", "path": "/export/2"}),
        sem.acquire(key="frank", meta={"user": "frank", "method": "POST", "path": "/export/3"}),
    ]
    assert all(held)
    yield held
    for lease in held:
        lease.release()


def _block(html, start, end):
    """The part of ``html`` from ``start`` to the next ``end``."""
    at = html.index(start)
    return html[at : html.index(end, at)]


@pytest.mark.usefixtures("backend")
def test_a_total_name_lists_its_whole_use_above_its_partitions(client, viewer, exports):
    client.force_login(viewer)
    html = client.get(LIST_URL).content.decode()
    group = _block(html, 'data-semaphore="exports"', "</tbody>")
    total_row = _block(group, 'class="sema-partition sema-total', "</tr>")
    assert 'data-total="3"' in total_row and 'rowspan="3"' in total_row  # the total's line and 2 partitions
    assert re.search(r'class="field-limit sema-num">3<', total_row)
    assert re.search(r'class="field-in_use sema-num">3<', total_row)
    assert re.search(r'class="field-free sema-num">0<', total_row)
    assert 'aria-valuemax="3" aria-valuenow="3"' in total_row and 'class="sema-pct">100%' in total_row
    partitions = re.findall(r'data-partition="([^"]*)"', group)
    assert partitions == [key_hash("erin"), key_hash("frank")]  # never the whole name's "+"
    assert "erin" in group and "frank" in group
    frank = _block(group, f'data-partition="{key_hash("frank")}"', "</tr>")
    # frank's partition has room under LIMIT 2 but the total has none: 0 free
    assert re.search(r'class="field-limit sema-num">2<', frank)
    assert re.search(r'class="field-free sema-num">0<', frank)

    data = client.get(LIST_URL + "status.json").json()
    listed = {s["name"]: s for s in data["semaphores"]}
    assert listed["exports"]["total"] == 3
    assert listed["exports"]["all_partitions"] == {
        "limit": 3,
        "in_use": 3,
        "free": 0,
        "waiting": 0,
        "utilisation": 100,
    }
    assert [p["partition"] for p in listed["exports"]["partitions"]] == [key_hash("erin"), key_hash("frank")]
    assert listed["reports"]["total"] is None and listed["reports"]["all_partitions"] is None
    assert data["totals"]["in_use"] == 3  # counted once, not once more for the whole name


@pytest.mark.usefixtures("backend")
def test_a_total_name_page_has_the_total_bar_then_each_partition_with_its_holders(client, changer, exports):
    erin1, erin2, frank = exports
    client.force_login(changer)
    page = client.get(LIST_URL + "exports/").content.decode()
    assert "settings: LIMIT 2, TOTAL 3, MODE enforce" in page
    assert re.search(r'class="sema-effective-total">3<', page)
    total = _block(page, 'id="sema-total"', "</section>")
    assert 'aria-valuemax="3" aria-valuenow="3"' in total
    assert "3 of 3 in use · 0 free · 0 waiting, all partitions together" in total
    assert page.index('id="sema-total"') < page.index('class="sema-partition-block"')
    blocks = re.findall(r'<section class="sema-partition-block" data-partition="([^"]*)"', page)
    assert blocks == [key_hash("erin"), key_hash("frank")]
    erin = _block(page, f'data-partition="{key_hash("erin")}"', "</section>")
    assert "2 of 2 in use · 0 free · 0 waiting" in erin
    assert re.findall(r'data-token="(\d+)"', erin) == [str(erin1.token), str(erin2.token)]
    frank_block = _block(page, f'data-partition="{key_hash("frank")}"', "</section>")
    assert "1 of 2 in use · 0 free · 0 waiting" in frank_block and "total reached" in frank_block
    assert f'name="partition" value="{key_hash("frank")}"' in frank_block
    for lease in exports:
        assert lease.identifier not in page

    # One partition's page: that partition, the whole name's bar above it.
    one = client.get(LIST_URL + f"exports/?partition={key_hash('frank')}").content.decode()
    assert 'id="sema-total"' in one
    assert re.findall(r'data-token="(\d+)"', one) == [str(frank.token)]
    assert client.get(LIST_URL + "exports/?partition=%2B").status_code == 404  # "+": no partition
    assert client.get(LIST_URL + "reports/?partition=%2B").status_code == 404

    status = client.get(LIST_URL + "exports/status.json").json()
    assert status["all_partitions"]["in_use"] == 3 and status["total"] == 3
    assert [h["token"] for h in status["partitions"][0]["holders"]] == [erin1.token, erin2.token]
    assert 'id="sema-total"' in status["html"]

    # Force release on a partition of the name: the holder named by partition and token.
    response = client.post(
        LIST_URL + "exports/release/", {"partition": key_hash("erin"), "token": frank.token}, follow=True
    )
    assert "no longer holds a slot" in response.content.decode()  # frank's token is not erin's
    assert len(semaphores["exports"].holders()) == 3
    response = client.post(
        LIST_URL + "exports/release/", {"partition": key_hash("erin"), "token": erin2.token}
    )
    assert response.status_code == 302
    assert [h.token for h in semaphores["exports"].holders(key="erin")] == [erin1.token]
    assert erin2.refresh() is False
    assert "partition erin" in LogEntry.objects.get(object_id="exports").get_change_message()
    response = client.post(
        LIST_URL + "exports/release/", {"partition": "+", "token": erin1.token}, follow=True
    )
    assert "named no holder" in response.content.decode()
    assert semaphores["exports"].status().in_use == 2


@pytest.mark.usefixtures("backend")
def test_an_idle_total_name_shows_its_total_and_no_partition(client, viewer, settings):
    settings.SEMAPHORES = TOTAL_SEMAPHORES
    client.force_login(viewer)
    html = client.get(LIST_URL).content.decode()
    group = _block(html, 'data-semaphore="exports"', "</tbody>")
    assert 'data-total="3"' in group and "data-partition" not in group
    assert "no live partition" not in group  # the total's line says it: 0 of 3
    page = client.get(LIST_URL + "exports/").content.decode()
    assert "0 of 3 in use · 3 free · 0 waiting, all partitions together" in page
    assert "No live partition." in page


@pytest.mark.usefixtures("backend")
def test_purge_expired_on_a_total_name(client, changer, settings, raw_redis):
    settings.SEMAPHORES = {"quick": {"LIMIT": 2, "TIMEOUT": 0.2, "KEY": "user", "TOTAL": 3}}
    quick = semaphores["quick"]
    assert quick.acquire(key="a") and quick.acquire(key="b") and quick.acquire(key="b")
    keys = quick.partition("a")
    wait_until_expired(raw_redis, keys)
    client.force_login(changer)
    response = client.post(LIST_URL + "quick/purge/", follow=True)
    assert "Removed 3 expired entries from “quick”." in response.content.decode()
    assert raw_redis.zcard(keys.timeouts) == 0


@pytest.fixture
def raising_receiver():
    """A config_changed receiver of the project's that raises (connected for the test)."""
    from django_semaphore import signals

    calls = []

    def announce(sender, semaphore, **kwargs):
        calls.append(semaphore.name)
        raise RuntimeError("the chat webhook is down")

    signals.config_changed.connect(announce, weak=False)
    yield calls
    signals.config_changed.disconnect(announce)


@pytest.mark.usefixtures("backend")
def test_a_raising_config_changed_receiver_does_not_undo_the_admins_change(
    client, changer, raising_receiver, caplog
):
    """The override is written before the signal is sent: a receiver that raised turned the
    applied change into a 500, with no LogEntry and no message. Now the change completes
    and the receiver's exception is logged once at ERROR."""
    reports = semaphores["reports"]
    client.force_login(changer)
    try:
        with caplog.at_level("ERROR", logger="django_semaphore"):
            response = client.post(LIST_URL + "reports/", {"limit": "1", "mode": "enforce"})
        assert response.status_code == 302 and response["Location"] == LIST_URL + "reports/"
        assert reports.effective(fresh=True).limit == 1 and raising_receiver == ["reports"]
        assert LogEntry.objects.get(object_id="reports").get_change_message() == (
            "Set limit 2 -> 1, mode enforce -> enforce."
        )
        errors = [r for r in caplog.records if r.levelname == "ERROR" and r.name == "django_semaphore"]
        assert len(errors) == 1
        assert "announce" in errors[0].getMessage() and "'reports'" in errors[0].getMessage()
        assert errors[0].exc_info[0] is RuntimeError
    finally:
        reports.clear_override()


@pytest.mark.usefixtures("backend")
def test_an_ad_hoc_semaphores_pages_say_redis_failed_while_it_is_down(client, changer):
    """An ad-hoc semaphore is looked up in the registry in Redis: with Redis down, its
    pages were a 404 ("not in SEMAPHORES or in use"), where a configured one's page says
    Redis failed. Now they get the same error page, and the actions the same message."""
    from django_semaphore import Semaphore as Sem
    from django_semaphore.runtime import adhoc, stats
    from tests.support.servers import free_port

    adhoc.forget()
    lease = Sem("crawler", limit=2, timeout=30).acquire()
    stats.flush()  # recorded in the registry
    client.force_login(changer)
    assert client.get(LIST_URL + "crawler/").status_code == 200
    try:
        with override_settings(SEMAPHORE_REDIS={"URL": f"redis://127.0.0.1:{free_port()}/0"}):
            _ad_hoc_pages_while_redis_is_down(client, lease.token)
    finally:
        lease.release()


def _ad_hoc_pages_while_redis_is_down(client, token):
    """The pages and actions of ad-hoc "crawler" (recorded, held) with Redis unreachable."""
    configured = client.get(LIST_URL + "reports/")
    page = client.get(LIST_URL + "crawler/")
    assert configured.status_code == page.status_code == 200
    assert "failed" in page.content.decode() and 'id="sema-control"' not in page.content.decode()
    status = client.get(LIST_URL + "crawler/status.json")
    assert status.status_code == 200 and "failed" in status.json()["error"]
    assert client.get(LIST_URL + "crawler/history/").status_code == 200
    for action in ("release/", "purge/"):
        response = client.post(LIST_URL + "crawler/" + action, {"partition": "_", "token": token})
        assert response.status_code == 302 and response["Location"] == LIST_URL + "crawler/"
        (message,) = client.get(LIST_URL + "crawler/").context["messages"]
        assert message.level_tag == "error" and "failed" in message.message
    assert not LogEntry.objects.exists()
