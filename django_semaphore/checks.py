"""System checks: every SEMAPHORE_* setting, without talking to Redis.

| id | what |
|----|------|
| E001 | SEMAPHORES is not a dict |
| E002 | an entry is not a dict, or its name is not a non-empty string |
| E003 | LIMIT missing or not an int from 1 to 1,000,000 (MAX_LIMIT) |
| E004 | TIMEOUT not a number above 0 and at most 31,536,000 (365 days) |
| E005 | WAIT not an int or float from 0 to 31,536,000 (365 days) |
| E006 | KEY not None, "ip", "user", "header:<Name>", a callable or a dotted path |
| E007 | KEY's dotted path cannot be imported or is not callable |
| E008 | unknown ALGORITHM |
| E009 | AUTO_REFRESH not a bool |
| E010 | PATHS not a list of valid str regexes (bytes ones, compiled or not, are refused) |
| E011 | unknown option in an entry (a typo such as "LIMT") |
| E012 | URL_NAMES not a list of names |
| E013 | METHODS not None or a list of HTTP methods |
| E014 | SEMAPHORE_KEY_PREFIX empty, too long, or with braces/space/glob characters |
| E015 | SEMAPHORE_FAIL_OPEN not a bool |
| E016 | SEMAPHORE_REJECT_VIEW cannot be imported |
| E017 | SEMAPHORE_REDIS not a django-redis alias or {"URL": ...}, a ShardClient alias, refused by redis-py |
| E018 | MODE not "enforce", "dry_run" or "off" |
| E019 | SEMAPHORE_ENABLED not a bool |
| E020 | PERMITS not an int from 1 to LIMIT (and at most TOTAL), a callable or a dotted path to one |
| E021 | PRIORITY not an int of absolute value below 2**53, a callable or a dotted path to one |
| E022 | MAX_WAITERS not None or an int >= 0 |
| E023 | PERMITS, PRIORITY, MAX_WAITERS, ADAPTIVE, SLOTS or TOTAL with an ALGORITHM other than "lua" |
| E024 | ADAPTIVE not None or a dict; unknown keys; MIN/MAX not ints; bad INTERVAL, TOLERANCE, MIN_SAMPLES |
| E025 | ADAPTIVE's MIN above its MAX |
| E026 | ADAPTIVE's MIN or MAX outside 1..1,000,000 |
| E027 | (urls) a ``@semaphore`` view: no such SEMAPHORES entry, or a refused key, wait, permits or priority |
| E028 | SLOTS not True or False |
| E029 | TOTAL not None or an int from 1 to 1,000,000 |
| E030 | TOTAL without KEY (TOTAL shares permits between the partitions KEY makes) |
| E031 | TOTAL with SLOTS (slot numbers are per partition; a TOTAL name's partitions share keys) |
| W001 | ALGORITHM "basic" or "fair": over-admits under contention |
| W002 | (deploy) the django-redis alias has no SOCKET_CONNECT_TIMEOUT / SOCKET_TIMEOUT |
| W003 | (deploy) Redis cannot be reached |
| W004 | (deploy) Redis's maxmemory-policy is not noeviction: it may evict live holders |
| W005 | LIMIT outside ADAPTIVE's [MIN, MAX]: the adaptive limit starts at the nearest bound |
| W006 | (deploy) Redis persists nothing (save "" and appendonly no): a restart forgets every override |
| I001 | (deploy) maxmemory-policy cannot be read (CONFIG refused, as on many managed Redis) |
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import redis
from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.urls import URLResolver, get_resolver
from redis.exceptions import RedisClusterException

from .backend import connection
from .config import settings as semaphore_settings
from .config.validation import Problem
from .exceptions import SemaphoreBackendError
from .web.needs import Need, needs_of


def _message(problem: Problem) -> checks.CheckMessage:
    cls = checks.Warning if problem.warning else checks.Error
    return cls(problem.msg, hint=problem.hint, id=problem.id)


@checks.register("django_semaphore")
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Report every bad SEMAPHORE_* setting as an error or warning with a hint."""
    return [_message(problem) for problem in semaphore_settings.validated().all_problems()]


def _settings_have_errors() -> bool:
    # The deploy checks need usable settings; check_settings reports the errors.
    return any(not p.warning for p in semaphore_settings.validated().all_problems())


@checks.register("django_semaphore", checks.Tags.urls)
def check_guarded_views(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E027: every ``@semaphore`` view of the URLconf names a SEMAPHORES entry and
    passes a ``key``, ``wait``, ``permits`` and ``priority`` that entry accepts (reported
    by ``manage.py check`` and runserver, not at the view's first request)."""
    if _settings_have_errors():
        return []
    messages: list[checks.CheckMessage] = []
    for route, view, needs in _guarded_views(get_resolver()):
        name = f"{view.__module__}.{view.__qualname__}"
        for need in needs:
            for msg, hint in _need_problems(need):
                messages.append(
                    checks.Error(
                        f"The view {name} (URL {route!r}) has @semaphore({need.name!r}, ...): {msg}",
                        hint=hint,
                        obj=view,
                        id="django_semaphore.E027",
                    )
                )
    return messages


def _guarded_views(resolver: URLResolver, prefix: str = "") -> Iterator[tuple[str, Any, tuple[Need, ...]]]:
    """(route, view, needs) of every view under ``resolver`` that ``@semaphore``
    guards (a class-based view: the class, whose ``dispatch`` it decorates)."""
    try:
        patterns = resolver.url_patterns
    except ImproperlyConfigured:
        return  # Django's own urls checks report a URLconf that does not load
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _guarded_views(pattern, route)
            continue
        view = getattr(pattern.callback, "view_class", None) or pattern.callback
        # as_view() copies dispatch's attributes (the needs among them) to its function.
        dispatch = getattr(view, "dispatch", None)
        needs = needs_of(pattern.callback) or (needs_of(dispatch) if dispatch is not None else ())
        if needs:
            yield route, view, needs


def _need_problems(need: Need) -> Iterator[tuple[str, str]]:
    """(message, hint) for each thing wrong with one ``@semaphore(...)``."""
    try:
        config = semaphore_settings.get_config(need.name)
    except ImproperlyConfigured:
        yield "SEMAPHORES has no such entry.", f"Add SEMAPHORES[{need.name!r}], or fix the name."
        return
    yield from need.problems(config)


@checks.register("django_semaphore", deploy=True)
def check_redis(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Deploy checks: socket timeouts on the alias, and Redis reachable."""
    if _settings_have_errors():
        return []
    messages: list[checks.CheckMessage] = []
    value = semaphore_settings.setting("SEMAPHORE_REDIS")
    if isinstance(value, str):
        caches: dict[str, Any] = settings.CACHES
        options = caches[value].get("OPTIONS", {})
        if not options.get("SOCKET_CONNECT_TIMEOUT") or not options.get("SOCKET_TIMEOUT"):
            messages.append(
                checks.Warning(
                    f"CACHES[{value!r}] sets no SOCKET_CONNECT_TIMEOUT or SOCKET_TIMEOUT, so an "
                    "unreachable Redis can hold guarded requests for minutes.",
                    hint=f'Add "SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2 '
                    f'to CACHES[{value!r}]["OPTIONS"].',
                    id="django_semaphore.W002",
                )
            )
    try:
        connection.get_client().ping()
    except Exception as exc:
        messages.append(
            checks.Warning(
                f"Redis for SEMAPHORE_REDIS cannot be reached: {exc}.",
                hint="Start Redis or fix SEMAPHORE_REDIS / the cache alias it names.",
                id="django_semaphore.W003",
            )
        )
    return messages


#: The one maxmemory-policy under which Redis never drops a semaphore key to
#: make room: every key the app writes has a TTL, so the volatile-* policies
#: can evict them as well as the allkeys-* ones.
SAFE_POLICY = "noeviction"


def _where() -> str:
    value = semaphore_settings.setting("SEMAPHORE_REDIS")
    if isinstance(value, str):
        return f"CACHES[{value!r}] (SEMAPHORE_REDIS = {value!r})"
    return "SEMAPHORE_REDIS"


def _config(client: Any, *parameters: str) -> list[tuple[str, dict[str, str]]]:
    """[(server, {parameter: value})]: ``CONFIG GET`` of each parameter on the one
    server ("" names it), or on every primary of a cluster (named host:port).

    One CONFIG GET per parameter: Redis 6.2 takes a single one per call.
    """
    if connection.is_cluster(client):
        servers = [(node.name, node.redis_connection) for node in client.get_primaries()]
    else:
        servers = [("", client)]
    return [
        (name, {p: _config_value(server.config_get(p), p) for p in parameters}) for name, server in servers
    ]


def _config_value(reply: dict[Any, Any], parameter: str) -> str:
    value = reply.get(parameter, reply.get(parameter.encode(), ""))
    return value.decode() if isinstance(value, bytes) else str(value)


@checks.register("django_semaphore", deploy=True)
def check_eviction_policy(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Deploy check: the semaphore Redis must not evict keys (maxmemory-policy noeviction).

    An evicted owner or timeout ZSET forgets live holders, and the semaphore
    then admits more than LIMIT callers.  Reads ``CONFIG GET maxmemory-policy``
    from the server, or from every primary of a cluster.  A server that
    refuses CONFIG (renamed or denied by an ACL, as on many managed services)
    gets an info, not an error; an unreachable one is W003's to report.
    """
    if _settings_have_errors():
        return []
    try:
        policies = [
            (server, values["maxmemory-policy"])
            for server, values in _config(connection.get_client(), "maxmemory-policy")
        ]
    except (redis.ConnectionError, redis.TimeoutError, RedisClusterException, SemaphoreBackendError):
        return []  # W003 (check_redis) says the server cannot be reached (a cluster: when its client is made)
    except Exception as exc:
        return [
            checks.Info(
                f"The maxmemory-policy of the Redis in {_where()} could not be read ({exc}), so "
                "whether it may evict live semaphore holders is unknown.",
                hint=f"Make sure that server runs maxmemory-policy {SAFE_POLICY} (on a managed "
                "Redis, in its parameter group or settings page).",
                id="django_semaphore.I001",
            )
        ]
    unsafe = [(server, policy) for server, policy in policies if policy != SAFE_POLICY]
    if not unsafe:
        return []
    found = ", ".join(f"{policy!r} on {server}" if server else repr(policy) for server, policy in unsafe)
    return [
        checks.Warning(
            f"The Redis in {_where()} runs maxmemory-policy {found}: when it reaches maxmemory it "
            "evicts keys, semaphore keys included (they all have a TTL), and a semaphore whose "
            "holders were evicted admits more than LIMIT callers.",
            hint=f"Give the semaphores a Redis server of their own running maxmemory-policy "
            f"{SAFE_POLICY} (the policy is per server: another database number does not help), "
            "and point SEMAPHORE_REDIS at it: another CACHES alias, or SEMAPHORE_REDIS = "
            '{"URL": "redis://…"}. Or set noeviction on this server if nothing on it is a cache.',
            id="django_semaphore.W004",
        )
    ]


@checks.register("django_semaphore", deploy=True)
def check_persistence(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Deploy check W006: the semaphore Redis should persist its data (RDB or AOF).

    Runtime overrides live in Redis only: a server that persists nothing
    (``save ""`` and ``appendonly no``) forgets them when it restarts, an
    incident's ``sema_set --limit 0`` pause included, and every process goes
    back to the settings.  Reads ``CONFIG GET save`` and ``appendonly`` from
    the server, or from every primary of a cluster.  A server that refuses
    CONFIG (as many managed services do) gets nothing here: I001 already says
    CONFIG cannot be read; an unreachable one is W003's to report.
    """
    if _settings_have_errors():
        return []
    try:
        found = _config(connection.get_client(), "save", "appendonly")
    except Exception:  # unreachable (W003), or CONFIG refused (I001): nothing to add
        return []
    volatile = [
        server for server, values in found if not values["save"].strip() and values["appendonly"] == "no"
    ]
    if not volatile:
        return []
    servers = f" (on {', '.join(volatile)})" if any(volatile) else ""
    return [
        checks.Warning(
            f'The Redis in {_where()} persists nothing{servers}: save is "" and appendonly is no, so '
            "a restart forgets every runtime override (an incident's `sema_set --limit 0` pause "
            "included) and every process goes back to the settings.",
            hint="Turn persistence on for that server: appendonly yes (appendfsync everysec), or an "
            'RDB schedule such as save "3600 1 300 100 60 10000" (on a managed Redis, in its '
            "parameter group or settings page). Or give the semaphores a Redis server of their own "
            "that persists, and point SEMAPHORE_REDIS at it.",
            id="django_semaphore.W006",
        )
    ]
