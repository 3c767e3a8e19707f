"""Settings of the demo site (``make demo``).

Redis: REDIS_URL if set; otherwise ``manage.py demo`` starts an embedded
redis-server and points the cache at it before serving.  The database is
testproject/db.sqlite3 unless DEMO_DATABASE names another file.
"""

import os

BASE_DIR = os.path.dirname(os.path.abspath(__file__))
REDIS_URL = os.environ.get("REDIS_URL", "")

SECRET_KEY = os.environ.get("DEMO_SECRET_KEY", "demo-only-not-secret")
DEBUG = os.environ.get("DEMO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
ALLOWED_HOSTS += [host for host in os.environ.get("DEMO_HOSTS", "").split(",") if host]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_semaphore",
    "testproject.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # After AuthenticationMiddleware, so a KEY of "user" sees the user.
    "django_semaphore.middleware.SemaphoreMiddleware",
]

ROOT_URLCONF = "testproject.urls"
ASGI_APPLICATION = "testproject.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DEMO_DATABASE") or os.path.join(BASE_DIR, "db.sqlite3"),
    }
}

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        # Replaced by ``manage.py demo`` when it starts its own Redis.
        "LOCATION": REDIS_URL or "redis://127.0.0.1:6379/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        "KEY_PREFIX": "demo",
    }
}

STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
LOGIN_URL = "admin:login"
# {"username", "password" ("" if not the default), "created"}: set by ``manage.py demo``
# for the home page's "how to log in" line.
DEMO_ADMIN = None

# -- django-semaphore ------------------------------------------------------------

SEMAPHORE_REDIS = "default"
SEMAPHORE_KEY_PREFIX = os.environ.get("SEMAPHORE_KEY_PREFIX", "demo")
SEMAPHORES = {
    # /report/: @semaphore("reports") on a view that takes a few seconds.
    "reports": {"LIMIT": 2, "TIMEOUT": 10},
    # /me/: one at a time per logged-in user (anonymous visitors: per IP).
    "per-user": {"LIMIT": 1, "TIMEOUT": 10, "KEY": "user"},
    # Everything under /api/, guarded by SemaphoreMiddleware: no decorator in sight.
    "api": {"LIMIT": 3, "TIMEOUT": 10, "PATHS": [r"^/api/"]},
    # /download/: a streaming response holds its slot until the last byte is sent.
    "downloads": {"LIMIT": 1, "TIMEOUT": 10},
    # /async/: an async view; the slot is taken with the asyncio client.
    "async-work": {"LIMIT": 2, "TIMEOUT": 10},
    # /export/: the view hands its slot to a background task (demo/tasks.py), which releases it.
    "exports": {"LIMIT": 1, "TIMEOUT": 10},
}
