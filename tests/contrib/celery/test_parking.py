"""contrib.celery.parking: parked messages in Redis, in arrival order, with TTLs."""

import pytest

pytest.importorskip("celery")

from django_semaphore import Semaphore, SemaphoreBackendError
from django_semaphore.contrib.celery import parking, store
from tests.contrib.celery.support import message

pytestmark = pytest.mark.usefixtures("backend")


def test_a_park_racing_the_forgetting_is_not_lost(backend_redis):
    sem = Semaphore("cel-race", limit=1, timeout=30)
    parking.park(sem, None, message(sem, None, 0))
    field = sem.partition().base
    stale = backend_redis.hget(store.registry_key(), field)
    parking.park(sem, None, message(sem, None, 1))  # re-registers with a new nonce
    assert store.script(store.UNREGISTER, (store.registry_key(),), field, stale) == 0
    assert backend_redis.hexists(store.registry_key(), field)


def test_redis_failures_are_backend_errors(own_redis):
    sem = Semaphore("cel-down", limit=1, timeout=30)
    own_redis.stop()
    with pytest.raises(SemaphoreBackendError):
        parking.parked(sem.partition())


def test_every_key_has_a_ttl_that_a_park_never_shortens(backend_redis):
    long = Semaphore("cel-ttl-long", limit=1, timeout=2 * 24 * 3600)  # TIMEOUT: two days
    short = Semaphore("cel-ttl-short", limit=1, timeout=30)
    parking.park(long, None, message(long, None, 0))
    parking.park(short, None, message(short, None, 1))  # writes the shared registry too
    assert backend_redis.pttl(store.registry_key()) > 24 * 3600 * 1000  # still the long one's
    assert backend_redis.pttl(store.queue_key(long.partition())) > 24 * 3600 * 1000
    assert 0 < backend_redis.pttl(store.queue_key(short.partition())) <= 24 * 3600 * 1000
