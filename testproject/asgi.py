"""ASGI entry point of the demo site (served by uvicorn, so async views are truly async)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

application = get_asgi_application()
