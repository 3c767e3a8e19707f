"""Reading the settings, lazily, and handing out the validated semaphores.

:func:`setting` reads a SEMAPHORE_* setting (or its default), remembered until it changes.
:func:`validated` is the cached verdict of :func:`django_semaphore.config.validation.validate`
on the current settings, and :func:`get_config` hands out one entry's
:class:`~django_semaphore.config.validation.SemaphoreConfig` from it.  The cache is
cleared by Django's ``setting_changed`` signal (as django-debug-toolbar does
with its settings), so ``override_settings`` and pytest-django's ``settings``
fixture take effect at the next call.  Judging the values is
:mod:`django_semaphore.config.validation`'s; this module only reads them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import validation

DEFAULTS: dict[str, Any] = {
    "SEMAPHORE_REDIS": "default",
    "SEMAPHORE_KEY_PREFIX": "sema",
    "SEMAPHORE_FAIL_OPEN": False,
    "SEMAPHORE_REJECT_VIEW": "django_semaphore.views.rejected",
    "SEMAPHORE_ENABLED": True,
    "SEMAPHORES": {},
}

#: The global settings without which no Redis call can be made (the prefix, the server).
ENGINE_CHECKS = frozenset({"django_semaphore.E014", "django_semaphore.E017"})


_values: dict[str, Any] = {}


def setting(name: str) -> Any:
    """The current value of a SEMAPHORE_* setting, or its default.

    Remembered until ``setting_changed`` says it changed: every acquire reads
    a few, and Django's lazy settings object costs a little each time.
    """
    try:
        return _values[name]
    except KeyError:
        value = _values[name] = getattr(settings, name, DEFAULTS[name])
        return value


def enabled() -> bool:
    """SEMAPHORE_ENABLED: False lets every guard pass through (anything but True counts as True:
    a bad value is check E019's to report, and must not switch the semaphores off)."""
    return setting("SEMAPHORE_ENABLED") is not False


def names() -> list[str]:
    """Names of the configured semaphores, in settings order."""
    raw = setting("SEMAPHORES")
    return list(raw) if isinstance(raw, dict) else []


@functools.cache
def validated() -> validation.Report:
    """The verdict on the current SEMAPHORE_* settings (cached until a setting changes)."""
    values = {name: setting(name) for name in DEFAULTS}
    return validation.validate(values, getattr(settings, "CACHES", {}))


def get_config(name: str) -> validation.SemaphoreConfig:
    """The validated config of semaphore ``name``; ImproperlyConfigured if unusable."""
    report = validated()
    try:
        return report.configs[name]
    except KeyError:
        pass
    for problem in report.problems.get(name, ()):
        if not problem.warning:
            raise problem.as_exception()
    raise ImproperlyConfigured(
        f"No semaphore named {name!r} in SEMAPHORES. HINT: Add SEMAPHORES[{name!r}] = "
        f"{{'LIMIT': ...}} to your settings, or use one of: {', '.join(map(repr, names())) or 'none'}."
    )


def check_global(ids: Iterable[str] = ENGINE_CHECKS) -> None:
    """Raise ImproperlyConfigured if a global setting among ``ids`` is unusable."""
    for problem in validated().problems[None]:
        if problem.id in ids and not problem.warning:
            raise problem.as_exception()


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting in DEFAULTS or setting == "CACHES":
        _values.pop(setting, None)
        validated.cache_clear()
