"""Hostile requests to the admin: every semaphore URL, as anonymous, as a
logged-in user who is not staff (even with the permissions), as staff who may
only view; forged identifiers and partitions.  Nothing may change in Redis,
nothing may answer 500, and no lease identifier may leak."""

import pytest
from django.contrib.auth.models import Permission, User

from django_semaphore import semaphores
from django_semaphore.backend.keys import key_hash

LIST_URL = "/admin/django_semaphore/semaphore/"
SEMAPHORES = {
    "reports": {"LIMIT": 2, "TIMEOUT": 30},
    "per-ip": {"LIMIT": 1, "TIMEOUT": 30, "KEY": "ip"},
}


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = SEMAPHORES


@pytest.fixture
def held(backend):
    leases = [semaphores["reports"].acquire(), semaphores["per-ip"].acquire(key="10.0.0.1")]
    assert all(leases)
    yield leases
    for lease in leases:
        lease.release()


def _user(username, staff, *perms):
    user = User.objects.create_user(username, password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def _urls(held):
    ip_partition = key_hash("10.0.0.1")
    reports, per_ip = held
    gets = [
        LIST_URL,
        LIST_URL + "status.json",
        LIST_URL + "reports/",
        LIST_URL + "reports/status.json",
        LIST_URL + f"per-ip/?partition={ip_partition}",
        LIST_URL + f"per-ip/status.json?partition={ip_partition}",
    ]
    posts = [
        (LIST_URL + "reports/release/", {"partition": "_", "token": str(reports.token)}),
        (LIST_URL + "per-ip/release/", {"partition": ip_partition, "token": str(per_ip.token)}),
        (LIST_URL + "reports/purge/", {}),
        (LIST_URL + "per-ip/purge/", {}),
    ]
    return gets, posts


def _still_held(held):
    return [h.identifier for h in semaphores["reports"].holders()] == [held[0].identifier] and [
        h.identifier for h in semaphores["per-ip"].holders(key="10.0.0.1")
    ] == [held[1].identifier]


@pytest.mark.parametrize("who", ["anonymous", "not-staff-with-perms", "staff-no-perms"])
def test_outsiders_get_nothing_and_change_nothing(client, db, held, who):
    if who == "not-staff-with-perms":
        client.force_login(_user("mallory", False, "view_semaphore", "change_semaphore"))
    elif who == "staff-no-perms":
        client.force_login(_user("eve", True))
    gets, posts = _urls(held)
    for url in gets:
        response = client.get(url)
        if who == "staff-no-perms":
            assert response.status_code == 403, url
        else:
            assert response.status_code == 302 and "/admin/login/" in response["Location"], url
    for url, data in posts:
        response = client.post(url, data)
        assert response.status_code in (302, 403), url
        if response.status_code == 302:
            assert "/admin/login/" in response["Location"], url
    assert _still_held(held)


def test_view_only_staff_cannot_release_or_purge(client, db, held):
    client.force_login(_user("viewer", True, "view_semaphore"))
    gets, posts = _urls(held)
    for url in gets:
        response = client.get(url)
        assert response.status_code == 200, url
        assert held[0].identifier.encode() not in response.content
        assert held[1].identifier.encode() not in response.content
    for url, data in posts:
        assert client.post(url, data).status_code == 403, url
        assert client.get(url).status_code in (403, 405), url
    assert _still_held(held)


FORGED = [
    ("reports", {"partition": "../../x", "token": "1"}),
    ("reports", {"partition": "{" * 10_000, "token": "1"}),
    ("reports", {"partition": "_", "token": "9" * 400}),
    ("reports", {"partition": "_", "token": "-1"}),
    ("reports", {"partition": "_\x00", "token": "x"}),
    ("reports", {"partition": "_"}),
    ("per-ip", {"partition": "*", "token": "1"}),
]


@pytest.mark.parametrize("index", range(len(FORGED)))
def test_forged_force_release_forms(client, db, held, index):
    client.force_login(_user("changer", True, "view_semaphore", "change_semaphore"))
    name, data = FORGED[index]
    response = client.post(LIST_URL + f"{name}/release/", data)
    assert response.status_code in (302, 400, 404), response.status_code
    assert _still_held(held)


@pytest.mark.parametrize(
    "object_id", ["nope", "reports%00", "%7B%7D", "x" * 2000, "..%2F..%2Fsettings", "reports%0Ainjected"]
)
def test_unknown_or_forged_semaphore_names(client, db, held, object_id):
    client.force_login(_user("changer", True, "view_semaphore", "change_semaphore"))
    for url in (LIST_URL + object_id + "/", LIST_URL + object_id + "/status.json"):
        assert client.get(url).status_code in (301, 302, 404), url
    response = client.post(LIST_URL + object_id + "/release/", {"partition": "_", "token": "1"})
    assert response.status_code in (301, 302, 404)
    assert _still_held(held)
