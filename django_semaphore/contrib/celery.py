"""Celery tasks that hold a semaphore slot while they run, parked (not retried) when none is free.

Install the extra (``pip install django-semaphore[celery]``), then::

    from celery import shared_task
    from django_semaphore.contrib.celery import semaphore_task

    @shared_task
    @semaphore_task("exports", key=lambda account_id, **kw: str(account_id))
    def export(account_id): ...

How it works (docs/background.rst has the figures):

* The task's run holds a slot: acquired when it starts (its meta names the
  task and its id), renewed by the watchdog while it runs, released when it
  ends, also on an exception.
* A task that finds no slot is **parked**: its message (task name, args,
  kwargs, and the options Celery sends a request again with: routing, the
  chain and callbacks that follow, errbacks, chord and group, expiry, time
  limits) is appended to a Redis LIST of its partition,
  ``<partition>:celery:q``, in the partition's hash tag, and the task
  returns at once (``celery.exceptions.Ignore``: no result is stored, the
  worker is free).  A task arriving while others are parked parks behind
  them: parked tasks go in arrival order.  A task whose ``expires`` passes
  while it is parked is sent without a slot, for the worker to revoke it as
  Celery does any expired task.
* A **dispatcher** sends parked tasks again: it takes a slot *on behalf of*
  the first parked task (the holder's meta names that task), hands the lease
  over in a ticket (:mod:`django_semaphore.handoff`) carried by the re-sent
  message, and only then removes the message from the list.  The re-sent task
  adopts that lease instead of acquiring: it never runs without a slot held
  for it.  A task that ends dispatches its partition itself, at once; the
  dispatcher thread each Celery worker starts (``worker_ready``) polls every
  partition with parked tasks every :data:`POLL_INTERVAL` seconds, so a slot
  freed by any process, or by expiry, is used within a second.  Parked tasks
  live in Redis: they survive a worker restart.
* Exactly once: one dispatcher at a time per partition (a lock key), and the
  re-sent task claims its task id in Redis before running (a duplicate sent
  by a dispatcher that died between sending and removing gives its slot back
  and does nothing).
* ``ticket_arg="ticket"``: a task started with ``ticket=<lease.handoff()>``
  (e.g. by a view that acquired the slot) adopts that lease instead of
  acquiring, adds its task id to the holder's meta, and releases the lease
  when it ends.

Outside a worker (a direct call, ``task_always_eager``) nothing is parked:
the call waits up to ``wait`` seconds and raises SemaphoreFull if refused.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from celery import current_app, current_task
from celery import signals as celery_signals
from celery.exceptions import Ignore
from kombu.utils import json as kombu_json  # Celery's own JSON: dates, UUIDs, decimals
from redis.exceptions import NoScriptError, RedisError

from .. import conf, connection, handoff, refresh, signals
from ..core import Semaphore, semaphores
from ..exceptions import SemaphoreBackendError, SemaphoreFull
from ..handoff import HandoffError
from ..keys import PartitionKeys
from ..lease import Lease
from ..scripting import backend_error, run

logger = logging.getLogger("django_semaphore")

F = TypeVar("F", bound=Callable[..., Any])
KeyArg = str | Callable[..., "str | None"] | None

#: The reserved kwarg carrying a parked task's ticket when the dispatcher sends it again.
PARKED_KWARG = "_semaphore_parked"
#: Suffixes (after the partition's keys' base) of the keys this module writes.
QUEUE_SUFFIX = "celery:q"  # LIST of parked task messages, oldest first
LOCK_SUFFIX = "celery:l"  # STRING: the dispatcher of this partition now
CLAIM_SUFFIX = "celery:r:"  # STRING per task id: the task has run (exactly once)
#: ``<prefix>:celery:parked``: HASH partition base -> what the dispatcher needs to rebuild its semaphore.
REGISTRY_SUFFIX = "celery:parked"
#: How long parked tasks (and the registry) stay in Redis without any write: a day.
PARK_TTL = 24 * 3600.0
#: How long a task id's "has run" claim is kept: far longer than a duplicate can take to arrive.
CLAIM_TTL = 3600.0
#: How often each dispatcher thread looks for slots freed elsewhere (releases in other processes, expiry).
POLL_INTERVAL = 0.5
#: How long one dispatcher may hold a partition's lock beyond its current wait for a slot.
LOCK_MS = 2_000
#: Seconds a dispatcher thread queues for a slot at a time (then it looks at the list again).
WAIT = 5.0
#: Partitions that get a waiting dispatcher thread each, per process; more are polled.
MAX_WAITING = 32

# Typed handles on kombu's JSON (the task arguments are encoded as Celery encodes them).
_loads = cast(Callable[[str], Any], kombu_json.loads)
_dumps = cast(Callable[[Any], str], kombu_json.dumps)

_current: contextvars.ContextVar[Lease | None] = contextvars.ContextVar("semaphore_task_lease", default=None)


def current_lease() -> Lease | None:
    """The lease held for the running ``semaphore_task`` (None outside one)."""
    return _current.get()


# -- Redis: small single-key scripts (each touches one key, so one cluster slot) --------------

# Every write renews a TTL, never shortening one (a semaphore with a longer TIMEOUT may rely on it).
_PUSH = """
redis.call(ARGV[1], KEYS[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return redis.call('LLEN', KEYS[1])
"""
# Remove the head only if it is still the message sent (a dispatcher that lost its lock must not
# remove another's head).
_POP_IF_HEAD = """
if redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then
  redis.call('LPOP', KEYS[1])
  return 1
end
return 0
"""
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_REGISTER = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
"""
# Forget a partition only if nobody re-registered it since it was read (a park writes a new nonce).
_UNREGISTER = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""
_SHAS: dict[str, str] = {}


def _eval(source: str, keys: tuple[str, ...], *args: Any) -> Any:
    client = connection.get_client()
    sha = _SHAS.get(source) or _SHAS.setdefault(source, hashlib.sha1(source.encode()).hexdigest())
    try:
        try:
            return client.evalsha(sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(source, len(keys), *keys, *args)
    except RedisError as exc:
        raise backend_error(client, exc) from exc


def _command(*words: Any) -> Any:
    client = connection.get_client()
    try:
        return client.execute_command(*words)
    except RedisError as exc:
        raise backend_error(client, exc) from exc


def queue_key(keys: PartitionKeys) -> str:
    """The LIST of tasks parked on partition ``keys``."""
    return keys.base + QUEUE_SUFFIX


def registry_key() -> str:
    """The HASH of partitions that have (or recently had) parked tasks."""
    return f"{conf.setting('SEMAPHORE_KEY_PREFIX')}:{REGISTRY_SUFFIX}"


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def parked(keys: PartitionKeys) -> list[dict[str, Any]]:
    """The messages of the tasks parked on partition ``keys``, in the order they will be sent."""
    raw = _command("LRANGE", queue_key(keys), 0, -1) or []
    return [cast(dict[str, Any], _loads(_text(item))) for item in raw]


def annotate(lease: Lease, **fields: Any) -> bool:
    """Add ``fields`` to the meta Redis stores with ``lease``'s holder (the admin shows it).

    False if the slot is no longer held.
    """
    return run(connection.get_client(), handoff.annotate_op(lease, fields))


# -- the semaphore of a task ------------------------------------------------------------------


def _semaphore(name: str | Semaphore) -> Semaphore:
    return name if isinstance(name, Semaphore) else semaphores[name]


def _describe(semaphore: Semaphore, key: str | None) -> dict[str, Any]:
    """What a dispatcher needs to rebuild ``semaphore`` (ad-hoc ones carry their config)."""
    entry: dict[str, Any] = {"name": semaphore.name, "key": key}
    if semaphore.ad_hoc:
        config = semaphore.config
        entry["adhoc"] = {"limit": config.limit, "timeout": config.timeout, "algorithm": config.algorithm}
    return entry


def _rebuild(entry: dict[str, Any]) -> Semaphore:
    adhoc = entry.get("adhoc")
    if adhoc:
        return Semaphore(entry["name"], adhoc["limit"], adhoc["timeout"], algorithm=adhoc["algorithm"])
    return semaphores[entry["name"]]


# -- parking -------------------------------------------------------------------------------


def _message(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], entry: dict[str, Any]) -> str:
    request = task.request
    delivery = getattr(request, "delivery_info", None) or {}
    # What Celery itself sends a request again with (Task.retry does): the
    # chain and callbacks that follow, errbacks, chord and group membership,
    # the workflow's ids, expiry, time limits, headers; and the routing.
    options = {
        k: v for k, v in request.as_execution_options().items() if v is not None and k not in _NOT_OPTIONS
    }
    options.update((k, delivery[k]) for k in ("exchange", "routing_key", "priority") if delivery.get(k))
    message = {
        **entry,
        "task": task.name,
        "id": request.id,
        "args": list(args),
        "kwargs": kwargs,
        "options": options,
        "parked_at": time.time(),
    }
    return _dumps(message)


#: Execution options not sent again: the id is the message's own.
_NOT_OPTIONS = frozenset({"task_id"})


def _expired(message: dict[str, Any], now: float | None = None) -> bool:
    """Whether the parked task's ``expires`` (an ISO 8601 time, as Celery sends it) has passed."""
    expires = message.get("options", {}).get("expires")
    if isinstance(expires, datetime.datetime):  # (kombu's JSON gives dates back as such)
        when = expires
    elif isinstance(expires, str):
        try:
            when = datetime.datetime.fromisoformat(expires)
        except ValueError:
            return False
    else:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp() <= (time.time() if now is None else now)


def park(semaphore: Semaphore, key: str | None, message: str, *, front: bool = False) -> int:
    """Park a task message on its partition (at the back, or ``front``); the number parked there."""
    keys = semaphore.partition(key)
    ttl = int(max(PARK_TTL, semaphore.config.timeout + 1) * 1000)
    count = int(_eval(_PUSH, (queue_key(keys),), "LPUSH" if front else "RPUSH", message, ttl))
    entry = _describe(semaphore, key)
    entry["nonce"] = os.urandom(8).hex()  # a new value at each park: see _UNREGISTER
    _eval(_REGISTER, (registry_key(),), keys.base, json.dumps(entry), ttl)
    _command("PUBLISH", registry_key(), keys.base)  # dispatchers subscribed start waiting now
    _wake.set()
    return count


def _ignore(reason: str) -> Ignore:
    return Ignore(reason)


# -- dispatching -----------------------------------------------------------------------------


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


def _dispatch(semaphore: Semaphore, key: str | None, app: Any, wait: float) -> tuple[int, bool]:
    """:func:`dispatch`: (how many were sent, whether a *waiting* dispatcher holds the partition)."""
    keys = semaphore.partition(key)
    queue = queue_key(keys)
    if not _command("LLEN", queue):
        return 0, False
    # The lock's value says whether its holder queues for a slot ("w") or just looks ("n").
    lock, token = keys.base + LOCK_SUFFIX, ("w:" if wait else "n:") + os.urandom(8).hex()
    if not _command("SET", lock, token, "NX", "PX", LOCK_MS):
        holder = _command("GET", lock)
        return 0, holder is not None and _text(holder).startswith("w:")  # another dispatcher is at it
    sent = 0
    try:
        while True:
            head = _command("LINDEX", queue, 0)
            if head is None:
                break
            message = _loads(_text(head))
            meta = {"task": message["task"], "task_id": message["id"], "parked": True}
            if not _eval(_RENEW, (lock,), token, int(wait * 1000) + LOCK_MS):
                break  # the lock ran out meanwhile: another dispatcher may be at it
            if _expired(message):
                # Sent without a slot: the worker that receives it revokes it as
                # expired (its result says REVOKED, as for any expired task).
                _send(app, message, None)
                _eval(_POP_IF_HEAD, (queue,), head)
                sent += 1
                continue
            lease = semaphore.acquire(key, wait=wait, meta=meta)
            if lease is None:
                break
            ticket = lease.handoff()
            try:
                _send(app, message, ticket)
            except BaseException:
                # Not sent: give the slot back (the message stays first in line).
                Lease.adopt(ticket, verify=False).release()
                raise
            _eval(_POP_IF_HEAD, (queue,), head)
            sent += 1
    finally:
        _eval(_UNLOCK, (lock,), token)
    return sent, False


def _send(app: Any, message: dict[str, Any], ticket: str | None) -> None:
    kwargs = dict(message["kwargs"])
    if ticket is not None:
        kwargs[PARKED_KWARG] = ticket
    # send_task: by name, without the argument check of apply_async (the kwarg above is ours).
    (app or current_app).send_task(
        message["task"], args=message["args"], kwargs=kwargs, task_id=message["id"], **message["options"]
    )


def parked_partitions() -> Iterator[tuple[str, Semaphore, str | None]]:
    """(keys' base, semaphore, partition value) of every partition with parked tasks.

    Partitions found empty are forgotten on the way.
    """
    registry = registry_key()
    for field, value in _pairs(registry):
        try:
            entry = json.loads(value)
            semaphore, key = _rebuild(entry), entry["key"]
        except Exception:  # an entry of a semaphore no longer configured here: leave it to others
            continue
        if semaphore.partition(key).base != field:
            continue
        if not _command("LLEN", queue_key(semaphore.partition(key))):
            _eval(_UNREGISTER, (registry,), field, value)
            continue
        yield field, semaphore, key


def dispatch_all(app: Any = None) -> int:
    """One pass over every partition with parked tasks, without waiting; how many tasks were sent."""
    return sum(dispatch(semaphore, key, app) for _, semaphore, key in parked_partitions())


def _pairs(registry: str) -> Iterator[tuple[str, str]]:
    reply = _command("HGETALL", registry) or {}
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    for field, value in items:
        yield _text(field), _text(value)


class Dispatcher:
    """The threads that send parked tasks again, in one process (:func:`start_dispatcher`).

    The main thread polls the registry every ``interval`` seconds; each
    partition with parked tasks gets a thread of its own (up to
    :data:`MAX_WAITING`) that queues for a slot on the first parked task's
    behalf, so a release anywhere wakes it at once.  Partitions beyond the cap
    are dispatched by the poll itself, without waiting.
    """

    def __init__(self, app: Any = None, interval: float = POLL_INTERVAL) -> None:
        self.app = app
        self.interval = interval
        self._waiting: dict[str, threading.Thread] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name="django-semaphore-celery-dispatcher", daemon=True
        )

    def start(self) -> Dispatcher:
        self.thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        _wake.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        subscription = None
        while not self._stop.is_set():
            subscription = self._listen(subscription)
            _wake.clear()
            if self._stop.is_set():
                break
            try:
                self._poll()
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
                subscription = connection.get_client().pubsub(ignore_subscribe_messages=True)
                subscription.subscribe(registry_key())
            subscription.get_message(timeout=self.interval)
            while subscription.get_message(timeout=0):  # drain: one poll serves them all
                pass
            return subscription
        except Exception:  # Redis away: poll on the timer, subscribe again next time
            with contextlib.suppress(Exception):
                subscription.close()
            _wake.wait(self.interval)
            return None

    def _poll(self) -> None:
        self._waiting = {field: t for field, t in self._waiting.items() if t.is_alive()}
        for field, semaphore, key in parked_partitions():
            if field in self._waiting:
                continue
            if len(self._waiting) >= MAX_WAITING:
                dispatch(semaphore, key, self.app)
                continue
            thread = threading.Thread(
                target=self._wait_on,
                args=(semaphore, key),
                name="django-semaphore-celery-waiter",
                daemon=True,
            )
            self._waiting[field] = thread
            thread.start()

    def _wait_on(self, semaphore: Semaphore, key: str | None) -> None:
        """Queue for slots of one partition while it has parked tasks."""
        queue = queue_key(semaphore.partition(key))
        while not self._stop.is_set():
            try:
                _, waited_on = _dispatch(semaphore, key, self.app, WAIT)
                if not _command("LLEN", queue):
                    return
            except SemaphoreBackendError as exc:
                logger.warning("Could not dispatch parked tasks: %s", exc)
                return  # the poll starts another
            except Exception:
                logger.exception("Unexpected error dispatching parked tasks")
                return
            # Another process's dispatcher queues for this partition: look again later.  One
            # that only looks (a task that just parked or ended) is done in a few milliseconds.
            self._stop.wait(self.interval if waited_on else 0.01)


_wake = threading.Event()  # set by a release in this process, or a park: poll now
_dispatcher: tuple[int, Dispatcher] | None = None
_dispatcher_lock = threading.Lock()


def start_dispatcher(app: Any = None) -> Dispatcher:
    """Start this process's dispatcher thread (idempotent); Celery workers start it themselves."""
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is None or _dispatcher[0] != os.getpid() or not _dispatcher[1].thread.is_alive():
            _dispatcher = (os.getpid(), Dispatcher(app).start())
        return _dispatcher[1]


def stop_dispatcher() -> None:
    """Stop this process's dispatcher thread, if it runs."""
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is not None and _dispatcher[0] == os.getpid():
            _dispatcher[1].stop()
        _dispatcher = None


def _on_worker_ready(sender: Any = None, **kwargs: Any) -> None:
    start_dispatcher(getattr(sender, "app", None))


def _on_worker_shutdown(**kwargs: Any) -> None:
    stop_dispatcher()


# Every worker (its main process) runs a dispatcher: parked tasks need no extra service.
celery_signals.worker_ready.connect(_on_worker_ready, weak=False)
celery_signals.worker_shutting_down.connect(_on_worker_shutdown, weak=False)


def _on_release(**kwargs: Any) -> None:
    _wake.set()  # a slot came free in this process: the dispatcher looks now


signals.released.connect(_on_release, weak=False, dispatch_uid="django_semaphore.contrib.celery")


# -- the decorator ---------------------------------------------------------------------------


def _in_worker(task: Any) -> bool:
    if task is None:
        return False
    request = task.request
    return bool(request.id) and not request.called_directly and not request.is_eager


def semaphore_task(
    name: str | Semaphore,
    key: KeyArg = None,
    *,
    ticket_arg: str | None = None,
    wait: float | None = None,
    meta: dict[str, Any] | None = None,
) -> Callable[[F], F]:
    """Hold a slot of semaphore ``name`` for each run of the decorated Celery task.

    Put it under ``@shared_task`` (or ``@app.task``).  ``name`` is a SEMAPHORES
    name or a :class:`~django_semaphore.Semaphore`; ``key`` a partition value,
    or a callable ``(*args, **kwargs) -> str | None`` given the task's
    arguments.  ``wait``: seconds to wait for a slot before parking (default
    0: park at once).  ``meta``: extra meta stored with the holder (the task's
    name and id always are).  ``ticket_arg``: the name of a kwarg that may
    carry a :meth:`Lease.handoff <django_semaphore.lease.Lease.handoff>`
    ticket; when it does, the task adopts that lease instead of acquiring
    (the kwarg is passed on to the function unchanged).
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            ticket = kwargs.pop(PARKED_KWARG, None)
            semaphore = _semaphore(name)
            partition = key(*args, **kwargs) if callable(key) else key
            if semaphore.passes_through():  # SEMAPHORE_ENABLED = False, or mode "off"
                return func(*args, **kwargs)
            task = current_task if current_task else None
            if not _in_worker(task):
                return _run_direct(func, semaphore, partition, wait, meta, ticket_arg, args, kwargs)
            assert task is not None
            identity = {"task": task.name, "task_id": task.request.id}
            lease: Lease | None
            if ticket is not None:  # sent again by a dispatcher: the slot was taken for us
                lease = _adopt_parked(task, semaphore, partition, ticket, args, kwargs)
            elif ticket_arg and kwargs.get(ticket_arg):
                lease = Lease.adopt(kwargs[ticket_arg], meta=identity)
            else:
                entry = _describe(semaphore, partition)
                if _command("LLEN", queue_key(semaphore.partition(partition))):
                    lease = None  # others are parked: behind them, in arrival order
                else:
                    lease = semaphore.acquire(partition, wait=wait or 0, meta={**(meta or {}), **identity})
                if lease is None:
                    park(semaphore, partition, _message(task, args, kwargs, entry))
                    dispatch(semaphore, partition, task.app)  # a slot may have come free meanwhile
                    raise _ignore(f"parked until a slot of semaphore {semaphore.name!r} is free")
            return _hold(func, lease, semaphore, partition, task.app, args, kwargs)

        return cast(F, run)

    return decorate


def _adopt_parked(
    task: Any, semaphore: Semaphore, partition: str | None, ticket: str, args: Any, kwargs: dict[str, Any]
) -> Lease:
    try:
        lease = Lease.adopt(ticket)
    except HandoffError as exc:
        # The slot taken for this task expired before a worker picked it up: first in line again.
        logger.warning(
            "Parked task %s lost its slot before it started (%s): parked again.", task.request.id, exc
        )
        park(semaphore, partition, _message(task, args, kwargs, _describe(semaphore, partition)), front=True)
        raise _ignore("parked again") from exc
    claim = lease.keys.base + CLAIM_SUFFIX + str(task.request.id)
    ttl = int(max(CLAIM_TTL, semaphore.config.timeout + 1) * 1000)
    if not _command("SET", claim, "1", "NX", "PX", ttl):
        lease.release()  # a duplicate: this task id has run already
        raise _ignore("already run")
    return lease


@contextlib.contextmanager
def _held(lease: Lease) -> Iterator[None]:
    """Run the body as the holder of ``lease``: it is the current lease, refreshed
    by the watchdog, and released at the end whatever happens."""
    token = _current.set(lease)
    try:
        with refresh.watching(lease):
            yield
    finally:
        _current.reset(token)
        lease.release()


def _hold(
    func: Callable[..., Any],
    lease: Lease,
    semaphore: Semaphore,
    partition: str | None,
    app: Any,
    args: Any,
    kwargs: dict[str, Any],
) -> Any:
    try:
        with _held(lease):
            return func(*args, **kwargs)
    finally:
        try:
            dispatch(semaphore, partition, app)  # the next parked task gets this slot now
        except SemaphoreBackendError as exc:
            logger.warning("Could not dispatch parked tasks: %s", exc)


def _run_direct(
    func: Callable[..., Any],
    semaphore: Semaphore,
    partition: str | None,
    wait: float | None,
    meta: dict[str, Any] | None,
    ticket_arg: str | None,
    args: Any,
    kwargs: dict[str, Any],
) -> Any:
    """Not in a worker (a direct call, eager mode): hold a slot or raise SemaphoreFull; nothing parks."""
    lease: Lease | None
    if ticket_arg and kwargs.get(ticket_arg):
        lease = Lease.adopt(kwargs[ticket_arg])
    else:
        lease, retry_after = semaphore.try_acquire(partition, wait=wait or 0, meta=meta)
        if lease is None:
            raise SemaphoreFull(semaphore.name, retry_after or 1, partition)
    with _held(lease):
        return func(*args, **kwargs)
