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

from typing import TYPE_CHECKING, Any

from .exceptions import SemaphoreBackendError, SemaphoreError, SemaphoreFull

if TYPE_CHECKING:  # what the lazy imports below give, for type checkers
    from .core import Semaphore, semaphores
    from .decorators import semaphore
    from .inspection import Holder
    from .lease import Lease


def __getattr__(name: str) -> Any:
    # Imported on first use: the engine needs Django settings, and this
    # package must stay importable from settings.py and setup tools.
    if name in ("Semaphore", "semaphores"):
        from . import core

        return getattr(core, name)
    if name == "Lease":
        from .lease import Lease

        return Lease
    if name == "Holder":
        from .inspection import Holder

        return Holder
    if name == "semaphore":
        from .decorators import semaphore

        return semaphore
    raise AttributeError(f"module 'django_semaphore' has no attribute {name!r}")
