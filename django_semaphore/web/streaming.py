"""Holding a request's semaphores until its response is closed.

Django closes a response after sending its last byte (a StreamingHttpResponse
after its iterator is exhausted or the client goes away), calling each of its
resource closers.  :class:`ReleaseOnClose` adds the give-back to them, so a
slot is held for exactly as long as the response is being sent.

A response may be dropped without being closed: an outer middleware replaced
it (ConditionalGetMiddleware answers a revalidation with a 304 of its own),
the client of a sync view under ASGI went away while the view ran (Django
drops what the view returns in its thread), a view was called directly in a
test, a server never calls close().  When such a response is
garbage-collected, its renewals stop and its slots are given back by the
watchdog's releaser thread (:func:`django_semaphore.engine.watchdog.release_later`).
The give-back is never made by the garbage collector itself, which may run on
an event loop or amid a Redis call holding a lock: the finalizer only queues
it.  A response exists only once its view has returned, so this never gives
back a slot while the view runs; a response that is closed after all finds
the slots given back (the guard's release is idempotent).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..engine import watchdog

if TYPE_CHECKING:
    from django.http import HttpResponseBase


def closable(response: object) -> bool:
    """True for an HttpResponseBase, which Django closes after sending it.

    Anything else is not a response Django will send (it refuses it with an
    error), so there is no closing to wait for.
    """
    return hasattr(response, "_resource_closers")


def _collected(abandon: Callable[[], None], release: Callable[[], None]) -> None:
    # A finalizer: stop the renewals (no lock, no wait) and queue the give-back.
    abandon()
    watchdog.release_later(release)


class ReleaseOnClose:
    """Call ``release`` when ``response`` is closed; if it is collected unclosed,
    ``abandon`` at once and ``release`` from the watchdog's releaser thread."""

    def __init__(
        self, response: HttpResponseBase, release: Callable[[], None], abandon: Callable[[], None]
    ) -> None:
        response._resource_closers.append(release)  # type: ignore[attr-defined]
        watchdog.releaser().start()  # here, not in the finalizer: starting a thread takes locks
        self._finalizer: weakref.finalize[Any, Any] = weakref.finalize(response, _collected, abandon, release)
        self._finalizer.atexit = False  # at exit, the process's leases go with it

    def cancel(self) -> None:
        """The slots were given back another way: nothing to do when the response is collected."""
        self._finalizer.detach()
