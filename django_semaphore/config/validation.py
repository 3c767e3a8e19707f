"""Validating the settings: raw values in, :class:`SemaphoreConfig` objects and problems out.

Nothing here reads Django settings: :mod:`django_semaphore.config.settings` reads them
(lazily, cached) and hands the values to :func:`validate`; this module only
judges them.  Each option has its validator, returning ``(value, problems)``
for an entry option or a list of problems for a global setting.  The same
:class:`Problem` objects become the system checks
(:mod:`django_semaphore.checks`), the refusal to boot
(:mod:`django_semaphore.apps`) and the ``ImproperlyConfigured`` raised when a
bad entry is used anyway, so all three carry the same words.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import key_functions

#: A KEY, once resolved: the request to a partition value.
KeyFunc = Callable[[Any], str]
#: PERMITS or PRIORITY, once resolved: an int, or a callable (request) -> int.
PerRequest = int | Callable[[Any], int]

T = TypeVar("T")

ENTRY_DEFAULTS: dict[str, Any] = {
    "TIMEOUT": 60,
    "WAIT": 0,
    "KEY": None,
    "ALGORITHM": "lua",
    "AUTO_REFRESH": True,
    "PATHS": [],
    "URL_NAMES": [],
    "METHODS": None,
    "MODE": "enforce",
    "MAX_WAITERS": None,
    "PERMITS": 1,
    "PRIORITY": 0,
    "ADAPTIVE": None,
    "SLOTS": False,
    "TOTAL": None,
}
ENTRY_OPTIONS = frozenset(ENTRY_DEFAULTS) | {"LIMIT"}

ALGORITHM_NAMES = ("lua", "fair_locked", "fair", "basic")
#: MODE: "enforce" refuses and queues; "dry_run" admits everyone and records
#: would-be refusals; "off": guards pass through without touching Redis.
MODES = ("enforce", "dry_run", "off")
OVER_ADMITTING = ("fair", "basic")
#: The algorithms that take PERMITS, PRIORITY, MAX_WAITERS, ADAPTIVE, SLOTS and TOTAL.
SCHEDULING = ("lua",)
NAMED_KEYS: dict[str, KeyFunc] = {"ip": key_functions.by_ip, "user": key_functions.by_user}
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})
MAX_PREFIX_LENGTH = 64
#: The largest limit anywhere: LIMIT, TOTAL, ADAPTIVE's MIN and MAX, a runtime override.
#: Far above any real concurrency, and far below where Redis's numbers (doubles in
#: Lua, 64-bit ints in ZSET scores and JSON) would round or overflow.
MAX_LIMIT = 1_000_000
#: The longest TIMEOUT, in seconds: 365 days.  A lease is meant to end: work that
#: runs longer refreshes a shorter one (AUTO_REFRESH, ``lease.refresh()``).
#: Far above it the expiry times outgrow what Redis takes: a TIMEOUT of
#: 10**15 s, or an infinite one, failed every acquire (10**13 s still worked).
MAX_TIMEOUT = 365 * 24 * 3600
#: A PRIORITY's absolute value must stay below this: the scripts order
#: waiters by priority in Lua's numbers (doubles), exact up to 2**53.
MAX_PRIORITY = 2**53
#: The optional keys of an ADAPTIVE dict and their defaults (MIN and MAX are required).
ADAPTIVE_DEFAULTS: dict[str, Any] = {
    "INTERVAL": 1.0,
    "TOLERANCE": 1.25,
    "MIN_SAMPLES": 10,
    "PROBE_INTERVAL": 60.0,
}
ADAPTIVE_OPTIONS = ("MIN", "MAX", *ADAPTIVE_DEFAULTS)
_PREFIX_FORBIDDEN = re.compile(r"[{}\s*?\[\]\\]")
# A limit as typed: ASCII digits only (no sign, "_", space, or other scripts' digits).
_DIGITS = re.compile(r"[0-9]+")

# An entry without LIMIT (a LIMIT of None is reported differently).
_MISSING = object()


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the settings: a system check message in waiting."""

    id: str
    msg: str
    hint: str
    warning: bool = False

    def as_exception(self) -> ImproperlyConfigured:
        """The ``ImproperlyConfigured`` raised when a setting with this problem is used anyway."""
        return ImproperlyConfigured(f"{self.msg} HINT: {self.hint} ({self.id})")


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """A validated ADAPTIVE setting: the bounds and knobs of the adaptive limit
    (:mod:`django_semaphore.runtime.adaptive`)."""

    min: int
    max: int
    interval: float = ADAPTIVE_DEFAULTS["INTERVAL"]  # seconds between two updates
    tolerance: float = ADAPTIVE_DEFAULTS["TOLERANCE"]  # mean hold / baseline allowed before shrinking
    min_samples: int = ADAPTIVE_DEFAULTS["MIN_SAMPLES"]  # holds a window needs for an update
    probe_interval: float = ADAPTIVE_DEFAULTS["PROBE_INTERVAL"]  # seconds between two baseline probes

    def clamp(self, limit: int) -> int:
        """``limit`` brought into [MIN, MAX]."""
        return max(self.min, min(self.max, limit))


@dataclass(frozen=True)
class SemaphoreConfig:
    """One validated semaphore: what the engine and the web layer act on."""

    name: str
    limit: int
    timeout: float = 60
    wait: float = 0
    key: KeyFunc | None = None  # None, or a callable (request) -> str
    algorithm: str = "lua"
    auto_refresh: bool = True
    paths: tuple[re.Pattern[str], ...] = ()  # compiled regexes
    url_names: frozenset[str] = frozenset()
    methods: frozenset[str] | None = None
    mode: str = "enforce"  # MODE in settings (a runtime override may replace it)
    max_waiters: int | None = None  # None: an unbounded queue
    permits: PerRequest = 1  # an int, or a callable (request) -> int
    priority: PerRequest = 0  # an int, or a callable (request) -> int
    adaptive: AdaptiveConfig | None = None  # None: the limit is LIMIT (or an override's)
    slots: bool = False  # True: each holder gets slot numbers (lease.slots); False: lease.slots == ()
    total: int | None = None  # None: no name-wide bound; n: at most n permits across all partitions

    @functools.cached_property
    def timeout_ms(self) -> int:
        """TIMEOUT in whole milliseconds (at least 1), as the scripts take it (worked out
        once: every acquire asks)."""
        return max(1, int(round(self.timeout * 1000)))


#: What an entry option's validator returns: the value to use and the problems found.
#: With an error among them the value is a placeholder: the entry gets no config.
Checked = tuple[T, list[Problem]]


def where(name: object) -> str:
    """How messages name the entry ``name``: ``SEMAPHORES['reports']``."""
    return f"SEMAPHORES[{name!r}]"


def _is_number(value: object) -> bool:
    """An int or a float, not a bool: what the engine computes with (a Fraction or a
    Decimal is not, and a Fraction used to pass the checks, then fail every call)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: What a wait must be, for the messages that refuse one.
WAIT_RANGE = f"a number (int or float) of seconds from 0 to {MAX_TIMEOUT:,} (365 days)"


def is_wait(value: object) -> TypeGuard[float]:
    """True if ``value`` is a wait: an int or float (not a bool) of seconds from 0 to
    :data:`MAX_TIMEOUT` (NaN, infinity and 10**400 are not: the engine adds it to a
    clock).  The one rule for WAIT, ``Semaphore(wait=)``, ``acquire(wait=)`` and the
    function guard's ``wait``."""
    return _is_number(value) and 0 <= value <= MAX_TIMEOUT  # type: ignore[operator]


def checked_wait(value: object) -> float:
    """``value`` if it is a wait (:func:`is_wait`); ValueError otherwise."""
    if is_wait(value):
        return value
    raise ValueError(f"wait must be {WAIT_RANGE}, not {shown(value)}.")


def is_limit(value: object, minimum: int = 0) -> TypeGuard[int]:
    """True if ``value`` is a limit: an int (not a bool) from ``minimum`` to :data:`MAX_LIMIT`.

    The one rule for every limit: LIMIT and ADAPTIVE's bounds (``minimum`` 1)
    and runtime overrides (:func:`checked_limit`, :func:`limit_from_text`).
    """
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= MAX_LIMIT


def shown(value: object) -> str:
    """``repr(value)``, cut short: a message never echoes a 5,000-digit number whole."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4,300 digits has no repr
        return "an int of more than 4,300 digits"
    return text if len(text) <= 40 else text[:30] + "…" + text[-5:]


def checked_limit(value: object, what: str = "limit") -> int:
    """``value`` as a runtime override's limit: an int from 0 (0 pauses) to
    :data:`MAX_LIMIT`; ValueError (naming ``what``) for anything else -- a str,
    a float or a bool included."""
    if is_limit(value):
        return value
    raise ValueError(
        f"{what} must be an int from 0 to {MAX_LIMIT:,} (0 pauses the semaphore), not {shown(value)}."
    )


def limit_from_text(text: object, what: str = "limit") -> int:
    """A limit as an operator types it (``sema_set --limit``, the admin form): ASCII
    digits only, for a number from 0 to :data:`MAX_LIMIT`; ValueError (naming
    ``what``) otherwise.

    Stricter than ``int()``, which takes "+3", " 7 ", "1_000" and "١٢".
    """
    if isinstance(text, str) and _DIGITS.fullmatch(text):
        digits = text.lstrip("0") or "0"
        # More digits than MAX_LIMIT has is out of range (and int() refuses 4,300 and more).
        value = int(digits) if len(digits) <= len(str(MAX_LIMIT)) else MAX_LIMIT + 1
        if is_limit(value):
            return value
    raise ValueError(
        f"{what} must be a whole number from 0 to {MAX_LIMIT:,} (0 pauses the semaphore), not {shown(text)}."
    )


def _collect(problems: list[Problem], checked: Checked[T]) -> T:
    """The value of ``checked``; its problems are appended to ``problems``."""
    value, found = checked
    problems.extend(found)
    return value


# -- one entry: each option -------------------------------------------------------------


def validate_shape(name: object, raw: object) -> list[Problem]:
    """E002: an entry is a dict under a non-empty string name (nothing else is checked without it)."""
    if not isinstance(name, str) or not name:
        return [
            Problem(
                "django_semaphore.E002",
                f"SEMAPHORES has the name {name!r}; names must be non-empty strings.",
                "Rename the entry, e.g. SEMAPHORES = {'reports': {...}}.",
            )
        ]
    if not isinstance(raw, dict):
        return [
            Problem(
                "django_semaphore.E002",
                f"{where(name)} is {type(raw).__name__}, not a dict.",
                f"Write {where(name)} = {{'LIMIT': 2, ...}}.",
            )
        ]
    return []


def validate_options(entry: str, raw: Mapping[object, object]) -> list[Problem]:
    """E011: options that do not exist (a typo such as "LIMT")."""
    unknown = sorted(str(k) for k in raw if k not in ENTRY_OPTIONS)
    if not unknown:
        return []
    return [
        Problem(
            "django_semaphore.E011",
            f"{entry} has unknown option(s) {', '.join(unknown)}.",
            f"The options are {', '.join(sorted(ENTRY_OPTIONS))}.",
        )
    ]


def validate_limit(entry: str, value: object) -> Checked[int | None]:
    """E003: LIMIT, required, an int from 1 to MAX_LIMIT (``value`` is ``_MISSING`` when absent)."""
    if is_limit(value, 1):
        return value, []
    return None, [
        Problem(
            "django_semaphore.E003",
            f"{entry} has no LIMIT."
            if value is _MISSING
            else f"{entry}['LIMIT'] is {shown(value)}; it must be an int from 1 to {MAX_LIMIT:,}.",
            "Set LIMIT to how many holders may hold the semaphore at once, e.g. 'LIMIT': 2 "
            f"(an int from 1 to {MAX_LIMIT:,}).",
        )
    ]


def validate_timeout(entry: str, value: Any) -> Checked[float]:
    """E004: TIMEOUT, a number of seconds above 0 and at most :data:`MAX_TIMEOUT`
    (NaN and infinity are not)."""
    if _is_number(value) and 0 < value <= MAX_TIMEOUT:
        return value, []
    return 0, [
        Problem(
            "django_semaphore.E004",
            f"{entry}['TIMEOUT'] is {value!r}; it must be a number of seconds above 0 "
            f"and at most {MAX_TIMEOUT:,} (365 days).",
            "Set TIMEOUT to the lease length in seconds (default 60); work that runs longer "
            "keeps a shorter lease and refreshes it (AUTO_REFRESH, lease.refresh()).",
        )
    ]


def validate_wait(entry: str, value: Any) -> Checked[float]:
    """E005: WAIT, an int or float of seconds from 0 to :data:`MAX_TIMEOUT` (:func:`is_wait`)."""
    if is_wait(value):
        return value, []
    return 0, [
        Problem(
            "django_semaphore.E005",
            f"{entry}['WAIT'] is {shown(value)}; it must be {WAIT_RANGE}.",
            "Set WAIT to how long a caller may queue for a slot (0: refuse at once), "
            f"at most {MAX_TIMEOUT:,} seconds.",
        )
    ]


def validate_algorithm(entry: str, value: Any) -> Checked[str]:
    """E008: ALGORITHM, one of ALGORITHM_NAMES; W001 for one that over-admits."""
    if value not in ALGORITHM_NAMES:
        return "lua", [
            Problem(
                "django_semaphore.E008",
                f"{entry}['ALGORITHM'] is {value!r}, which is not an algorithm.",
                f"Use one of {', '.join(map(repr, ALGORITHM_NAMES))}; 'lua' is the default.",
            )
        ]
    if value in OVER_ADMITTING:
        return value, [
            Problem(
                "django_semaphore.W001",
                f"{entry} uses ALGORITHM {value!r}, which can admit more than LIMIT "
                "holders under contention.",
                "Use the default 'lua' (atomic, fair, server clock) or 'fair_locked'.",
                warning=True,
            )
        ]
    return str(value), []


def resolve_key(name: object, value: object) -> Checked[KeyFunc | None]:
    """E006 / E007: turn the KEY of entry ``name`` into a callable (or None).

    Also used for a ``@semaphore(key=...)`` override, with the same messages.
    """
    entry = where(name)
    if value is None:
        return None, []
    if callable(value):
        return value, []
    if not isinstance(value, str):
        return None, [
            Problem(
                "django_semaphore.E006",
                f"{entry}['KEY'] is {value!r}, which is not a KEY.",
                'Use None, "ip", "user", "header:<Name>", a callable or a dotted path to one.',
            )
        ]
    if value in NAMED_KEYS:
        return NAMED_KEYS[value], []
    if value.startswith("header:"):
        header = value[len("header:") :].strip()
        if not header:
            return None, [
                Problem(
                    "django_semaphore.E006",
                    f"{entry}['KEY'] is {value!r}, which names no header.",
                    'Write the header name after the colon, e.g. "header:X-Api-Key".',
                )
            ]
        return key_functions.ByHeader(header), []
    if "." not in value:
        return None, [
            Problem(
                "django_semaphore.E006",
                f"{entry}['KEY'] is {value!r}, which is not a known KEY.",
                'Use "ip", "user", "header:<Name>", a callable or a dotted path to one.',
            )
        ]
    try:
        func = import_string(value)
    except ImportError as exc:
        return None, [
            Problem(
                "django_semaphore.E007",
                f"{entry}['KEY'] is {value!r}, which cannot be imported: {exc}.",
                "Check the dotted path: module path, then the function name.",
            )
        ]
    if not callable(func):
        return None, [
            Problem(
                "django_semaphore.E007",
                f"{entry}['KEY'] is {value!r}, which is not callable.",
                "Point KEY at a function taking the request and returning a string.",
            )
        ]
    return func, []


def validate_auto_refresh(entry: str, value: object) -> Checked[bool]:
    """E009: AUTO_REFRESH, True or False."""
    if isinstance(value, bool):
        return value, []
    return True, [
        Problem(
            "django_semaphore.E009",
            f"{entry}['AUTO_REFRESH'] is {value!r}; it must be True or False.",
            "Set AUTO_REFRESH to True (renew leases while a view runs) or False.",
        )
    ]


def validate_paths(entry: str, value: object) -> Checked[tuple[re.Pattern[str], ...]]:
    """E010: PATHS, a list of regexes (compiled here, one problem per bad one)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        return (), [
            Problem(
                "django_semaphore.E010",
                f"{entry}['PATHS'] is {value!r}; it must be a list of regexes.",
                "Write PATHS as a list, e.g. [r'^/api/'].",
            )
        ]
    paths, problems = [], []
    for pattern in value:
        # request.path_info is a str: a bytes regex (or a compiled one) would fail every request.
        if not isinstance(getattr(pattern, "pattern", pattern), str):
            problems.append(
                Problem(
                    "django_semaphore.E010",
                    f"{entry}['PATHS'] has {shown(pattern)}, which is not a str regex.",
                    "Write each path regex as a str, e.g. r'^/api/' (not b'^/api/'): it is matched "
                    "against request.path_info, a str.",
                )
            )
            continue
        try:
            paths.append(re.compile(pattern))
        except (re.error, TypeError) as exc:
            problems.append(
                Problem(
                    "django_semaphore.E010",
                    f"{entry}['PATHS'] has {pattern!r}, which is not a regex: {exc}.",
                    "Fix the regular expression (it is matched against request.path_info).",
                )
            )
    return tuple(paths), problems


def _as_list(value: object) -> list[object] | None:
    """``value`` as a list if it is a list, tuple or set, else None (a str is not a list of names)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        return None
    return list(value)


def validate_url_names(entry: str, value: object) -> Checked[frozenset[str]]:
    """E012: URL_NAMES, a list of non-empty URL names."""
    items = _as_list(value)
    if items is not None:
        names = [n for n in items if isinstance(n, str) and n]
        if len(names) == len(items):
            return frozenset(names), []
    return frozenset(), [
        Problem(
            "django_semaphore.E012",
            f"{entry}['URL_NAMES'] is {value!r}; it must be a list of URL names.",
            "Write URL_NAMES as a list of names, e.g. ['reports:export'].",
        )
    ]


def validate_methods(entry: str, value: object) -> Checked[frozenset[str] | None]:
    """E013: METHODS, None (every method) or a list of HTTP methods, any case."""
    if value is None:
        return None, []
    items = _as_list(value)
    if items is not None:
        methods = [m.upper() for m in items if isinstance(m, str) and m.upper() in HTTP_METHODS]
        if len(methods) == len(items):
            return frozenset(methods), []
    return None, [
        Problem(
            "django_semaphore.E013",
            f"{entry}['METHODS'] is {value!r}; it must be None or a list of HTTP methods.",
            "Write METHODS as e.g. ['POST', 'PUT'], or None for every method.",
        )
    ]


def validate_mode(entry: str, value: object) -> Checked[str]:
    """E018: MODE, one of MODES."""
    if isinstance(value, str) and value in MODES:
        return value, []
    return "enforce", [
        Problem(
            "django_semaphore.E018",
            f"{entry}['MODE'] is {value!r}, which is not a mode.",
            f"Use one of {', '.join(map(repr, MODES))}; 'enforce' is the default "
            "('dry_run' records would-be refusals without refusing anyone).",
        )
    ]


def _per_request(
    check_id: str, entry: str, option: str, value: object, hint: str
) -> Checked[PerRequest | None]:
    """An int as it is, or a callable / dotted path to one, resolved (None and a problem if not)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, []
    if callable(value):
        return value, []
    if isinstance(value, str) and "." in value:
        try:
            func = import_string(value)
        except ImportError as exc:
            return None, [
                Problem(
                    check_id,
                    f"{entry}[{option!r}] is {value!r}, which cannot be imported: {exc}.",
                    "Check the dotted path: module path, then the function name.",
                )
            ]
        if callable(func):
            return func, []
    return None, [
        Problem(check_id, f"{entry}[{option!r}] is {value!r}, which is not an int or a callable.", hint)
    ]


def validate_permits(
    entry: str, value: object, limit: int | None, total: int | None = None
) -> Checked[PerRequest]:
    """E020: PERMITS, an int in 1..LIMIT (and at most TOTAL, when there is one: more
    could never be granted), or a callable / dotted path (request) -> int."""
    hint = "Set PERMITS to an int from 1 to LIMIT, or a callable (request) -> int (or a dotted path to one)."
    resolved, problems = _per_request("django_semaphore.E020", entry, "PERMITS", value, hint)
    if resolved is None:
        return 1, problems
    if isinstance(resolved, int) and (resolved < 1 or (limit is not None and resolved > limit)):
        return 1, [
            Problem(
                "django_semaphore.E020",
                f"{entry}['PERMITS'] is {resolved!r}; it must be from 1 to LIMIT ({limit}).",
                "Set PERMITS to how many of the LIMIT slots one guarded request takes (default 1).",
            )
        ]
    if isinstance(resolved, int) and total is not None and resolved > total:
        return 1, [
            Problem(
                "django_semaphore.E020",
                f"{entry}['PERMITS'] is {resolved!r}, more than TOTAL ({total}): all partitions "
                "together hold at most TOTAL permits, so a request for it could never be granted.",
                "Set PERMITS to at most TOTAL (and LIMIT), or raise TOTAL.",
            )
        ]
    return resolved, []


def resolve_per_request(name: object, option: str, value: object) -> Checked[PerRequest]:
    """PERMITS or PRIORITY (``option``) of entry ``name`` as an int or a callable:
    also used for a ``@semaphore(permits=..., priority=...)`` override, with the
    same messages (PERMITS is checked against LIMIT when it is used)."""
    if option == "PERMITS":
        return validate_permits(where(name), value, None)
    return validate_priority(where(name), value)


def validate_priority(entry: str, value: object) -> Checked[PerRequest]:
    """E021: PRIORITY, an int whose absolute value is below :data:`MAX_PRIORITY`,
    or a callable / dotted path (request) -> int."""
    hint = "Set PRIORITY to an int (higher is served first), or a callable (request) -> int."
    resolved, problems = _per_request("django_semaphore.E021", entry, "PRIORITY", value, hint)
    if isinstance(resolved, int) and not priority_in_range(resolved):
        return 0, [
            Problem(
                "django_semaphore.E021",
                f"{entry}['PRIORITY'] is {resolved!r}; {PRIORITY_RANGE}.",
                "Set PRIORITY to a small int such as 10 (higher is served first).",
            )
        ]
    return (0 if resolved is None else resolved), problems


#: What a priority must be, for the messages that refuse one.
PRIORITY_RANGE = f"it must be an int from {1 - MAX_PRIORITY:,} to {MAX_PRIORITY - 1:,}"


def priority_in_range(priority: int) -> bool:
    """Whether an int ``priority`` is one the scripts order exactly (below :data:`MAX_PRIORITY`)."""
    return -MAX_PRIORITY < priority < MAX_PRIORITY


def validate_max_waiters(entry: str, value: object) -> Checked[int | None]:
    """E022: MAX_WAITERS, None (an unbounded queue) or an int >= 0."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value, []
    return None, [
        Problem(
            "django_semaphore.E022",
            f"{entry}['MAX_WAITERS'] is {value!r}; it must be None or an int >= 0.",
            "Set MAX_WAITERS to how many callers may wait for a partition at once (None: no bound).",
        )
    ]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _adaptive_type_problems(entry: str, value: Mapping[Any, Any]) -> list[Problem]:
    """E024's findings inside an ADAPTIVE dict: unknown, missing and mistyped keys."""
    where_ = f"{entry}['ADAPTIVE']"
    found: list[str] = []
    unknown = sorted(str(k) for k in value if k not in ADAPTIVE_OPTIONS)
    if unknown:
        found.append(f"has unknown key(s) {', '.join(unknown)}")
    for option in ("MIN", "MAX"):
        if option not in value:
            found.append(f"has no {option}")
        elif not _is_int(value[option]):
            found.append(f"has {option} {value[option]!r}, not an int")
    # INTERVAL and PROBE_INTERVAL go to the controller in milliseconds: at most MAX_TIMEOUT
    # (1e308 used to pass, then crash the control job at every tick: OverflowError).
    interval = value.get("INTERVAL", ADAPTIVE_DEFAULTS["INTERVAL"])
    if not (_is_number(interval) and 0 < interval <= MAX_TIMEOUT):
        found.append(
            f"has INTERVAL {shown(interval)}, not a number of seconds above 0 and at most {MAX_TIMEOUT:,}"
        )
    tolerance = value.get("TOLERANCE", ADAPTIVE_DEFAULTS["TOLERANCE"])
    if not (_is_number(tolerance) and math.isfinite(tolerance) and tolerance > 1):
        found.append(f"has TOLERANCE {tolerance!r}, not a number > 1")
    min_samples = value.get("MIN_SAMPLES", ADAPTIVE_DEFAULTS["MIN_SAMPLES"])
    if not (_is_int(min_samples) and min_samples >= 1):
        found.append(f"has MIN_SAMPLES {min_samples!r}, not an int >= 1")
    probe = value.get("PROBE_INTERVAL", ADAPTIVE_DEFAULTS["PROBE_INTERVAL"])
    if not (_is_number(probe) and 0 <= probe <= MAX_TIMEOUT):
        found.append(f"has PROBE_INTERVAL {shown(probe)}, not a number of seconds from 0 to {MAX_TIMEOUT:,}")
    if not found:
        return []
    return [
        Problem(
            "django_semaphore.E024",
            f"{where_} {'; '.join(found)}.",
            "Write ADAPTIVE as {'MIN': 1, 'MAX': 64} (ints), optionally with INTERVAL (seconds > 0, "
            f"default 1.0), TOLERANCE (> 1, default 1.25), MIN_SAMPLES (int >= 1, default 10) and "
            f"PROBE_INTERVAL (seconds >= 0, default 60; 0: no periodic probe); the intervals are at "
            f"most {MAX_TIMEOUT:,} seconds (365 days).",
        )
    ]


def validate_adaptive(entry: str, value: object, limit: int | None) -> Checked[AdaptiveConfig | None]:
    """E024: ADAPTIVE, None or a dict of MIN, MAX (ints), INTERVAL, TOLERANCE, MIN_SAMPLES,
    PROBE_INTERVAL;
    E025: MIN above MAX; E026: MIN or MAX outside 1..MAX_LIMIT; W005: LIMIT outside [MIN, MAX]."""
    if value is None:
        return None, []
    if not isinstance(value, dict):
        return None, [
            Problem(
                "django_semaphore.E024",
                f"{entry}['ADAPTIVE'] is {value!r}; it must be None or a dict.",
                "Write ADAPTIVE as {'MIN': 1, 'MAX': 64}, or None for a fixed LIMIT.",
            )
        ]
    problems = _adaptive_type_problems(entry, value)
    if problems:
        return None, problems
    low, high = value["MIN"], value["MAX"]
    if not (is_limit(low, 1) and is_limit(high, 1)):
        return None, [
            Problem(
                "django_semaphore.E026",
                f"{entry}['ADAPTIVE'] has MIN {shown(low)} and MAX {shown(high)}; both must be "
                f"from 1 to {MAX_LIMIT:,}.",
                "The adaptive limit stays within [MIN, MAX]: use bounds from 1 (an override of "
                f"limit 0 pauses a semaphore) to {MAX_LIMIT:,}.",
            )
        ]
    if low > high:
        return None, [
            Problem(
                "django_semaphore.E025",
                f"{entry}['ADAPTIVE'] has MIN {low!r} above MAX {high!r}.",
                "Set MIN to the lowest limit the adaptive limit may reach and MAX to the highest "
                "(MIN <= MAX).",
            )
        ]
    config = AdaptiveConfig(
        low,
        high,
        float(value.get("INTERVAL", ADAPTIVE_DEFAULTS["INTERVAL"])),
        float(value.get("TOLERANCE", ADAPTIVE_DEFAULTS["TOLERANCE"])),
        value.get("MIN_SAMPLES", ADAPTIVE_DEFAULTS["MIN_SAMPLES"]),
        float(value.get("PROBE_INTERVAL", ADAPTIVE_DEFAULTS["PROBE_INTERVAL"])),
    )
    if limit is not None and not low <= limit <= high:
        return config, [
            Problem(
                "django_semaphore.W005",
                f"{entry} has LIMIT {limit}, outside ADAPTIVE's [{low}, {high}]: the adaptive "
                f"limit starts at {config.clamp(limit)}.",
                "Set LIMIT (the starting point of the adaptive limit) between MIN and MAX.",
                warning=True,
            )
        ]
    return config, []


def validate_slots(entry: str, value: object) -> Checked[bool]:
    """E028: SLOTS, True or False (not 1 or 0, not "yes")."""
    if isinstance(value, bool):
        return value, []
    return False, [
        Problem(
            "django_semaphore.E028",
            f"{entry}['SLOTS'] is {shown(value)}; it must be True or False.",
            "Set SLOTS to True to give each holder slot numbers (lease.slots), or False "
            "(the default: lease.slots is () and nothing is spent on them).",
        )
    ]


def validate_total(entry: str, value: object, keyed: bool, ad_hoc: bool = False) -> Checked[int | None]:
    """E029: TOTAL, None or an int from 1 to MAX_LIMIT; E030: TOTAL in SEMAPHORES without
    KEY (``keyed`` False), unless the entry is an ad-hoc Semaphore's (``ad_hoc``: its
    partitions are the ``key=`` values passed to acquire)."""
    if value is None:
        return None, []
    if not is_limit(value, 1):
        return None, [
            Problem(
                "django_semaphore.E029",
                f"{entry}['TOTAL'] is {shown(value)}; it must be None or an int from 1 to {MAX_LIMIT:,}.",
                "Set TOTAL to how many permits all the partitions of this semaphore may hold together, "
                f"e.g. 'TOTAL': 8 (an int from 1 to {MAX_LIMIT:,}), or None for no such bound.",
            )
        ]
    if not keyed and not ad_hoc:
        return None, [
            Problem(
                "django_semaphore.E030",
                f"{entry} sets TOTAL ({value}) without KEY.",
                "TOTAL shares permits between the partitions that KEY makes (LIMIT per partition, "
                "TOTAL across all of them): set KEY, e.g. 'KEY': 'user', or remove TOTAL "
                "(without KEY, LIMIT alone bounds the one semaphore).",
            )
        ]
    return value, []


def validate_scheduling(entry: str, algorithm: str, raw: Mapping[object, object]) -> list[Problem]:
    """E023: PERMITS other than 1, PRIORITY, MAX_WAITERS, ADAPTIVE, SLOTS or TOTAL with an
    algorithm that has no scheduling."""
    if algorithm in SCHEDULING:
        return []
    used = [
        option
        for option, default in (
            ("PERMITS", 1),
            ("PRIORITY", 0),
            ("MAX_WAITERS", None),
            ("ADAPTIVE", None),
            ("SLOTS", False),
            ("TOTAL", None),
        )
        if option in raw and raw[option] != default
    ]
    if not used:
        return []
    return [
        Problem(
            "django_semaphore.E023",
            f"{entry} sets {', '.join(used)}, which ALGORITHM {algorithm!r} does not support.",
            "Permits, priorities, MAX_WAITERS, slot numbers (SLOTS), the adaptive limit and the "
            "name-wide TOTAL belong to the default ALGORITHM 'lua': "
            "use it, or remove these options.",
        )
    ]


def validate_entry(
    name: object, raw: object, ad_hoc: bool = False
) -> tuple[SemaphoreConfig | None, list[Problem]]:
    """Validate one SEMAPHORES entry: (its SemaphoreConfig, or None if it has an error; problems).

    The problems, warnings included, come in a fixed order: unknown options,
    then LIMIT, TIMEOUT, WAIT, ALGORITHM, KEY, AUTO_REFRESH, PATHS, URL_NAMES,
    METHODS, MODE, MAX_WAITERS, PERMITS, PRIORITY, ADAPTIVE, SLOTS, TOTAL and the
    algorithm's support for the last six (the order the system checks list them in).

    ``ad_hoc``: the entry is an ad-hoc :class:`~django_semaphore.Semaphore`'s
    (``Semaphore(name, limit=2, total=8)``), whose TOTAL needs no KEY: its
    partitions are the ``key=`` values passed to acquire.
    """
    entry = where(name)
    shape = validate_shape(name, raw)
    if shape or not isinstance(name, str) or not isinstance(raw, dict):  # for mypy: the same test
        return None, shape
    opts = {**ENTRY_DEFAULTS, **raw}
    problems = validate_options(entry, raw)
    limit = _collect(problems, validate_limit(entry, raw.get("LIMIT", _MISSING)))
    timeout = _collect(problems, validate_timeout(entry, opts["TIMEOUT"]))
    wait = _collect(problems, validate_wait(entry, opts["WAIT"]))
    algorithm = _collect(problems, validate_algorithm(entry, opts["ALGORITHM"]))
    key = _collect(problems, resolve_key(name, opts["KEY"]))
    auto_refresh = _collect(problems, validate_auto_refresh(entry, opts["AUTO_REFRESH"]))
    paths = _collect(problems, validate_paths(entry, opts["PATHS"]))
    url_names = _collect(problems, validate_url_names(entry, opts["URL_NAMES"]))
    methods = _collect(problems, validate_methods(entry, opts["METHODS"]))
    mode = _collect(problems, validate_mode(entry, opts["MODE"]))
    max_waiters = _collect(problems, validate_max_waiters(entry, opts["MAX_WAITERS"]))
    # TOTAL bounds PERMITS, so it is judged first; its problems are listed after SLOTS'.
    total, total_problems = validate_total(entry, opts["TOTAL"], opts["KEY"] is not None, ad_hoc)
    permits = _collect(problems, validate_permits(entry, opts["PERMITS"], limit, total))
    priority = _collect(problems, validate_priority(entry, opts["PRIORITY"]))
    adaptive = _collect(problems, validate_adaptive(entry, opts["ADAPTIVE"], limit))
    slots = _collect(problems, validate_slots(entry, opts["SLOTS"]))
    problems.extend(total_problems)
    if total is not None and slots is True:
        problems.append(
            Problem(
                "django_semaphore.E031",
                f"{entry} sets both TOTAL and SLOTS, which do not go together.",
                "Slot numbers are counted per partition in a partition's own keys, and the "
                "partitions of a TOTAL name share one set of keys: remove SLOTS (or TOTAL).",
            )
        )
    problems.extend(validate_scheduling(entry, algorithm, raw))
    if limit is None or any(not p.warning for p in problems):
        return None, problems
    config = SemaphoreConfig(
        name=name,
        limit=limit,
        timeout=timeout,
        wait=wait,
        key=key,
        algorithm=algorithm,
        auto_refresh=auto_refresh,
        paths=paths,
        url_names=url_names,
        methods=methods,
        mode=mode,
        max_waiters=max_waiters,
        permits=permits,
        priority=priority,
        adaptive=adaptive,
        slots=slots,
        total=total,
    )
    return config, problems


# -- the global settings -------------------------------------------------------------------


def _utf8_length(text: str) -> int:
    """How many bytes ``text`` takes in a Redis key (UTF-8); more than any limit if it
    cannot be encoded (a lone surrogate)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return MAX_PREFIX_LENGTH + 1


def validate_key_prefix(value: object) -> list[Problem]:
    """E014: SEMAPHORE_KEY_PREFIX, short (in UTF-8 bytes, as in the keys), non-empty, no
    braces, spaces or glob characters."""
    if (
        isinstance(value, str)
        and value
        and _utf8_length(value) <= MAX_PREFIX_LENGTH
        and not _PREFIX_FORBIDDEN.search(value)
    ):
        return []
    return [
        Problem(
            "django_semaphore.E014",
            f"SEMAPHORE_KEY_PREFIX is {value!r}; it must be a non-empty string of at most "
            f"{MAX_PREFIX_LENGTH} bytes in UTF-8 without braces, spaces or glob characters.",
            'Use a short plain prefix such as "sema" or "myproject:sema".',
        )
    ]


def validate_fail_open(value: object) -> list[Problem]:
    """E015: SEMAPHORE_FAIL_OPEN, True or False."""
    if isinstance(value, bool):
        return []
    return [
        Problem(
            "django_semaphore.E015",
            f"SEMAPHORE_FAIL_OPEN is {value!r}; it must be True or False.",
            "False answers 503 when Redis is unreachable; True lets requests through unguarded.",
        )
    ]


def validate_enabled(value: object) -> list[Problem]:
    """E019: SEMAPHORE_ENABLED, True or False."""
    if isinstance(value, bool):
        return []
    return [
        Problem(
            "django_semaphore.E019",
            f"SEMAPHORE_ENABLED is {value!r}; it must be True or False.",
            "True guards as configured; False lets every guard pass through without touching Redis.",
        )
    ]


def validate_redis(value: object, caches: Mapping[str, Any]) -> list[Problem]:
    """E017: SEMAPHORE_REDIS, a django-redis alias in ``caches`` or a URL dict (never connects)."""
    if isinstance(value, str):
        if value not in caches:
            return [
                Problem(
                    "django_semaphore.E017",
                    f"SEMAPHORE_REDIS is {value!r}, but CACHES has no such alias.",
                    'Name a django-redis cache alias from CACHES, or give {"URL": "redis://host:6379/0"}.',
                )
            ]
        backend = str(caches[value].get("BACKEND", ""))
        if not backend.startswith("django_redis."):
            return [
                Problem(
                    "django_semaphore.E017",
                    f"SEMAPHORE_REDIS is {value!r}, whose BACKEND {backend!r} is not django-redis.",
                    'Use "django_redis.cache.RedisCache" for that alias, or give '
                    'SEMAPHORE_REDIS = {"URL": "redis://host:6379/0"}.',
                )
            ]
        return _alias_client_problems(value, caches[value])
    if isinstance(value, dict):
        url = value.get("URL")
        unknown = sorted(set(value) - {"URL", "CLUSTER", "OPTIONS"})
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            return [
                Problem(
                    "django_semaphore.E017",
                    f"SEMAPHORE_REDIS['URL'] is {url!r}; it must be a redis://, rediss:// or unix:// URL.",
                    'Write SEMAPHORE_REDIS = {"URL": "redis://host:6379/0"}.',
                )
            ]
        if (
            unknown
            or not isinstance(value.get("CLUSTER", False), bool)
            or not isinstance(value.get("OPTIONS", {}), dict)
        ):
            return [
                Problem(
                    "django_semaphore.E017",
                    f"SEMAPHORE_REDIS is {value!r}; it takes URL, CLUSTER (bool) and OPTIONS (dict).",
                    'Write SEMAPHORE_REDIS = {"URL": "redis://…", "CLUSTER": False}.',
                )
            ]
        refused = _redis_connection_problem(url, value.get("OPTIONS", {}), value.get("CLUSTER", False))
        if refused:
            return [
                Problem(
                    "django_semaphore.E017",
                    f"SEMAPHORE_REDIS's URL {url!r} and OPTIONS {shown(value.get('OPTIONS', {}))} "
                    f"are refused by redis-py: {refused}.",
                    "Fix the URL (host, port 0-65535, query options) and OPTIONS (keyword "
                    "arguments of redis-py's connections, e.g. {'socket_timeout': 2.0}; timeouts "
                    "are numbers of seconds > 0).",
                )
            ]
        return []
    return [
        Problem(
            "django_semaphore.E017",
            f"SEMAPHORE_REDIS is {value!r}; it must be a cache alias or a dict with a URL.",
            'Use a django-redis alias such as "default", or {"URL": "redis://host:6379/0"}.',
        )
    ]


def _alias_client_problems(alias: str, cache: Mapping[str, Any]) -> list[Problem]:
    """E017 for a django-redis alias whose client shards keys over several servers
    (ShardClient): it gives no one connection for the semaphores."""
    options = cache.get("OPTIONS") or {}
    name = (
        options.get("CLIENT_CLASS", "django_redis.client.DefaultClient")
        if isinstance(options, dict)
        else None
    )
    try:
        from django_redis.client import ShardClient

        client_class = import_string(name) if isinstance(name, str) else name
    except ImportError:  # Django's own cache checks fail on that alias first
        return []
    if isinstance(client_class, type) and issubclass(client_class, ShardClient):
        return [
            Problem(
                "django_semaphore.E017",
                f"SEMAPHORE_REDIS is {alias!r}, whose client {name!r} shards keys over several servers "
                "itself: it has no one Redis connection for the semaphores, whose keys must be together.",
                "Give the semaphores an alias of one server (DefaultClient or SentinelClient), or "
                'SEMAPHORE_REDIS = {"URL": "redis://host:6379/0"} ({"CLUSTER": True} for a Redis Cluster).',
            )
        ]
    return []


#: The connection options that are numbers of seconds (None: no timeout / no health check).
_SECONDS_OPTIONS = ("socket_timeout", "socket_connect_timeout", "health_check_interval")


def _redis_connection_problem(url: str, options: Mapping[str, Any], cluster: bool) -> str | None:
    """What redis-py refuses in ``url`` and ``options`` (None: nothing), found by building
    one connection object as the client would, without connecting: a bad port, a bad
    query option or an unknown keyword used to pass E017, then fail every call with a
    ValueError or a TypeError (a 500 even under SEMAPHORE_FAIL_OPEN).  A cluster's
    client passes its nodes only the connection options (and drops the others)."""
    import redis
    from redis.cluster import KWARGS_DISABLED_KEYS, REDIS_ALLOWED_KEYS

    # What RedisCluster keeps for its nodes' connections (redis.cluster.cleanup_kwargs).
    kwargs = {
        k: v
        for k, v in options.items()
        if not cluster or (k in REDIS_ALLOWED_KEYS and k not in KWARGS_DISABLED_KEYS)
    }
    try:
        connection = redis.ConnectionPool.from_url(url, **kwargs).make_connection()
    except (TypeError, ValueError, redis.RedisError) as exc:
        return str(exc) or type(exc).__name__
    for option in _SECONDS_OPTIONS:
        seconds = getattr(connection, option, None)
        if seconds is None:
            continue
        # A socket timeout of 0 makes the socket non-blocking; a health check interval of 0 is none.
        zero_ok = option == "health_check_interval"
        if not (
            _is_number(seconds) and math.isfinite(seconds) and (seconds > 0 or (zero_ok and seconds == 0))
        ):
            return f"{option} is {shown(seconds)}, not a number of seconds {'>=' if zero_ok else '>'} 0"
    return None


def validate_reject_view(value: object) -> list[Problem]:
    """E016: SEMAPHORE_REJECT_VIEW, a view or a dotted path to one."""
    try:
        view = import_string(value) if isinstance(value, str) else value
        if not callable(view):
            raise ImportError("not callable")
    except ImportError as exc:
        return [
            Problem(
                "django_semaphore.E016",
                f"SEMAPHORE_REJECT_VIEW is {value!r}, which cannot be imported as a view: {exc}.",
                "Point it at a function (request, exception) -> HttpResponse, "
                'or remove it to use "django_semaphore.views.rejected".',
            )
        ]
    return []


def validate_semaphores(value: object) -> list[Problem]:
    """E001: SEMAPHORES, a dict (its entries are :func:`validate_entry`'s)."""
    if isinstance(value, dict):
        return []
    return [
        Problem(
            "django_semaphore.E001",
            f"SEMAPHORES is {type(value).__name__}, not a dict.",
            "Write SEMAPHORES = {'name': {'LIMIT': 2, ...}, ...}.",
        )
    ]


def validate_global(values: Mapping[str, Any], caches: Mapping[str, Any]) -> list[Problem]:
    """Problems with the SEMAPHORE_* settings ``values`` other than SEMAPHORES entries."""
    return [
        *validate_key_prefix(values["SEMAPHORE_KEY_PREFIX"]),
        *validate_fail_open(values["SEMAPHORE_FAIL_OPEN"]),
        *validate_enabled(values.get("SEMAPHORE_ENABLED", True)),
        *validate_redis(values["SEMAPHORE_REDIS"], caches),
        *validate_reject_view(values["SEMAPHORE_REJECT_VIEW"]),
        *validate_semaphores(values["SEMAPHORES"]),
    ]


# -- every setting at once ----------------------------------------------------------------

# The setting each global check id is about, to name it in boot_errors().
_GLOBAL_SETTINGS = {
    "django_semaphore.E001": "SEMAPHORES",
    "django_semaphore.E014": "SEMAPHORE_KEY_PREFIX",
    "django_semaphore.E015": "SEMAPHORE_FAIL_OPEN",
    "django_semaphore.E016": "SEMAPHORE_REJECT_VIEW",
    "django_semaphore.E017": "SEMAPHORE_REDIS",
    "django_semaphore.E019": "SEMAPHORE_ENABLED",
}


@dataclass(frozen=True)
class Report:
    """The verdict on one set of settings: the usable entries' configs and every problem.

    ``problems`` maps an entry's name to its problems (an entry without any
    has an empty list), in settings order, after ``None``: the global settings'.
    """

    configs: Mapping[str, SemaphoreConfig] = field(default_factory=dict)
    problems: Mapping[object, list[Problem]] = field(default_factory=dict)

    def all_problems(self) -> list[Problem]:
        """Every problem, global first, then the entries' in settings order."""
        return [p for group in self.problems.values() for p in group]

    def boot_errors(self, silenced: Collection[str] = ()) -> list[tuple[str, Problem]]:
        """The errors that stop the app from starting: ``[(what, problem)]``.

        ``what`` names the entry (``SEMAPHORES['reports']``) or the global
        setting.  Warnings are left out, and so are the ids in ``silenced``
        (SILENCED_SYSTEM_CHECKS), as ``manage.py check`` leaves them out.
        """
        errors = []
        for name, group in self.problems.items():
            for problem in group:
                if problem.warning or problem.id in silenced:
                    continue
                what = _GLOBAL_SETTINGS.get(problem.id, "SEMAPHORE settings") if name is None else where(name)
                errors.append((what, problem))
        return errors


def validate(values: Mapping[str, Any], caches: Mapping[str, Any]) -> Report:
    """Validate every SEMAPHORE_* setting in ``values`` (and SEMAPHORES' entries) against ``caches``."""
    configs: dict[str, SemaphoreConfig] = {}
    problems: dict[object, list[Problem]] = {None: validate_global(values, caches)}
    raw = values["SEMAPHORES"]
    if isinstance(raw, dict):
        for name, entry in raw.items():
            config, entry_problems = validate_entry(name, entry)
            problems[name] = entry_problems
            if config is not None:
                configs[name] = config
    return Report(configs, problems)
