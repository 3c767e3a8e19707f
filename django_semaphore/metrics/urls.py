"""``include("django_semaphore.metrics.urls")``: the scrape endpoint, from
:mod:`django_semaphore.ops.metrics.urls`."""

from ..ops.metrics.urls import urlpatterns

__all__ = ["urlpatterns"]
