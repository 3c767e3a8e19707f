"""The engine: Semaphore, Lease and Holder. No HTTP code lives here."""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    from .conf import SemaphoreConfig
    from .guards import Guard

from redis.exceptions import RedisError

from . import conf, connection, recovery, signals, waiting
from .algorithms import ALGORITHMS, Basic, Granted, Lua, Outcome, purge, status
from .algorithms import holders as holders_op
from .exceptions import SemaphoreBackendError, SemaphoreFull
from .keys import PartitionKeys, partition_keys_from_timeouts, timeouts_pattern
from .scripting import Client, Operation, _backend_error, arun, run

META_KEY_LENGTH = 64  # how much of a partition value is copied into meta

F = TypeVar("F", bound=Callable[..., Any])


def _new_identifier() -> str:
    return os.urandom(16).hex()


def _to_datetime(ms: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000.0, tz=datetime.UTC)


_process: tuple[int | None, str | None, str] = (
    None,
    None,
    "",
)  # (pid, host, JSON of {"host", "pid"}) of this process


def _meta_json(meta: dict[str, Any] | None, key: object) -> str:
    """The JSON stored with a holder: the caller's meta plus host and pid."""
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


class Holder(NamedTuple):
    """One live holder of a semaphore, as read from Redis."""

    identifier: str
    token: int
    acquired_at: datetime.datetime | None  # None only for a malformed record
    expires_at: datetime.datetime
    meta: dict[str, Any]


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
        "_keys",
        "_config",
        "_done",
        "_lost",
        "_retrying",
        "_pid",
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
        waited: float = 0.0,
    ) -> None:
        self.semaphore = semaphore
        self.key = key
        self.identifier = identifier
        self.token = granted.token
        self.acquired_ms = granted.acquired_ms
        self.expires_ms = granted.expires_ms
        self.waited = waited
        self._keys = keys
        self._config = config
        self._done = False
        self._lost = False
        self._retrying = False  # a release went unanswered: recovery retries it
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return f"<Lease {self.semaphore.name!r} token={self.token} key={self.key!r}>"

    @property
    def name(self) -> str:
        return self.semaphore.name

    @property
    def acquired_at(self) -> datetime.datetime:
        """When the slot was granted (server time for the "lua" algorithm)."""
        return _to_datetime(self.acquired_ms)

    @property
    def expires_at(self) -> datetime.datetime:
        """When the slot is lost unless refreshed (as of the last refresh)."""
        return _to_datetime(self.expires_ms)

    @property
    def released(self) -> bool:
        """True once release() has been called."""
        return self._done

    @property
    def lost(self) -> bool:
        """True once a refresh or release found the slot gone."""
        return self._lost

    def _algorithm(self) -> type[Lua] | type[Basic]:
        return ALGORITHMS[self._config.algorithm]

    def _after_refresh(self, expires: Any) -> bool:
        if expires:
            self.expires_ms = int(expires)
            return True
        self._mark_lost()
        return False

    def _mark_lost(self) -> None:
        if not self._lost:
            self._lost = True
            signals.lease_lost.send(sender=Semaphore, semaphore=self.semaphore, lease=self)

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
            signals.released.send(sender=Semaphore, semaphore=self.semaphore, lease=self, held=held)
        return held

    def _hand_over_release(self) -> None:
        """The release failed or was interrupted: the recovery thread sends it
        again until Redis answers (or the slot has expired)."""
        with _settling:
            if self._done and not self._retrying:
                return  # settled meanwhile: an earlier attempt's retry got through
            self._done = self._retrying = True
        recovery.remember_release(self._config, self._keys, self.identifier, self._after_release)

    def _caller_release(self, held: bool) -> bool:
        if self._retrying:  # the caller's own retry got through: none in the background
            recovery.drop_release(self.identifier)
        return self._after_release(held)

    def refresh(self) -> bool:
        """Extend the lease by TIMEOUT. False if the slot was already lost.

        A lost slot is never re-acquired: the caller must stop relying on it.
        """
        if self._done or self._lost or self._pid != os.getpid():
            return False
        op = self._algorithm().refresh(self._keys, self._config.timeout_ms, self.identifier)
        return self._after_refresh(run(connection.get_client(), op))

    async def arefresh(self) -> bool:
        """The asyncio twin of :meth:`refresh`."""
        if self._done or self._lost or self._pid != os.getpid():
            return False
        op = self._algorithm().refresh(self._keys, self._config.timeout_ms, self.identifier)
        return self._after_refresh(await arun(connection.get_async_client(), op))

    def release(self) -> bool:
        """Give the slot back. True if it was still held, False if it had been lost.

        If Redis fails, :class:`~django_semaphore.SemaphoreBackendError` is
        raised and the release is sent again in the background until Redis
        answers (:mod:`~django_semaphore.recovery`); calling release() again
        retries it at once (False once it has gone through).
        """
        if self._pid != os.getpid() or (self._done and not self._retrying):
            return False
        op = _release_op(self)
        try:
            held = run(connection.get_client(), op)
        except BaseException:  # Redis failed, or interrupted: the release may not have run
            self._hand_over_release()
            raise
        return self._caller_release(held)

    async def arelease(self) -> bool:
        """The asyncio twin of :meth:`release`."""
        if self._pid != os.getpid() or (self._done and not self._retrying):
            return False
        op = _release_op(self)
        try:
            held = await arun(connection.get_async_client(), op)
        except BaseException:  # Redis failed, or cancelled: the release may not have run
            self._hand_over_release()
            raise
        return self._caller_release(held)


class PartitionStatus(NamedTuple):
    """Figures of one partition, read at one instant of server time."""

    key_hash: str
    limit: int
    in_use: int
    waiting: int
    retry_after: int  # seconds until the earliest lease ends (0 if none held)

    @property
    def free(self) -> int:
        return max(0, self.limit - self.in_use)


def _retry_after_seconds(retry_ms: float, timeout: float) -> int:
    """Retry-After in whole seconds >= 1 from a refusal's ``retry_after_ms``
    (for "lua" already an estimate from recent hold times and the queue ahead,
    capped by the earliest expiry), and at most the caller's own TIMEOUT."""
    return max(1, min(math.ceil(retry_ms / 1000.0), math.ceil(timeout)))


def _release_op(lease: Lease) -> Operation[bool]:
    """The release of ``lease``; "lua" also records the hold time (for Retry-After)."""
    algorithm = lease._algorithm()
    if algorithm is Lua:
        return Lua.release(lease._keys, lease._config.limit, lease.identifier, lease.acquired_ms)
    return algorithm.release(lease._keys, lease._config.limit, lease.identifier)


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
            config, problems = conf.validate_entry(
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
        """The :class:`~django_semaphore.conf.SemaphoreConfig` in force now."""
        return self._config or conf.get_config(self.name)

    @property
    def limit(self) -> int:
        return self.config.limit

    @property
    def timeout(self) -> float:
        return self.config.timeout

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
        return config, wait, self.partition(key), _new_identifier(), _meta_json(meta, key)

    def _operation(
        self,
        config: SemaphoreConfig,
        wait: float,
        keys: PartitionKeys,
        identifier: str,
        meta_json: str,
        client: Client,
    ) -> Operation[Outcome]:
        algorithm = ALGORITHMS[config.algorithm]
        args = (keys, config.limit, config.timeout_ms, identifier, meta_json)
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
            signals.acquired.send(sender=Semaphore, semaphore=self, lease=lease, waited=waited)
            return lease, None
        retry_after = _retry_after_seconds(outcome.retry_after_ms, config.timeout)
        signals.refused.send(
            sender=Semaphore, semaphore=self, key=key, retry_after=retry_after, waited=waited
        )
        return None, retry_after

    def try_acquire(
        self, key: str | None = None, wait: float | None = None, meta: dict[str, Any] | None = None
    ) -> tuple[Lease, None] | tuple[None, int]:
        """Like :meth:`acquire`, returning ``(lease, None)`` or ``(None, retry_after)``."""
        started = time.monotonic()
        config, wait, keys, identifier, meta_json = self._prepare(key, wait, meta)
        client = connection.get_client()
        mark = recovery.freed_mark()
        try:
            outcome = run(client, self._operation(config, wait, keys, identifier, meta_json, client))
            if recovery.pending() or recovery.freed_mark() != mark:
                # Redis answers again after failing this process: its unanswered
                # acquires and releases may hold slots.  Inline, only a little of
                # this partition's, and only to turn a refusal into a grant; the
                # recovery thread does the rest.
                if not isinstance(outcome, Granted) and recovery.give_back_partition(client, keys, mark):
                    outcome = run(client, self._operation(config, 0, keys, identifier, meta_json, client))
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
        config, wait, keys, identifier, meta_json = self._prepare(key, wait, meta)
        client = connection.get_async_client()
        mark = recovery.freed_mark()
        try:
            outcome = await arun(client, self._operation(config, wait, keys, identifier, meta_json, client))
            if recovery.pending() or recovery.freed_mark() != mark:  # see try_acquire
                refused = not isinstance(outcome, Granted)
                if refused and await recovery.agive_back_partition(client, keys, mark):
                    again = self._operation(config, 0, keys, identifier, meta_json, client)
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
        """Take a slot: a :class:`Lease`, or None when none is free.

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

    def _holders(self, raw: tuple[int, list[tuple[Any, Any, Any]]]) -> list[Holder]:
        now_ms, rows = raw
        result = []
        meta: Any
        for identifier, expires_ms, rec in rows:
            rec = rec.decode("utf-8", "replace") if isinstance(rec, bytes) else rec
            token, acquired, meta = (rec.split(":", 2) + ["", "", ""])[:3]
            try:
                meta = json.loads(meta) if meta else {}
            except ValueError:
                meta = {"raw": meta}
            result.append(
                Holder(
                    identifier.decode() if isinstance(identifier, bytes) else identifier,
                    int(token) if token.isdigit() else 0,
                    _to_datetime(int(acquired)) if acquired.isdigit() else None,
                    _to_datetime(int(expires_ms)),
                    meta,
                )
            )
        # The owner ZSET scores are doubles: beyond 2**53 neighbouring tokens
        # can share a score, so the exact tokens settle the order.
        result.sort(key=lambda holder: holder.token)
        return result

    def holders(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> list[Holder]:
        """Live holders of partition ``key``, in token order (oldest first).

        ``keys`` (a PartitionKeys from :meth:`partitions`) may stand for ``key``.
        """
        op = holders_op(keys or self.partition(key), self.config.algorithm)
        return self._holders(run(connection.get_client(), op))

    async def aholders(self, key: str | None = None) -> list[Holder]:
        """The asyncio twin of :meth:`holders`."""
        op = holders_op(self.partition(key), self.config.algorithm)
        return self._holders(await arun(connection.get_async_client(), op))

    def _status(self, keys: PartitionKeys, raw: tuple[int, ...]) -> PartitionStatus:
        now_ms, live, waiters, earliest = raw
        retry = _retry_after_seconds(earliest - now_ms, self.config.timeout) if earliest >= 0 else 0
        return PartitionStatus(keys.partition_hash.split(".", 1)[1], self.config.limit, live, waiters, retry)

    def status(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> PartitionStatus:
        """A :class:`PartitionStatus` (limit, in use, free, waiting) of partition ``key``."""
        keys = keys or self.partition(key)
        return self._status(keys, run(connection.get_client(), status(keys, self.config.algorithm)))

    def available(self, key: str | None = None) -> int:
        """How many slots of partition ``key`` are free now."""
        return self.status(key).free

    async def aavailable(self, key: str | None = None) -> int:
        """The asyncio twin of :meth:`available`."""
        keys = self.partition(key)
        op = status(keys, self.config.algorithm)
        return self._status(keys, await arun(connection.get_async_client(), op)).free

    def partitions(self) -> list[PartitionKeys]:
        """PartitionKeys of every partition with keys in Redis (SCAN, never KEYS)."""
        pattern = timeouts_pattern(conf.setting("SEMAPHORE_KEY_PREFIX"), self.name)
        client = connection.get_client()
        found: dict[str, PartitionKeys] = {}
        for key in _scan(client, pattern):
            keys = partition_keys_from_timeouts(key)
            found[keys.base] = keys
        return list(found.values())

    def purge_expired(self, dry_run: bool = False) -> int:
        """Remove expired entries from every partition; return how many were removed."""
        client = connection.get_client()
        algorithm = self.config.algorithm
        return sum(run(client, purge(keys, dry_run, algorithm)) for keys in self.partitions())

    async def apurge_expired(self, dry_run: bool = False) -> int:
        """The asyncio twin of :meth:`purge_expired`."""
        client = connection.get_async_client()
        pattern = timeouts_pattern(conf.setting("SEMAPHORE_KEY_PREFIX"), self.name)
        total, seen = 0, set[str]()
        try:
            async for key in connection.ascan_iter(client, pattern):
                keys = partition_keys_from_timeouts(key)
                if keys.base not in seen:
                    seen.add(keys.base)
                    total += await arun(client, purge(keys, dry_run, self.config.algorithm))
        except (RedisError, OSError) as exc:
            raise _backend_error(client, exc) from exc
        return total

    def force_release(
        self, identifier: str, key: str | None = None, *, keys: PartitionKeys | None = None
    ) -> bool:
        """Remove holder ``identifier`` (an operator's action). True if it was live."""
        keys = keys or self.partition(key)
        algorithm = ALGORITHMS["lua"]
        return run(connection.get_client(), algorithm.release(keys, self.config.limit, identifier))

    # -- decorating functions (django_semaphore.guards) -------------------------

    do_not_call_in_templates = True  # a Semaphore is callable (a decorator), not a value getter

    def guard(
        self,
        key: str | Callable[..., str | None] | None = None,
        wait: float | None = None,
        meta: dict[str, Any] | None = None,
        refresh: bool | None = None,
    ) -> Guard:
        """A decorator holding a slot for each call of a sync or async function.

        See :class:`~django_semaphore.guards.Guard` for the options; a refused
        call raises :class:`~django_semaphore.SemaphoreFull`.
        """
        from .guards import Guard

        return Guard(self, key=key, wait=wait, meta=meta, refresh=refresh)

    def __call__(self, func: F) -> F:
        """``@semaphore`` on a function: ``self.guard()(func)``."""
        return self.guard()(func)


# Settles a release once, whether the caller's call or the recovery thread gets
# Redis's answer first (see Lease._after_release).
_settling = threading.Lock()


def _new_settling_lock() -> None:
    global _settling
    _settling = threading.Lock()  # it may have been held by a thread that did not survive fork()


os.register_at_fork(after_in_child=_new_settling_lock)


def _scan(client: Client, pattern: str) -> Iterator[bytes]:
    try:
        yield from connection.scan_iter(client, pattern)
    except Exception as exc:
        from redis.exceptions import RedisError

        from .scripting import _backend_error

        if isinstance(exc, RedisError):
            raise _backend_error(client, exc) from exc
        raise


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
