"""``django_semaphore.guards``: the function guard and the current lease, where the docs import
them from. They live in :mod:`django_semaphore.engine.guards`."""

from .engine.guards import FunctionGuard, current_lease

__all__ = ["FunctionGuard", "current_lease"]
