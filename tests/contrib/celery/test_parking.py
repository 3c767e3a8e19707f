"""contrib.celery.parking: parked messages in Redis, in arrival order, with TTLs."""

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("celery")

from kombu.exceptions import ContentDisallowed

from django_semaphore import Semaphore, SemaphoreBackendError
from django_semaphore.contrib.celery import parking, store
from tests.contrib.celery.support import message, park, parked_ids

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


def test_each_partition_of_a_total_name_parks_apart(backend_redis):
    sem = Semaphore("cel-total-park", limit=4, timeout=30, total=1)
    for n in range(3):
        park(sem, "A", f"a{n}")
    park(sem, "B", "b0")
    park(sem, "C", "c0")
    keys = {tenant: sem.partition(tenant) for tenant in ("A", "B", "C")}
    # One set of Redis keys for the name, but a list, a lock and runs of each partition's own,
    # all in the name's hash slot.
    assert len({k.base for k in keys.values()}) == 1 and len({k.own for k in keys.values()}) == 3
    assert len({store.queue_key(k) for k in keys.values()}) == 3
    assert len({store.lock_key(k) for k in keys.values()}) == 3
    assert len({store.run_key(k, "same-id") for k in keys.values()}) == 3
    tag = keys["A"].base[keys["A"].base.index("{") : keys["A"].base.index("}") + 1]
    assert all(tag in store.queue_key(k) and tag in store.lock_key(k) for k in keys.values())
    assert parked_ids(sem, "A") == ["id-a0", "id-a1", "id-a2"]
    assert parked_ids(sem, "B") == ["id-b0"] and parked_ids(sem, "C") == ["id-c0"]
    assert parking.parked(sem.partition("D")) == []
    # The registry names each partition, and rebuilds the ad-hoc semaphore with its TOTAL.
    found = {key: (field, s) for field, s, key in parking.parked_partitions()}
    assert sorted(found) == ["A", "B", "C"]
    for tenant, (field, rebuilt) in found.items():
        assert field == keys[tenant].own
        assert rebuilt.config.total == 1 and rebuilt.partition(tenant) == keys[tenant]
    assert backend_redis.hlen(store.registry_key()) == 3


@pytest.mark.parametrize(
    "sem",
    [
        Semaphore("cel-adapt", limit=4, timeout=10, adaptive={"MIN": 1, "MAX": 2, "MIN_SAMPLES": 3}),
        Semaphore("cel-opts", limit=3, timeout=5, wait=1.5, mode="dry_run", max_waiters=2, slots=True),
        Semaphore("cel-sched", limit=3, timeout=5, permits=2, priority=-4, total=6),
        Semaphore("cel-ria", limit=1, timeout=2, algorithm="fair"),
    ],
    ids=["adaptive", "options", "scheduling", "algorithm"],
)
def test_an_ad_hoc_semaphore_is_rebuilt_with_its_whole_configuration(sem):
    # Only LIMIT, TIMEOUT, ALGORITHM and TOTAL were kept: a dispatcher acquired for an ad-hoc
    # ADAPTIVE semaphore's parked tasks at LIMIT, above the adaptive limit in force.
    entry = json.loads(json.dumps(parking.describe(sem, "t")))  # as the registry keeps it
    rebuilt = parking.rebuild(entry)
    assert rebuilt == sem and rebuilt.config == sem.config


def test_an_entry_of_an_older_version_is_rebuilt_with_the_defaults():
    entry = {"name": "cel-old", "key": None, "adhoc": {"limit": 2, "timeout": 7, "algorithm": "lua"}}
    assert parking.rebuild(entry) == Semaphore("cel-old", limit=2, timeout=7)


def _task(properties=None, serializer=None):
    from celery.app.task import Context

    request = Context(id="id-s", args=(), kwargs={}, delivery_info={}, properties=properties or {})
    app = SimpleNamespace(conf=SimpleNamespace(task_serializer="json"))
    return SimpleNamespace(
        name="app.export", request=request, app=app, serializer=serializer, ignore_result=False
    )


@pytest.mark.parametrize(
    ("properties", "serializer", "expected"),
    [
        ({}, None, "json"),  # the app's task_serializer
        ({}, "pickle", "pickle"),  # the task's
        (
            {"content_type": "application/x-python-serialize"},
            "json",
            "pickle",
        ),  # the message's own (AMQP says it)
    ],
)
def test_a_parked_message_keeps_its_arguments_as_its_serializer_encodes_them(
    properties, serializer, expected
):
    task = _task(properties, serializer)
    assert parking.serializer_of(task) == expected
    sem = Semaphore("cel-ser", limit=1, timeout=30)
    args, kwargs = ("x", ["y", 1]), {"n": {"deep": [1.5]}}
    found = parking.loads(parking.message(task, args, kwargs, parking.describe(sem, None)))
    if expected == "json":
        assert "body" not in found and (found["args"], found["kwargs"]) == (list(args), kwargs)
        return
    assert found["body"]["serializer"] == expected and "args" not in found
    content_type = found["body"]["content_type"]
    opened = parking.opened(found, {content_type})
    assert (opened["args"], opened["kwargs"], opened["options"]["ignore_result"]) == (
        list(args),
        kwargs,
        False,
    )
    with pytest.raises(ContentDisallowed):  # never decoded unless accepted
        parking.opened(found, {"application/json"})
