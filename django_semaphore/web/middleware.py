"""SemaphoreMiddleware: guard requests by path, URL name and method, from settings.

::

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django_semaphore.middleware.SemaphoreMiddleware",
    ]
    SEMAPHORES = {
        "api-writes": {"LIMIT": 10, "PATHS": [r"^/api/"], "METHODS": ["POST", "PUT"]},
        "exports": {"LIMIT": 2, "URL_NAMES": ["reports:export"], "KEY": "user"},
    }

A request is guarded by every semaphore whose PATHS match ``request.path_info``
(``re.search``) or whose URL_NAMES hold the resolved ``namespace:name``, and
whose METHODS (None: all) hold its method (GET holds HEAD too).  The semaphores of a
``@semaphore``-decorated view are taken in the same step, so a request gets all
of them or none.  Place it after AuthenticationMiddleware when a KEY is "user".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase
from django.urls import ResolverMatch

from ..config import settings
from ..engine.cancellation import run_to_completion
from .needs import Need, needs_of, pending_needs
from .request_guard import RequestGuard

#: The attribute a request keeps the middleware's RequestGuard in.
GUARD_ATTR = "_semaphore_middleware_guard"


def _runs_in_a_thread(request: HttpRequest) -> bool:
    """Whether ``request``'s view is a sync one, which Django runs in a thread under ASGI."""
    view = getattr(getattr(request, "resolver_match", None), "func", None)
    return view is not None and not iscoroutinefunction(view)


def _nothing() -> None:
    return None


def matching_needs(request: HttpRequest, resolver_match: ResolverMatch | None) -> list[Need]:
    """The :class:`~django_semaphore.web.needs.Need` of every semaphore whose rules match ``request``."""
    needs: list[Need] = []
    url_name = getattr(resolver_match, "view_name", None)
    # Django runs the GET view for HEAD: METHODS that guard GET guard HEAD too.
    methods = {"HEAD", "GET"} if request.method == "HEAD" else {request.method}
    for name in settings.names():
        config = settings.get_config(name)
        if not (config.paths or config.url_names):
            continue
        if config.methods is not None and config.methods.isdisjoint(methods):
            continue
        if (url_name is not None and url_name in config.url_names) or any(
            pattern.search(request.path_info) for pattern in config.paths
        ):
            needs.append(Need(name))
    return needs


class SemaphoreMiddleware:
    """Guard requests with the semaphores whose PATHS / URL_NAMES / METHODS match.

    Sync and async capable: under ASGI the semaphores are taken with the
    asyncio Redis client, without a thread.  Responses are those of the
    ``@semaphore`` decorator (SEMAPHORE_REJECT_VIEW, 503, fail open).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
            # Django awaits process_view under ASGI: keep it on the event loop.
            self.process_view = self._aprocess_view  # type: ignore[method-assign,assignment]

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        try:
            response = self.get_response(request)
        except BaseException:
            self._release(request)
            raise
        return self._finish(request, response)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        try:
            response = await self.get_response(request)
        except BaseException as exc:
            # Raised, or cancelled (the ASGI client went away, Django >= 5.0):
            # release now, even if the task is cancelled again meanwhile.  A sync
            # view cancelled goes on in its thread, which a cancel cannot stop:
            # then once it has returned, or LIMIT would be exceeded meanwhile.
            in_thread = isinstance(exc, asyncio.CancelledError) and _runs_in_a_thread(request)
            await run_to_completion(self._arelease(request, after_view=in_thread))
            raise
        return self._finish(request, response)

    def _needs(self, request: HttpRequest, view_func: Callable[..., Any]) -> list[Need]:
        needs = matching_needs(request, getattr(request, "resolver_match", None))
        if needs:
            needs.extend(needs_of(view_func))  # the decorator's too: all or none
        return pending_needs(request, needs) if needs else []

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        """Take the semaphores of this request; a response refuses it."""
        needs = self._needs(request, view_func)
        if not needs:
            return None
        guard = RequestGuard(request, needs)
        setattr(request, GUARD_ATTR, guard)
        return guard.enter()

    async def _aprocess_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponseBase | None:
        needs = self._needs(request, view_func)
        if not needs:
            return None
        guard = RequestGuard(request, needs)
        setattr(request, GUARD_ATTR, guard)
        return await guard.aenter()

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        """The view raised: release at once rather than when the error page is sent."""
        self._release(request)

    def _release(self, request: HttpRequest) -> None:
        guard = getattr(request, GUARD_ATTR, None)
        if guard is not None:
            guard.release()

    async def _arelease(self, request: HttpRequest, after_view: bool = False) -> None:
        guard = getattr(request, GUARD_ATTR, None)
        if guard is not None:
            if after_view:
                # Behind the view in the request's one sync thread (Django runs a
                # sync view thread_sensitive, one thread per request): done once it is.
                await sync_to_async(_nothing, thread_sensitive=True)()
            await guard.arelease()

    def _finish(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        guard = getattr(request, GUARD_ATTR, None)
        if guard is not None and not guard.closed:
            guard.hold_until_closed(response)
        return response
