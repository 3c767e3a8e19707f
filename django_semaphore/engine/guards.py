"""The function guard: semaphores as decorators on plain functions and tasks, sync or async.

A :class:`~django_semaphore.Semaphore` is itself a decorator: each call
of the decorated function holds one slot for the whole run::

    @semaphores["crawler"]                     # configured in SEMAPHORES
    def fetch(url): ...

    @Semaphore("crawler", limit=3, timeout=30)  # ad hoc, no settings entry
    async def afetch(url): ...

:meth:`Semaphore.guard <django_semaphore.Semaphore.guard>` gives the
per-use options::

    @semaphores["crawler"].guard(key=lambda url: urlsplit(url).hostname, wait=5)
    def fetch(url): ...

A call waits for a slot up to ``wait`` seconds (default: the semaphore's
WAIT), then raises :class:`~django_semaphore.SemaphoreFull` with
``retry_after``.  While the function runs, the lease watchdog
(:mod:`django_semaphore.engine.watchdog`) renews the lease, so a run may outlast
TIMEOUT; TIMEOUT then only bounds how long a crashed process keeps its slot.
The running function finds its lease with :func:`current_lease`, as does a
Celery task's body under ``semaphore_task``
(:mod:`django_semaphore.contrib.celery`), which holds its slot with
:func:`holding`: there is one current lease, whatever took it.

(A guarded *view* is the web layer's: :mod:`django_semaphore.web.request_guard`.)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from asgiref.sync import iscoroutinefunction

from ..config.validation import PRIORITY_RANGE, checked_wait, priority_in_range
from ..exceptions import SemaphoreBackendError, SemaphoreFull
from . import watchdog
from .cancellation import run_to_completion

if TYPE_CHECKING:
    from ..config.validation import SemaphoreConfig
    from ..exceptions import RetryAfter

__all__ = ["FunctionGuard", "GuardedSemaphore", "HeldLease", "KeyFunction", "current_lease", "holding"]

logger = logging.getLogger("django_semaphore.engine.guards")  # its name before the engine had a folder

F = TypeVar("F", bound=Callable[..., Any])

#: ``key=`` may be a partition value, or a function of the decorated
#: function's arguments returning one (None: the unpartitioned semaphore).
KeyFunction = Callable[..., "str | None"]


class HeldLease(watchdog.Renewable, Protocol):
    """A held slot as the guards see it: a :class:`~django_semaphore.Lease`.

    The engine's Semaphore, which makes leases, uses this module (its ``guard()``
    makes a :class:`FunctionGuard`), so the guards know a lease and a semaphore
    by these Protocols, not by their classes.
    """

    @property
    def identifier(self) -> str: ...
    @property
    def key(self) -> str | None: ...
    @property
    def permits(self) -> int: ...
    @property
    def slots(self) -> tuple[int, ...]: ...
    @property
    def semaphore(self) -> GuardedSemaphore: ...
    def release(self) -> bool: ...
    async def arelease(self) -> bool: ...
    def handoff(self) -> str: ...


class GuardedSemaphore(Protocol):
    """What a guard takes slots of: a :class:`~django_semaphore.Semaphore`."""

    @property
    def name(self) -> str: ...
    @property
    def config(self) -> SemaphoreConfig: ...
    def passes_through(self) -> bool: ...
    async def apasses_through(self) -> bool: ...
    def try_acquire(
        self,
        key: str | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> tuple[HeldLease, None] | tuple[None, RetryAfter]: ...
    async def atry_acquire(
        self,
        key: str | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> tuple[HeldLease, None] | tuple[None, RetryAfter]: ...


# The one record of the leases held in this context (thread, asyncio task), by
# semaphore name, innermost last: the guards' and semaphore_task's alike.
_held: contextvars.ContextVar[Mapping[str, HeldLease] | None] = contextvars.ContextVar(
    "django_semaphore_held", default=None
)


def current_lease(name: str | None = None) -> HeldLease | None:
    """The lease held by the guarded function or ``semaphore_task`` running in this context.

    ``name`` picks a semaphore when guards are nested (a guarded function
    called inside a task); without it, the innermost one's lease.  None
    outside any guarded function or task.  Use it for the fencing token
    (``current_lease().token``) or to check ``lost``.
    """
    held = _held.get()
    if not held:
        return None
    if name is not None:
        return held.get(name)
    return list(held.values())[-1]


@contextlib.contextmanager
def holding(lease: HeldLease) -> Iterator[None]:
    """Make ``lease`` the :func:`current_lease` for the ``with`` block (innermost, and
    by its semaphore's name): for code that holds a slot on a caller's behalf, as
    the guards and ``semaphore_task`` do.  It neither refreshes nor releases it."""
    token = _held.set({**(_held.get() or {}), lease.name: lease})
    try:
        yield
    finally:
        _held.reset(token)


class FunctionGuard:
    """Hold a slot of ``semaphore`` for every call of the decorated function.

    Made by :meth:`Semaphore.guard <django_semaphore.Semaphore.guard>`
    (or by using the semaphore itself as a decorator, which is
    ``semaphore.guard()``):

    * ``key``: the partition, either a value (a string; None is the whole
      semaphore) or a callable taking the decorated function's arguments and
      returning the value, e.g. ``key=lambda url: urlsplit(url).hostname``;
    * ``wait``: seconds to queue for a slot before :class:`SemaphoreFull` is
      raised (None: the semaphore's WAIT);
    * ``meta``: a small JSON-serialisable dict stored with the holder (the
      admin shows it); the guard adds ``function`` (its qualified name);
    * ``refresh``: renew the lease while the function runs (None: the
      semaphore's AUTO_REFRESH, True unless configured otherwise);
    * ``permits``: how many of the semaphore's permits each call takes
      (default 1), and ``priority``: its place among the waiters (higher is
      served first; default 0) -- the "lua" algorithm only.

    With SEMAPHORE_ENABLED = False or MODE "off" in force, the function runs
    without a slot and without a Redis call.  The lease is released when the
    function returns or raises.  A Redis
    failure while acquiring raises :class:`SemaphoreBackendError` before the
    function runs; one while releasing is logged and not raised (the
    function's own result or exception wins, and the slot expires after
    TIMEOUT).  A coroutine function, or a callable marked with asgiref's
    ``markcoroutinefunction``, is awaited under the slot.  Generator
    functions are refused: hold the slot inside them with
    ``semaphore.hold()`` instead.
    """

    def __init__(
        self,
        semaphore: GuardedSemaphore,
        key: str | KeyFunction | None = None,
        wait: float | None = None,
        meta: Mapping[str, Any] | None = None,
        refresh: bool | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> None:
        if wait is not None:
            checked_wait(wait)
        if refresh is not None and not isinstance(refresh, bool):
            raise ValueError(f"refresh must be True, False or None, not {refresh!r}.")
        if type(permits) is not int or permits < 1:
            raise ValueError(f"permits must be an int >= 1, not {permits!r}.")
        if type(priority) is not int or not priority_in_range(priority):
            raise ValueError(f"priority is {priority!r}; {PRIORITY_RANGE}.")
        self.permits = permits
        self.priority = priority
        self.semaphore = semaphore
        self.key = key
        self.wait = wait
        self.meta = dict(meta) if meta else {}
        self.refresh = refresh

    def __repr__(self) -> str:
        return f"<FunctionGuard {self.semaphore.name!r} key={self.key!r} wait={self.wait!r}>"

    def partition(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """The partition value for one call with ``args`` and ``kwargs``."""
        if callable(self.key):
            value = self.key(*args, **kwargs)
            return None if value is None else str(value)
        return self.key

    def _refreshes(self) -> bool:
        return self.semaphore.config.auto_refresh if self.refresh is None else self.refresh

    def _meta(self, func: Callable[..., Any]) -> dict[str, Any]:
        return {"function": f"{func.__module__}.{func.__qualname__}", **self.meta}

    def __call__(self, func: F) -> F:
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"{func.__qualname__} is a generator function; a guard would release its slot "
                "before the generator runs. Hold the slot inside it: `with semaphore.hold(): ...`."
            )
        # asgiref's test, as Django's: it also sees a callable marked with
        # markcoroutinefunction (async middleware, views), which
        # inspect.iscoroutinefunction does not before Python 3.12.
        if iscoroutinefunction(func):
            return cast(F, self._wrap_async(func))
        return cast(F, self._wrap_sync(func))

    def _wrap_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        meta = self._meta(func)

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.semaphore.passes_through():  # SEMAPHORE_ENABLED False, MODE "off"
                return func(*args, **kwargs)
            key = self.partition(args, kwargs)
            lease, retry_after = self.semaphore.try_acquire(key, self.wait, meta, self.permits, self.priority)
            if lease is None:
                raise SemaphoreFull(self.semaphore.name, retry_after or 1, key)
            try:
                with holding(lease), self._watch(lease):
                    return func(*args, **kwargs)
            finally:
                try:
                    lease.release()
                except SemaphoreBackendError as exc:
                    logger.warning("Could not release %r: %s", lease, exc)

        guarded.guard = self  # type: ignore[attr-defined]
        return guarded

    def _wrap_async(self, func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        meta = self._meta(func)

        @functools.wraps(func)
        async def aguarded(*args: Any, **kwargs: Any) -> Any:
            if await self.semaphore.apasses_through():  # SEMAPHORE_ENABLED False, MODE "off"
                return await func(*args, **kwargs)
            key = self.partition(args, kwargs)
            lease, retry_after = await self.semaphore.atry_acquire(
                key, self.wait, meta, self.permits, self.priority
            )
            if lease is None:
                raise SemaphoreFull(self.semaphore.name, retry_after or 1, key)
            try:
                with holding(lease):
                    async with self._awatch(lease):
                        result = await func(*args, **kwargs)
            except BaseException:
                # Cancelled (a timeout, a TaskGroup) or failed: release even if
                # the task is cancelled again while releasing.
                await run_to_completion(_arelease(lease))
                raise
            await _arelease(lease)
            return result

        aguarded.guard = self  # type: ignore[attr-defined]
        return aguarded

    # -- the watchdog -----------------------------------------------------------

    @contextlib.contextmanager
    def _watch(self, lease: HeldLease) -> Iterator[None]:
        if not self._refreshes():
            yield
            return
        with watchdog.watching(lease):
            yield

    @contextlib.asynccontextmanager
    async def _awatch(self, lease: HeldLease) -> AsyncIterator[None]:
        if not self._refreshes():
            yield
            return
        async with watchdog.awatching(lease):
            yield


async def _arelease(lease: HeldLease) -> None:
    try:
        await lease.arelease()
    except SemaphoreBackendError as exc:
        logger.warning("Could not release %r: %s", lease, exc)
