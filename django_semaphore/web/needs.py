"""What a request needs: the semaphores the decorator and the middleware ask for.

A :class:`Need` names one semaphore (with KEY, WAIT, PERMITS or PRIORITY
overrides); :func:`resolve` turns a request's needs into :class:`Item` objects
(the semaphore, its partition value, permits and priority for this request,
the wait) in the one global
order in which every request takes them.  A request remembers the needs taken
care of already (:func:`pending_needs`, :func:`mark_handled`), so the
middleware and stacked ``@semaphore`` decorators never take a semaphore twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import key_functions, settings, validation
from ..engine.semaphore import Semaphore
from ..runtime import control

if TYPE_CHECKING:
    from django.http import HttpRequest

    from ..config.validation import KeyFunc, PerRequest, SemaphoreConfig

#: The attribute a request keeps its handled needs in.
HANDLED_ATTR = "_semaphore_handled"
#: The attribute ``@semaphore`` puts a view's needs in (outermost first).
NEEDS_ATTR = "semaphore_needs"


@dataclass(frozen=True)
class Need:
    """One semaphore a request needs: ``key`` / ``wait`` / ``permits`` / ``priority``
    of None use its settings."""

    name: str
    key: object = None
    wait: float | None = None
    permits: PerRequest | None = None
    priority: PerRequest | None = None

    def key_function(self, config: SemaphoreConfig) -> KeyFunc | None:
        """The callable (request) -> str giving the partition value, or None."""
        if self.key is None:
            return config.key
        func, problems = validation.resolve_key(self.name, self.key)
        for problem in problems:
            if not problem.warning:
                raise problem.as_exception()
        return func

    def argument_problems(self) -> Iterator[tuple[str, str]]:
        """(message, hint) for each of ``key``, ``wait``, ``permits`` and ``priority``
        that no settings could accept: ``@semaphore(...)`` raises the first at once.

        A dotted path is not imported here (the view's module may be the one
        still being imported): :meth:`problems` reports one that does not import.
        """
        if self.key is not None and not _dotted_path(self.key, "header:"):
            for problem in validation.resolve_key(self.name, self.key)[1]:
                if not problem.warning:
                    yield f"key={validation.shown(self.key)} is refused ({problem.msg})", problem.hint
        if self.wait is not None and not validation.is_wait(self.wait):
            yield (
                f"wait={validation.shown(self.wait)} is refused: it must be {validation.WAIT_RANGE}.",
                "Pass how long a request may queue for a slot, e.g. wait=2, or drop the argument "
                "(the entry's WAIT).",
            )
        for option, value in (("PERMITS", self.permits), ("PRIORITY", self.priority)):
            if value is not None and not _dotted_path(value):
                yield from _per_request_problems(self.name, option, value)

    def problems(self, config: SemaphoreConfig) -> Iterator[tuple[str, str]]:
        """(message, hint) for each thing wrong with this need against its entry
        ``config``: :meth:`argument_problems`, a dotted path that does not import,
        permits or priority with a seed algorithm, permits no request could get.
        System check E027 reports them for every ``@semaphore`` view of the URLconf."""
        yield from self.argument_problems()
        if _dotted_path(self.key, "header:"):
            for problem in validation.resolve_key(self.name, self.key)[1]:
                if not problem.warning:
                    yield f"key={self.key!r} is refused ({problem.msg})", problem.hint
        for option, value in (("PERMITS", self.permits), ("PRIORITY", self.priority)):
            if value is None:
                continue
            words = f"{option.lower()}={validation.shown(value)}"
            if config.algorithm != "lua":
                yield (
                    f"{words} needs the 'lua' algorithm; this entry's is {config.algorithm!r}.",
                    'Set its ALGORITHM to "lua", or drop the argument.',
                )
                continue
            if _dotted_path(value):
                yield from _per_request_problems(self.name, option, value)
            if option == "PERMITS" and isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                yield from _permits_beyond(words, value, config)

    def scheduling(self, config: SemaphoreConfig) -> tuple[PerRequest, PerRequest]:
        """PERMITS and PRIORITY: this need's overrides (resolved) or the settings'."""
        values = []
        for option, override, default in (
            ("PERMITS", self.permits, config.permits),
            ("PRIORITY", self.priority, config.priority),
        ):
            if override is None:
                values.append(default)
                continue
            value, problems = validation.resolve_per_request(self.name, option, override)
            for problem in problems:
                if not problem.warning:
                    raise problem.as_exception()
            values.append(value)
        return values[0], values[1]


def _dotted_path(value: object, but: str | None = None) -> bool:
    # A str that resolving imports (a "header:<Name>" KEY is not one).
    return isinstance(value, str) and "." in value and not (but and value.startswith(but))


def _per_request_problems(name: str, option: str, value: object) -> Iterator[tuple[str, str]]:
    for problem in validation.resolve_per_request(name, option, value)[1]:
        if not problem.warning:
            yield f"{option.lower()}={validation.shown(value)} is refused ({problem.msg})", problem.hint


def _permits_beyond(words: str, permits: int, config: SemaphoreConfig) -> Iterator[tuple[str, str]]:
    """Permits more than the entry could ever grant one request: LIMIT (ADAPTIVE's MAX), TOTAL."""
    bound, highest = (
        ("LIMIT", config.limit) if config.adaptive is None else ("ADAPTIVE's MAX", config.adaptive.max)
    )
    if permits > highest:
        yield (
            f"{words} is more than the entry's {bound} {highest}: no request could ever be served.",
            f"Ask for at most {bound} permits, or raise {bound}.",
        )
    # TOTAL (None, or >= 1) bounds the permits of any one request too.
    elif permits > (config.total or permits):
        yield (
            f"{words} is more than the entry's TOTAL {config.total}: no request could ever be served.",
            "Ask for at most TOTAL permits, or raise TOTAL.",
        )


@dataclass(frozen=True, slots=True, order=True)
class Order:
    """Where an :class:`Item` comes in the one global acquisition order: by semaphore
    name, then partition (the unpartitioned semaphore first, then by key)."""

    name: str
    partitioned: bool
    key: str


class Item:
    """A Need resolved against one request: the semaphore, the partition value, the
    wait, and the permits and priority of this request."""

    __slots__ = ("semaphore", "config", "key", "wait", "permits", "priority")

    def __init__(
        self,
        semaphore: Semaphore,
        config: SemaphoreConfig,
        key: str | None,
        wait: float,
        permits: int = 1,
        priority: int = 0,
    ) -> None:
        self.semaphore = semaphore
        self.config = config
        self.key = key
        self.wait = wait
        self.permits = permits
        self.priority = priority

    @property
    def order(self) -> Order:
        """The global acquisition order: by name, then partition (None first)."""
        return Order(self.semaphore.name, self.key is not None, self.key or "")


def needs_of(func: Callable[..., Any]) -> tuple[Need, ...]:
    """The needs a ``@semaphore``-decorated callable declares (empty if none)."""
    return tuple(getattr(func, NEEDS_ATTR, ()))


def per_request(value: PerRequest, request: HttpRequest) -> int:
    """PERMITS or PRIORITY for ``request``: an int as it is, a callable called with the request."""
    return value if isinstance(value, int) else value(request)


def partition_of(name: str, func: KeyFunc, request: HttpRequest) -> str:
    """The partition value KEY function ``func`` of semaphore ``name`` gives ``request``.

    A value that is not a str is taken as ``str(value)`` (a pk).  None is
    refused with a TypeError (a 500, in Django's error log): it would otherwise
    become one partition "None" shared by every such request, and no fallback
    is right for every project (a missing ``return`` gives None too).  The
    built-in KEYs give ``""`` when their value is missing; a KEY function of
    the project's returns its own value for that case.
    """
    value = func(request)
    if value is None:
        raise TypeError(
            f"The KEY function {_describe(func)} of semaphore {name!r} returned None: a KEY "
            "function returns the partition value as a str. Return a value of your own for "
            'requests without one (the built-in KEYs give "" when the header or address is missing).'
        )
    return str(value)


def _describe(func: object) -> str:
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    return repr(func)


def resolve(request: HttpRequest, needs: Iterable[Need]) -> list[Item]:
    """Resolve ``needs`` into Items in the global order, one per semaphore and partition.

    Taking every request's semaphores in one order (by name, then partition
    value) is what keeps two requests that need the same pair from
    deadlocking.  KEY, PERMITS and PRIORITY callables run here, so an async
    caller loads the user first.

    A semaphore whose mode in force is "off" (or every one, with
    SEMAPHORE_ENABLED = False) is left out: the request passes it without a
    Redis call.  The mode comes from the settings and the cache of the
    overrides, never from Redis here (this runs on the event loop too).
    """
    items: list[Item] = []
    seen: set[tuple[str, str | None]] = set()
    for need, config in _in_force(needs):
        func = need.key_function(config)
        key = None if func is None else partition_of(need.name, func, request)
        wait = config.wait if need.wait is None else need.wait
        if (need.name, key) in seen:
            continue
        seen.add((need.name, key))
        permits, priority = need.scheduling(config)
        item = Item(
            Semaphore(need.name),
            config,
            key,
            wait,
            per_request(permits, request),
            per_request(priority, request),
        )
        items.append(item)
    items.sort(key=lambda item: item.order)
    return items


def _in_force(needs: Iterable[Need]) -> Iterator[tuple[Need, SemaphoreConfig]]:
    """Each of ``needs`` with its configuration, but those whose mode in force is "off"
    (all of them with SEMAPHORE_ENABLED = False): from the settings and the cache of
    the overrides, never from Redis."""
    if not settings.enabled():
        return
    for need in needs:
        config = settings.get_config(need.name)
        if control.cached(config).mode != "off":
            yield need, config


def _project_code(value: object) -> bool:
    # A KEY, PERMITS or PRIORITY of the project's own: a callable that is not
    # one of the app's KEY functions, which only read the request.
    if value is None or isinstance(value, int | key_functions.ByHeader):
        return False
    return value not in validation.NAMED_KEYS.values()


def calls_project_code(needs: Iterable[Need]) -> bool:
    """True when :func:`resolve` would call a KEY, PERMITS or PRIORITY callable of
    the project's, which may query the database: an async caller resolves in a
    thread then, as Django runs sync code under ASGI."""
    return any(
        any(map(_project_code, (need.key_function(config), *need.scheduling(config))))
        for need, config in _in_force(needs)
    )


def pending_needs(request: HttpRequest, needs: Iterable[Need]) -> list[Need]:
    """The needs not already taken care of for this request (by the middleware or an outer decorator)."""
    handled: set[Need] | None = getattr(request, HANDLED_ATTR, None)
    if handled is None:
        handled = set()
        setattr(request, HANDLED_ATTR, handled)
    return [need for need in needs if need not in handled]


def mark_handled(request: HttpRequest, needs: Iterable[Need]) -> None:
    """Record ``needs`` as taken care of for this request (held, refused or failed open)."""
    getattr(request, HANDLED_ATTR).update(needs)
