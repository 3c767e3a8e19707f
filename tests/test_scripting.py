"""The drivers (scripting.run / arun): every Redis failure becomes one SemaphoreBackendError
and one ``backend_failed`` signal, sent by the driver itself."""

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
