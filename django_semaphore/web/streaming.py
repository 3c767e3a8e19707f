"""Holding a request's semaphores until its response is closed.

Django closes a response after sending its last byte (a StreamingHttpResponse
after its iterator is exhausted or the client goes away), calling each of its
resource closers.  :class:`ReleaseOnClose` adds the give-back to them, so a
slot is held for exactly as long as the response is being sent.  A response
that is never closed (a view called directly in a test, a server that never
calls close()) is caught when it is garbage-collected: the renewals stop
there, and the slots expire after TIMEOUT instead of being renewed for the
life of the process.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.http import HttpResponseBase


def closable(response: object) -> bool:
    """True for an HttpResponseBase, which Django closes after sending it.

    Anything else is not a response Django will send (it refuses it with an
    error), so there is no closing to wait for.
    """
    return hasattr(response, "_resource_closers")


class ReleaseOnClose:
    """Call ``release`` when ``response`` is closed; ``abandon`` if it is collected unclosed."""

    def __init__(
        self, response: HttpResponseBase, release: Callable[[], None], abandon: Callable[[], None]
    ) -> None:
        response._resource_closers.append(release)  # type: ignore[attr-defined]
        self._finalizer: weakref.finalize[Any, Any] = weakref.finalize(response, abandon)
        self._finalizer.atexit = False  # at exit, the process's leases go with it

    def cancel(self) -> None:
        """The slots were given back another way: nothing to do when the response is collected."""
        self._finalizer.detach()
