"""The engine's front: :class:`Semaphore`, its :class:`Lease`, and the ``semaphores`` registry. No HTTP.

A Semaphore takes slots (:meth:`Semaphore.try_acquire` and its twins), each a
:class:`Lease`, and reads its partitions (:mod:`~django_semaphore.engine.inspection`,
:mod:`~django_semaphore.engine.discovery`).  A lease is refreshed and released by the
process that took it; a release that Redis does not answer is handed to
:mod:`~django_semaphore.engine.recovery`, which sends it again (whichever answer comes
first, the caller's own retry or the recovery thread's, settles it, with one
``released`` signal).

The two classes share this module because each makes the other:
``Semaphore.acquire`` makes a Lease, and ``Lease.adopt`` rebuilds the Semaphore a
hand-off ticket names (:mod:`~django_semaphore.engine.handoff` reads the ticket and
knows neither class).  Every method that talks to Redis has an asyncio twin, named
with an ``a``: both run the same operations (:mod:`~django_semaphore.backend.scripting`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ImproperlyConfigured

from .. import signals
from ..backend import connection, forks
from ..backend.keys import PartitionKeys
from ..backend.scripting import Call, Client, Flow, Operation, adrive, arun, drive, run
from ..config import settings
from ..config.validation import PRIORITY_RANGE, checked_wait, priority_in_range, validate_entry
from ..exceptions import RetryAfter, SemaphoreBackendError, SemaphoreFull
from ..runtime import adaptive, adhoc, control, stats, tally
from ..runtime.control import Effective
from . import discovery, handoff, inspection, recovery, waiting
from .algorithms import ALGORITHMS, AcquireRequest, Algorithm, Granted, Outcome, algorithm_for
from .algorithms.base import retry_after_seconds
from .guards import FunctionGuard
from .inspection import Holder, PartitionStatus, Waiter, to_datetime

if TYPE_CHECKING:
    from ..config.validation import SemaphoreConfig

META_KEY_LENGTH = 64  # how much of a partition value is copied into meta
PAUSED_RETRY_MS = 5000  # Retry-After of a caller refused because the limit in force is 0

F = TypeVar("F", bound=Callable[..., Any])


def new_identifier() -> str:
    """A fresh, random identifier naming one holder (or waiter) in Redis."""
    return os.urandom(16).hex()


_process: tuple[int | None, str | None, str] = (
    None,
    None,
    "",
)  # (pid, host, JSON of {"host", "pid"}) of this process


def meta_json(meta: dict[str, Any] | None, key: object) -> str:
    """The JSON stored with a holder: the caller's meta plus host, pid and the partition value."""
    global _process
    pid = forks.pid()
    if _process[0] != pid:  # first call, or first call after fork()
        host = socket.gethostname()
        _process = (pid, host, json.dumps({"host": host, "pid": pid}, separators=(",", ":")))
    if meta is None and key is None:
        return _process[2]
    data: dict[str, Any] = {"host": _process[1], "pid": pid}
    if key is not None:
        data["key"] = str(key)[:META_KEY_LENGTH]
    if meta:
        data.update(meta)
    return json.dumps(data, separators=(",", ":"), default=str)


class Semaphore:
    """A distributed counting semaphore: at most ``limit`` holders at once.

    ``Semaphore("reports")`` (no ``limit``) is the semaphore configured in
    ``SEMAPHORES["reports"]``, read from settings at each call.  With
    ``limit`` it is an ad-hoc semaphore that needs no SEMAPHORES entry (the
    connection still comes from SEMAPHORE_REDIS)::

        sem = Semaphore("crawler", limit=3, timeout=10)
        with sem.hold():
            ...
    """

    def __init__(
        self,
        name: str,
        limit: int | None = None,
        timeout: float = 60,
        *,
        wait: float = 0,
        algorithm: str = "lua",
        mode: str = "enforce",
        max_waiters: int | None = None,
        permits: int = 1,
        priority: int = 0,
        adaptive: dict[str, Any] | None = None,
        slots: bool = False,
        total: int | None = None,
    ) -> None:
        self.name = name
        self._config: SemaphoreConfig | None
        if limit is None:
            self._config = None
        else:
            entry: dict[str, Any] = {
                "LIMIT": limit,
                "TIMEOUT": timeout,
                "WAIT": wait,
                "ALGORITHM": algorithm,
                "MODE": mode,
            }
            # Only the scheduling options given: a seed variant refuses them (E023).
            for option, value, default in (
                ("MAX_WAITERS", max_waiters, None),
                ("PERMITS", permits, 1),
                ("PRIORITY", priority, 0),
                ("ADAPTIVE", adaptive, None),
                ("TOTAL", total, None),
            ):
                if value != default:
                    entry[option] = value
            if slots is not False:  # 0 == False, but 0 is no bool: validated (E028)
                entry["SLOTS"] = slots
            config, problems = validate_entry(name, entry, ad_hoc=True)
            for problem in problems:
                if not problem.warning:
                    raise ValueError(f"{problem.msg} HINT: {problem.hint}")
            self._config = config

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semaphore) and (self.name, self._config) == (other.name, other._config)

    def __hash__(self) -> int:
        return hash((Semaphore, self.name))

    @property
    def config(self) -> SemaphoreConfig:
        """The :class:`~django_semaphore.config.validation.SemaphoreConfig` in force now."""
        return self._config or settings.get_config(self.name)

    @property
    def ad_hoc(self) -> bool:
        """True for a semaphore made with ``limit`` (its settings are its own), False
        for one read from SEMAPHORES."""
        return self._config is not None

    @property
    def limit(self) -> int:
        """LIMIT: how many holders at once (per partition)."""
        return self.config.limit

    @property
    def timeout(self) -> float:
        """TIMEOUT: lease seconds."""
        return self.config.timeout

    def _algorithm(self) -> Algorithm:
        return algorithm_for(self.config)

    def partition(self, key: str | None = None) -> PartitionKeys:
        """The Redis keys of partition ``key`` (None: the unpartitioned semaphore).

        With TOTAL, every partition is in the keys of the whole name, and the
        partition's key hash is their :attr:`~PartitionKeys.part`."""
        try:
            config = self.config
        except ImproperlyConfigured:  # a name no longer configured: the keys of a partition
            return PartitionKeys.build(settings.setting("SEMAPHORE_KEY_PREFIX"), self.name, key)
        return self._keys(config, key)

    def _keys(self, config: SemaphoreConfig, key: str | None) -> PartitionKeys:
        prefix = settings.setting("SEMAPHORE_KEY_PREFIX")
        if config.total is not None:
            return PartitionKeys.for_total(prefix, self.name, key)
        return PartitionKeys.build(prefix, self.name, key)

    def _read_keys(self, key: str | None) -> PartitionKeys:
        """The keys the reading methods read for ``key``: with TOTAL and no key, the whole name."""
        keys = self.partition(key)
        return keys.whole if key is None else keys

    # -- acquire --------------------------------------------------------------

    @staticmethod
    def _check_scheduling(config: SemaphoreConfig, limit: int, permits: int, priority: int) -> None:
        """ValueError unless ``permits`` is in 1..the limit in force (``limit``; LIMIT
        while paused) and ``priority`` an int, and the algorithm takes them."""
        if type(permits) is not int:
            raise ValueError(f"permits must be an int from 1 to LIMIT, not {permits!r}.")
        if type(priority) is not int or not priority_in_range(priority):
            raise ValueError(f"priority is {priority!r}; {PRIORITY_RANGE} (higher is served first).")
        if (permits != 1 or priority != 0) and not algorithm_for(config).schedules:
            raise ValueError(
                f"Semaphore {config.name!r} uses ALGORITHM {config.algorithm!r}, which takes one "
                "permit at a time and no priority: permits and priority belong to 'lua'."
            )
        # The bound is LIMIT (or a higher limit in force): a lower runtime limit
        # refuses a caller that does not fit (reason "full"), it does not turn
        # a valid call into an error.
        bound = max(limit, config.limit)
        if not 1 <= permits <= bound:
            raise ValueError(
                f"permits is {permits}; semaphore {config.name!r} takes from 1 to {bound} "
                "(its LIMIT, or a higher limit in force) at a time."
            )

    def _operation(
        self,
        config: SemaphoreConfig,
        keys: PartitionKeys,
        limit: int,
        request: AcquireRequest,
        client: Client,
    ) -> Operation[Outcome]:
        """The acquire ``request`` on partition ``keys``: one attempt, or a wait (``request.wait``)."""
        algorithm = algorithm_for(config)
        if request.wait > 0:
            queued = None
            if config.adaptive is not None:  # a caller that has to queue is pressure on the limit
                queued = functools.partial(
                    adaptive.record_pressure, settings.setting("SEMAPHORE_KEY_PREFIX"), config.name
                )
            return waiting.wait_ops(algorithm, keys, request, client, control.limit_of(config), queued)
        return algorithm.acquire(keys, limit, request)

    def _paused(
        self, config: SemaphoreConfig, key: str | None, started: float, reason: str = "paused"
    ) -> tuple[None, RetryAfter]:
        """Refused at once, without Redis: the limit in force is 0 (paused), or
        lower than the permits asked ("full": they cannot fit, even by waiting,
        until the limit is raised)."""
        retry_after = RetryAfter(retry_after_seconds(PAUSED_RETRY_MS, config.timeout), reason)
        return self._refuse(config, key, retry_after, time.monotonic() - started)

    def _refuse(
        self, config: SemaphoreConfig, key: str | None, retry_after: RetryAfter, waited: float
    ) -> tuple[None, RetryAfter]:
        stats.record_refusal(self.name)
        if tally.counting:
            tally.refused(self.name, self, waited)
        signals.refused.send(
            sender=type(self), semaphore=self, key=key, retry_after=retry_after, waited=waited, dry_run=False
        )
        return None, retry_after

    def _outcome(
        self,
        outcome: Outcome,
        config: SemaphoreConfig,
        key: str | None,
        keys: PartitionKeys,
        request: AcquireRequest,
        started: float,
    ) -> tuple[Lease, None] | tuple[None, RetryAfter]:
        waited = time.monotonic() - started
        if isinstance(outcome, Granted):
            lease = Lease(self, key, request.identifier, outcome, keys, config)
            lease.waited = waited
            if self._config is not None:  # ad hoc: recorded for the admin (no Redis call here)
                adhoc.seen(settings.setting("SEMAPHORE_KEY_PREFIX"), config)
            if outcome.over_limit:  # a dry run: enforcing would have refused this caller
                stats.record_refusal(self.name, dry_run=True)
                signals.refused.send(
                    sender=type(self),
                    semaphore=self,
                    key=key,
                    retry_after=RetryAfter(1, "total" if outcome.over_total else "full"),
                    waited=waited,
                    dry_run=True,
                )
            if tally.counting:
                tally.acquired(self.name, self, waited)
            signals.acquired.send(sender=type(self), semaphore=self, lease=lease, waited=waited)
            return lease, None
        # For "lua", retry_after_ms is already an estimate from recent hold
        # times and the queue ahead, capped by the earliest expiry.
        # A waiter that gave up while the semaphore is paused: "paused".
        paused = control.cached(config).limit == 0
        if outcome.queue_full:
            reason = "queue_full"
        elif paused:
            reason = "paused"
        elif request.wait > 0:
            reason = "timeout"
        else:  # TOTAL: "total" when the partition had room and the name had none
            reason = "total" if outcome.total else "full"
        return self._refuse(config, key, RetryAfter(outcome.retry_after(config.timeout), reason), waited)

    def _acquiring(
        self,
        client: Client,
        key: str | None,
        wait: float | None,
        meta: dict[str, Any] | None,
        permits: int,
        priority: int,
    ) -> Flow[tuple[Lease, None] | tuple[None, RetryAfter]]:
        """:meth:`try_acquire` and :meth:`atry_acquire`, written once: a flow that
        :func:`~django_semaphore.backend.scripting.drive` or
        :func:`~django_semaphore.backend.scripting.adrive` carries out on ``client``."""
        started = time.monotonic()
        config = self.config
        wait = config.wait if wait is None else checked_wait(wait)
        keys = self._keys(config, key)
        # TOTAL: the identifier names the partition, for the scripts.
        identifier = keys.part + "/" + new_identifier() if keys.part else new_identifier()
        meta_text = meta_json(meta, key)
        # The cache of the overrides: no round trip, but the first read of a prefix.
        limit, mode, _, _ = yield Call(control.effective, control.aeffective, (config, client))
        if type(permits) is not int or type(priority) is not int or permits != 1 or priority != 0:
            self._check_scheduling(config, limit, permits, priority)  # one permit, priority 0: valid
        dry_run = mode != "enforce"
        # The admission decision taken before Redis: refused at once while paused
        # (the limit in force is 0), or when the permits asked exceed the limit in
        # force ("full": they cannot fit, even by waiting, until it is raised); a
        # dry run is never refused, and never waits.
        if not dry_run and (limit == 0 or permits > limit):
            return self._paused(config, key, started, "paused" if limit == 0 else "full")
        if dry_run:
            request = AcquireRequest(
                identifier, meta_text, config.timeout_ms, 0, 0, True, permits, priority, None, config.slots
            )
        else:
            ticket_ms = waiting.TICKET_MS if wait > 0 and algorithm_for(config).queues else 0
            request = AcquireRequest(
                identifier,
                meta_text,
                config.timeout_ms,
                wait,
                ticket_ms,
                False,
                permits,
                priority,
                config.max_waiters,
                config.slots,
            )
        mark = recovery.freed_mark()
        try:
            outcome = yield self._operation(config, keys, limit, request, client)
            if recovery.pending() or recovery.freed_mark() != mark:
                # Redis answers again after failing this process: its unanswered
                # acquires and releases may hold slots.  Inline, only a little of
                # this partition's, and only to turn a refusal into a grant; the
                # recovery thread does the rest.
                if not isinstance(outcome, Granted) and (yield from recovery.giving_back(keys, mark)):
                    once = dataclasses.replace(
                        request, wait=0, ticket_ms=0, dry_run=False, max_waiters=config.max_waiters
                    )
                    outcome = yield self._operation(config, keys, limit, once, client)
                recovery.kick()
        except SemaphoreBackendError:
            recovery.remember_acquire(config, keys, identifier)
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, a timeout from outside, a cancelled
            # task): the slot may have been granted with the reply unread, and a
            # waiter's ticket would hold up the queue until it expires. Give both
            # back now (if Redis fails, the recovery thread does).
            yield Call(recovery.forget_now, recovery.aforget_now, (client, config, keys, identifier))
            raise
        return self._outcome(outcome, config, key, keys, request, started)

    def try_acquire(
        self,
        key: str | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> tuple[Lease, None] | tuple[None, RetryAfter]:
        """Like :meth:`acquire`, returning ``(lease, None)`` or ``(None, retry_after)``.

        ``retry_after`` is a :class:`~django_semaphore.exceptions.RetryAfter`:
        an int of seconds whose ``reason`` says why the caller was refused
        ("full", "timeout", "queue_full", "paused" or "total").
        """
        client = connection.get_client()
        return drive(client, self._acquiring(client, key, wait, meta, permits, priority))

    async def atry_acquire(
        self,
        key: str | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> tuple[Lease, None] | tuple[None, RetryAfter]:
        """The asyncio twin of :meth:`try_acquire`."""
        client = connection.get_async_client()
        return await adrive(client, self._acquiring(client, key, wait, meta, permits, priority))

    def acquire(
        self,
        key: str | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> Lease | None:
        """Take ``permits`` slots: a :class:`~django_semaphore.Lease`, or None
        when they are not free.

        ``key`` is the partition value (None: the whole semaphore), ``wait``
        how many seconds to queue for a slot (None: the configured WAIT),
        ``meta`` a small JSON-serialisable dict stored with the holder.
        ``permits`` (1 to the limit in force, else ValueError) is how many of
        the limit this holder counts for; ``priority`` orders the waiters
        (higher first, then arrival).  The lease's ``slots`` are its slot
        numbers with SLOTS True, else ``()``.  Raises
        :class:`~django_semaphore.SemaphoreBackendError` if Redis fails.
        """
        return self.try_acquire(key, wait, meta, permits, priority)[0]

    async def aacquire(
        self,
        key: str | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> Lease | None:
        """The asyncio twin of :meth:`acquire`."""
        return (await self.atry_acquire(key, wait, meta, permits, priority))[0]

    @contextlib.contextmanager
    def hold(
        self,
        key: str | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> Iterator[Lease]:
        """Hold ``permits`` slots for the ``with`` block; raise SemaphoreFull if they are not free."""
        lease, retry_after = self.try_acquire(key, wait, meta, permits, priority)
        if lease is None:
            assert retry_after is not None  # (None, retry_after) when refused
            raise SemaphoreFull(self.name, retry_after, key, retry_after.reason)
        try:
            yield lease
        finally:
            lease.release()

    @contextlib.asynccontextmanager
    async def ahold(
        self,
        key: str | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> AsyncIterator[Lease]:
        """The asyncio twin of :meth:`hold`."""
        lease, retry_after = await self.atry_acquire(key, wait, meta, permits, priority)
        if lease is None:
            assert retry_after is not None  # (None, retry_after) when refused
            raise SemaphoreFull(self.name, retry_after, key, retry_after.reason)
        try:
            yield lease
        finally:
            await lease.arelease()

    # -- inspection -------------------------------------------------------------

    def holders(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> list[Holder]:
        """Live holders of partition ``key``, in token order (oldest first).

        ``keys`` (a PartitionKeys from :meth:`partitions`) may stand for ``key``.
        """
        op = inspection.holders(keys or self._read_keys(key), self._algorithm())
        return run(connection.get_client(), op)

    async def aholders(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> list[Holder]:
        """The asyncio twin of :meth:`holders`."""
        op = inspection.holders(keys or self._read_keys(key), self._algorithm())
        return await arun(connection.get_async_client(), op)

    def _status_op(
        self, key: str | None, keys: PartitionKeys | None, config: SemaphoreConfig, limit: int
    ) -> Operation[PartitionStatus]:
        keys = keys or self._read_keys(key)
        if keys.shared:  # TOTAL's keys (by the keys: the settings may have changed since)
            total = control.total_in_force(config)
            if total is None:  # TOTAL removed from the settings since: its keys still say
                total = limit if config.total is None else config.total
            return inspection.total_status(keys, limit, total, config.timeout)
        return inspection.status(keys, ALGORITHMS[config.algorithm], limit, config.timeout)

    def status(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> PartitionStatus:
        """A :class:`~django_semaphore.engine.inspection.PartitionStatus` (limit in force, in use,
        free, waiting) of partition ``key`` (or ``keys``)."""
        config, client = self.config, connection.get_client()
        limit = control.effective(config, client).limit
        return run(client, self._status_op(key, keys, config, limit))

    async def astatus(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> PartitionStatus:
        """The asyncio twin of :meth:`status`."""
        config, client = self.config, connection.get_async_client()
        limit = (await control.aeffective(config, client)).limit
        return await arun(client, self._status_op(key, keys, config, limit))

    def statuses(self, keys: Sequence[PartitionKeys]) -> list[PartitionStatus]:
        """:meth:`status` of each partition of ``keys``, in order: the same figures, read
        :data:`~django_semaphore.engine.inspection.BATCH` partitions per round trip (per
        node on a cluster) instead of one round trip each
        (:func:`~django_semaphore.engine.inspection.batched`)."""
        config, client = self.config, connection.get_client()
        limit = control.effective(config, client).limit
        return run(client, inspection.batched([self._status_op(None, k, config, limit) for k in keys]))

    async def astatuses(self, keys: Sequence[PartitionKeys]) -> list[PartitionStatus]:
        """The asyncio twin of :meth:`statuses`."""
        config, client = self.config, connection.get_async_client()
        limit = (await control.aeffective(config, client)).limit
        return await arun(client, inspection.batched([self._status_op(None, k, config, limit) for k in keys]))

    def waiters(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> list[Waiter]:
        """The callers queued for partition ``key``, in serving order (priority, then arrival).

        Each :class:`~django_semaphore.engine.inspection.Waiter` has its meta (the
        caller's and the web layer's, as a holder's) and ``since``, when it
        queued (server time).  Only "lua" queues waiters: for the Redis in
        Action variants (their waiters poll, unseen) the list is always empty.
        """
        if not self._algorithm().queues:
            return []
        return run(connection.get_client(), inspection.waiters(keys or self._read_keys(key)))

    async def awaiters(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> list[Waiter]:
        """The asyncio twin of :meth:`waiters`."""
        if not self._algorithm().queues:
            return []
        return await arun(connection.get_async_client(), inspection.waiters(keys or self._read_keys(key)))

    # -- runtime control (django_semaphore.runtime.control) ------------------------------

    def effective(self, *, fresh: bool = False) -> Effective:
        """The limit and mode in force in this process, and their ``source``
        ("settings", "override", or "adaptive" for the limit of ADAPTIVE without
        an override): an :class:`~django_semaphore.runtime.control.Effective`.

        From this process's cache of the overrides (every process applies a
        change within a second); ``fresh=True`` reads Redis now.
        """
        config = self.config
        if fresh:
            return run(connection.get_client(), control.fresh(config))
        return control.effective(config)

    async def aeffective(self, *, fresh: bool = False) -> Effective:
        """The asyncio twin of :meth:`effective`."""
        config = self.config
        if fresh:
            return await arun(connection.get_async_client(), control.fresh(config))
        return await control.aeffective(config)

    def _changed(self, effective: Effective, user: Any) -> Effective:
        # The override is written and in force: a receiver that raises must not turn
        # it into a failure (a 500 without LogEntry, a command reporting an error).
        # send_robust, and each receiver's exception logged once, with its traceback.
        replies = signals.config_changed.send_robust(
            sender=type(self),
            semaphore=self,
            limit=effective.limit,
            mode=effective.mode,
            total=effective.total,
            user=user,
        )
        for receiver, reply in replies:
            if isinstance(reply, Exception):
                logging.getLogger("django_semaphore").error(
                    "django-semaphore: a config_changed receiver %r raised for semaphore %r "
                    "(the change is applied): %s: %s",
                    receiver,
                    self.name,
                    type(reply).__name__,
                    reply,
                    exc_info=reply,
                )
        return effective

    def override(
        self, limit: int | None = None, mode: str | None = None, total: int | None = None, *, user: Any = None
    ) -> Effective:
        """Override LIMIT, MODE and/or TOTAL at runtime, for every process (within a second).

        Only the values given change: ``override(mode="dry_run")`` keeps an
        earlier limit override.  ``limit`` is an int from 0 to 1,000,000
        (:data:`~django_semaphore.config.validation.MAX_LIMIT`; 0 pauses the
        semaphore: new callers are refused with reason "paused"; holders keep
        their slots); ``mode`` one of "enforce", "dry_run", "off"; ``total`` an int
        from 0 to 1,000,000, only for a semaphore with TOTAL.  Bad values
        (a str, float or bool limit included) raise ValueError and nothing is
        written, neither of them; an unknown semaphore raises
        ImproperlyConfigured.  ``user`` (who made the change) is stored with it
        and passed on by the ``config_changed`` signal.  Returns the
        configuration in force after the change.
        """
        config = self.config
        control.validate(limit, mode, total, config)
        effective = control.set_override(config, control.Change(limit, mode, total), user)
        return self._changed(effective, user)

    async def aoverride(
        self, limit: int | None = None, mode: str | None = None, total: int | None = None, *, user: Any = None
    ) -> Effective:
        """The asyncio twin of :meth:`override`."""
        config = self.config
        control.validate(limit, mode, total, config)
        effective = await control.aset_override(config, control.Change(limit, mode, total), user)
        return self._changed(effective, user)

    def clear_override(self, *, user: Any = None) -> Effective:
        """Remove the runtime override: back to the settings' LIMIT and MODE, in every process."""
        effective = control.set_override(self.config, control.CLEAR, user)
        return self._changed(effective, user)

    async def aclear_override(self, *, user: Any = None) -> Effective:
        """The asyncio twin of :meth:`clear_override`."""
        effective = await control.aset_override(self.config, control.CLEAR, user)
        return self._changed(effective, user)

    def passes_through(self) -> bool:
        """True when the guards let callers through without touching Redis: SEMAPHORE_ENABLED
        is False, or the mode in force is "off"."""
        if not settings.enabled():
            return True
        config = self.config
        if config.mode == "off":  # the settings say off: the cache only, never Redis
            return control.cached(config).mode == "off"
        return control.effective(config).mode == "off"

    async def apasses_through(self) -> bool:
        """The asyncio twin of :meth:`passes_through`."""
        if not settings.enabled():
            return True
        config = self.config
        if config.mode == "off":
            return control.cached(config).mode == "off"
        return (await control.aeffective(config)).mode == "off"

    def available(self, key: str | None = None) -> int:
        """How many permits of partition ``key`` are free now: the limit in force
        minus the permits held, never below 0.  With TOTAL: without a key, the
        free permits of the TOTAL; with one, the smaller of the partition's and
        the TOTAL's."""
        return self.status(key).free

    async def aavailable(self, key: str | None = None) -> int:
        """The asyncio twin of :meth:`available`."""
        return (await self.astatus(key)).free

    def partitions(self) -> list[PartitionKeys]:
        """PartitionKeys of every partition with keys in Redis (SCAN, never KEYS).

        With TOTAL: every partition that holds permits or has waiters (all of
        them in the keys of the whole name)."""
        return discovery.expand(discovery.partitions(self.name))

    async def apartitions(self) -> list[PartitionKeys]:
        """The asyncio twin of :meth:`partitions`."""
        return await discovery.aexpand(await discovery.apartitions(self.name))

    def purge_expired(self, dry_run: bool = False) -> int:
        """Remove expired entries from every partition; return how many were removed.

        With ``dry_run``, count them without removing them.  Live holders are
        never touched.
        """
        client, algorithm = connection.get_client(), self._algorithm()
        found = discovery.partitions(self.name)  # TOTAL: the whole name's keys, once
        return sum(run(client, inspection.purge(keys, algorithm, dry_run)) for keys in found)

    async def apurge_expired(self, dry_run: bool = False) -> int:
        """The asyncio twin of :meth:`purge_expired`."""
        client, algorithm = connection.get_async_client(), self._algorithm()
        total = 0
        for keys in await discovery.apartitions(self.name):
            total += await arun(client, inspection.purge(keys, algorithm, dry_run))
        return total

    def _force_release_op(
        self, identifier: str, key: str | None, keys: PartitionKeys | None
    ) -> Operation[bool]:
        # The "lua" release whatever the algorithm: it removes the holder from
        # every key of the layout the algorithms share, and wakes a waiter.
        config = self.config
        limit = control.cached(config).limit
        algorithm = algorithm_for(config) if config.total is not None else ALGORITHMS["lua"]
        return algorithm.release(keys or self.partition(key), limit, identifier)

    def force_release(
        self, identifier: str, key: str | None = None, *, keys: PartitionKeys | None = None
    ) -> bool:
        """Remove holder ``identifier`` (an operator's action). True if it was live."""
        return run(connection.get_client(), self._force_release_op(identifier, key, keys))

    async def aforce_release(
        self, identifier: str, key: str | None = None, *, keys: PartitionKeys | None = None
    ) -> bool:
        """The asyncio twin of :meth:`force_release`."""
        return await arun(connection.get_async_client(), self._force_release_op(identifier, key, keys))

    # -- decorating functions (django_semaphore.engine.guards) -------------------------

    do_not_call_in_templates = True  # a Semaphore is callable (a decorator), not a value getter

    def guard(
        self,
        key: str | Callable[..., str | None] | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        refresh: bool | None = None,
        permits: int = 1,
        priority: int = 0,
    ) -> FunctionGuard:
        """A decorator holding a slot for each call of a sync or async function.

        See :class:`~django_semaphore.guards.FunctionGuard` for the options; a refused
        call raises :class:`~django_semaphore.SemaphoreFull`.
        """
        return FunctionGuard(
            self, key=key, wait=wait, meta=meta, refresh=refresh, permits=permits, priority=priority
        )

    def __call__(self, func: F) -> F:
        """``@semaphore`` on a function: ``self.guard()(func)``."""
        return self.guard()(func)


class Lease:
    """A held slot. Release it, or refresh it before TIMEOUT runs out.

    ``token`` is a fencing token: strictly increasing per semaphore and
    partition.  ``identifier`` names the slot in Redis.  The lease belongs
    to the process that acquired it: in a child forked while it was held,
    ``refresh()`` and ``release()`` return False and leave the slot alone.
    """

    __slots__ = (
        "semaphore",
        "key",
        "identifier",
        "token",
        "acquired_ms",
        "expires_ms",
        "waited",
        "keys",
        "config",
        "over_limit",
        "permits",
        "slots",
        "ticket",
        "_started",
        "_done",
        "_lost",
        "_retrying",
        "_pid",
        "_handed_off",
        "_granted",
        "__weakref__",
    )

    def __init__(
        self,
        semaphore: Semaphore,
        key: str | None,
        identifier: str,
        granted: Granted,
        keys: PartitionKeys,
        config: SemaphoreConfig,
    ) -> None:
        self.semaphore = semaphore
        self.key = key
        self.identifier = identifier
        self.token = granted.token
        self.acquired_ms = granted.acquired_ms
        self.expires_ms = granted.expires_ms
        #: Seconds the caller waited for the slot (set by the acquire that made the lease).
        self.waited = 0.0
        #: The Redis keys of the partition held.
        self.keys = keys
        #: The semaphore's configuration when the slot was granted (TIMEOUT, algorithm...).
        self.config = config
        #: True only in MODE "dry_run" (or "off") when enforcing would have refused this caller.
        self.over_limit = granted.over_limit
        #: The slot numbers held, one per permit: distinct among the partition's
        #: live holders, in range(limit) (SLOTS True; empty otherwise).
        self.slots = granted.slots
        #: How many of the limit this lease holds.
        self.permits = granted.permits
        #: Its queue ticket number (server microseconds when it queued) if it
        #: waited in the queue, else "": with the token, the server's own
        #: record of arrival and grant order.
        self.ticket = granted.ticket
        self._granted = granted  # how to release it: see Algorithm.release
        self._started = time.monotonic()  # for the hold time (stats)
        self._done = False
        self._lost = False
        self._retrying = False  # a release went unanswered: recovery retries it
        self._pid = forks.pid()  # a lease belongs to the process that acquired it
        self._handed_off = False  # handoff(): another process refreshes and releases it

    def __repr__(self) -> str:
        return f"<Lease {self.semaphore.name!r} token={self.token} key={self.key!r}>"

    @property
    def name(self) -> str:
        """The semaphore's name."""
        return self.semaphore.name

    @property
    def acquired_at(self) -> datetime.datetime:
        """When the slot was granted (server time for the "lua" algorithm)."""
        return to_datetime(self.acquired_ms)

    @property
    def expires_at(self) -> datetime.datetime:
        """When the slot is lost unless refreshed (as of the last refresh)."""
        return to_datetime(self.expires_ms)

    @property
    def released(self) -> bool:
        """True once release() has been called."""
        return self._done

    @property
    def lost(self) -> bool:
        """True once a refresh or release found the slot gone."""
        return self._lost

    @property
    def handed_off(self) -> bool:
        """True once :meth:`handoff` gave the slot to another process."""
        return self._handed_off

    def handoff(self) -> str:
        """Hand the slot to another process: a ticket for :meth:`adopt` there.

        The ticket is signed with SECRET_KEY and expires with the lease.  From
        now on this process neither refreshes nor releases the slot (release()
        and refresh() return False): a guarded view's slot stays held after its
        response, until the adopter releases it or it expires.  ValueError if
        the lease was already released, lost or handed off.
        """
        if self._done or self._lost or self._handed_off or self._pid != forks.pid():
            raise ValueError(f"{self!r} is no longer held by this process: it cannot be handed off.")
        ticket = handoff.sign(
            handoff.Ticket(
                self.name,
                self.key,
                self.identifier,
                Granted(self.token, self.acquired_ms, self.expires_ms, False, self.slots, self.permits),
                self.keys,
                self.config.timeout,
                self.config.algorithm,
                self.config.limit if self.semaphore.ad_hoc else None,
                self.config.total if self.semaphore.ad_hoc else None,
            )
        )
        self._handed_off = True
        return ticket

    @classmethod
    def adopt(cls, ticket: str, *, verify: bool = True, meta: dict[str, Any] | None = None) -> Lease:
        """The lease a :meth:`handoff` ticket stands for, held by this process now.

        Same semaphore, partition, identifier and token: refresh() and
        release() work here.  With ``verify`` (the default) the slot is
        refreshed at once, which checks that it is still held (one round trip).
        ``meta`` (e.g. ``{"task_id": ...}``) is added to the meta stored with
        the holder, for the admin to show who holds it now.  A ticket is
        single-use: a second adopt raises
        :class:`~django_semaphore.handoff.AlreadyAdopted`.  Raises
        :class:`~django_semaphore.handoff.HandoffError` (a SemaphoreError) for
        a tampered, expired or malformed ticket, an unknown semaphore, one
        adopted already, or (``verify``) a slot no longer held.
        """
        return adopt_ticket(cls, ticket, verify, meta)

    @classmethod
    async def aadopt(cls, ticket: str, *, verify: bool = True, meta: dict[str, Any] | None = None) -> Lease:
        """The asyncio twin of :meth:`adopt`."""
        return await aadopt_ticket(cls, ticket, verify, meta)

    @property
    def _algorithm(self) -> Algorithm:
        return algorithm_for(self.config)

    def _after_refresh(self, expires: float | None) -> bool:
        if expires:
            self.expires_ms = int(expires)
            if self.semaphore.ad_hoc:  # a long run keeps its ad-hoc semaphore recorded
                adhoc.seen(settings.setting("SEMAPHORE_KEY_PREFIX"), self.config)
            return True
        self._mark_lost()
        return False

    def _mark_lost(self) -> None:
        if not self._lost:
            self._lost = True
            # The sender is the semaphore's class, as for every semaphore signal.
            signals.lease_lost.send(sender=type(self.semaphore), semaphore=self.semaphore, lease=self)

    def _after_release(self, held: bool) -> bool:
        """Settle the release with Redis's answer ``held``; one ``released`` signal.

        Also called from the recovery thread, for a release that went
        unanswered (:meth:`_hand_over_release`): the first answer, the
        thread's or the caller's own retry, settles it.  After an unanswered
        attempt, "not held" is ambiguous (that attempt may have run after all,
        or the slot expired during the outage): it is not reported as lost.
        """
        with _settling:
            already = self._done and not self._retrying
            retried = self._retrying
            self._done, self._retrying = True, False
        if not already:
            if not held and not retried:
                self._mark_lost()
            elif held and not retried:  # a hold that ended with its release: its length
                stats.record_hold(self.semaphore.name, time.monotonic() - self._started)
            if tally.counting:
                tally.released(self.semaphore.name, self.semaphore)
            signals.released.send(
                sender=type(self.semaphore), semaphore=self.semaphore, lease=self, held=held
            )
        return held

    def _hand_over_release(self) -> None:
        """The release failed or was interrupted: the recovery thread sends it
        again until Redis answers (or the slot has expired)."""
        with _settling:
            if self._done and not self._retrying:
                return  # settled meanwhile: an earlier attempt's retry got through
            self._done = self._retrying = True
        recovery.remember_release(self.config, self.keys, self.identifier, self._after_release)

    def _caller_release(self, held: bool) -> bool:
        if self._retrying:  # the caller's own retry got through: none in the background
            recovery.drop_release(self.identifier)
        return self._after_release(held)

    def _refresh_op(self) -> Operation[float | None]:
        return self._algorithm.refresh(self.keys, self.config.timeout_ms, self.identifier)

    def _release_op(self) -> Operation[bool]:
        # The grant lets "lua" record the hold time (for Retry-After estimates),
        # push its successor's grant, and give a quiet grant back with plain
        # commands.  The limit in force (an override) decides how many waiters to wake.
        limit = control.cached(self.config).limit
        return self._algorithm.release(self.keys, limit, self.identifier, self._granted)

    def _usable(self) -> bool:
        return not (self._done or self._lost or self._handed_off or self._pid != forks.pid())

    def refresh(self) -> bool:
        """Extend the lease by TIMEOUT. False if the slot was already lost.

        A lost slot is never re-acquired: the caller must stop relying on it.
        """
        if not self._usable():
            return False
        return self._after_refresh(run(connection.get_client(), self._refresh_op()))

    async def arefresh(self) -> bool:
        """The asyncio twin of :meth:`refresh`."""
        if not self._usable():
            return False
        return self._after_refresh(await arun(connection.get_async_client(), self._refresh_op()))

    def _releasable(self) -> bool:
        return self._pid == forks.pid() and not self._handed_off and not (self._done and not self._retrying)

    def release(self) -> bool:
        """Give the slot back. True if it was still held, False if it had been lost.

        If Redis fails, :class:`~django_semaphore.SemaphoreBackendError` is
        raised and the release is sent again in the background until Redis
        answers (:mod:`~django_semaphore.engine.recovery`); calling release() again
        retries it at once (False once it has gone through).
        """
        if not self._releasable():
            return False
        op = self._release_op()
        try:
            held = run(connection.get_client(), op)
        except BaseException:  # Redis failed, or interrupted: the release may not have run
            self._hand_over_release()
            raise
        return self._caller_release(held)

    async def arelease(self) -> bool:
        """The asyncio twin of :meth:`release`."""
        if not self._releasable():
            return False
        op = self._release_op()
        try:
            held = await arun(connection.get_async_client(), op)
        except BaseException:  # Redis failed, or cancelled: the release may not have run
            self._hand_over_release()
            raise
        return self._caller_release(held)


# -- adopting a ticket (Lease.adopt): the lease and its semaphore, rebuilt -------------------


def lease_from_ticket(lease_class: type[Lease], ticket: str) -> Lease:
    """The lease (of class ``lease_class``) a ticket stands for, in this process (no Redis round trip).

    HandoffError for a ticket :func:`handoff.read <django_semaphore.engine.handoff.read>` refuses,
    or whose semaphore this process cannot rebuild.
    """
    return _rebuilt(lease_class, handoff.read(ticket))


def _rebuilt(lease_class: type[Lease], found: handoff.Ticket) -> Lease:
    config = handoff.config_of(found)
    if found.limit is not None:  # ad hoc: rebuilt from the ticket
        semaphore = Semaphore(
            found.name,
            limit=config.limit,
            timeout=config.timeout,
            algorithm=config.algorithm,
            total=config.total,
        )
        config = semaphore.config
    else:
        semaphore = Semaphore(found.name)
    return lease_class(semaphore, found.key, found.identifier, found.granted, found.keys, config)


def _adopter(adopter: str | None) -> str:
    return adopter or os.urandom(8).hex()


def adopt_ticket(
    lease_class: type[Lease],
    ticket: str,
    verify: bool = True,
    meta: dict[str, Any] | None = None,
    adopter: str | None = None,
) -> Lease:
    """:meth:`Lease.adopt`: see there.

    ``adopter`` names who adopts (a Celery task id): the same adopter may adopt
    a ticket again; by default each call is an adopter of its own.
    """
    found = handoff.read(ticket)
    lease = _rebuilt(lease_class, found)
    client = connection.get_client()
    if verify and not lease.refresh():
        raise handoff.no_longer_held(found)
    if not run(
        client, handoff.claim_op(lease.keys, lease.identifier, lease.config.timeout, _adopter(adopter))
    ):
        raise handoff.already_adopted(found)
    if meta:
        run(client, handoff.annotate_op(lease.keys, lease.identifier, meta))
    return lease


async def aadopt_ticket(
    lease_class: type[Lease],
    ticket: str,
    verify: bool = True,
    meta: dict[str, Any] | None = None,
    adopter: str | None = None,
) -> Lease:
    """The asyncio twin of :func:`adopt_ticket`."""
    found = handoff.read(ticket)
    lease = _rebuilt(lease_class, found)
    client = connection.get_async_client()
    if verify and not await lease.arefresh():
        raise handoff.no_longer_held(found)
    claim = handoff.claim_op(lease.keys, lease.identifier, lease.config.timeout, _adopter(adopter))
    if not await arun(client, claim):
        raise handoff.already_adopted(found)
    if meta:
        await arun(client, handoff.annotate_op(lease.keys, lease.identifier, meta))
    return lease


class _Semaphores:
    """``semaphores["name"]``: the semaphores configured in SEMAPHORES."""

    def __getitem__(self, name: str) -> Semaphore:
        settings.get_config(name)  # ImproperlyConfigured for an unknown or invalid name
        return Semaphore(name)

    def __contains__(self, name: object) -> bool:
        return name in settings.names()

    def __iter__(self) -> Iterator[str]:
        return iter(settings.names())

    def __len__(self) -> int:
        return len(settings.names())

    def all(self) -> list[Semaphore]:
        """Every configured semaphore, in settings order."""
        return [Semaphore(name) for name in settings.names()]


semaphores = _Semaphores()


# Settles a release once, whether the caller's call or the recovery thread gets
# Redis's answer first (see Lease._after_release).
_settling = threading.Lock()


def _new_settling_lock() -> None:
    global _settling
    _settling = threading.Lock()  # it may have been held by a thread that did not survive fork()


forks.in_child(_new_settling_lock)
