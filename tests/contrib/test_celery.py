"""django_semaphore.contrib.celery without a worker: parking, dispatching, annotating, direct calls.

The broker is the one boundary replaced here (``Outbox`` records what would be
sent); tests/system/test_celery_worker.py runs the same code under a real
Celery worker.
"""

import time

import pytest

pytest.importorskip("celery")

from celery import Celery

from django_semaphore import Semaphore, SemaphoreBackendError, SemaphoreFull
from django_semaphore.contrib import celery as sc
from django_semaphore.lease import Lease
from tests.helpers import wait_until

pytestmark = pytest.mark.usefixtures("backend")


class Outbox:
    """Stands for a Celery app's send_task: records the messages, or fails."""

    def __init__(self, fail=False):
        self.sent = []
        self.fail = fail

    def send_task(self, name, args=None, kwargs=None, task_id=None, **options):
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append({"task": name, "args": args, "kwargs": kwargs, "id": task_id, "options": options})


def _message(sem, key, n, options=None):
    entry = sc._describe(sem, key)
    return sc.kombu_json.dumps(
        {
            **entry,
            "task": "app.export",
            "id": f"id-{n}",
            "args": [n],
            "kwargs": {"k": n},
            "options": options or {},
        }
    )


def test_parked_tasks_are_sent_in_arrival_order_each_with_a_slot_taken_for_it():
    sem = Semaphore("cel-order", limit=2, timeout=30)
    held = [sem.acquire("t1"), sem.acquire("t1")]
    for n in range(3):
        assert sc.park(sem, "t1", _message(sem, "t1", n)) == n + 1
    outbox = Outbox()
    assert sc.dispatch(sem, "t1", outbox) == 0  # no slot free: nothing sent
    assert [m["id"] for m in sc.parked(sem.partition("t1"))] == ["id-0", "id-1", "id-2"]
    held[0].release()
    assert sc.dispatch(sem, "t1", outbox) == 1
    (sent,) = outbox.sent
    assert (sent["task"], sent["id"], sent["args"]) == ("app.export", "id-0", [0])
    ticket = sent["kwargs"].pop(sc.PARKED_KWARG)
    assert sent["kwargs"] == {"k": 0}
    holder = [h for h in sem.holders("t1") if h.identifier != held[1].identifier][0]
    assert holder.meta["task_id"] == "id-0" and holder.meta["parked"] is True
    lease = Lease.adopt(ticket)
    assert lease.identifier == holder.identifier and lease.key == "t1"
    assert [m["id"] for m in sc.parked(sem.partition("t1"))] == ["id-1", "id-2"]
    lease.release()
    held[1].release()
    assert sc.dispatch(sem, "t1", outbox) == 2
    assert [m["id"] for m in outbox.sent] == ["id-0", "id-1", "id-2"]
    assert sc.parked(sem.partition("t1")) == []


def test_a_failed_send_gives_the_slot_back_and_keeps_the_task_first(prefix_keys):
    sem = Semaphore("cel-fail", limit=1, timeout=30)
    sc.park(sem, None, _message(sem, None, 0))
    with pytest.raises(ConnectionError):
        sc.dispatch(sem, None, Outbox(fail=True))
    assert sem.available() == 1
    assert [m["id"] for m in sc.parked(sem.partition())] == ["id-0"]
    assert not any(key.endswith(sc.LOCK_SUFFIX) for key in prefix_keys())  # the lock was let go
    assert sc.dispatch(sem, None, Outbox()) == 1


def test_a_task_that_expired_while_parked_is_sent_without_a_slot():
    sem = Semaphore("cel-expired", limit=1, timeout=30)
    held = sem.acquire()
    gone = {"expires": "2000-01-01T00:00:00+00:00", "link": [{"task": "app.next"}], "priority": 3}
    later = {"expires": "2999-01-01T00:00:00+00:00", "chain": [{"task": "app.next"}]}
    sc.park(sem, None, _message(sem, None, 0, gone))
    sc.park(sem, None, _message(sem, None, 1, later))
    held.release()
    outbox = Outbox()
    assert sc.dispatch(sem, None, outbox) == 2
    expired, live = outbox.sent
    # The expired one goes out as it came (the worker revokes it) and takes no slot...
    assert (expired["id"], expired["kwargs"], expired["options"]) == ("id-0", {"k": 0}, gone)
    # ...which the next one gets, with its ticket and options.
    assert live["id"] == "id-1" and live["options"] == later
    assert Lease.adopt(live["kwargs"].pop(sc.PARKED_KWARG)).release()
    assert sc.parked(sem.partition()) == []


def test_one_dispatcher_at_a_time_per_partition(backend_redis):
    sem = Semaphore("cel-lock", limit=1, timeout=30)
    sc.park(sem, None, _message(sem, None, 0))
    backend_redis.set(sem.partition().base + sc.LOCK_SUFFIX, "someone else", px=5000)
    assert sc.dispatch(sem, None, Outbox()) == 0
    backend_redis.delete(sem.partition().base + sc.LOCK_SUFFIX)
    assert sc.dispatch(sem, None, Outbox()) == 1


def test_dispatch_all_finds_every_parked_partition_and_forgets_empty_ones(backend_redis):
    sem = Semaphore("cel-all", limit=1, timeout=30)
    for key in ("a", "b"):
        sc.park(sem, key, _message(sem, key, key))
    assert (
        backend_redis.ttl(sc.registry_key()) > 3600
        and backend_redis.ttl(sc.queue_key(sem.partition("a"))) > 3600
    )
    outbox = Outbox()
    assert sc.dispatch_all(outbox) == 2
    assert sorted(m["id"] for m in outbox.sent) == ["id-a", "id-b"]
    assert backend_redis.hlen(sc.registry_key()) == 2
    assert sc.dispatch_all(outbox) == 0  # empty: the partitions are forgotten
    assert backend_redis.hlen(sc.registry_key()) == 0


def test_a_park_racing_the_forgetting_is_not_lost(backend_redis):
    sem = Semaphore("cel-race", limit=1, timeout=30)
    sc.park(sem, None, _message(sem, None, 0))
    field = sem.partition().base
    stale = backend_redis.hget(sc.registry_key(), field)
    sc.park(sem, None, _message(sem, None, 1))  # re-registers with a new nonce
    assert sc._eval(sc._UNREGISTER, (sc.registry_key(),), field, stale) == 0
    assert backend_redis.hexists(sc.registry_key(), field)


def test_annotate_adds_to_a_live_holders_meta():
    sem = Semaphore("cel-meta", limit=1, timeout=30)
    lease = sem.acquire(meta={"path": "/export/"})
    assert sc.annotate(lease, task_id="abc", task="app.export")
    (holder,) = sem.holders()
    assert holder.meta["path"] == "/export/" and holder.meta["task_id"] == "abc"
    assert holder.token == lease.token
    lease.release()
    assert not sc.annotate(lease, task_id="late")


def _app():
    app = Celery("contrib-tests", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    return app


def test_a_direct_or_eager_call_holds_a_slot_or_raises():
    sem = Semaphore("cel-direct", limit=1, timeout=30)
    app = _app()
    seen = []

    @app.task
    @sc.semaphore_task(sem, key=lambda n: f"k{n}")
    def work(n):
        seen.append((sc.current_lease().key, sem.available(f"k{n}")))
        return n

    assert work(1) == 1 and work.delay(2).get() == 2  # direct, and eager
    assert seen == [("k1", 0), ("k2", 0)]
    assert sem.available("k1") == 1 and sc.current_lease() is None
    held = sem.acquire(key="k3")
    with pytest.raises(SemaphoreFull):
        work(3)
    held.release()


def test_a_direct_call_adopts_a_ticket():
    sem = Semaphore("cel-ticket", limit=1, timeout=30)
    app = _app()

    @app.task
    @sc.semaphore_task(sem, ticket_arg="ticket")
    def work(ticket=None):
        return sc.current_lease().identifier

    lease = sem.acquire()
    assert work(ticket=lease.handoff()) == lease.identifier
    assert sem.available() == 1  # released when the task ended


def test_disabled_semaphores_pass_through(settings):
    settings.SEMAPHORE_ENABLED = False
    sem = Semaphore("cel-off", limit=1, timeout=30)
    held = sem.acquire()

    @sc.semaphore_task(sem)
    def work():
        return "ran"

    assert work() == "ran"
    settings.SEMAPHORE_ENABLED = True
    held.release()


def test_redis_failures_are_backend_errors(own_redis):
    sem = Semaphore("cel-down", limit=1, timeout=30)
    own_redis.stop()
    with pytest.raises(SemaphoreBackendError):
        sc.parked(sem.partition())


def test_the_dispatcher_queues_for_a_slot_and_sends_at_the_release():
    sem = Semaphore("cel-disp", limit=1, timeout=30)
    held = sem.acquire()
    outbox = Outbox()
    dispatcher = sc.Dispatcher(outbox).start()
    try:
        sc.park(sem, None, _message(sem, None, 0))  # announced: the dispatcher starts waiting
        # It queues like any waiter, on the parked task's behalf (the admin lists it).
        wait_until(lambda: [w.meta.get("task_id") for w in sem.waiters()] == ["id-0"], 5, message="queued")
        released = time.monotonic()
        held.release()
        wait_until(lambda: outbox.sent, 1, interval=0.002, message="sent within a second")
        print(f"\nrelease -> parked task sent: {(time.monotonic() - released) * 1000:.1f} ms")
        (holder,) = sem.holders()
        assert holder.meta["task_id"] == "id-0" and sc.parked(sem.partition()) == []
    finally:
        dispatcher.stop()
    assert not dispatcher.thread.is_alive()


def test_every_key_has_a_ttl_that_a_park_never_shortens(backend_redis):
    long = Semaphore("cel-ttl-long", limit=1, timeout=2 * 24 * 3600)  # TIMEOUT: two days
    short = Semaphore("cel-ttl-short", limit=1, timeout=30)
    sc.park(long, None, _message(long, None, 0))
    sc.park(short, None, _message(short, None, 1))  # writes the shared registry too
    assert backend_redis.pttl(sc.registry_key()) > 24 * 3600 * 1000  # still the long one's
    assert backend_redis.pttl(sc.queue_key(long.partition())) > 24 * 3600 * 1000
    assert 0 < backend_redis.pttl(sc.queue_key(short.partition())) <= 24 * 3600 * 1000
