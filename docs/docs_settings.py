"""Django settings for building the documentation (``make docs``).

Sphinx's autodoc imports django_semaphore, which needs configured settings.
Nothing here connects anywhere: the Redis URL is never used while the docs
are built (no check runs, no semaphore is acquired).
"""

SECRET_KEY = "docs-only-not-secret"
USE_TZ = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_semaphore",
]

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": "redis://docs.invalid:6379/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
    }
}

SEMAPHORES = {"reports": {"LIMIT": 2}}
