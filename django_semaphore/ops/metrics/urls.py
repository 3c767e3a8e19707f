"""``path("metrics/", include("django_semaphore.metrics.urls"))``: the Prometheus scrape endpoint."""

from django.urls import path

from . import metrics_view

urlpatterns = [
    path("", metrics_view, name="django_semaphore_metrics"),
]
