"""Settings for the web-layer tests, in-process and in server subprocesses.

In-process tests apply ``WEB_SEMAPHORES`` through the ``settings`` fixture;
the uvicorn subprocesses load this module as DJANGO_SETTINGS_MODULE.
``WEB_SEMAPHORE_REDIS_URL`` points the semaphores at another Redis (a closed
port, for the failure tests) and ``WEB_FAIL_OPEN=1`` sets SEMAPHORE_FAIL_OPEN.
"""

import os

from tests.support.settings import *  # noqa: F403
from tests.support.settings import MIDDLEWARE

TIMEOUT = float(os.environ.get("WEB_TIMEOUT", "5"))

WEB_SEMAPHORES = {
    "reports": {"LIMIT": 2, "TIMEOUT": 5},
    "web-slow": {"LIMIT": 2, "TIMEOUT": TIMEOUT},
    "web-one": {"LIMIT": 1, "TIMEOUT": TIMEOUT},
    "web-weighted": {
        "LIMIT": 4,
        "TIMEOUT": TIMEOUT,
        "PERMITS": 2,
        "PRIORITY": 1,
        "MAX_WAITERS": 8,
        "SLOTS": True,
    },
    "web-queue": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "WAIT": 20},
    "web-user": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "KEY": "user"},
    "web-ip": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "KEY": "ip"},
    "web-header": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "KEY": "header:X-Tenant"},
    "web-total": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "KEY": "header:X-Tenant", "TOTAL": 2},
    "web-short": {"LIMIT": 1, "TIMEOUT": 1},
    "mw-path": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "PATHS": [r"^/web/mw/a?path/"]},
    "mw-name": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "URL_NAMES": ["web:mw-named"]},
    "mw-post": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "PATHS": [r"^/web/mw/post/"], "METHODS": ["POST"]},
    "pair-x": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "WAIT": 20},
    "pair-y": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "WAIT": 20},
    "mw-a": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "PATHS": [r"^/web/mw/pair/"]},
    "mw-b": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "PATHS": [r"^/web/mw/pair/", r"^/web/mw/b-only/"]},
    "mw-wait-a": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "WAIT": 20, "PATHS": [r"^/web/mw/await/"]},
    "mw-wait-b": {"LIMIT": 1, "TIMEOUT": TIMEOUT, "WAIT": 20, "PATHS": [r"^/web/mw/await/"]},
}
SEMAPHORES = WEB_SEMAPHORES

MIDDLEWARE = [*MIDDLEWARE, "django_semaphore.middleware.SemaphoreMiddleware"]

if os.environ.get("WEB_SEMAPHORE_REDIS_URL"):
    SEMAPHORE_REDIS = {"URL": os.environ["WEB_SEMAPHORE_REDIS_URL"]}
SEMAPHORE_FAIL_OPEN = os.environ.get("WEB_FAIL_OPEN") == "1"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_semaphore": {"handlers": ["stderr"], "level": "INFO", "propagate": False}},
}
