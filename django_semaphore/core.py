"""The engine: Semaphore, Lease and Holder. No HTTP code lives here."""

from __future__ import annotations

import collections
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

from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.exceptions import RedisError

from . import conf, connection, signals, waiting
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
    return datetime.datetime.fromtimestamp(ms / 1000.0, tz=datetime.timezone.utc)


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
        already = self._done
        self._done = True
        if not held and not already:
            self._mark_lost()
        if not already:
            signals.released.send(sender=Semaphore, semaphore=self.semaphore, lease=self, held=held)
        return held

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
        """Give the slot back. True if it was still held, False if it had been lost."""
        if self._done or self._pid != os.getpid():
            return False
        op = self._algorithm().release(self._keys, self._config.limit, self.identifier)
        return self._after_release(run(connection.get_client(), op))

    async def arelease(self) -> bool:
        """The asyncio twin of :meth:`release`."""
        if self._done or self._pid != os.getpid():
            return False
        op = self._algorithm().release(self._keys, self._config.limit, self.identifier)
        return self._after_release(await arun(connection.get_async_client(), op))


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
    return max(1, min(math.ceil(retry_ms / 1000.0), math.ceil(timeout)))


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
        try:
            outcome = run(client, self._operation(config, wait, keys, identifier, meta_json, client))
            if _unanswered and _forget_unanswered(client, keys) and not isinstance(outcome, Granted):
                outcome = run(client, self._operation(config, 0, keys, identifier, meta_json, client))
        except SemaphoreBackendError:
            _unanswered.add(config, keys, identifier)
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, a timeout from outside): the slot
            # may have been granted with the reply unread, and a waiter's ticket
            # would hold up the queue until it expires. Give both back now.
            with contextlib.suppress(Exception):
                run(client, _forget(config, keys, identifier))
            raise
        return self._outcome(outcome, config, key, keys, identifier, started)

    async def atry_acquire(
        self, key: str | None = None, wait: float | None = None, meta: dict[str, Any] | None = None
    ) -> tuple[Lease, None] | tuple[None, int]:
        """The asyncio twin of :meth:`try_acquire`."""
        started = time.monotonic()
        config, wait, keys, identifier, meta_json = self._prepare(key, wait, meta)
        client = connection.get_async_client()
        try:
            outcome = await arun(client, self._operation(config, wait, keys, identifier, meta_json, client))
            if _unanswered and await _aforget_unanswered(client, keys) and not isinstance(outcome, Granted):
                outcome = await arun(client, self._operation(config, 0, keys, identifier, meta_json, client))
        except SemaphoreBackendError:
            _unanswered.add(config, keys, identifier)
            raise
        except BaseException:  # cancelled: see try_acquire
            with contextlib.suppress(Exception):
                await arun(client, _forget(config, keys, identifier))
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
        return self._holders(run(connection.get_client(), holders_op(keys or self.partition(key))))

    async def aholders(self, key: str | None = None) -> list[Holder]:
        """The asyncio twin of :meth:`holders`."""
        return self._holders(await arun(connection.get_async_client(), holders_op(self.partition(key))))

    def _status(self, keys: PartitionKeys, raw: tuple[int, ...]) -> PartitionStatus:
        now_ms, live, waiters, earliest = raw
        retry = _retry_after_seconds(earliest - now_ms, self.config.timeout) if earliest >= 0 else 0
        return PartitionStatus(keys.partition_hash.split(".", 1)[1], self.config.limit, live, waiters, retry)

    def status(self, key: str | None = None, *, keys: PartitionKeys | None = None) -> PartitionStatus:
        """A :class:`PartitionStatus` (limit, in use, free, waiting) of partition ``key``."""
        keys = keys or self.partition(key)
        return self._status(keys, run(connection.get_client(), status(keys)))

    def available(self, key: str | None = None) -> int:
        """How many slots of partition ``key`` are free now."""
        return self.status(key).free

    async def aavailable(self, key: str | None = None) -> int:
        """The asyncio twin of :meth:`available`."""
        keys = self.partition(key)
        return self._status(keys, await arun(connection.get_async_client(), status(keys))).free

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
        return sum(run(client, purge(keys, dry_run)) for keys in self.partitions())

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
                    total += await arun(client, purge(keys, dry_run))
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


class _Unanswered:
    """Acquires that failed on a backend error, whose script may still run.

    A hung Redis (paused, or behind a stalled network) executes the commands it
    had buffered once it resumes: an acquire the client gave up on can then
    grant a slot that nobody will release before TIMEOUT.  The next acquire
    that reaches Redis in this process gives those slots (and tickets) back,
    and if it was refused while one of them held a slot of its own partition,
    tries once more.  Best effort: a buffered acquire that Redis runs after
    that is not seen.  Entries are kept until a call reaches Redis (at most
    MAX), however old: a buffered acquire runs when Redis resumes, however
    late, and the lease it grants lasts TIMEOUT from then.
    """

    MAX = 1000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: collections.deque[tuple[float, SemaphoreConfig, PartitionKeys, str]] = collections.deque(
            maxlen=self.MAX
        )

    def __bool__(self) -> bool:
        return bool(self._items)

    def add(self, config: SemaphoreConfig, keys: PartitionKeys, identifier: str) -> None:
        with self._lock:
            self._items.append((time.monotonic() + config.timeout + 1, config, keys, identifier))

    def take(self) -> list[tuple[float, SemaphoreConfig, PartitionKeys, str]]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items

    def put_back(self, items: list[tuple[float, SemaphoreConfig, PartitionKeys, str]]) -> None:
        with self._lock:
            self._items.extendleft(reversed(items))

    def clear(self) -> None:
        self._lock = threading.Lock()
        self._items = collections.deque(maxlen=self.MAX)


_unanswered = _Unanswered()
os.register_at_fork(after_in_child=_unanswered.clear)


@receiver(setting_changed)
def _forget_other_servers(*, setting: str, **kwargs: Any) -> None:
    # Entries about another server or key prefix are of no use any more.
    if setting in ("SEMAPHORE_REDIS", "CACHES", "SEMAPHORE_KEY_PREFIX"):
        _unanswered.clear()


def _forget_unanswered(client: Client, keys: PartitionKeys) -> bool:
    """Give back what unanswered acquires took; True if one held a slot of ``keys``."""
    freed = False
    items = _unanswered.take()
    for index, (_, config, orphan_keys, identifier) in enumerate(items):
        try:
            held = run(client, _forget(config, orphan_keys, identifier))
        except SemaphoreBackendError:
            _unanswered.put_back(items[index:])
            break
        freed = freed or (held and orphan_keys == keys)
    return freed


async def _aforget_unanswered(client: Client, keys: PartitionKeys) -> bool:
    """The asyncio twin of :func:`_forget_unanswered`."""
    freed = False
    items = _unanswered.take()
    for index, (_, config, orphan_keys, identifier) in enumerate(items):
        try:
            held = await arun(client, _forget(config, orphan_keys, identifier))
        except SemaphoreBackendError:
            _unanswered.put_back(items[index:])
            break
        freed = freed or (held and orphan_keys == keys)
    return freed


def _forget(config: SemaphoreConfig, keys: PartitionKeys, identifier: str) -> Operation[bool]:
    """Undo an acquire whose answer was lost: release a slot it may hold, drop its
    ticket; True if it held a slot."""
    algorithm = ALGORITHMS[config.algorithm]
    held = yield from algorithm.release(keys, config.limit, identifier)
    if algorithm.queues:
        yield from algorithm.abandon(keys, config.limit, identifier)
    return held


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
