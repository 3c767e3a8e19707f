import pytest

from django_semaphore import Semaphore, SemaphoreFull, semaphores


def test_limit_release_refresh(prefix_keys):
    sem = semaphores["reports"]
    a = sem.acquire()
    b = sem.acquire()
    assert a and b and b.token > a.token
    assert sem.acquire() is None
    with pytest.raises(SemaphoreFull) as info, sem.hold():
        pass
    assert 1 <= info.value.retry_after <= 5
    assert [h.identifier for h in sem.holders()] == [a.identifier, b.identifier]
    assert a.refresh() is True
    assert a.release() is True
    assert a.release() is False
    assert sem.available() == 1
    print(prefix_keys())


@pytest.mark.parametrize("algorithm", ["lua", "fair_locked", "fair", "basic"])
def test_algorithms(algorithm):
    sem = Semaphore("adhoc-" + algorithm, limit=2, timeout=5, algorithm=algorithm)
    a, b = sem.acquire(), sem.acquire()
    assert a and b and sem.acquire() is None
    assert len(sem.holders()) == 2
    assert b.release() and sem.acquire() is not None


@pytest.mark.asyncio
async def test_async():
    sem = semaphores["reports"]
    lease = await sem.aacquire()
    assert await lease.arefresh()
    async with sem.ahold() as other:
        assert other.token > lease.token
        assert await sem.aacquire() is None
    assert await lease.arelease()
