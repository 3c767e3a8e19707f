"""The table-less model behind the admin pages (django_semaphore.models)."""

from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection

from django_semaphore.models import Semaphore


@pytest.mark.usefixtures("backend")
def test_the_migration_matches_the_model(db):
    out = StringIO()
    call_command("makemigrations", "django_semaphore", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_the_model_has_no_table_but_gives_the_admin_its_permissions():
    assert Semaphore._meta.managed is False
    assert Semaphore._meta.db_table not in connection.introspection.table_names()
    content_type = ContentType.objects.get_for_model(Semaphore)
    codenames = set(Permission.objects.filter(content_type=content_type).values_list("codename", flat=True))
    assert {"view_semaphore", "change_semaphore"} <= codenames
    assert str(Semaphore(name="reports")) == "reports"
