"""``semaphore_task``: a Celery task's run holds a slot, and a task that finds none is parked.

A worker run, in order:

1. claims its task id (:mod:`.runs`): a duplicate of a run that completed,
   or of one that is alive, does not run;
2. adopts the slot its message carries (a parked task sent again by the
   dispatcher, or ``ticket_arg``), or acquires one; with none free it parks
   (:mod:`.parking`) and returns at once (``celery.exceptions.Ignore``);
3. runs the body as the slot's holder (renewed by the watchdog), releases
   the slot, marks the task id done (or lets it go if the body raised or
   retried), and sends the partition's next parked task.

The tickets a message carries are taken out of ``request.kwargs`` first, so
that ``self.retry()`` sends the task again without a slot that its first run
gives back: the retry acquires (or parks) like any new task.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, cast

from celery import Task, current_task
from celery.exceptions import Ignore

from ...engine import handoff, watchdog
from ...engine.guards import current_lease as current_lease  # the one current lease, re-exported
from ...engine.guards import holding
from ...engine.handoff import HandoffError
from ...engine.semaphore import Lease, Semaphore, adopt_ticket, lease_from_ticket, semaphores
from ...exceptions import SemaphoreBackendError, SemaphoreFull
from . import orphans, parking, runs
from .dispatcher import PARKED_KWARG, dispatch

logger = logging.getLogger("django_semaphore")

F = TypeVar("F", bound=Callable[..., Any])
KeyArg = str | Callable[..., "str | None"] | None


def annotate(lease: Lease, **fields: Any) -> bool:
    """Add ``fields`` to the meta Redis stores with ``lease``'s holder (the admin shows it).

    False if the slot is no longer held.
    """
    return handoff.annotate(lease.keys, lease.identifier, fields)


@dataclass(frozen=True, slots=True)
class Options:
    """What ``semaphore_task`` was given, kept on the task's run function."""

    name: str | Semaphore
    key: KeyArg
    ticket_arg: str | None
    wait: float | None
    meta: dict[str, Any] | None

    @property
    def semaphore(self) -> Semaphore:
        return self.name if isinstance(self.name, Semaphore) else semaphores[self.name]

    def partition(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return self.key(*args, **kwargs) if callable(self.key) else self.key


@dataclass(frozen=True, slots=True)
class Call:
    """One run of the task: the function's arguments, and those of its message (without ``self``)."""

    func: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    message_args: tuple[Any, ...]

    def __call__(self) -> Any:
        return self.func(*self.args, **self.kwargs)


def semaphore_task(
    name: str | Semaphore,
    key: KeyArg = None,
    *,
    ticket_arg: str | None = None,
    wait: float | None = None,
    meta: dict[str, Any] | None = None,
) -> Callable[[F], F]:
    """Hold a slot of semaphore ``name`` for each run of the decorated Celery task.

    Put it under ``@shared_task`` (or ``@app.task``; ``bind=True`` too).
    ``name`` is a SEMAPHORES name or a :class:`~django_semaphore.Semaphore`;
    ``key`` a partition value, or a callable ``(*args, **kwargs) -> str |
    None`` given the task's arguments (without the bound task).  ``wait``:
    seconds to wait for a slot before parking (a direct or eager call: before
    raising SemaphoreFull); None (the default) means the semaphore's WAIT,
    as everywhere (an ad-hoc Semaphore's own ``wait``, 0 unless given), and
    ``wait=0`` parks at once.  A worker process waits in it: keep it short.
    ``meta``: extra meta stored with the holder (the task's name and id always
    are).  ``ticket_arg``: the name of a kwarg that may carry a
    :meth:`Lease.handoff <django_semaphore.Lease.handoff>` ticket; when
    it does, the task adopts that lease instead of acquiring (the kwarg is
    passed on to the function unchanged).
    """
    options = Options(name, key, ticket_arg, wait, meta)

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def run_task(*args: Any, **kwargs: Any) -> Any:
            ticket = kwargs.pop(PARKED_KWARG, None)
            bound = bool(args) and isinstance(args[0], Task)  # bind=True: the task comes first
            call = Call(func, args, kwargs, args[1:] if bound else args)
            semaphore = options.semaphore
            partition = options.partition(call.message_args, kwargs)
            if semaphore.passes_through():  # SEMAPHORE_ENABLED = False, or mode "off"
                return call()
            task = current_task if current_task else None
            if not _in_worker(task):
                return _run_direct(call, semaphore, partition, options)
            return _run_in_worker(task, call, semaphore, partition, options, ticket)

        run_task._semaphore_task = options  # type: ignore[attr-defined]  # read by on_revoked
        return cast(F, run_task)

    return decorate


def _in_worker(task: Any) -> bool:
    if task is None:
        return False
    request = task.request
    return bool(request.id) and not request.called_directly and not request.is_eager


def _take_tickets(request: Any, options: Options) -> None:
    """Take the tickets out of the message's kwargs: ``self.retry()`` sends those again,
    and the slot they stand for is given back when this run ends."""
    kwargs = getattr(request, "kwargs", None)
    if isinstance(kwargs, dict):
        kwargs.pop(PARKED_KWARG, None)
        if options.ticket_arg and kwargs.get(options.ticket_arg) is not None:
            kwargs[options.ticket_arg] = None


@dataclass(frozen=True, slots=True)
class _Given:
    """The ticket a message carries, and whether the dispatcher sent it (a parked task)."""

    ticket: str
    parked: bool


def _given(ticket: str | None, call: Call, options: Options) -> _Given | None:
    if ticket is not None:
        return _Given(ticket, parked=True)
    if options.ticket_arg and call.kwargs.get(options.ticket_arg):
        return _Given(call.kwargs[options.ticket_arg], parked=False)
    return None


def _run_in_worker(
    task: Any, call: Call, semaphore: Semaphore, partition: str | None, options: Options, ticket: str | None
) -> Any:
    request = task.request
    _take_tickets(request, options)
    given = _given(ticket, call, options)
    handed = _readable(given)
    claimed = runs.claim(semaphore.partition(partition), request.id, handed.identifier if handed else "")
    if isinstance(claimed, runs.Duplicate):
        if handed is not None and (claimed.done or claimed.identifier != handed.identifier):
            handed.release()  # a slot taken for this message that no run will use
        raise Ignore("already run" if claimed.done else "running elsewhere")
    try:
        _give_back_orphan(claimed, semaphore, partition, handed, request.id)
        lease = _take(task, call, semaphore, partition, options, given)
    except BaseException:
        runs.end(claimed, done=False)
        raise
    runs.hold(claimed, lease.identifier, lease.config.timeout)
    orphans.register(claimed, semaphore, partition, lease.identifier, request.id, adopted=given is not None)
    return _hold(task, call, lease, semaphore, partition, claimed)


def _give_back_orphan(
    claimed: runs.Run, semaphore: Semaphore, partition: str | None, handed: Lease | None, task_id: str
) -> None:
    """Give back the slot a run of this task id held when its process died (``acks_late``
    redelivered it), instead of leaving it held until its lease expires (:mod:`.orphans`);
    not the slot this message's ticket hands over: the run adopts it again."""
    orphan = claimed.orphan
    if not orphan or (handed is not None and orphan == handed.identifier):
        return
    try:
        orphans.give_back(semaphore, partition, orphan, task_id)
    except SemaphoreBackendError as exc:
        logger.warning("Task %s could not give back the slot of its run that died: %s", task_id, exc)


def _readable(given: _Given | None) -> Lease | None:
    """The lease of the ticket given (not adopted: no Redis call), None if none or unreadable."""
    if given is None:
        return None
    try:
        return lease_from_ticket(Lease, given.ticket)
    except HandoffError:
        return None  # adopting it says why


def _take(
    task: Any, call: Call, semaphore: Semaphore, partition: str | None, options: Options, given: _Given | None
) -> Lease:
    """The slot this run holds: adopted from its ticket, or acquired; parks (raises Ignore) if none."""
    request = task.request
    identity = {"task": task.name, "task_id": request.id}
    if given is not None:
        try:
            return adopt_ticket(Lease, given.ticket, meta=identity, adopter=str(request.id))
        except HandoffError as exc:
            if not given.parked:
                raise
            _park_again(task, call, semaphore, partition, exc)
    lease = None
    if not parking.count(semaphore.partition(partition)):  # others parked: behind them
        meta = {**(options.meta or {}), **identity}
        lease = semaphore.acquire(partition, wait=options.wait, meta=meta)  # None: the WAIT
    if lease is None:
        parking.park(semaphore, partition, _parked_message(task, call, semaphore, partition))
        dispatch(semaphore, partition, task.app)  # a slot may have come free meanwhile
        raise Ignore(f"parked until a slot of semaphore {semaphore.name!r} is free")
    return lease


def _park_again(
    task: Any, call: Call, semaphore: Semaphore, partition: str | None, exc: Exception
) -> NoReturn:
    """The slot taken for this parked task is gone (it expired before a worker picked the
    task up): first in line again."""
    logger.warning("Parked task %s lost its slot before it started (%s): parked again.", task.request.id, exc)
    parking.park(semaphore, partition, _parked_message(task, call, semaphore, partition), front=True)
    raise Ignore("parked again") from exc


def _parked_message(task: Any, call: Call, semaphore: Semaphore, partition: str | None) -> str:
    return parking.message(task, call.message_args, call.kwargs, parking.describe(semaphore, partition))


@contextlib.contextmanager
def _held(lease: Lease) -> Iterator[None]:
    """Run the body as the holder of ``lease``: it is the current lease
    (:func:`django_semaphore.guards.current_lease`), refreshed by the watchdog,
    and released at the end whatever happens."""
    try:
        with holding(lease), watchdog.watching(lease):
            yield
    finally:
        lease.release()


def _hold(
    task: Any, call: Call, lease: Lease, semaphore: Semaphore, partition: str | None, claimed: runs.Run
) -> Any:
    done = False
    try:
        with _held(lease):
            result = call()
        done = True
        return result
    finally:
        runs.end(claimed, done=done, ttl=max(runs.DONE_TTL, semaphore.config.timeout + 1))
        orphans.unregister(claimed)
        try:
            dispatch(semaphore, partition, task.app)  # the next parked task gets this slot now
        except SemaphoreBackendError as exc:
            logger.warning("Could not dispatch parked tasks: %s", exc)


def _run_direct(call: Call, semaphore: Semaphore, partition: str | None, options: Options) -> Any:
    """Not in a worker (a direct call, eager mode): hold a slot or raise SemaphoreFull; nothing parks."""
    lease: Lease | None
    if options.ticket_arg and call.kwargs.get(options.ticket_arg):
        lease = Lease.adopt(call.kwargs[options.ticket_arg])
    else:
        lease, retry_after = semaphore.try_acquire(partition, wait=options.wait, meta=options.meta)
        if lease is None:
            raise SemaphoreFull(semaphore.name, retry_after or 1, partition)
    with _held(lease):
        return call()


def on_revoked(sender: Any = None, request: Any = None, terminated: bool = False, **kwargs: Any) -> None:
    """``task_revoked``: a revoked (or expired) task gives back the slot its message carried
    at once, instead of holding it until TIMEOUT; the dispatcher looks now.

    A slot whose ticket a run adopted stays with that run, unless the revoke
    terminated it.
    """
    options = getattr(getattr(sender, "run", None), "_semaphore_task", None)
    message_kwargs = getattr(request, "kwargs", None)
    if not isinstance(options, Options) or not isinstance(message_kwargs, dict):
        return
    tickets = [message_kwargs.get(PARKED_KWARG)]
    if options.ticket_arg:
        tickets.append(message_kwargs.get(options.ticket_arg))
    for ticket in tickets:
        if not isinstance(ticket, str) or not ticket:
            continue
        try:
            lease = lease_from_ticket(Lease, ticket)
            if terminated or not handoff.adopted(lease.keys, lease.identifier):
                lease.release()
        except (HandoffError, SemaphoreBackendError) as exc:
            logger.warning("Could not give back the slot of revoked task %s: %s", request.id, exc)
    parking.wake.set()
