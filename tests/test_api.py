"""The public API (django_semaphore/__init__.py): the names users import, lazily; and the
public paths kept at the package root (the shims).

The package re-exports its public names from their modules on first use, so
that ``import django_semaphore`` works where Django is not set up yet (a
settings module, setup tools).  The shims (``django_semaphore.middleware``,
``.views``, ...) keep the dotted paths settings and the docs name: each
re-exports the object of the layer that holds it.
"""

import importlib
import subprocess
import sys

import pytest

import django_semaphore

HOMES = {
    "Holder": "django_semaphore.engine.inspection",
    "Lease": "django_semaphore.engine.semaphore",
    "Semaphore": "django_semaphore.engine.semaphore",
    "SemaphoreBackendError": "django_semaphore.exceptions",
    "SemaphoreError": "django_semaphore.exceptions",
    "SemaphoreFull": "django_semaphore.exceptions",
    "semaphore": "django_semaphore.web.decorators",
    "semaphores": "django_semaphore.engine.semaphore",
}

#: The public paths kept at the root: shim module -> the module whose objects it re-exports.
SHIMS = {
    "django_semaphore.middleware": "django_semaphore.web.middleware",
    "django_semaphore.views": "django_semaphore.web.views",
    "django_semaphore.decorators": "django_semaphore.web.decorators",
    "django_semaphore.guards": "django_semaphore.engine.guards",
    "django_semaphore.lease": "django_semaphore.engine.semaphore",
    "django_semaphore.handoff": "django_semaphore.engine.handoff",
    "django_semaphore.metrics": "django_semaphore.ops.metrics",
    "django_semaphore.metrics.urls": "django_semaphore.ops.metrics.urls",
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
        "assert 'django_semaphore.engine.semaphore' not in sys.modules\n"
        "print(django_semaphore.__version__, django_semaphore.SemaphoreFull.__name__)\n"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no DJANGO_SETTINGS_MODULE, no REDIS_URL
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [django_semaphore.__version__, "SemaphoreFull"]


@pytest.mark.parametrize("shim", sorted(SHIMS))
def test_a_shim_re_exports_the_objects_of_its_layer(shim):
    module, home = importlib.import_module(shim), importlib.import_module(SHIMS[shim])
    assert module.__all__, shim
    for name in module.__all__:
        assert getattr(module, name) is getattr(home, name), f"{shim}.{name}"


def test_the_documented_paths_resolve():
    from django.utils.module_loading import import_string

    from django_semaphore.engine.guards import current_lease
    from django_semaphore.web.middleware import SemaphoreMiddleware
    from django_semaphore.web.views import rejected

    assert import_string("django_semaphore.middleware.SemaphoreMiddleware") is SemaphoreMiddleware
    assert import_string("django_semaphore.views.rejected") is rejected
    assert import_string("django_semaphore.guards.current_lease") is current_lease
    assert importlib.import_module("django_semaphore.metrics.urls").urlpatterns
