"""KEY functions: the partition value of a request is the raw value that
``sem.acquire(key=...)`` takes, so code outside a view shares a request's
partition (API.md: for KEY "user", ``str(user.pk)``; for "ip", the address;
for "header:<Name>", the header's value).

Each test fills a partition from one side (a request, or ``acquire``) and is
refused from the other, on the test's own real Redis.
"""

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpResponse
from django.test import RequestFactory

from django_semaphore import semaphore, semaphores
from django_semaphore.backend.keys import key_hash
from django_semaphore.config.key_functions import ByHeader, by_ip, by_user
from tests.support.helpers import body, close
from tests.support.settings_web import WEB_SEMAPHORES


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


@semaphore("web-user")
def user_view(request):
    return HttpResponse("ok")


# -- KEY "user" ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_acquire_with_the_users_pk_fills_that_users_requests(client):
    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    sem = semaphores["web-user"]  # LIMIT 1, KEY "user"
    held = sem.acquire(key=str(alice.pk))
    assert held is not None
    client.force_login(alice)
    refused = client.get("/web/user/", HTTP_ACCEPT="application/json")
    assert refused.status_code == 429  # before: 200 (alice's requests used "user:<pk>")
    client.force_login(bob)
    response = client.get("/web/user/")
    assert response.status_code == 200
    assert body(response)["leases"]["web-user"]["key"] == str(bob.pk)
    held.release()
    client.force_login(alice)
    response = client.get("/web/user/")
    assert response.status_code == 200
    assert body(response)["leases"]["web-user"]["key"] == str(alice.pk)


@pytest.mark.django_db
def test_a_users_request_fills_acquire_with_the_users_pk():
    alice = User.objects.create_user("alice")
    sem = semaphores["web-user"]
    request = RequestFactory().get("/")
    request.user = alice
    response = user_view(request)  # holds alice's slot until the response is closed
    assert response.status_code == 200
    try:
        assert sem.acquire(key=str(alice.pk)) is None
        assert [h.meta["key"] for h in sem.holders(key=str(alice.pk))] == [str(alice.pk)]
    finally:
        close(response)
    lease = sem.acquire(key=str(alice.pk))
    assert lease is not None
    lease.release()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_async_requests_share_the_users_partition(async_client):
    from asgiref.sync import sync_to_async

    alice = await sync_to_async(User.objects.create_user)("alice")
    if hasattr(async_client, "aforce_login"):
        await async_client.aforce_login(alice)
    else:  # Django < 5.0
        await sync_to_async(async_client.force_login)(alice)
    held = await semaphores["web-user"].aacquire(key=str(alice.pk))
    assert (await async_client.get("/web/auser/")).status_code == 429
    await held.arelease()
    response = await async_client.get("/web/auser/")
    assert body(response)["leases"]["web-user"]["key"] == str(alice.pk)


def test_anonymous_requests_are_keyed_by_their_address(client):
    held = semaphores["web-user"].acquire(key="7.7.7.7")
    assert client.get("/web/user/", REMOTE_ADDR="7.7.7.7").status_code == 429
    other = client.get("/web/user/", REMOTE_ADDR="8.8.8.8")
    assert body(other)["leases"]["web-user"]["key"] == "8.8.8.8"
    held.release()


def test_key_functions_return_the_raw_value():
    factory = RequestFactory()
    request = factory.get("/", REMOTE_ADDR="10.0.0.9", HTTP_X_TENANT="acme")
    request.user = AnonymousUser()
    assert by_user(request) == "10.0.0.9"
    assert by_ip(request) == "10.0.0.9"
    assert ByHeader("X-Tenant")(request) == "acme"
    assert ByHeader("X-Missing")(request) == ""


# -- KEY "header:<Name>" -------------------------------------------------------------------------


def test_header_partition_is_the_header_value(client):
    acme = client.get("/web/header/", HTTP_X_TENANT="acme")
    assert body(acme)["leases"]["web-header"]["key"] == "acme"
    held = semaphores["web-header"].acquire(key="acme")
    assert client.get("/web/header/", HTTP_X_TENANT="acme").status_code == 429
    assert client.get("/web/header/", HTTP_X_TENANT="other").status_code == 200
    held.release()


def test_missing_and_empty_header_share_the_empty_partition(client):
    missing = client.get("/web/header/")
    assert body(missing)["leases"]["web-header"]["key"] == ""
    held = semaphores["web-header"].acquire(key="")
    assert client.get("/web/header/").status_code == 429
    assert client.get("/web/header/", HTTP_X_TENANT="").status_code == 429
    assert client.get("/web/header/", HTTP_X_TENANT="acme").status_code == 200
    held.release()
    # "" is a partition of its own, not the unpartitioned semaphore (key=None)
    assert key_hash("") != key_hash(None)


# -- the decorator's KEY partitions ------------------------------------------------------------


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
