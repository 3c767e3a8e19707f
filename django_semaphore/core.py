"""The engine's front: :class:`Semaphore` and the ``semaphores`` registry. No HTTP code lives here.

A Semaphore takes slots (:meth:`Semaphore.try_acquire` and its twins), each a
:class:`~django_semaphore.lease.Lease`, and reads its partitions
(:mod:`~django_semaphore.inspection`, :mod:`~django_semaphore.discovery`).
Every method that talks to Redis has an asyncio twin, named with an ``a``:
both run the same operations (:mod:`~django_semaphore.scripting`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from . import conf, connection, discovery, inspection, recovery, signals, waiting
from .algorithms import ALGORITHMS, Algorithm, Granted, Outcome
from .exceptions import SemaphoreBackendError, SemaphoreFull
from .guards import FunctionGuard
from .inspection import Holder, PartitionStatus
from .keys import PartitionKeys
from .lease import Lease
from .scripting import Client, Operation, arun, run
from .validation import validate_entry

if TYPE_CHECKING:
    from .validation import SemaphoreConfig

META_KEY_LENGTH = 64  # how much of a partition value is copied into meta

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
    pid = os.getpid()
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
    ) -> None:
        self.name = name
        self._config: SemaphoreConfig | None
        if limit is None:
            self._config = None
        else:
            config, problems = validate_entry(
                name, {"LIMIT": limit, "TIMEOUT": timeout, "WAIT": wait, "ALGORITHM": algorithm}
            )
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
        """The :class:`~django_semaphore.validation.SemaphoreConfig` in force now."""
        return self._config or conf.get_config(self.name)

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
        return ALGORITHMS[self.config.algorithm]

    def partition(self, key: str | None = None) -> PartitionKeys:
        """The Redis keys of partition ``key`` (None: the unpartitioned semaphore)."""
        return PartitionKeys.build(conf.setting("SEMAPHORE_KEY_PREFIX"), self.name, key)

    # -- acquire --------------------------------------------------------------

    def _prepare(
        self, key: str | None, wait: float | None, meta: dict[str, Any] | None
    ) -> tuple[SemaphoreConfig, float, PartitionKeys, str, str]:
        config = self.config
        wait = config.wait if wait is None else wait
        if not isinstance(wait, (int, float)) or wait < 0:
            raise ValueError(f"wait must be a number of seconds >= 0, not {wait!r}.")
        return config, wait, self.partition(key), new_identifier(), meta_json(meta, key)

    def _operation(
        self,
        config: SemaphoreConfig,
        wait: float,
        keys: PartitionKeys,
        identifier: str,
        meta: str,
        client: Client,
    ) -> Operation[Outcome]:
        algorithm = ALGORITHMS[config.algorithm]
        args = (keys, config.limit, config.timeout_ms, identifier, meta)
        if wait > 0:
            return waiting.wait_ops(algorithm, *args, wait, client)
        return algorithm.acquire(*args)

    def _outcome(
        self,
        outcome: Outcome,
        config: SemaphoreConfig,
        key: str | None,
        keys: PartitionKeys,
        identifier: str,
        started: float,
    ) -> tuple[Lease, None] | tuple[None, int]:
        waited = time.monotonic() - started
        if isinstance(outcome, Granted):
            lease = Lease(self, key, identifier, outcome, keys, config, waited)
            signals.acquired.send(sender=type(self), semaphore=self, lease=lease, waited=waited)
            return lease, None
        # For "lua", retry_after_ms is already an estimate from recent hold
        # times and the queue ahead, capped by the earliest expiry.
        retry_after = outcome.retry_after(config.timeout)
        signals.refused.send(
            sender=type(self), semaphore=self, key=key, retry_after=retry_after, waited=waited
        )
        return None, retry_after

    def try_acquire(
        self, key: str | None = None, wait: float | None = None, meta: dict[str, Any] | None = None
    ) -> tuple[Lease, None] | tuple[None, int]:
        """Like :meth:`acquire`, returning ``(lease, None)`` or ``(None, retry_after)``."""
        started = time.monotonic()
        config, wait, keys, identifier, meta_text = self._prepare(key, wait, meta)
        client = connection.get_client()
        mark = recovery.freed_mark()
        try:
            outcome = run(client, self._operation(config, wait, keys, identifier, meta_text, client))
            if recovery.pending() or recovery.freed_mark() != mark:
                # Redis answers again after failing this process: its unanswered
                # acquires and releases may hold slots.  Inline, only a little of
                # this partition's, and only to turn a refusal into a grant; the
                # recovery thread does the rest.
                if not isinstance(outcome, Granted) and recovery.give_back_partition(client, keys, mark):
                    outcome = run(client, self._operation(config, 0, keys, identifier, meta_text, client))
                recovery.kick()
        except SemaphoreBackendError:
            recovery.remember_acquire(config, keys, identifier)
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, a timeout from outside): the slot
            # may have been granted with the reply unread, and a waiter's ticket
            # would hold up the queue until it expires. Give both back now (if
            # Redis fails, the recovery thread does).
            recovery.forget_now(client, config, keys, identifier)
            raise
        return self._outcome(outcome, config, key, keys, identifier, started)

    async def atry_acquire(
        self, key: str | None = None, wait: float | None = None, meta: dict[str, Any] | None = None
    ) -> tuple[Lease, None] | tuple[None, int]:
        """The asyncio twin of :meth:`try_acquire`."""
        started = time.monotonic()
        config, wait, keys, identifier, meta_text = self._prepare(key, wait, meta)
        client = connection.get_async_client()
        mark = recovery.freed_mark()
        try:
            outcome = await arun(client, self._operation(config, wait, keys, identifier, meta_text, client))
            if recovery.pending() or recovery.freed_mark() != mark:  # see try_acquire
                refused = not isinstance(outcome, Granted)
                if refused and await recovery.agive_back_partition(client, keys, mark):
                    again = self._operation(config, 0, keys, identifier, meta_text, client)
                    outcome = await arun(client, again)
                recovery.kick()
        except SemaphoreBackendError:
            recovery.remember_acquire(config, keys, identifier)
            raise
        except BaseException:  # cancelled: see try_acquire
            await recovery.aforget_now(client, config, keys, identifier)
            raise
        return self._outcome(outcome, config, key, keys, identifier, started)

    def acquire(
        self, key: str | None = None, wait: float | None = None, meta: dict[str, Any] | None = None
    ) -> Lease | None:
        """Take a slot: a :class:`~django_semaphore.lease.Lease`, or None when none is free.

        ``key`` is the partition value (None: the whole semaphore), ``wait``
        how many seconds to queue for a slot (None: the configured WAIT),
        ``meta`` a small JSON-serialisable dict stored with the holder.
        Raises :class:`~django_semaphore.SemaphoreBackendError` if Redis fails.
        """
        return self.try_acquire(key, wait, meta)[0]

    async def aacquire(
        self, key: str | None = None, wait: float | None = None, meta: dict[str, Any] | None = None
    ) -> Lease | None:
        """The asyncio twin of :meth:`acquire`."""
        return (await self.atry_acquire(key, wait, meta))[0]

    @contextlib.contextmanager
    def hold(
        self, key: str | None = None, wait: float | None = None, meta: dict[str, Any] | None = None
    ) -> Iterator[Lease]:
        """Hold a slot for the ``with`` block; raise SemaphoreFull if none is free."""
        lease, retry_after = self.try_acquire(key, wait, meta)
        if lease is None:
            assert retry_after is not None  # (None, retry_after) when refused
            raise SemaphoreFull(self.name, retry_after, key)
        try:
            yield lease
        finally:
            lease.release()

    @contextlib.asynccontextmanager
    async def ahold(
        self, key: str | None = None, wait: float | None = None, meta: dict[str, Any] | None = None
    ) -> AsyncIterator[Lease]:
        """The asyncio twin of :meth:`hold`."""
        lease, retry_after = await self.atry_acquire(key, wait, meta)
        if lease is None:
            assert retry_after is not None  # (None, retry_after) when refused
            raise SemaphoreFull(self.name, retry_after, key)
        try:
            yield lease
        finally:
            await lease.arelease()

    # -- inspection -------------------------------------------------------------

    def holders(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> list[Holder]:
        """Live holders of partition ``key``, in token order (oldest first).

        ``keys`` (a PartitionKeys from :meth:`partitions`) may stand for ``key``.
        """
        op = inspection.holders(keys or self.partition(key), self._algorithm())
        return run(connection.get_client(), op)

    async def aholders(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> list[Holder]:
        """The asyncio twin of :meth:`holders`."""
        op = inspection.holders(keys or self.partition(key), self._algorithm())
        return await arun(connection.get_async_client(), op)

    def _status_op(self, key: str | None, keys: PartitionKeys | None) -> Operation[PartitionStatus]:
        config = self.config
        return inspection.status(
            keys or self.partition(key), ALGORITHMS[config.algorithm], config.limit, config.timeout
        )

    def status(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> PartitionStatus:
        """A :class:`~django_semaphore.inspection.PartitionStatus` (limit, in use, free,
        waiting) of partition ``key`` (or ``keys``)."""
        return run(connection.get_client(), self._status_op(key, keys))

    async def astatus(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> PartitionStatus:
        """The asyncio twin of :meth:`status`."""
        return await arun(connection.get_async_client(), self._status_op(key, keys))

    def available(self, key: str | None = None) -> int:
        """How many slots of partition ``key`` are free now."""
        return self.status(key).free

    async def aavailable(self, key: str | None = None) -> int:
        """The asyncio twin of :meth:`available`."""
        return (await self.astatus(key)).free

    def partitions(self) -> list[PartitionKeys]:
        """PartitionKeys of every partition with keys in Redis (SCAN, never KEYS)."""
        return discovery.partitions(self.name)

    async def apartitions(self) -> list[PartitionKeys]:
        """The asyncio twin of :meth:`partitions`."""
        return await discovery.apartitions(self.name)

    def purge_expired(self, dry_run: bool = False) -> int:
        """Remove expired entries from every partition; return how many were removed.

        With ``dry_run``, count them without removing them.  Live holders are
        never touched.
        """
        client, algorithm = connection.get_client(), self._algorithm()
        return sum(run(client, inspection.purge(keys, algorithm, dry_run)) for keys in self.partitions())

    async def apurge_expired(self, dry_run: bool = False) -> int:
        """The asyncio twin of :meth:`purge_expired`."""
        client, algorithm = connection.get_async_client(), self._algorithm()
        total = 0
        for keys in await self.apartitions():
            total += await arun(client, inspection.purge(keys, algorithm, dry_run))
        return total

    def _force_release_op(
        self, identifier: str, key: str | None, keys: PartitionKeys | None
    ) -> Operation[bool]:
        # The "lua" release whatever the algorithm: it removes the holder from
        # every key of the layout the algorithms share, and wakes a waiter.
        return ALGORITHMS["lua"].release(keys or self.partition(key), self.config.limit, identifier)

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

    # -- decorating functions (django_semaphore.guards) -------------------------

    do_not_call_in_templates = True  # a Semaphore is callable (a decorator), not a value getter

    def guard(
        self,
        key: str | Callable[..., str | None] | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        refresh: bool | None = None,
    ) -> FunctionGuard:
        """A decorator holding a slot for each call of a sync or async function.

        See :class:`~django_semaphore.guards.FunctionGuard` for the options; a refused
        call raises :class:`~django_semaphore.SemaphoreFull`.
        """
        return FunctionGuard(self, key=key, wait=wait, meta=meta, refresh=refresh)

    def __call__(self, func: F) -> F:
        """``@semaphore`` on a function: ``self.guard()(func)``."""
        return self.guard()(func)


class _Semaphores:
    """``semaphores["name"]``: the semaphores configured in SEMAPHORES."""

    def __getitem__(self, name: str) -> Semaphore:
        conf.get_config(name)  # ImproperlyConfigured for an unknown or invalid name
        return Semaphore(name)

    def __contains__(self, name: object) -> bool:
        return name in conf.names()

    def __iter__(self) -> Iterator[str]:
        return iter(conf.names())

    def __len__(self) -> int:
        return len(conf.names())

    def all(self) -> list[Semaphore]:
        """Every configured semaphore, in settings order."""
        return [Semaphore(name) for name in conf.names()]


semaphores = _Semaphores()
