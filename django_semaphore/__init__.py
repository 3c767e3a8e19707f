"""django-semaphore: distributed counting semaphores on Redis for Django.

Public API::

    from django_semaphore import (semaphores, semaphore, Semaphore, Lease, Holder,
                                  SemaphoreError, SemaphoreFull, SemaphoreBackendError)
"""

__version__ = "0.1.0"

__all__ = [
    "Holder",
    "Lease",
    "Semaphore",
    "SemaphoreBackendError",
    "SemaphoreError",
    "SemaphoreFull",
    "semaphore",
    "semaphores",
]

from .exceptions import SemaphoreBackendError, SemaphoreError, SemaphoreFull


def __getattr__(name):
    # Imported on first use: the engine needs Django settings, and this
    # package must stay importable from settings.py and setup tools.
    if name in ("Semaphore", "Lease", "Holder", "semaphores"):
        from . import core

        return getattr(core, name)
    if name == "semaphore":
        from .decorators import semaphore

        return semaphore
    raise AttributeError(f"module 'django_semaphore' has no attribute {name!r}")
