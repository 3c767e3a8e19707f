"""What the decorator and the middleware share: from a request and the
semaphores it needs, to leases held or to the response that refuses it.

* :class:`Need` is one semaphore a request needs (name, KEY override, WAIT override).
* :class:`Guard` takes every need of one request **all or none**: in one global
  order (by name, then partition value), so two requests needing the same pair
  cannot deadlock, and giving back what it took if one is refused or Redis fails.
  ``enter()`` / ``aenter()`` return None when the view may run (guarded, or
  unguarded under SEMAPHORE_FAIL_OPEN) or the response to send instead.
* The leases are released when the response is closed (after the last byte of a
  stream), or at once if the view raises.

The sync and async paths share every decision here; only the Redis calls differ.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.functional import empty
from django.utils.module_loading import import_string
from redis.exceptions import RedisError

from . import conf, refresh
from .core import Semaphore
from .exceptions import SemaphoreBackendError, SemaphoreFull
from .guards import run_to_completion

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponseBase

    from .conf import KeyFunc, SemaphoreConfig
    from .core import Lease

logger = logging.getLogger("django_semaphore")

PATH_META_LENGTH = 200
HANDLED_ATTR = "_semaphore_handled"
NEEDS_ATTR = "semaphore_needs"

# What a broken or unreachable Redis can raise through the client besides
# SemaphoreBackendError (the engine wraps RedisError; a client may also let an
# OSError through).  Anything else is a programming error and propagates.
BACKEND_ERRORS = (SemaphoreBackendError, RedisError, OSError)


@dataclass(frozen=True)
class Need:
    """One semaphore a request needs: ``key`` / ``wait`` of None use its settings."""

    name: str
    key: object = None
    wait: float | None = None

    def key_function(self, config: SemaphoreConfig) -> KeyFunc | None:
        """The callable (request) -> str giving the partition value, or None."""
        if self.key is None:
            return config.key
        func, problems = conf.resolve_key(self.name, self.key)
        for problem in problems:
            if not problem.warning:
                raise problem.as_exception()
        return func


class Item:
    """A Need resolved against one request: the semaphore, the partition value, the wait."""

    __slots__ = ("semaphore", "config", "key", "wait")

    def __init__(self, semaphore: Semaphore, config: SemaphoreConfig, key: str | None, wait: float) -> None:
        self.semaphore = semaphore
        self.config = config
        self.key = key
        self.wait = wait

    @property
    def order(self) -> tuple[str, bool, str]:
        # The global acquisition order: by name, then partition (None first).
        return (self.semaphore.name, self.key is not None, self.key or "")


def needs_of(func: Callable[..., Any]) -> tuple[Need, ...]:
    """The needs a ``@semaphore``-decorated callable declares (empty if none)."""
    return tuple(getattr(func, NEEDS_ATTR, ()))


def _user(request: HttpRequest) -> Any:
    """The user if the request has one already loaded or loadable without I/O in async code."""
    user = getattr(request, "user", None)
    if user is None:
        return None
    wrapped = getattr(user, "_wrapped", None)
    if wrapped is empty:
        return None  # a lazy user not loaded yet (async path: see load_user_async)
    return user


def _user_label(user: Any) -> str | None:
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(user.pk)


def request_meta(request: HttpRequest, user: Any = None) -> dict[str, Any]:
    """The meta the web layer stores with each holder: method, path, user, remote_addr."""
    return {
        "method": request.method,
        "path": request.path[:PATH_META_LENGTH],
        "user": _user_label(user),
        "remote_addr": request.META.get("REMOTE_ADDR"),
    }


def _sync_user(request: HttpRequest) -> Any:
    user = getattr(request, "user", None)
    if user is not None:
        user.is_authenticated  # noqa: B018 - load a lazy user in the sync world
    return user


async def load_user_async(request: HttpRequest) -> Any:
    """Load ``request.user`` without sync database access in async code.

    With Django's AuthenticationMiddleware the user is lazy; ``request.auser()``
    loads it asynchronously, and ``request.user`` is then bound to the loaded
    user so KEY callables may read it.
    """
    user = getattr(request, "user", None)
    if user is None:
        return None
    if getattr(user, "_wrapped", None) is empty:
        if hasattr(request, "auser"):
            user = await request.auser()
        else:  # Django < 5.0 has no request.auser()
            from asgiref.sync import sync_to_async

            user = await sync_to_async(_sync_user)(request)
            user = getattr(user, "_wrapped", user)
        request.user = user
    return user


def resolve(request: HttpRequest, needs: Iterable[Need]) -> list[Item]:
    """Resolve ``needs`` (not yet handled for this request) into sorted Items."""
    items: list[Item] = []
    seen: set[tuple[str, str | None]] = set()
    for need in needs:
        config = conf.get_config(need.name)
        func = need.key_function(config)
        key = None if func is None else str(func(request))
        wait = config.wait if need.wait is None else need.wait
        if (need.name, key) in seen:
            continue
        seen.add((need.name, key))
        items.append(Item(Semaphore(need.name), config, key, wait))
    items.sort(key=lambda item: item.order)
    return items


def pending_needs(request: HttpRequest, needs: Iterable[Need]) -> list[Need]:
    """The needs not already taken care of for this request (by the middleware or an outer decorator)."""
    handled: set[Need] | None = getattr(request, HANDLED_ATTR, None)
    if handled is None:
        handled = set()
        setattr(request, HANDLED_ATTR, handled)
    return [need for need in needs if need not in handled]


def _mark_handled(request: HttpRequest, needs: Iterable[Need]) -> None:
    getattr(request, HANDLED_ATTR).update(needs)


def reject_view() -> Callable[[HttpRequest, SemaphoreFull], HttpResponseBase]:
    """SEMAPHORE_REJECT_VIEW, imported."""
    value = conf.setting("SEMAPHORE_REJECT_VIEW")
    view: Callable[[HttpRequest, SemaphoreFull], HttpResponseBase]
    view = import_string(value) if isinstance(value, str) else value
    return view


def printable(text: object) -> str:
    """``text`` made safe for one log line: unprintable characters escaped.

    Control characters (``\\n``, ``\\r``, ``\\x1b``...), Unicode line
    separators and format characters (bidi overrides) are written as Python
    escapes, and a backslash is doubled so an escape cannot be forged;
    printable non-ASCII text stays readable.  A client controls the path and
    header values: raw, they could start a forged log line or drive a terminal.
    """
    text = str(text)
    if text.isprintable() and "\\" not in text:  # the common case, without a copy
        return text
    return "".join(
        char if char.isprintable() and char != "\\" else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def _describe(request: HttpRequest) -> str:
    return f"{printable(request.method)} {printable(request.path[:PATH_META_LENGTH])}"


def _not_for_django_request(response: HttpResponseBase) -> HttpResponseBase:
    # django.utils.log.log_response (Django 4.2 to 5.2 at least) skips a
    # response marked as logged: without the mark, django.request would log
    # every 429 as a WARNING and every 503 as an ERROR -- an e-mail to ADMINS
    # per request while Redis is down.  This module logs them, once per burst.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


#: Seconds without a refusal of a semaphore that end its burst of refusals.
REFUSAL_QUIET = 10.0
#: Seconds after which a burst still going is logged at WARNING again, with a count.
BURST_REPEAT = 300.0


def _now() -> float:
    return time.monotonic()


class _Burst:
    __slots__ = ("last", "warned_at", "since_warning", "total")

    def __init__(self, now: float) -> None:
        self.last = self.warned_at = now
        self.since_warning = 0  # events logged at DEBUG since the last WARNING
        self.total = 1


class Bursts:
    """Bursts of like events (refusals of one semaphore, failures of one Redis server).

    The first event of a burst is logged at WARNING, the next ones at DEBUG,
    and a burst still going after BURST_REPEAT seconds at WARNING again with
    how many were logged at DEBUG meanwhile: a dead Redis or an overloaded
    view under load writes a few lines, not one per request.  A burst ends
    after ``quiet`` seconds without an event (None: only by :meth:`end`).
    """

    def __init__(self, quiet: float | None) -> None:
        self.quiet = quiet
        self._lock = threading.Lock()
        self._active: dict[Hashable, _Burst] = {}

    def event(self, label: Hashable) -> int | None:
        """Record one event: None to log it at DEBUG, else log it at WARNING.

        The number is how many events of the burst were logged at DEBUG since
        its last warning (0 for the first event of a burst).
        """
        now = _now()
        with self._lock:
            burst = self._active.get(label)
            if burst is None or (self.quiet is not None and now - burst.last > self.quiet):
                self._active[label] = _Burst(now)
                return 0
            burst.last = now
            burst.total += 1
            if now - burst.warned_at >= BURST_REPEAT:
                skipped, burst.since_warning, burst.warned_at = burst.since_warning, 0, now
                return skipped
            burst.since_warning += 1
            return None

    def end(self) -> list[tuple[Hashable, int]]:
        """End every burst: ``[(label, events in the burst)]``."""
        if not self._active:  # the common case, without the lock
            return []
        with self._lock:
            ended, self._active = self._active, {}
        return [(label, burst.total) for label, burst in ended.items()]

    def reset(self) -> None:
        with self._lock:
            self._active = {}


#: Refusals, per semaphore name; failures, per Redis server (ended when Redis answers).
refusals = Bursts(quiet=REFUSAL_QUIET)
bursts = Bursts(quiet=None)


@receiver(setting_changed)
def _reset_bursts(*, setting: str, **kwargs: Any) -> None:
    if setting in ("SEMAPHORE_REDIS", "CACHES"):
        bursts.reset()
    if setting in ("SEMAPHORES", "SEMAPHORE_KEY_PREFIX", "SEMAPHORE_REDIS", "CACHES"):
        refusals.reset()


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
        _describe(request),
        exc.name,
        exc.key,
        exc.retry_after,
        note,
    )
    return _not_for_django_request(reject_view()(request, exc))


def backend_recovered() -> None:
    """Log that Redis answers again, once per burst of failures."""
    for server, failures in bursts.end():
        logger.info(
            "Redis at %s answers again after %d failed request%s; semaphores guard requests again.",
            printable(server or "?"),
            failures,
            "s" if failures != 1 else "",
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
    skipped = bursts.event(exc.server)
    fail_open = conf.setting("SEMAPHORE_FAIL_OPEN")
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
        _describe(request),
        "runs UNGUARDED (SEMAPHORE_FAIL_OPEN)" if fail_open else "answered 503",
        printable(exc),
        note,
    )
    if fail_open:
        return None
    from .views import unavailable

    return _not_for_django_request(unavailable(request, exc))


class Guard:
    """The semaphores of one request (or of one layer of it), taken all or none."""

    def __init__(self, request: HttpRequest, needs: Iterable[Need]) -> None:
        self.request = request
        self.needs = list(needs)
        self.leases: list[Lease] = []
        self.watches: list[refresh.Watch] = []
        self.async_watch: refresh.AsyncWatch | None = None
        self.closed = False
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # -- shared decisions --------------------------------------------------------

    def _granted(self, items: list[Item]) -> list[Lease]:
        leases: dict[str, Lease] = self.request.__dict__.setdefault("semaphore_leases", {})
        for lease in self.leases:
            leases[lease.name] = lease
        _mark_handled(self.request, self.needs)
        return [lease for item, lease in zip(items, self.leases, strict=True) if item.config.auto_refresh]

    def _refused(self, item: Item, retry_after: int | None) -> HttpResponseBase:
        backend_recovered()  # Redis answered
        exc = SemaphoreFull(item.semaphore.name, retry_after or 1, item.key)
        return refused_response(self.request, exc)

    def _failed(self, exc: BaseException) -> HttpResponseBase | None:
        self.request.__dict__.setdefault("semaphore_leases", {})
        _mark_handled(self.request, self.needs)  # fail open: do not try again further in
        return backend_failure(self.request, [n.name for n in self.needs], exc)

    # -- sync ----------------------------------------------------------------------

    def enter(self) -> HttpResponseBase | None:
        """Take every semaphore: None to run the view, else the response to send."""
        items = resolve(self.request, self.needs)
        if not items:
            return None
        meta = request_meta(self.request, _sync_user(self.request))
        try:
            for item in items:
                lease, retry_after = item.semaphore.try_acquire(item.key, item.wait, meta)
                if lease is None:
                    self._give_back()
                    _mark_handled(self.request, self.needs)
                    return self._refused(item, retry_after)
                self.leases.append(lease)
        except BACKEND_ERRORS as exc:
            self._give_back()
            return self._failed(exc)
        except BaseException:
            # Interrupted while taking the next one (KeyboardInterrupt, a signal
            # handler's exception, a bug): what this request already holds must
            # not stay taken until TIMEOUT.
            self._give_back()
            raise
        backend_recovered()
        self.watches = [refresh.watch(lease) for lease in self._granted(items)]
        return None

    def _give_back(self) -> None:
        leases, self.leases = self.leases, []
        for lease in reversed(leases):
            try:
                lease.release()
            except Exception as exc:  # every lease gets its try; a failure expires after TIMEOUT
                logger.warning("Could not release semaphore %r: %s", lease.name, printable(exc))

    def release(self) -> None:
        """Stop renewing and release every lease (sync; idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
        for watch in self.watches:
            watch.stop()
        if self.async_watch is not None:
            self.async_watch.stop()
        self._give_back()

    # -- async ---------------------------------------------------------------------

    async def aenter(self) -> HttpResponseBase | None:
        """The asyncio twin of :meth:`enter`."""
        await load_user_async(self.request)
        items = resolve(self.request, self.needs)
        if not items:
            return None
        meta = request_meta(self.request, _user(self.request))
        try:
            for item in items:
                lease, retry_after = await item.semaphore.atry_acquire(item.key, item.wait, meta)
                if lease is None:
                    await self._agive_back()
                    _mark_handled(self.request, self.needs)
                    return self._refused(item, retry_after)
                self.leases.append(lease)
        except BACKEND_ERRORS as exc:
            await self._agive_back()
            return self._failed(exc)
        except BaseException:
            # Cancelled while waiting for the next one (the ASGI client went
            # away: Django >= 5.0 cancels the view's task), or any other error:
            # give back what this request holds now, not after TIMEOUT, even if
            # the task is cancelled again meanwhile.
            await run_to_completion(self._agive_back())
            raise
        backend_recovered()
        leases = self._granted(items)
        if leases:
            self.async_watch = refresh.AsyncWatch(leases)
        return None

    async def _agive_back(self) -> None:
        leases, self.leases = self.leases, []
        for lease in reversed(leases):
            try:
                await lease.arelease()
            except Exception as exc:  # every lease gets its try; a failure expires after TIMEOUT
                logger.warning("Could not release semaphore %r: %s", lease.name, printable(exc))

    async def arelease(self) -> None:
        """The asyncio twin of :meth:`release`."""
        if self.closed:
            return
        self.closed = True
        if self._finalizer is not None:
            self._finalizer.detach()
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

        A response dropped without being closed (a view called directly in a
        test, a server that never calls close()) stops the renewals when it is
        garbage-collected, so its slots expire after TIMEOUT instead of being
        renewed for the life of the process.
        """
        if not self.leases:
            self.closed = True
            return response
        closers = getattr(response, "_resource_closers", None)
        if closers is None:  # not an HttpResponse: Django will refuse it anyway
            self.release()
            return response
        closers.append(self.release)
        self._finalizer = weakref.finalize(response, self.abandon)
        self._finalizer.atexit = False
        return response
