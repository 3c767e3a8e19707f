"""The dispatcher: sends parked tasks again, each with a slot taken on its behalf.

For the first parked task of a partition, the dispatcher takes a slot (its
holder's meta names the task), hands the lease over in a ticket carried by the
re-sent message (same task id), and only then removes the message from the
list.  One dispatcher at a time serves a partition (a lock key that its holder
renews while it queues for a slot, so a dispatcher that died lets go within
:data:`LOCK_MS`).  A task that expired while parked, or that this worker knows
revoked, is sent without a slot: the worker revokes it, as Celery does.  A
parked task whose serializer this worker's ``accept_content`` refuses (workers
that disagree on it) is left, first in line and without a slot taken, to a
worker that accepts it: this one logs it once and looks again a poll later.

Every Celery worker runs a :class:`Dispatcher` in its main process
(``worker_ready``); a task that ends dispatches its partition itself, at once.
When more partitions have parked tasks than it queues for at a time
(:data:`MAX_WAITING`), its waiting threads take turns: each leaves after one
task sent, and the partition whose turn is oldest queues next, so that a TOTAL
name's freed permits still go round all of its partitions.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from celery import current_app

from ...engine import storage
from ...engine.semaphore import Lease, Semaphore
from ...exceptions import SemaphoreBackendError
from . import orphans, parking, runs, store

logger = logging.getLogger("django_semaphore")

#: The reserved kwarg carrying a parked task's ticket when the dispatcher sends it again.
PARKED_KWARG = "_semaphore_parked"
#: How often each dispatcher thread looks for slots freed elsewhere (releases in other processes, expiry).
POLL_INTERVAL = 0.5
#: The lifetime of a partition's dispatcher lock, renewed while its holder is alive.
LOCK_MS = 1_500
#: How often a dispatcher that queues for a slot renews its lock.
KEEP_EVERY = 0.25
#: Seconds a dispatcher thread queues for a slot at a time (then it looks at the list again).
WAIT = 5.0
#: At most how long a partition's parked tasks go without their TTL renewed while a
#: dispatcher serves them (and at most a tenth of that TTL: :func:`parking.ttl_ms`).
KEEP_TTL_EVERY = 60.0
#: Partitions that get a waiting dispatcher thread each at a time, per process; beyond
#: that, the partitions take turns (one task sent each) and the others are polled.
MAX_WAITING = 32


def dispatch(semaphore: Semaphore, key: str | None, app: Any = None, wait: float = 0) -> int:
    """Send parked tasks of partition ``key`` again, as many as slots are free; how many were sent.

    For each, in arrival order: a slot is taken on the parked task's behalf
    (meta: its task name and id), handed off in a ticket the re-sent message
    carries, and the message is removed from the list once sent.  One
    dispatcher at a time per partition; any process may call this.  With
    ``wait``, the dispatcher queues for a slot like any waiter ("lua": woken
    by the release itself, in milliseconds) for up to ``wait`` seconds.
    """
    return _dispatch(semaphore, key, app, wait)[0]


def _dispatch(
    semaphore: Semaphore, key: str | None, app: Any, wait: float, more: Callable[[], bool] | None = None
) -> tuple[int, bool]:
    """:func:`dispatch`: (how many were sent, whether to look again only a poll later: a
    *waiting* dispatcher holds the partition, or the first task is refused here).

    ``more``: asked after each task sent, whether to go on with the next (None: yes)."""
    keys = semaphore.partition(key)
    if not parking.count(keys):
        return 0, False
    # The lock's value says whether its holder queues for a slot ("w") or just looks
    # ("n"), and which process holds it: "w:<host>:<pid>:<nonce>".
    lock = store.lock_key(keys)
    token = f"{'w' if wait else 'n'}:{runs.HOST}:{os.getpid()}:{os.urandom(8).hex()}"
    if not store.command("SET", lock, token, "NX", "PX", LOCK_MS):
        holder = store.command("GET", lock)
        seen = "" if holder is None else store.text(holder)
        # A worker restarted on this host takes over its dead predecessor's lock at
        # once, instead of leaving the partition's parked tasks for up to LOCK_MS.
        if not (_holder_gone(seen) and store.script(store.SWAP_IF, (lock,), seen, token, LOCK_MS)):
            return 0, seen.startswith("w:")  # another is at it
    try:
        with _kept(lock, token, wait, lambda: _keep(semaphore, key)):
            return _send_parked(semaphore, key, app, wait, token, more)
    finally:
        store.script(store.UNLOCK, (lock,), token)


def _send_parked(
    semaphore: Semaphore, key: str | None, app: Any, wait: float, token: str, more: Callable[[], bool] | None
) -> tuple[int, bool]:
    """:func:`_dispatch` with the lock held: (how many were sent, whether to look again
    only a poll later: the first task's serializer is refused here)."""
    keys = semaphore.partition(key)
    queue, lock = store.queue_key(keys), store.lock_key(keys)
    sent = 0
    while True:
        head = store.command("LINDEX", queue, 0)
        if head is None:
            return sent, False
        parked_message = parking.loads(store.text(head))
        if not _accepted_here(app, parked_message):
            return sent, True  # no slot taken: a worker that accepts it sends it
        if not store.script(store.RENEW_IF, (lock,), token, LOCK_MS):
            return sent, False  # the lock ran out meanwhile: another dispatcher may be at it
        _keep(semaphore, key)
        if parking.expired(parked_message) or _revoked(parked_message):
            # Sent without a slot: the worker that receives it revokes it (its
            # result says REVOKED, as for any expired or revoked task).
            _send(app, parked_message, None)
        else:
            meta = {"task": parked_message["task"], "task_id": parked_message["id"], "parked": True}
            lease = semaphore.acquire(key, wait=wait, meta=meta)
            if lease is None:
                return sent, False
            ticket = lease.handoff()
            try:
                _send(app, parked_message, ticket)
            except BaseException:
                # Not sent: give the slot back (the message stays first in line).
                Lease.adopt(ticket, verify=False).release()
                raise
        store.script(store.POP_IF_HEAD, (queue,), head, parking.ttl_ms(semaphore))
        sent += 1
        if more is not None and not more():
            return sent, False


#: The parked tasks whose serializer this process refused, logged once each (task ids).
_refused: set[str] = set()


def _accepted_here(app: Any, parked_message: dict[str, Any]) -> bool:
    """Whether this worker can send ``parked_message`` again: its arguments are JSON, or
    encoded by a serializer its ``accept_content`` accepts.  Logged once per task if not."""
    body = parked_message.get("body")
    if not isinstance(body, dict):
        return True
    try:
        parking.opened(parked_message, parking.accepted(app or current_app))
    except Exception as exc:  # kombu's ContentDisallowed, or bytes it cannot decode
        task_id = str(parked_message.get("id"))
        if task_id not in _refused:
            if len(_refused) >= 10_000:
                _refused.clear()
            _refused.add(task_id)
            logger.warning(
                "Parked task %s (%s) is encoded as %s, which this worker cannot decode (%s): "
                "it stays first in line for a worker that can. Give every worker the same "
                "accept_content.",
                task_id,
                parked_message.get("task"),
                body.get("content_type"),
                exc,
            )
        return False
    return True


@contextlib.contextmanager
def _kept(lock: str, token: str, wait: float, keep_parked: Callable[[], None]) -> Iterator[None]:
    """Keep ``lock`` while a dispatcher queues for a slot (up to ``wait`` seconds at a time),
    and the parked tasks it serves (``keep_parked``: their TTL, which a long wait outlasts)."""
    if wait <= 0:
        yield
        return
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(KEEP_EVERY):
            try:
                if not store.script(store.RENEW_IF, (lock,), token, LOCK_MS):
                    return
                keep_parked()
            except SemaphoreBackendError:
                pass  # the dispatcher's own calls fail too, and say so

    keeper = threading.Thread(target=keep, name="django-semaphore-celery-lock", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join()


#: When this process last renewed each partition's parked tasks (queue key: monotonic time).
_kept_at: dict[str, float] = {}
_kept_at_lock = threading.Lock()


def _keep(semaphore: Semaphore, key: str | None) -> None:
    """Renew the TTL of partition ``key``'s parked tasks and of the registry (:func:`parking.keep`)
    while this process serves them: at most every tenth of that TTL, or KEEP_TTL_EVERY."""
    queue = store.queue_key(semaphore.partition(key))
    every = min(KEEP_TTL_EVERY, parking.ttl_ms(semaphore) / 10_000)
    now = time.monotonic()
    with _kept_at_lock:
        if now - _kept_at.get(queue, -math.inf) < every:
            return
        if len(_kept_at) >= 10_000:  # partitions come and go: forget them all now and then
            _kept_at.clear()
        _kept_at[queue] = now
    parking.keep(semaphore, key)


def _holder_gone(value: str) -> bool:
    """Whether the dispatcher lock ``value`` belongs to a process of this host that is gone."""
    parts = value.split(":", 3)
    if len(parts) != 4 or not parts[2].isdigit():
        return False  # no lock, or one of an older version: it lapses within LOCK_MS
    return runs.process_gone(parts[1], int(parts[2]))


def _revoked(parked_message: dict[str, Any]) -> bool:
    """Whether this worker knows the parked task revoked (``celery control revoke``)."""
    from celery.worker import state

    return parked_message.get("id") in state.revoked


def _send(app: Any, parked_message: dict[str, Any], ticket: str | None) -> None:
    app = app or current_app
    body = parked_message.get("body")
    if isinstance(body, dict):  # encoded by another serializer than JSON: sent again with it
        parked_message = {**parking.opened(parked_message, parking.accepted(app))}
        parked_message["options"] = {**parked_message["options"], "serializer": body["serializer"]}
    kwargs = dict(parked_message["kwargs"])
    if ticket is not None:
        kwargs[PARKED_KWARG] = ticket
    # send_task: by name, without the argument check of apply_async (the kwarg above is ours).
    app.send_task(
        parked_message["task"],
        args=parked_message["args"],
        kwargs=kwargs,
        task_id=parked_message["id"],
        **parked_message["options"],
    )


def dispatch_all(app: Any = None) -> int:
    """One pass over every partition with parked tasks, without waiting; how many tasks were sent."""
    return sum(dispatch(semaphore, key, app) for _, semaphore, key in parking.parked_partitions())


class Dispatcher:
    """The threads that send parked tasks again, in one process (:func:`start_dispatcher`).

    The main thread polls the registry every ``interval`` seconds, and at once
    when a park is announced; each partition with parked tasks gets a thread
    of its own (up to :data:`MAX_WAITING`) that queues for a slot on the first
    parked task's behalf, so a release anywhere wakes it at once.  Partitions
    beyond the cap are dispatched by the poll itself, without waiting.

    With more partitions than that, the threads take turns: each leaves once
    it has sent a task (or finds another process queueing for its partition),
    and the partitions whose thread started longest ago (or never) get the
    free threads first.  Otherwise the first :data:`MAX_WAITING` partitions
    found would keep them: under TOTAL, where the name's freed permits go to
    its waiters, the partitions beyond would wait for all of their parked
    tasks to be sent first.
    """

    def __init__(self, app: Any = None, interval: float = POLL_INTERVAL) -> None:
        self.app = app
        self.interval = interval
        self._waiting: dict[str, threading.Thread] = {}
        #: When each partition's last waiting thread started (a count of starts).
        self._turns: dict[str, int] = {}
        self._started = 0
        #: (registry field, semaphore, partition value) of each partition with parked
        #: tasks, as the last poll found them.
        self._found: list[tuple[str, Semaphore, str | None]] = []
        #: More partitions with parked tasks than MAX_WAITING, at the last poll: take turns.
        self._crowded = False
        self._lock = threading.Lock()  # the poll runs in the main thread and in a thread that leaves
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name="django-semaphore-celery-dispatcher", daemon=True
        )

    def start(self) -> Dispatcher:
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        parking.wake.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        subscription = None
        while not self._stop.is_set():
            subscription = self._listen(subscription)
            parking.wake.clear()
            if self._stop.is_set():
                break
            try:
                self._poll()
                orphans.reap_due()  # the slots of this host's runs whose process died
            except SemaphoreBackendError as exc:
                logger.warning("Could not dispatch parked tasks: %s", exc)
            except Exception:  # never let the thread die: parked tasks depend on it
                logger.exception("Unexpected error dispatching parked tasks")
        if subscription is not None:
            with contextlib.suppress(Exception):
                subscription.close()

    def _listen(self, subscription: Any) -> Any:
        """Wait up to ``interval`` for a park announced on the registry's channel (any
        process's park: a PUBLISH) or in this process; the subscription, None if lost."""
        try:
            if subscription is None:
                subscription = storage.pubsub()
                subscription.subscribe(store.registry_key())
            subscription.get_message(timeout=self.interval)
            while subscription.get_message(timeout=0):  # drain: one poll serves them all
                pass
            return subscription
        except Exception:  # Redis away: poll on the timer, subscribe again next time
            with contextlib.suppress(Exception):
                subscription.close()
            parking.wake.wait(self.interval)
            return None

    def _poll(self) -> None:
        found = list(parking.parked_partitions())
        with self._lock:
            self._found = found
            self._crowded = len(found) > MAX_WAITING
            fields = {field for field, _, _ in found}
            self._turns = {field: n for field, n in self._turns.items() if field in fields}
        for semaphore, key in self._fill():
            dispatch(semaphore, key, self.app)

    def _fill(self) -> list[tuple[Semaphore, str | None]]:
        """Start waiting threads for the partitions the last poll found, those whose turn is
        oldest first (never: first of all; then as found), up to MAX_WAITING at a time; the
        partitions left without one (no Redis call: a thread that leaves starts the next)."""
        left = []
        with self._lock:
            self._waiting = {field: t for field, t in self._waiting.items() if t.is_alive()}
            for field, semaphore, key in sorted(self._found, key=lambda item: self._turns.get(item[0], -1)):
                if field in self._waiting:
                    continue
                if len(self._waiting) >= MAX_WAITING:
                    left.append((semaphore, key))
                    continue
                thread = threading.Thread(
                    target=self._wait_on,
                    args=(field, semaphore, key),
                    name="django-semaphore-celery-waiter",
                    daemon=True,
                )
                self._started += 1
                self._turns[field] = self._started
                self._waiting[field] = thread
                thread.start()
        return left

    def _wait_on(self, field: str, semaphore: Semaphore, key: str | None) -> None:
        """Queue for slots of one partition while it has parked tasks (or until its turn ends)."""
        outcome = _FAILED
        try:
            outcome = self._serve(semaphore, key)
        finally:
            with self._lock:
                if self._waiting.get(field) is threading.current_thread():
                    del self._waiting[field]
                if outcome != _TURN_OVER:  # no thread for it again before a poll finds it
                    self._found = [item for item in self._found if item[0] != field]
        if outcome != _FAILED and self._crowded and not self._stop.is_set():
            try:
                self._fill()  # the next partition's turn starts now, not at the next poll
            except Exception:
                logger.exception("Unexpected error dispatching parked tasks")

    def _serve(self, semaphore: Semaphore, key: str | None) -> str:
        """:meth:`_wait_on`'s loop: how it ended (:data:`_TURN_OVER`: to let another partition
        take its turn; :data:`_EMPTY`; :data:`_FAILED`, or stopped)."""
        keys = semaphore.partition(key)
        while not self._stop.is_set():
            try:
                sent, later = _dispatch(semaphore, key, self.app, WAIT, self._alone)
                if not parking.count(keys):
                    return _EMPTY
            except SemaphoreBackendError as exc:
                logger.warning("Could not dispatch parked tasks: %s", exc)
                return _FAILED  # the poll starts another
            except Exception:
                logger.exception("Unexpected error dispatching parked tasks")
                return _FAILED
            if self._crowded and sent:
                return _TURN_OVER  # served: the others' turn
            # Another process's dispatcher queues for this partition (or the first task is
            # one to leave to a worker that accepts its serializer): look again a poll later
            # (a dead one's lock lapses within LOCK_MS); when partitions wait for a turn,
            # leave it to that one then.  One that only looks (a task that just parked or
            # ended) is done in a few milliseconds.
            self._stop.wait(self.interval if later else 0.01)
            if self._crowded and later:
                return _TURN_OVER
        return _FAILED

    def _alone(self) -> bool:
        """Whether a waiting thread goes on after a task it sent (no other partition waits for a turn)."""
        return not self._crowded


# How a waiting thread ended (Dispatcher._serve).
_TURN_OVER = "turn over"  # it sent a task, or another process queues for its partition
_EMPTY = "empty"  # no parked task left there
_FAILED = "failed"  # an error, or the dispatcher stopped


_dispatcher: Dispatcher | None = None
_dispatcher_lock = threading.Lock()


@storage.in_child
def _forget_the_parents_dispatcher() -> None:
    global _dispatcher, _dispatcher_lock
    # Its thread did not survive the fork; a child starts its own (start_dispatcher).
    _dispatcher, _dispatcher_lock = None, threading.Lock()


def start_dispatcher(app: Any = None) -> Dispatcher:
    """Start this process's dispatcher thread (idempotent); Celery workers start it themselves."""
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is None or not _dispatcher.thread.is_alive():
            _dispatcher = Dispatcher(app).start()
        return _dispatcher


def stop_dispatcher() -> None:
    """Stop this process's dispatcher thread, if it runs."""
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is not None:
            _dispatcher.stop()
        _dispatcher = None
