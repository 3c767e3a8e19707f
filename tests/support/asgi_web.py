"""The ASGI application the uvicorn tests serve (DJANGO_SETTINGS_MODULE=tests.support.settings_web)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings_web")
application = get_asgi_application()
