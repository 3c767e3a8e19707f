"""Settings with bad SEMAPHORES entries: the app must refuse to start under any server.

tests/test_apps.py starts gunicorn, uvicorn and ``django-admin runserver`` /
``check`` with DJANGO_SETTINGS_MODULE=tests.support.settings_bad.  The middleware is
installed, so a server that did start would answer every page with a 500.
"""

from tests.support.settings_web import *  # noqa: F403
from tests.support.settings_web import WEB_SEMAPHORES

SEMAPHORES = {
    **WEB_SEMAPHORES,
    "broken": {"LIMIT": 0},  # django_semaphore.E003
    "typo": {"LIMIT": 2, "TIMOUT": 5},  # django_semaphore.E011
}
