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
    from .engine.inspection import Holder
    from .engine.semaphore import Lease, Semaphore, semaphores
    from .web.decorators import semaphore


def __getattr__(name: str) -> Any:
    # Imported on first use: the engine needs Django settings, and this
    # package must stay importable from settings.py and setup tools.
    if name in ("Semaphore", "semaphores"):
        from .engine import semaphore as front

        return getattr(front, name)
    if name == "Lease":
        from .engine.semaphore import Lease

        return Lease
    if name == "Holder":
        from .engine.inspection import Holder

        return Holder
    if name == "semaphore":
        from .web.decorators import semaphore

        return semaphore
    raise AttributeError(f"module 'django_semaphore' has no attribute {name!r}")
