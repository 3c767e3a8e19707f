"""Loading ``request.user`` before a request's semaphores are taken (django_semaphore.users)."""

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.test import RequestFactory
from django.utils.functional import SimpleLazyObject

from django_semaphore import semaphores
from django_semaphore.web.users import aload_user, load_user, user_label
from tests.support.helpers import body
from tests.support.settings_web import WEB_SEMAPHORES


@pytest.fixture(autouse=True)
def web_semaphores(settings):
    settings.SEMAPHORES = WEB_SEMAPHORES


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_user_partition_in_an_async_view(async_client):
    from asgiref.sync import sync_to_async

    alice = await sync_to_async(User.objects.create_user)("alice")
    if hasattr(async_client, "aforce_login"):
        await async_client.aforce_login(alice)
    else:  # Django < 5.0
        await sync_to_async(async_client.force_login)(alice)
    response = await async_client.get("/web/auser/")
    assert response.status_code == 200
    assert body(response)["leases"]["web-user"]["key"] == str(alice.pk)
    held = await semaphores["web-user"].aacquire(key=str(alice.pk))
    assert (await async_client.get("/web/auser/")).status_code == 429
    await held.arelease()


def test_user_label_is_the_pk_of_an_authenticated_user_only():
    assert user_label(User(pk=7, username="alice")) == "7"
    assert user_label(AnonymousUser()) is None
    assert user_label(None) is None


def test_load_user_fetches_a_lazy_user_now():
    alice = User(pk=7, username="alice")
    fetched = []
    request = RequestFactory().get("/")
    assert load_user(request) is None  # no AuthenticationMiddleware: no user
    request.user = SimpleLazyObject(lambda: fetched.append(alice) or alice)
    assert fetched == []
    user = load_user(request)
    assert fetched == [alice] and user.pk == 7


@pytest.mark.asyncio
async def test_aload_user_binds_the_user_it_loaded_without_sync_database_access():
    alice = User(pk=7, username="alice")

    async def auser():  # what AuthenticationMiddleware gives the request
        return alice

    request = RequestFactory().get("/")
    assert await aload_user(request) is None
    request.user = SimpleLazyObject(lambda: pytest.fail("the lazy user was loaded synchronously"))
    request.auser = auser
    assert await aload_user(request) is alice
    assert request.user is alice  # KEY callables read request.user: it is loaded now
