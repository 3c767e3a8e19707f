"""RequestGuard: the semaphores of one request, taken all or none and given back.

The decorator and the middleware both guard a request with a
:class:`RequestGuard`: it resolves the request's needs
(:mod:`django_semaphore.web.needs`), takes them in the one global order (so two
requests needing the same pair cannot deadlock) and, if one is refused or
Redis fails, gives back what it took and returns the response to send instead
(:mod:`django_semaphore.web.responses`).  Granted leases are renewed while the view
runs and given back when the response is closed
(:mod:`django_semaphore.web.streaming`), or at once if the view raises, or if
the request's task is cancelled before Django closes the response (an ASGI
client that went away).

The sync and async paths share every decision here, written once as a flow
(:data:`~django_semaphore.backend.scripting.Flow`); only the calls differ.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from redis.exceptions import RedisError

from ..backend.scripting import Call, Flow, adrive, drive
from ..engine import watchdog
from ..engine.cancellation import finish_soon, run_to_completion
from ..exceptions import SemaphoreBackendError, SemaphoreFull
from ..runtime.bursts import printable
from .needs import Item, Need, calls_project_code, mark_handled, resolve
from .responses import backend_failure, backend_recovered, refused_response
from .streaming import ReleaseOnClose, closable
from .users import aload_user, load_user, user_label

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponseBase

    from ..engine.semaphore import Lease

logger = logging.getLogger("django_semaphore")

#: How much of the path the holder's meta keeps.
PATH_META_LENGTH = 200

# What a broken or unreachable Redis can raise through the client besides
# SemaphoreBackendError (the engine wraps RedisError; a client may also let an
# OSError through).  Anything else is a programming error and propagates.
BACKEND_ERRORS = (SemaphoreBackendError, RedisError, OSError)


def request_meta(request: HttpRequest, user: Any) -> dict[str, Any]:
    """The meta the web layer stores with each holder: method, path, user, remote_addr."""
    return {
        "method": request.method,
        "path": request.path[:PATH_META_LENGTH],
        "user": user_label(user),
        "remote_addr": request.META.get("REMOTE_ADDR"),
    }


class RequestGuard:
    """The semaphores of one request (or of one layer of it), taken all or none.

    ``enter()`` / ``aenter()`` return None when the view may run (guarded, or
    unguarded under SEMAPHORE_FAIL_OPEN) or the response to send instead;
    ``release()`` / ``arelease()`` give everything back (idempotent), and
    ``hold_until_closed(response)`` defers that to the response's closing.
    """

    def __init__(self, request: HttpRequest, needs: Iterable[Need]) -> None:
        self.request = request
        self.needs = list(needs)
        self.leases: list[Lease] = []
        self.watches: list[watchdog.Watch] = []
        self.async_watch: watchdog.AsyncWatch | None = None
        self.closed = False
        # release() may come from the request's thread or loop and from the
        # releaser thread (the response was collected unclosed) at once.
        self._closing = threading.Lock()
        self._on_close: ReleaseOnClose | None = None

    # -- shared decisions --------------------------------------------------------

    def _granted(self, items: list[Item]) -> list[Lease]:
        leases: dict[str, Lease] = self.request.__dict__.setdefault("semaphore_leases", {})
        for lease in self.leases:
            leases[lease.name] = lease
        mark_handled(self.request, self.needs)
        return [lease for item, lease in zip(items, self.leases, strict=True) if item.config.auto_refresh]

    def _refused(self, item: Item, retry_after: int | None) -> HttpResponseBase:
        backend_recovered()  # Redis answered
        mark_handled(self.request, self.needs)
        exc = SemaphoreFull(item.semaphore.name, retry_after or 1, item.key)
        return refused_response(self.request, exc)

    def _failed(self, exc: BaseException) -> HttpResponseBase | None:
        self.request.__dict__.setdefault("semaphore_leases", {})
        mark_handled(self.request, self.needs)  # fail open: do not try again further in
        return backend_failure(self.request, [n.name for n in self.needs], exc)

    # -- taking and giving back, written once ------------------------------------------

    def _entering(self, items: list[Item]) -> Flow[HttpResponseBase | None]:
        """:meth:`enter` and :meth:`aenter`, written once: a flow that
        :func:`~django_semaphore.backend.scripting.drive` or
        :func:`~django_semaphore.backend.scripting.adrive` carries out."""
        if not items:  # SEMAPHORE_ENABLED False, or MODE "off": the view runs unguarded
            self.request.__dict__.setdefault("semaphore_leases", {})
            return None
        # aenter() has loaded a lazy user already: this reads it without a query.
        meta = request_meta(self.request, load_user(self.request))
        try:
            for item in items:
                semaphore = item.semaphore
                lease, retry_after = yield Call(
                    semaphore.try_acquire,
                    semaphore.atry_acquire,
                    (item.key, item.wait, meta, item.permits, item.priority),
                )
                if lease is None:
                    yield from self._giving_back()
                    refused: HttpResponseBase = yield Call(self._refused, self._arefused, (item, retry_after))
                    return refused
                self.leases.append(lease)
        except BACKEND_ERRORS as exc:
            yield from self._giving_back()
            failed: HttpResponseBase | None = yield Call(self._failed, self._afailed, (exc,))
            return failed
        except BaseException:
            # Interrupted while taking the next one (KeyboardInterrupt, a signal
            # handler's exception, a bug), or cancelled while waiting for it (the
            # ASGI client went away: Django >= 5.0 cancels the view's task): give
            # back what this request holds now, not after TIMEOUT, even if the
            # task is cancelled again meanwhile.
            yield Call(self._give_back, self._agive_back_to_completion)
            raise
        backend_recovered()
        yield Call(self._watch, self._awatch, (self._granted(items),))
        return None

    def _giving_back(self) -> Flow[None]:
        leases, self.leases = self.leases, []
        for lease in reversed(leases):
            try:
                yield Call(lease.release, lease.arelease)
            except Exception as exc:  # every lease gets its try; a failure expires after TIMEOUT
                logger.warning("Could not release semaphore %r: %s", lease.name, printable(exc))

    # -- sync ----------------------------------------------------------------------

    def enter(self) -> HttpResponseBase | None:
        """Take every semaphore: None to run the view, else the response to send."""
        return drive(None, self._entering(resolve(self.request, self.needs)))

    def _give_back(self) -> None:
        drive(None, self._giving_back())

    def _watch(self, leases: list[Lease]) -> None:
        self.watches = [watchdog.watch(lease) for lease in leases]

    def _close(self) -> bool:
        # True the first time: the caller then stops the renewals and gives back.
        with self._closing:
            if self.closed:
                return False
            self.closed = True
        if self._on_close is not None:
            self._on_close.cancel()
        return True

    def release(self) -> None:
        """Stop renewing and release every lease (sync; idempotent)."""
        if not self._close():
            return
        for watch in self.watches:
            watch.stop()
        if self.async_watch is not None:
            self.async_watch.stop()
        self._give_back()

    # -- async ---------------------------------------------------------------------

    async def aenter(self) -> HttpResponseBase | None:
        """The asyncio twin of :meth:`enter`."""
        # Before any KEY callable reads request.user, without sync database access.
        await aload_user(self.request)
        if calls_project_code(self.needs):  # it may query the database: not on the loop
            items = await sync_to_async(resolve)(self.request, self.needs)
        else:
            items = resolve(self.request, self.needs)
        return await adrive(None, self._entering(items))

    # The 429 and 503 responses run user code: SEMAPHORE_REJECT_VIEW, templates
    # whose context processors read the session or the messages.  Like any sync
    # view under ASGI, they run in a thread, where the database may be used.

    async def _arefused(self, item: Item, retry_after: int | None) -> HttpResponseBase:
        return await sync_to_async(self._refused)(item, retry_after)

    async def _afailed(self, exc: BaseException) -> HttpResponseBase | None:
        return await sync_to_async(self._failed)(exc)

    async def _agive_back(self) -> None:
        await adrive(None, self._giving_back())

    async def _agive_back_to_completion(self) -> None:
        await run_to_completion(self._agive_back())

    async def _awatch(self, leases: list[Lease]) -> None:
        if leases:
            self.async_watch = watchdog.AsyncWatch(leases)

    async def arelease(self) -> None:
        """The asyncio twin of :meth:`release`."""
        if not self._close():
            return
        if self.async_watch is not None:
            await self.async_watch.astop()
        for watch in self.watches:
            watch.stop()
        await self._agive_back()

    # -- the response ------------------------------------------------------------------

    def abandon(self) -> None:
        """Stop renewing without touching Redis or waiting (the response was dropped unclosed)."""
        for watch in self.watches:
            watch.active = False
        if self.async_watch is not None:
            self.async_watch.abandon()

    def hold_until_closed(self, response: HttpResponseBase) -> HttpResponseBase:
        """Release when ``response`` is closed: after the last byte, streams included.

        A response that is not closable is no response Django sends: release
        now.  Under ASGI, also release as soon as the request's task ends with
        the response unclosed (when the client goes away, Django >= 5.0 drops
        a response that has already left this guard without closing it).
        Any other response dropped without being closed (a sync view's under
        ASGI whose client went away) stops the renewals when it is
        garbage-collected, and the watchdog's releaser thread gives its slots
        back then (see :mod:`django_semaphore.web.streaming`).
        """
        if not self.leases:
            self.closed = True
            return response
        if not closable(response):
            self.release()
            return response
        self._on_close = ReleaseOnClose(response, self.release, self.abandon)
        if isinstance(self.request, ASGIRequest):
            self._watch_request_task()
        else:
            self._renew_from_the_thread()
        return response

    def _renew_from_the_thread(self) -> None:
        # Under WSGI an async view runs in an event loop of its own
        # (async_to_sync) that ends when the view returns, and the server sends
        # the response after that: renewals on that loop would end with it (a
        # stream outlasting TIMEOUT lost its slot while being sent).  The
        # watchdog thread renews the leases until the response is closed.
        if self.async_watch is None:
            return
        async_watch, self.async_watch = self.async_watch, None
        async_watch.stop()  # called on its loop: it ends at its next step, without waiting
        self.watches = [watchdog.watch(lease) for lease in async_watch.leases]

    def _watch_request_task(self) -> None:
        # The client can go away after the response has left this guard,
        # while outer middleware or Django finish it: Django then cancels the
        # request's task and drops the response without closing it, so the
        # closing this guard waits for never comes (the slots stayed taken
        # until TIMEOUT).  The end of that task, cancelled, is the give-back.
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no event loop in this thread: WSGI, or a sync view in a worker thread
            return
        if task is not None:
            task.add_done_callback(self._on_request_task_done)

    def _on_request_task_done(self, task: asyncio.Task[Any]) -> None:
        # The request's task has ended and the response was not closed: it was
        # dropped.  Django 5.0-6.0 cancel their process_request task when the
        # client leaves; 6.1 serves the request in the handler's own task under
        # a TaskGroup, which absorbs the cancel (the task ends normally) and
        # drops an unfinished response unclosed.  A response that was sent is
        # done by then too (every byte went out inside this task), so giving
        # back now is never early; a close that follows finds it given back.
        if not self.closed:
            finish_soon(self.arelease())
