import importlib.util

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

from .config import settings as semaphore_settings


class DjangoSemaphoreConfig(AppConfig):
    """The ``django_semaphore`` app (the one settings object of a semaphore is ``SemaphoreConfig``)."""

    name = "django_semaphore"
    verbose_name = _("Semaphores")
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        """Register the checks, refuse to start on bad settings, install the metrics.

        gunicorn and uvicorn run no system checks: without this, one bad
        SEMAPHORES entry would let the server boot and answer every guarded
        (with the middleware: every) page with a 500.  Raising here makes every
        server (runserver, gunicorn, uvicorn, a management command) exit at
        start-up with the check ids, entries and hints instead.  Later settings
        changes (override_settings in tests) are not validated here: the system
        checks and the ImproperlyConfigured raised on use report those.
        """
        from . import checks  # noqa: F401 - registers the system checks

        refuse_bad_settings()

        if importlib.util.find_spec("prometheus_client") is not None:
            from .ops import metrics  # the [prometheus] extra: count what the signals report

            metrics.install()


def refuse_bad_settings() -> None:
    """Raise ImproperlyConfigured listing every SEMAPHORE settings error (id, entry, message, hint).

    The errors are those of the ``django_semaphore.E0xx`` system checks, less
    the ids in SILENCED_SYSTEM_CHECKS; warnings never stop the app.
    """
    silenced = set(getattr(settings, "SILENCED_SYSTEM_CHECKS", ()))
    errors = semaphore_settings.validated().boot_errors(silenced)
    if not errors:
        return
    lines = [
        f"django_semaphore: {len(errors)} error{'s' if len(errors) > 1 else ''} in the SEMAPHORE settings; "
        "the app refuses to start (each is a system check error: fix it, or list its id in "
        "SILENCED_SYSTEM_CHECKS to start anyway):"
    ]
    lines += [f"- {what} ({problem.id}): {problem.msg} HINT: {problem.hint}" for what, problem in errors]
    raise ImproperlyConfigured("\n".join(lines))
