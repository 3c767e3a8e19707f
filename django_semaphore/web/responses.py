"""What a guarded request gets instead of its view, and the failure policy.

* Refused (no slot): :func:`refused_response`, the SEMAPHORE_REJECT_VIEW
  response (429 by default, :func:`django_semaphore.views.rejected`).
* Redis failed: :func:`backend_failure` applies SEMAPHORE_FAIL_OPEN: a 503
  (:func:`django_semaphore.views.unavailable`) when failing closed, or None:
  the view runs unguarded.

Each is logged once per burst (:mod:`django_semaphore.runtime.bursts`) by the
``django_semaphore`` logger, and the response is marked as logged so that
``django.request`` does not log it again (nor mail ADMINS a 503 per request).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.utils.module_loading import import_string

from ..config import settings
from ..exceptions import SemaphoreBackendError, SemaphoreFull
from ..runtime.bursts import BURST_REPEAT, REFUSAL_QUIET, describe, failures, printable, refusals
from .views import unavailable

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponseBase

logger = logging.getLogger("django_semaphore")


def reject_view() -> Callable[[HttpRequest, SemaphoreFull], HttpResponseBase]:
    """SEMAPHORE_REJECT_VIEW, imported."""
    value = settings.setting("SEMAPHORE_REJECT_VIEW")
    view: Callable[[HttpRequest, SemaphoreFull], HttpResponseBase]
    view = import_string(value) if isinstance(value, str) else value
    return view


def _not_for_django_request(response: HttpResponseBase) -> HttpResponseBase:
    # django.utils.log.log_response (Django 4.2 to 5.2 at least) skips a
    # response marked as logged: without the mark, django.request would log
    # every 429 as a WARNING and every 503 as an ERROR -- an e-mail to ADMINS
    # per request while Redis is down.  This module logs them, once per burst.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def refused_response(request: HttpRequest, exc: SemaphoreFull) -> HttpResponseBase:
    """Log the refusal (once per burst at WARNING) and return the SEMAPHORE_REJECT_VIEW response.

    The response is marked as logged, so ``django.request`` does not log it again.
    """
    skipped = refusals.event(exc.name)
    if skipped is None:
        level, note = logging.DEBUG, ""
    elif skipped == 0:
        level = logging.WARNING
        note = f"; further refusals of {exc.name!r} are logged at DEBUG until none for {REFUSAL_QUIET:g}s"
    else:
        level = logging.WARNING
        note = (
            f"; {skipped} more refusal{'s' if skipped != 1 else ''} of {exc.name!r} "
            f"in the last {BURST_REPEAT:g}s were logged at DEBUG"
        )
    logger.log(
        level,
        "Refused %s: semaphore %r is full (key %r, retry after %ss)%s.",
        describe(request),
        exc.name,
        exc.key,
        exc.retry_after,
        note,
    )
    return _not_for_django_request(reject_view()(request, exc))


def backend_recovered() -> None:
    """Log that Redis answers again, once per burst of failures."""
    for server, count in failures.end():
        logger.info(
            "Redis at %s answers again after %d failed request%s; semaphores guard requests again.",
            printable(server or "?"),
            count,
            "s" if count != 1 else "",
        )


def backend_failure(request: HttpRequest, names: list[str], exc: BaseException) -> HttpResponseBase | None:
    """Log the failure; return the 503 response when failing closed, None under SEMAPHORE_FAIL_OPEN.

    One line per failure: WARNING for the first of a burst (and again every
    BURST_REPEAT seconds while it lasts), DEBUG for the others, until Redis
    answers again.  The 503 is marked as logged, so ``django.request`` does not
    log it as an error (nor mail ADMINS) per request.
    """
    if not isinstance(exc, SemaphoreBackendError):
        exc = SemaphoreBackendError(f"Redis failed: {type(exc).__name__}: {exc}")
    skipped = failures.event(exc.server)
    fail_open = settings.setting("SEMAPHORE_FAIL_OPEN")
    if skipped is None:
        level, note = logging.DEBUG, ""
    elif skipped == 0:
        level, note = logging.WARNING, " (further failures are logged at DEBUG until Redis answers again)"
    else:
        level = logging.WARNING
        note = (
            f" (Redis still unreachable: {skipped} more failure{'s' if skipped != 1 else ''} logged at DEBUG)"
        )
    logger.log(
        level,
        "Redis unreachable for semaphore(s) %s; %s %s: %s%s",
        ", ".join(map(repr, names)),
        describe(request),
        "runs UNGUARDED (SEMAPHORE_FAIL_OPEN)" if fail_open else "answered 503",
        printable(exc),
        note,
    )
    if fail_open:
        return None
    return _not_for_django_request(unavailable(request, exc))
