"""``django_semaphore.decorators.semaphore``: the view decorator (also ``django_semaphore.semaphore``).
It lives in :mod:`django_semaphore.web.decorators`."""

from .web.decorators import semaphore

__all__ = ["semaphore"]
