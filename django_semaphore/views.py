"""``django_semaphore.views.rejected`` (SEMAPHORE_REJECT_VIEW's default) and its 503 sibling,
where settings name them. They live in :mod:`django_semaphore.web.views`."""

from .web.views import prefers_json, rejected, unavailable

__all__ = ["prefers_json", "rejected", "unavailable"]
