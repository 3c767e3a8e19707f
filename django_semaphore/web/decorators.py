"""``@semaphore``: guard a view with one of the SEMAPHORES.

::

    @semaphore("reports")
    def export(request): ...

    @semaphore("reports", key="user", wait=2)
    async def aexport(request): ...

    @method_decorator(semaphore("reports"), name="dispatch")
    class ExportView(View): ...
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import SyncToAsync, async_to_sync, iscoroutinefunction, markcoroutinefunction
from django.core.exceptions import ImproperlyConfigured

from ..backend import forks
from ..engine.cancellation import run_to_completion
from .needs import NEEDS_ATTR, Need, needs_of, pending_needs
from .request_guard import RequestGuard
from .streaming import closable

if TYPE_CHECKING:
    from django.http import HttpRequest

    from ..config.validation import KeyFunc, PerRequest

V = TypeVar("V", bound=Callable[..., Any])


def _is_async_dispatch(view: Callable[..., Any]) -> bool:
    """True for ``dispatch`` of an async class-based view, as method_decorator passes it.

    method_decorator hands the decorator ``partial(bound dispatch)``; an async
    View's sync ``dispatch()`` returns the handler's coroutine, which Django
    awaits, so the guard must be the async one.
    """
    owner = getattr(getattr(view, "func", None), "__self__", None)
    try:
        return bool(getattr(owner, "view_is_async", False))
    except Exception:  # ImproperlyConfigured for a mix of sync and async handlers
        return False


def _guarded(
    view: Callable[..., Any],
    needs: tuple[Need, ...],
    request: HttpRequest,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    pending = pending_needs(request, needs)
    if not pending:
        return view(request, *args, **kwargs)
    guard = RequestGuard(request, pending)
    # A sync view under ASGI runs in a thread that a cancel (the client went
    # away) cannot stop: its semaphores are taken on the event loop instead,
    # where asgiref passes Django's cancel on, so that a request that waits
    # for one gives back what it holds at once, as an async view does.
    response = async_to_sync(guard.aenter)() if _in_a_thread_of_a_loop() else guard.enter()
    if response is not None:
        return response
    try:
        response = view(request, *args, **kwargs)
    except BaseException:
        guard.release()
        raise
    return guard.hold_until_closed(response)


def _in_a_thread_of_a_loop() -> bool:
    """Whether this runs in a thread that ``sync_to_async`` runs for a running event loop
    (a sync view under ASGI), where ``async_to_sync`` runs on that loop."""
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    return (
        loop is not None
        and getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None) == forks.pid()
        and loop.is_running()
    )


async def _aguarded(
    view: Callable[..., Any],
    needs: tuple[Need, ...],
    request: HttpRequest,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    pending = pending_needs(request, needs)
    if not pending:
        response = view(request, *args, **kwargs)
        return (await response) if inspect.isawaitable(response) else response
    guard = RequestGuard(request, pending)
    response = await guard.aenter()
    if response is not None:
        return response
    try:
        response = view(request, *args, **kwargs)
        if inspect.isawaitable(response):
            response = await response
    except BaseException:
        # The view raised, or its task was cancelled (the ASGI client went
        # away): release now, even if the task is cancelled again meanwhile.
        await run_to_completion(guard.arelease())
        raise
    if not closable(response):  # not an HttpResponse: Django refuses it
        await guard.arelease()
        return response
    return guard.hold_until_closed(response)


def semaphore(
    name: str,
    *,
    key: str | KeyFunc | None = None,
    wait: float | None = None,
    permits: PerRequest | None = None,
    priority: PerRequest | None = None,
) -> Callable[[V], V]:
    """Decorate a view so that at most LIMIT requests run it at once.

    ``name`` is a key of SEMAPHORES; ``key`` overrides its KEY (``"ip"``,
    ``"user"``, ``"header:<Name>"``, a callable ``(request) -> str`` or a
    dotted path to one; a KEY function returning None raises TypeError),
    ``wait`` its WAIT (seconds to queue for a slot),
    ``permits`` its PERMITS and ``priority`` its PRIORITY (each an int or a
    callable ``(request) -> int``; "lua" only).  An argument that no settings
    could accept (a ``wait`` out of range, ``permits=0``, ``key="header:"``)
    raises ImproperlyConfigured here, as the view's module is imported, with
    system check E027's message; one its SEMAPHORES entry refuses (no such
    entry, ``permits`` above LIMIT, a dotted path that does not import) is
    reported by E027 (``manage.py check``, runserver, the test runner).

    A refused request gets the SEMAPHORE_REJECT_VIEW response (429 with
    Retry-After by default); when Redis is unreachable, a 503, or the view runs
    unguarded under SEMAPHORE_FAIL_OPEN.  The view finds its leases in
    ``request.semaphore_leases`` (name -> Lease); they are renewed while it
    runs (AUTO_REFRESH) and released when the response is closed — after the
    last chunk of a streaming response — or at once if the view raises.

    Works on sync and async views (async ones are awaited on the asyncio
    Redis client, never in a thread), and on class-based views through
    ``method_decorator(semaphore(...), name="dispatch")``.  Stacked
    ``@semaphore`` decorators, and the middleware, take all their semaphores
    together, all or none.
    """
    need = Need(name, key, wait, permits, priority)
    for msg, hint in need.argument_problems():
        # Here, when the view's module (the URLconf) is imported, not at each
        # request: gunicorn and uvicorn run no system checks, so E027 alone
        # left every request to the view a 500.
        raise ImproperlyConfigured(f"@semaphore({name!r}, ...): {msg} HINT: {hint} (django_semaphore.E027)")

    def decorator(view: V) -> V:
        needs = (need, *needs_of(view))

        if iscoroutinefunction(view):

            async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                return await _aguarded(view, needs, request, args, kwargs)

            markcoroutinefunction(wrapper)
        else:

            def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                if _is_async_dispatch(view):
                    return _aguarded(view, needs, request, args, kwargs)
                return _guarded(view, needs, request, args, kwargs)

        functools.update_wrapper(wrapper, view)
        setattr(wrapper, NEEDS_ATTR, needs)
        return wrapper  # type: ignore[return-value]

    return decorator
