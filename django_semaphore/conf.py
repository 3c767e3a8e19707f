"""Settings, read lazily and validated once per settings change.

The raw settings are read through :func:`setting`; the SEMAPHORES entries are
validated into :class:`SemaphoreConfig` objects by :func:`get_config`.  Both
are cached and the caches are cleared by Django's ``setting_changed`` signal,
so ``override_settings`` and pytest-django's ``settings`` fixture take effect
at the next call.  The same validation feeds the system checks
(:mod:`django_semaphore.checks`), so a check and the ``ImproperlyConfigured``
raised when a bad setting is used anyway carry the same words.
"""

from __future__ import annotations

import functools
import numbers
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from . import partitions

#: A KEY, once resolved: the request to a partition value.
KeyFunc = Callable[[Any], str]

DEFAULTS: dict[str, Any] = {
    "SEMAPHORE_REDIS": "default",
    "SEMAPHORE_KEY_PREFIX": "sema",
    "SEMAPHORE_FAIL_OPEN": False,
    "SEMAPHORE_REJECT_VIEW": "django_semaphore.views.rejected",
    "SEMAPHORES": {},
}

ENTRY_DEFAULTS: dict[str, Any] = {
    "TIMEOUT": 60,
    "WAIT": 0,
    "KEY": None,
    "ALGORITHM": "lua",
    "AUTO_REFRESH": True,
    "PATHS": [],
    "URL_NAMES": [],
    "METHODS": None,
}
ENTRY_OPTIONS = frozenset(ENTRY_DEFAULTS) | {"LIMIT"}

ALGORITHMS = ("lua", "fair_locked", "fair", "basic")
OVER_ADMITTING = ("fair", "basic")
NAMED_KEYS: dict[str, KeyFunc] = {"ip": partitions.by_ip, "user": partitions.by_user}
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})
MAX_PREFIX_LENGTH = 64
_PREFIX_FORBIDDEN = re.compile(r"[{}\s*?\[\]\\]")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the settings: a system check message in waiting."""

    id: str
    msg: str
    hint: str
    warning: bool = False

    def as_exception(self) -> ImproperlyConfigured:
        return ImproperlyConfigured(f"{self.msg} HINT: {self.hint} ({self.id})")


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
    problems: tuple[Problem, ...] = field(default=(), compare=False, repr=False)

    @property
    def timeout_ms(self) -> int:
        return max(1, int(round(self.timeout * 1000)))


def setting(name: str) -> Any:
    """The current value of a SEMAPHORE_* setting, or its default."""
    return getattr(settings, name, DEFAULTS[name])


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _where(name: object) -> str:
    return f"SEMAPHORES[{name!r}]"


def resolve_key(name: object, value: object) -> tuple[KeyFunc | None, list[Problem]]:
    """Turn a KEY setting into a callable (or None); return (func, problems)."""
    where = _where(name)
    if value is None:
        return None, []
    if callable(value):
        return value, []
    if not isinstance(value, str):
        return None, [
            Problem(
                "django_semaphore.E006",
                f"{where}['KEY'] is {value!r}, which is not a KEY.",
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
                    f"{where}['KEY'] is {value!r}, which names no header.",
                    'Write the header name after the colon, e.g. "header:X-Api-Key".',
                )
            ]
        return partitions.ByHeader(header), []
    if "." not in value:
        return None, [
            Problem(
                "django_semaphore.E006",
                f"{where}['KEY'] is {value!r}, which is not a known KEY.",
                'Use "ip", "user", "header:<Name>", a callable or a dotted path to one.',
            )
        ]
    try:
        func = import_string(value)
    except ImportError as exc:
        return None, [
            Problem(
                "django_semaphore.E007",
                f"{where}['KEY'] is {value!r}, which cannot be imported: {exc}.",
                "Check the dotted path: module path, then the function name.",
            )
        ]
    if not callable(func):
        return None, [
            Problem(
                "django_semaphore.E007",
                f"{where}['KEY'] is {value!r}, which is not callable.",
                "Point KEY at a function taking the request and returning a string.",
            )
        ]
    return func, []


def validate_entry(name: object, raw: object) -> tuple[SemaphoreConfig | None, list[Problem]]:
    """Validate one SEMAPHORES entry; return (SemaphoreConfig or None, problems)."""
    where = _where(name)
    problems = []
    if not isinstance(name, str) or not name:
        return None, [
            Problem(
                "django_semaphore.E002",
                f"SEMAPHORES has the name {name!r}; names must be non-empty strings.",
                "Rename the entry, e.g. SEMAPHORES = {'reports': {...}}.",
            )
        ]
    if not isinstance(raw, dict):
        return None, [
            Problem(
                "django_semaphore.E002",
                f"{where} is {type(raw).__name__}, not a dict.",
                f"Write {where} = {{'LIMIT': 2, ...}}.",
            )
        ]
    unknown = sorted(str(k) for k in raw if k not in ENTRY_OPTIONS)
    if unknown:
        problems.append(
            Problem(
                "django_semaphore.E011",
                f"{where} has unknown option(s) {', '.join(unknown)}.",
                f"The options are {', '.join(sorted(ENTRY_OPTIONS))}.",
            )
        )
    opts = {**ENTRY_DEFAULTS, **raw}
    limit = raw.get("LIMIT")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        problems.append(
            Problem(
                "django_semaphore.E003",
                f"{where}['LIMIT'] is {limit!r}; it must be an int >= 1."
                if "LIMIT" in raw
                else f"{where} has no LIMIT.",
                "Set LIMIT to how many holders may hold the semaphore at once, e.g. 'LIMIT': 2.",
            )
        )
    timeout = opts["TIMEOUT"]
    if not _is_number(timeout) or not timeout > 0 or timeout != timeout:
        problems.append(
            Problem(
                "django_semaphore.E004",
                f"{where}['TIMEOUT'] is {timeout!r}; it must be a positive number of seconds.",
                "Set TIMEOUT to the lease length in seconds (default 60).",
            )
        )
    wait = opts["WAIT"]
    if not _is_number(wait) or not wait >= 0:
        problems.append(
            Problem(
                "django_semaphore.E005",
                f"{where}['WAIT'] is {wait!r}; it must be a number of seconds >= 0.",
                "Set WAIT to how long a caller may queue for a slot (0: refuse at once).",
            )
        )
    algorithm = opts["ALGORITHM"]
    if algorithm not in ALGORITHMS:
        problems.append(
            Problem(
                "django_semaphore.E008",
                f"{where}['ALGORITHM'] is {algorithm!r}, which is not an algorithm.",
                f"Use one of {', '.join(map(repr, ALGORITHMS))}; 'lua' is the default.",
            )
        )
    elif algorithm in OVER_ADMITTING:
        problems.append(
            Problem(
                "django_semaphore.W001",
                f"{where} uses ALGORITHM {algorithm!r}, which can admit more than LIMIT "
                "holders under contention.",
                "Use the default 'lua' (atomic, fair, server clock) or 'fair_locked'.",
                warning=True,
            )
        )
    key, key_problems = resolve_key(name, opts["KEY"])
    problems.extend(key_problems)
    if not isinstance(opts["AUTO_REFRESH"], bool):
        problems.append(
            Problem(
                "django_semaphore.E009",
                f"{where}['AUTO_REFRESH'] is {opts['AUTO_REFRESH']!r}; it must be True or False.",
                "Set AUTO_REFRESH to True (renew leases while a view runs) or False.",
            )
        )
    paths = []
    raw_paths = opts["PATHS"]
    if isinstance(raw_paths, str) or not isinstance(raw_paths, (list, tuple)):
        problems.append(
            Problem(
                "django_semaphore.E010",
                f"{where}['PATHS'] is {raw_paths!r}; it must be a list of regexes.",
                "Write PATHS as a list, e.g. [r'^/api/'].",
            )
        )
    else:
        for pattern in raw_paths:
            try:
                paths.append(re.compile(pattern))
            except (re.error, TypeError) as exc:
                problems.append(
                    Problem(
                        "django_semaphore.E010",
                        f"{where}['PATHS'] has {pattern!r}, which is not a regex: {exc}.",
                        "Fix the regular expression (it is matched against request.path_info).",
                    )
                )
    url_names = opts["URL_NAMES"]
    if (
        isinstance(url_names, str)
        or not isinstance(url_names, (list, tuple, set, frozenset))
        or not all(isinstance(n, str) and n for n in url_names)
    ):
        problems.append(
            Problem(
                "django_semaphore.E012",
                f"{where}['URL_NAMES'] is {url_names!r}; it must be a list of URL names.",
                "Write URL_NAMES as a list of names, e.g. ['reports:export'].",
            )
        )
        url_names = ()
    methods = opts["METHODS"]
    if methods is not None:
        if (
            isinstance(methods, str)
            or not isinstance(methods, (list, tuple, set, frozenset))
            or not all(isinstance(m, str) and m.upper() in HTTP_METHODS for m in methods)
        ):
            problems.append(
                Problem(
                    "django_semaphore.E013",
                    f"{where}['METHODS'] is {methods!r}; it must be None or a list of HTTP methods.",
                    "Write METHODS as e.g. ['POST', 'PUT'], or None for every method.",
                )
            )
            methods = None
        else:
            methods = frozenset(m.upper() for m in methods)
    errors = [p for p in problems if not p.warning]
    if errors:
        return None, problems
    assert isinstance(name, str) and isinstance(limit, int)  # for mypy: checked above
    config = SemaphoreConfig(
        name=name,
        limit=limit,
        timeout=timeout,
        wait=wait,
        key=key,
        algorithm=algorithm,
        auto_refresh=opts["AUTO_REFRESH"],
        paths=tuple(paths),
        url_names=frozenset(url_names),
        methods=methods,
        problems=tuple(problems),
    )
    return config, problems


def validate_global() -> list[Problem]:
    """Problems with the SEMAPHORE_* settings other than SEMAPHORES entries."""
    problems = []
    prefix = setting("SEMAPHORE_KEY_PREFIX")
    if (
        not isinstance(prefix, str)
        or not prefix
        or len(prefix) > MAX_PREFIX_LENGTH
        or _PREFIX_FORBIDDEN.search(prefix)
    ):
        problems.append(
            Problem(
                "django_semaphore.E014",
                f"SEMAPHORE_KEY_PREFIX is {prefix!r}; it must be a non-empty string of at most "
                f"{MAX_PREFIX_LENGTH} characters without braces, spaces or glob characters.",
                'Use a short plain prefix such as "sema" or "myproject:sema".',
            )
        )
    if not isinstance(setting("SEMAPHORE_FAIL_OPEN"), bool):
        problems.append(
            Problem(
                "django_semaphore.E015",
                f"SEMAPHORE_FAIL_OPEN is {setting('SEMAPHORE_FAIL_OPEN')!r}; it must be True or False.",
                "False answers 503 when Redis is unreachable; True lets requests through unguarded.",
            )
        )
    problems.extend(redis_setting_problems(setting("SEMAPHORE_REDIS")))
    reject = setting("SEMAPHORE_REJECT_VIEW")
    try:
        view = import_string(reject) if isinstance(reject, str) else reject
        if not callable(view):
            raise ImportError("not callable")
    except ImportError as exc:
        problems.append(
            Problem(
                "django_semaphore.E016",
                f"SEMAPHORE_REJECT_VIEW is {reject!r}, which cannot be imported as a view: {exc}.",
                "Point it at a function (request, exception) -> HttpResponse, "
                'or remove it to use "django_semaphore.views.rejected".',
            )
        )
    raw = setting("SEMAPHORES")
    if not isinstance(raw, dict):
        problems.append(
            Problem(
                "django_semaphore.E001",
                f"SEMAPHORES is {type(raw).__name__}, not a dict.",
                "Write SEMAPHORES = {'name': {'LIMIT': 2, ...}, ...}.",
            )
        )
    return problems


def redis_setting_problems(value: object) -> list[Problem]:
    """Problems with SEMAPHORE_REDIS (no connection is attempted)."""
    if isinstance(value, str):
        caches = getattr(settings, "CACHES", {})
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
        return []
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
        return []
    return [
        Problem(
            "django_semaphore.E017",
            f"SEMAPHORE_REDIS is {value!r}; it must be a cache alias or a dict with a URL.",
            'Use a django-redis alias such as "default", or {"URL": "redis://host:6379/0"}.',
        )
    ]


@functools.cache
def _validated() -> tuple[dict[str, SemaphoreConfig], dict[str | None, list[Problem]]]:
    """(configs by name, problems by name or None for global) for current settings."""
    configs: dict[str, SemaphoreConfig] = {}
    problems: dict[str | None, list[Problem]] = {None: validate_global()}
    raw = setting("SEMAPHORES")
    if isinstance(raw, dict):
        for name, entry in raw.items():
            config, entry_problems = validate_entry(name, entry)
            problems[name] = entry_problems
            if config is not None:
                configs[name] = config
    return configs, problems


def all_problems() -> list[Problem]:
    """Every settings problem, global first, in settings order."""
    _, problems = _validated()
    return [p for group in problems.values() for p in group]


def names() -> list[str]:
    """Names of the configured semaphores, in settings order."""
    raw = setting("SEMAPHORES")
    return list(raw) if isinstance(raw, dict) else []


def get_config(name: str) -> SemaphoreConfig:
    """The validated config of semaphore ``name``; ImproperlyConfigured if unusable."""
    configs, problems = _validated()
    try:
        return configs[name]
    except KeyError:
        pass
    for problem in problems.get(name, ()):
        if not problem.warning:
            raise problem.as_exception()
    raise ImproperlyConfigured(
        f"No semaphore named {name!r} in SEMAPHORES. HINT: Add SEMAPHORES[{name!r}] = "
        f"{{'LIMIT': ...}} to your settings, or use one of: {', '.join(map(repr, names())) or 'none'}."
    )


ENGINE_CHECKS = frozenset({"django_semaphore.E014", "django_semaphore.E017"})


def check_global(ids: Iterable[str] = ENGINE_CHECKS) -> None:
    """Raise ImproperlyConfigured if a global setting among ``ids`` is unusable."""
    _, problems = _validated()
    for problem in problems[None]:
        if problem.id in ids and not problem.warning:
            raise problem.as_exception()


# The setting each global check id is about, to name it in boot_errors().
_GLOBAL_SETTINGS = {
    "django_semaphore.E001": "SEMAPHORES",
    "django_semaphore.E014": "SEMAPHORE_KEY_PREFIX",
    "django_semaphore.E015": "SEMAPHORE_FAIL_OPEN",
    "django_semaphore.E016": "SEMAPHORE_REJECT_VIEW",
    "django_semaphore.E017": "SEMAPHORE_REDIS",
}


def boot_errors() -> list[tuple[str, Problem]]:
    """The settings errors that stop the app from starting: ``[(what, problem)]``.

    ``what`` names the entry (``SEMAPHORES['reports']``) or the global setting.
    Warnings are left out, and so are ids in SILENCED_SYSTEM_CHECKS, as
    ``manage.py check`` leaves them out.  No Redis is contacted.
    """
    silenced = set(getattr(settings, "SILENCED_SYSTEM_CHECKS", ()))
    _, problems = _validated()
    errors = []
    for name, group in problems.items():
        for problem in group:
            if problem.warning or problem.id in silenced:
                continue
            what = _GLOBAL_SETTINGS.get(problem.id, "SEMAPHORE settings") if name is None else _where(name)
            errors.append((what, problem))
    return errors


@receiver(setting_changed)
def _clear_caches(*, setting: str, **kwargs: Any) -> None:
    if setting in DEFAULTS or setting == "CACHES":
        _validated.cache_clear()
        from . import connection

        connection.reset()
