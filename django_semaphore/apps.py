import importlib.util

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SemaphoreConfig(AppConfig):
    name = "django_semaphore"
    verbose_name = _("Semaphores")
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks

        if importlib.util.find_spec("prometheus_client") is not None:
            from . import metrics  # the [prometheus] extra: count what the signals report

            metrics.install()
