"""The engine's Redis for integrations (django_semaphore.engine.storage): commands, scripts,
keys beside a partition's, the prefix."""

import time

import pytest

from django_semaphore import Semaphore, SemaphoreBackendError
from django_semaphore.backend import connection
from django_semaphore.engine import storage
from tests.support.servers import free_port


@pytest.fixture
def keys():
    return Semaphore("storage-test", limit=1).partition("k")


def test_a_command_runs_on_the_engines_client(keys):
    key = keys.base + "test:list"
    try:
        assert storage.command("RPUSH", key, "a", "b") == 2
        assert storage.command("LLEN", key) == 2
    finally:
        connection.get_client().delete(key)


def test_a_script_of_scripts_runs_by_name(keys):
    key = keys.base + "test:lock"
    client = connection.get_client()
    try:
        client.set(key, "me")
        # unlock.lua deletes the key only for its holder.
        assert storage.script(storage.LuaScript("unlock"), (key,), "someone else") == 0
        assert storage.script(storage.LuaScript("unlock"), (key,), "me") == 1
        assert not client.exists(key)
    finally:
        client.delete(key)


def test_keys_share_the_partitions_prefix(keys, settings):
    assert keys.base.startswith(storage.key_prefix())
    assert storage.key_prefix() == settings.SEMAPHORE_KEY_PREFIX


def test_pubsub_hears_what_is_published(keys):
    channel = keys.base + "test:channel"
    subscription = storage.pubsub()
    try:
        subscription.subscribe(channel)
        assert storage.command("PUBLISH", channel, "hello") >= 1
        deadline = time.monotonic() + 5
        message = None
        while message is None and time.monotonic() < deadline:  # None: the subscription's own reply
            message = subscription.get_message(timeout=1)
        assert message is not None and message["data"] in (b"hello", "hello")
    finally:
        subscription.close()


def test_a_redis_failure_is_a_backend_error(settings):
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0"}  # nothing listens there
    with pytest.raises(SemaphoreBackendError):
        storage.command("PING")
