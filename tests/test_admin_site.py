"""SemaphoreAdmin registered on a custom AdminSite (this module is also its URLconf)."""

import pytest
from django.contrib.admin import AdminSite
from django.contrib.auth.models import User
from django.urls import path

from django_semaphore import semaphores
from django_semaphore.admin import SemaphoreAdmin
from django_semaphore.models import Semaphore


class OpsSite(AdminSite):
    site_header = "Ops console"
    site_title = "Ops"


ops_site = OpsSite(name="ops")
ops_site.register(Semaphore, SemaphoreAdmin)

urlpatterns = [path("ops/", ops_site.urls)]

pytestmark = pytest.mark.urls(__name__)


@pytest.fixture(autouse=True)
def configured(settings):
    settings.SEMAPHORES = {"reports": {"LIMIT": 2, "TIMEOUT": 30}}


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
