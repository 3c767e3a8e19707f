"""``django_semaphore.metrics``: the Prometheus names the docs import (``metrics_view``, ``track``)
and ``django_semaphore.metrics.urls``. They live in :mod:`django_semaphore.ops.metrics`."""

from ..ops.metrics import SemaphoreCollector, install, metrics_view, track

__all__ = ["SemaphoreCollector", "install", "metrics_view", "track"]
