"""``django_semaphore.lease``: where the docs have shown ``Lease`` (the class is also
``django_semaphore.Lease``). It lives in :mod:`django_semaphore.engine.semaphore`."""

from .engine.semaphore import Lease

__all__ = ["Lease"]
