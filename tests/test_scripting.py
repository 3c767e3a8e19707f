"""The drivers (scripting.run / arun): every Redis failure becomes one SemaphoreBackendError
and one ``backend_failed`` signal, sent by the driver itself; a flushed script cache
(NOSCRIPT) is loaded again."""

import pytest

from django_semaphore import Semaphore, SemaphoreBackendError, signals
from tests.servers import free_port


@pytest.fixture
def failures(settings):
    """Redis unreachable; the (sender, kwargs) of every backend_failed sent."""
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{free_port()}/0"}
    sent = []

    def failed(sender, **kwargs):
        sent.append((sender, kwargs))

    signals.backend_failed.connect(failed, weak=False)
    yield sent
    signals.backend_failed.disconnect(failed)


def test_backend_failed_is_sent_by_the_driver_with_the_error_class_as_sender(failures):
    with pytest.raises(SemaphoreBackendError) as info:
        Semaphore("driver", limit=1).acquire()
    assert [(sender, kwargs["error"], kwargs["server"]) for sender, kwargs in failures] == [
        (SemaphoreBackendError, info.value, info.value.server)
    ]
    assert "semaphore" not in failures[0][1]  # below any one semaphore


@pytest.mark.asyncio
async def test_the_async_driver_sends_the_same_signal(failures):
    with pytest.raises(SemaphoreBackendError) as info:
        await Semaphore("driver", limit=1).aacquire()
    assert [(sender, kwargs["error"]) for sender, kwargs in failures] == [(SemaphoreBackendError, info.value)]


# -- NOSCRIPT ---------------------------------------------------------------------------


def test_script_flush_is_recovered(raw_redis):
    sem = Semaphore("flushed", limit=2, timeout=30)
    first = sem.acquire()
    raw_redis.script_flush()
    second = sem.acquire()
    assert second is not None and second.token > first.token
    raw_redis.script_flush()
    assert first.refresh() is True
    raw_redis.script_flush()
    assert [h.identifier for h in sem.holders()] == [first.identifier, second.identifier]
    raw_redis.script_flush()
    assert first.release() is True
    raw_redis.script_flush()
    assert sem.available() == 1


@pytest.mark.asyncio
async def test_script_flush_is_recovered_async(raw_redis):
    sem = Semaphore("aflushed", limit=2, timeout=30)
    first = await sem.aacquire()
    raw_redis.script_flush()
    assert await sem.aacquire() is not None
    raw_redis.script_flush()
    assert await first.arefresh() is True
    raw_redis.script_flush()
    assert await first.arelease() is True
