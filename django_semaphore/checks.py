"""System checks: every SEMAPHORE_* setting, without talking to Redis.

| id | what |
|----|------|
| E001 | SEMAPHORES is not a dict |
| E002 | an entry is not a dict, or its name is not a non-empty string |
| E003 | LIMIT missing or not an int >= 1 |
| E004 | TIMEOUT not a positive number |
| E005 | WAIT not a number >= 0 |
| E006 | KEY not None, "ip", "user", "header:<Name>", a callable or a dotted path |
| E007 | KEY's dotted path cannot be imported or is not callable |
| E008 | unknown ALGORITHM |
| E009 | AUTO_REFRESH not a bool |
| E010 | PATHS not a list of valid regexes |
| E011 | unknown option in an entry (a typo such as "LIMT") |
| E012 | URL_NAMES not a list of names |
| E013 | METHODS not None or a list of HTTP methods |
| E014 | SEMAPHORE_KEY_PREFIX empty, too long, or with braces/space/glob characters |
| E015 | SEMAPHORE_FAIL_OPEN not a bool |
| E016 | SEMAPHORE_REJECT_VIEW cannot be imported |
| E017 | SEMAPHORE_REDIS not a django-redis alias or a {"URL": ...} dict |
| W001 | ALGORITHM "basic" or "fair": over-admits under contention |
| W002 | (deploy) the django-redis alias has no SOCKET_CONNECT_TIMEOUT / SOCKET_TIMEOUT |
| W003 | (deploy) Redis cannot be reached |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks

from . import conf


def _message(problem: conf.Problem) -> checks.CheckMessage:
    cls = checks.Warning if problem.warning else checks.Error
    return cls(problem.msg, hint=problem.hint, id=problem.id)


@checks.register("django_semaphore")
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Report every bad SEMAPHORE_* setting as an error or warning with a hint."""
    return [_message(problem) for problem in conf.all_problems()]


@checks.register("django_semaphore", deploy=True)
def check_redis(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Deploy checks: socket timeouts on the alias, and Redis reachable."""
    if any(not p.warning for p in conf.all_problems()):
        return []
    messages: list[checks.CheckMessage] = []
    value = conf.setting("SEMAPHORE_REDIS")
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
    from . import connection

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
