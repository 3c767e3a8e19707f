"""Settings for the test suite. REDIS_URL is set by the root conftest.py."""

import os

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: the databases live there

# Never fall back to a server the suite did not start (a Redis on 6379 may be
# someone's): the root conftest.py starts one and sets REDIS_URL.
REDIS_URL = os.environ.get("REDIS_URL")
if not REDIS_URL:
    raise ImproperlyConfigured(
        "tests.support.settings needs REDIS_URL: run the suite with pytest from the project root "
        "(conftest.py starts a throwaway redis-server), or set REDIS_URL to a server of yours."
    )

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
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
    "tests",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "tests.support.urls"

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
        "NAME": os.path.join(BASE_DIR, "test.sqlite3"),
        # A file (server subprocesses share it); SEMAPHORE_TEST_DB gives each
        # concurrent run (e.g. the nox sessions) a file of its own.
        "TEST": {"NAME": os.environ.get("SEMAPHORE_TEST_DB") or os.path.join(BASE_DIR, "test-db.sqlite3")},
    }
}

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        "KEY_PREFIX": "django-semaphore-tests",
    }
}

STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

SEMAPHORE_REDIS = "default"
SEMAPHORE_KEY_PREFIX = os.environ.get("SEMAPHORE_KEY_PREFIX", "sematest")
SEMAPHORES = {
    "reports": {"LIMIT": 2, "TIMEOUT": 5},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"django_semaphore": {"handlers": ["null"], "level": "DEBUG", "propagate": True}},
}
