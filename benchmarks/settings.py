"""Minimal Django settings for the benchmarks (and the servers they start).

BENCH_REDIS_URL is set by ``python -m benchmarks`` to its own throwaway server.
"""

import os

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0")

SECRET_KEY = "benchmarks-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = ["django_semaphore"]
MIDDLEWARE = []
ROOT_URLCONF = "benchmarks.urls"
DATABASES = {}
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            "SOCKET_CONNECT_TIMEOUT": 1,
            "SOCKET_TIMEOUT": 5,
            # redis-py pools 100 connections by default; a waiter blocks on one
            # (BLPOP), and the fairness section queues 1,009 threads in one process.
            "CONNECTION_POOL_KWARGS": {"max_connections": 2000},
        },
    }
}

SEMAPHORE_REDIS = "default"
SEMAPHORE_KEY_PREFIX = "bench"
SEMAPHORES = {
    # The web benchmark: a limit above the load generator's concurrency, so
    # every request is granted and the figure is the semaphore's cost alone.
    "web": {"LIMIT": 1000, "TIMEOUT": 10},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "root": {"handlers": ["null"], "level": "WARNING"},
}
