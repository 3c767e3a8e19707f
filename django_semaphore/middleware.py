"""``django_semaphore.middleware.SemaphoreMiddleware``, the path MIDDLEWARE names. It lives in
:mod:`django_semaphore.web.middleware`."""

from .web.middleware import SemaphoreMiddleware

__all__ = ["SemaphoreMiddleware"]
