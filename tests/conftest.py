"""Fixtures shared by the test modules.

Every test gets its own SEMAPHORE_KEY_PREFIX, so tests never see each other's
keys and nothing is flushed: at the end of a test only its own keys are
deleted (by SCAN on its prefix).
"""

import itertools
import os
import sys
import uuid

import pytest
import redis

from django_semaphore import signals

pytest_plugins = ["tests.support.fixtures_redis"]

_SESSION = uuid.uuid4().hex[:8]
_counter = itertools.count()


@pytest.fixture(scope="session")
def redis_url():
    return os.environ["REDIS_URL"]


@pytest.fixture(scope="session")
def raw_redis(redis_url):
    """A plain redis-py client to the test server, for assertions."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def key_prefix(settings, raw_redis):
    """A SEMAPHORE_KEY_PREFIX of this test's own; its keys are deleted afterwards."""
    prefix = f"t{_SESSION}-{next(_counter)}"
    settings.SEMAPHORE_KEY_PREFIX = prefix
    yield prefix
    keys = list(raw_redis.scan_iter(match=prefix + ":*", count=1000))
    if keys:
        raw_redis.delete(*keys)


@pytest.fixture
def prefix_keys(raw_redis, key_prefix):
    """A function listing this test's keys in Redis."""

    def keys():
        return sorted(k.decode("utf-8", "replace") for k in raw_redis.scan_iter(match=key_prefix + ":*"))

    return keys


@pytest.fixture
def subprocess_env(redis_url, key_prefix):
    """Environment for child processes: same Redis, same prefix, same settings."""
    env = dict(os.environ)
    env["REDIS_URL"] = redis_url
    env["SEMAPHORE_KEY_PREFIX"] = key_prefix
    env["DJANGO_SETTINGS_MODULE"] = "tests.support.settings"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env["PYTHON"] = sys.executable
    return env


@pytest.fixture
def received():
    """Every acquired/refused/released/lease_lost signal sent during the test: (signal name, kwargs)."""
    seen = []
    receivers = {}
    for name in ("acquired", "refused", "released", "lease_lost"):

        def receiver(sender, _name=name, **kwargs):
            seen.append((_name, kwargs))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver, weak=False)
    yield seen
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


@pytest.fixture
def events(received):
    """The ``received`` record, under the name the web-layer tests give it."""
    return received
