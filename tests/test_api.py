"""The public API (django_semaphore/__init__.py): the names users import, lazily.

The package re-exports its public names from their modules on first use, so
that ``import django_semaphore`` works where Django is not set up yet (a
settings module, setup tools).
"""

import importlib
import subprocess
import sys

import pytest

import django_semaphore

HOMES = {
    "Holder": "django_semaphore.inspection",
    "Lease": "django_semaphore.lease",
    "Semaphore": "django_semaphore.core",
    "SemaphoreBackendError": "django_semaphore.exceptions",
    "SemaphoreError": "django_semaphore.exceptions",
    "SemaphoreFull": "django_semaphore.exceptions",
    "semaphore": "django_semaphore.decorators",
    "semaphores": "django_semaphore.core",
}


def test_every_public_name_is_the_object_of_its_module():
    assert sorted(django_semaphore.__all__) == sorted(HOMES)
    for name, module in HOMES.items():
        assert getattr(django_semaphore, name) is getattr(importlib.import_module(module), name), name


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Semaphores'"):
        django_semaphore.Semaphores  # noqa: B018


def test_importing_the_package_needs_no_django_settings():
    probe = (
        "import sys, django_semaphore\n"
        "from django.conf import settings\n"
        "assert not settings.configured\n"
        "assert 'django_semaphore.core' not in sys.modules\n"
        "print(django_semaphore.__version__, django_semaphore.SemaphoreFull.__name__)\n"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no DJANGO_SETTINGS_MODULE, no REDIS_URL
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [django_semaphore.__version__, "SemaphoreFull"]
