"""Exceptions raised by django-semaphore (django_semaphore.exceptions): what each
carries, and that every one of them is a SemaphoreError."""

import pytest

from django_semaphore import Semaphore, SemaphoreBackendError, SemaphoreError, SemaphoreFull
from tests.support.servers import free_port


def test_semaphore_full_carries_name_retry_after_key_and_reason():
    exc = SemaphoreFull("reports", 3, "alice")
    assert isinstance(exc, SemaphoreError)
    assert (exc.name, exc.retry_after, exc.key, exc.reason) == ("reports", 3, "alice", "full")
    assert "'reports'" in str(exc) and "3s" in str(exc)
    assert SemaphoreFull("reports", 2.0, reason="timeout").retry_after == 2  # whole seconds, an int
    assert isinstance(SemaphoreFull("reports", 2.0).retry_after, int)


@pytest.mark.usefixtures("backend")
def test_a_refused_hold_raises_semaphore_full_for_its_partition():
    sem = Semaphore("full", limit=1, timeout=30)
    lease = sem.acquire(key="k")
    with pytest.raises(SemaphoreFull) as refused, sem.hold(key="k"):
        pass  # pragma: no cover - never entered
    assert (refused.value.name, refused.value.key, refused.value.reason) == ("full", "k", "full")
    assert 1 <= refused.value.retry_after <= 30
    with pytest.raises(SemaphoreFull) as waited, sem.hold(key="k", wait=0.1):
        pass  # pragma: no cover
    assert waited.value.reason == "timeout"  # it waited its WAIT in vain
    assert lease.release() is True


def test_a_redis_failure_is_a_backend_error_naming_the_server(settings):
    port = free_port()
    settings.SEMAPHORE_REDIS = {"URL": f"redis://127.0.0.1:{port}/0"}
    with pytest.raises(SemaphoreError) as info:
        Semaphore("down", limit=1).acquire()
    assert isinstance(info.value, SemaphoreBackendError)
    assert info.value.server == f"127.0.0.1:{port}"
    assert SemaphoreBackendError("boom").server is None
