"""Holding a request's semaphores until its response is closed.

Django closes a response after sending its last byte (a StreamingHttpResponse
after its iterator is exhausted or the client goes away), calling each of its
resource closers.  :class:`ReleaseOnClose` adds the give-back to them, so a
slot is held for exactly as long as the response is being sent.

A response may be dropped without being closed: an outer middleware replaced
it (ConditionalGetMiddleware answers a revalidation with a 304 of its own),
a view was called directly in a test, a server never calls close().  Its
renewals stop when it is garbage-collected; its slots are given back when the
request's response is closed (Django's ``request_finished``, in the request's
context), or else expire after TIMEOUT instead of being renewed for the life
of the process.  The give-back is never made by the garbage collector itself,
which may run on an event loop or amid a Redis call holding a lock.
"""

from __future__ import annotations

import contextvars
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.signals import request_finished

if TYPE_CHECKING:
    from django.http import HttpResponseBase

logger = logging.getLogger("django_semaphore")

# The responses of this request (this context) that hold slots and were not
# closed yet: the give-backs that request_finished makes for dropped ones.
_held: contextvars.ContextVar[list[ReleaseOnClose] | None] = contextvars.ContextVar(
    "django_semaphore_held_responses", default=None
)


def closable(response: object) -> bool:
    """True for an HttpResponseBase, which Django closes after sending it.

    Anything else is not a response Django will send (it refuses it with an
    error), so there is no closing to wait for.
    """
    return hasattr(response, "_resource_closers")


class ReleaseOnClose:
    """Call ``release`` when ``response`` is closed; ``abandon`` if it is collected
    unclosed, and ``release`` when the request's response is closed after that."""

    def __init__(
        self, response: HttpResponseBase, release: Callable[[], None], abandon: Callable[[], None]
    ) -> None:
        response._resource_closers.append(release)  # type: ignore[attr-defined]
        self.release = release
        self.cancelled = False
        self._finalizer: weakref.finalize[Any, Any] = weakref.finalize(response, abandon)
        self._finalizer.atexit = False  # at exit, the process's leases go with it
        held = _held.get()
        if held is None:
            held = []
            _held.set(held)
        held[:] = [entry for entry in held if not entry.cancelled]  # a thread may serve no request
        held.append(self)

    def cancel(self) -> None:
        """The slots were given back another way: nothing to do when the response is collected."""
        self.cancelled = True
        self._finalizer.detach()

    @property
    def dropped(self) -> bool:
        """True once the response was collected without being closed."""
        return not self.cancelled and not self._finalizer.alive


def give_back_dropped(**kwargs: object) -> None:
    """``request_finished``: give back the slots of this request's responses that were
    dropped unclosed (the response that finished the request replaced them)."""
    held = _held.get()
    if not held:
        return
    for entry in list(held):
        if entry.dropped:
            try:
                entry.release()
            except Exception:  # a receiver that raises would break Django's close()
                logger.exception("Could not give back the slots of a response dropped unclosed")
        if entry.cancelled or entry.dropped:
            held.remove(entry)


request_finished.connect(give_back_dropped, dispatch_uid="django_semaphore.web.streaming")
