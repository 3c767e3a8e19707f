"""Runtime control: overrides of LIMIT, MODE and TOTAL kept in Redis, and the configuration in force.

An override (:meth:`Semaphore.override <django_semaphore.Semaphore.override>`)
is one field of the HASH ``<prefix>:control`` (:func:`~django_semaphore.backend.keys.control_key`):
semaphore name -> JSON ``{"limit": int|null, "mode": str|null, "total": int|null,
"at": epoch ms, "by": str}``.  It is configuration, not a partition: the key has no TTL.
A limit or a total is an int from 0 to :data:`~django_semaphore.config.validation.MAX_LIMIT`:
anything else is refused before it is written (and by the script that
writes it), and one found out of range in the HASH is read as the nearest
bound (:func:`stored_limit`), never as "no override".  A total is only taken
for a semaphore with TOTAL (and only applies to one).

Every process keeps the overrides of each prefix it uses in memory (the
*cache*), so an acquire reads the limit and mode in force without a Redis
round trip.  The ``control`` job of the process's background scheduler
(:mod:`~django_semaphore.runtime.scheduler`, scheduled at the first use, and
again at the first use in a forked child) refreshes the cache of every prefix
used in the last ``KEEP_POLLING`` seconds with one HGETALL each, every
``POLL_INTERVAL`` seconds, in one pipeline with the flush of
:mod:`~django_semaphore.runtime.stats`: a change reaches every process within a poll
interval plus a round trip (under a second).  The first use of a prefix in a
process (an empty cache) reads the overrides at once, on the caller's client
(sync or asyncio), so that a brand-new worker never ignores a pause; a
prefix not used for ``KEEP_POLLING`` seconds is dropped and read again at its
next use.  When Redis fails, the last overrides known are kept, the failure is
logged once per burst at WARNING, and the next tick tries again.

The same HGETALL brings the state of each adaptive limit
(:mod:`django_semaphore.runtime.adaptive`), kept in reserved fields of the same HASH,
and the same pipeline first sends each adaptive semaphore's window of samples
to its controller (one EVALSHA each, on the same key), so that a new adaptive
limit is read in the tick that made it.

The configuration in force (:class:`Effective`) is the override's limit,
mode and total where set, the settings' otherwise; for an adaptive semaphore
(ADAPTIVE), the limit without a limit override is the adaptive one (LIMIT
clamped into [MIN, MAX] before its first update), ``source == "adaptive"``.
``source`` is "override" whenever an override is in force (of the limit, the
mode, the total or several).  The total is None for a semaphore without TOTAL,
whatever is stored.  SEMAPHORE_ENABLED = False makes the mode "off" whatever else
says.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..backend import connection, forks
from ..backend.keys import control_key
from ..backend.scripting import Client, Command, LuaScript, Operation, Pipe, Script, arun, execute, run
from ..config import settings
from ..config.validation import MAX_LIMIT, MODES, checked_limit
from . import adaptive, stats
from .bursts import Bursts
from .scheduler import scheduler

if TYPE_CHECKING:
    from ..config.validation import SemaphoreConfig

# A child of "django_semaphore" (its handlers get these lines): the poller's own
# failures, apart from the web layer's one line per burst of failed requests.
logger = logging.getLogger("django_semaphore.runtime.control")

POLL_INTERVAL = 0.5  # seconds between two reads of the overrides
KEEP_POLLING = 30.0  # seconds a prefix stays polled after its last use
REPLICA_ACK_MS = 1000  # how long a write waits for a replica's acknowledgement
SOURCES = ("settings", "override", "adaptive")

CONTROL = LuaScript("control")

__all__ = [
    "CLEAR",
    "MODES",
    "Change",
    "Effective",
    "Override",
    "aeffective",
    "aset_override",
    "cached",
    "effective",
    "set_override",
    "total_in_force",
]


class Effective(NamedTuple):
    """The limit, mode and total in force, and where they come from (``source``:
    ``"settings"``; ``"override"`` while an override of the limit, the mode or the
    total is in force; ``"adaptive"`` while the adaptive limit (ADAPTIVE) is, without an
    override).  ``total`` is None unless the semaphore has a TOTAL."""

    limit: int
    mode: str
    source: str
    total: int | None = None


@dataclass(frozen=True, slots=True)
class Override:
    """One semaphore's runtime override: None for a value left to the settings."""

    limit: int | None = None
    mode: str | None = None
    at: int = 0  # epoch ms of the last change
    by: str = ""  # who made it
    total: int | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """What one call changes in an override: the values given (None: kept as they are),
    or, for :data:`CLEAR`, the whole override removed."""

    limit: int | None = None
    mode: str | None = None
    total: int | None = None
    clear: bool = False


#: The change that removes a semaphore's override: back to the settings.
CLEAR = Change(clear=True)


def parse(raw: Any) -> Override | None:
    """The Override in a control HASH value (None if it is malformed or overrides nothing)."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    limit = stored_limit(data.get("limit"))
    total = stored_limit(data.get("total"))
    mode = data.get("mode")
    if mode not in MODES:
        mode = None
    if limit is None and mode is None and total is None:
        return None
    at = data.get("at")
    return Override(limit, mode, at if isinstance(at, int) else 0, str(data.get("by") or ""), total)


def stored_limit(value: object) -> int | None:
    """The limit (or total) of a stored override: None for none (JSON null, or not a number); a
    number out of 0..MAX_LIMIT is clamped to the nearest bound (NaN to 0).

    Nothing this app writes is out of range, but a value written by hand or by an
    older version (which stored ``--limit 99999999999999999999999`` as -2**63) must
    not silently become "no limit override", which would put the settings' limit
    back in force while the operator's override is shown: a number says a limit was
    meant, and the nearest one in range is applied (the script that merges the next
    change into the stored value clamps it the same way).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value:  # NaN
        return 0
    return int(max(0, min(MAX_LIMIT, value)))


def resolve(
    config: SemaphoreConfig, override: Override | None, adaptive_limit: int | None = None
) -> Effective:
    """The :class:`Effective` configuration of ``config`` under ``override`` (and, for an
    adaptive semaphore, the adaptive limit stored, None before the first update)."""
    limit, mode, total, source = config.limit, config.mode, config.total, "settings"
    if config.adaptive is not None:
        limit = config.adaptive.clamp(config.limit if adaptive_limit is None else adaptive_limit)
        source = "adaptive"
    # A stored total applies to a semaphore with TOTAL only (the settings may have
    # dropped TOTAL since): alone, it is no override in force.
    stored_total = None if override is None or config.total is None else override.total
    if override is not None and (
        override.limit is not None or override.mode is not None or stored_total is not None
    ):
        source = "override"
        if override.limit is not None:
            limit = override.limit
        if override.mode is not None:
            mode = override.mode
        if stored_total is not None:
            total = stored_total
    if not settings.enabled():
        mode = "off"
    return Effective(limit, mode, source, total)


def validate(
    limit: object, mode: object, total: object = None, config: SemaphoreConfig | None = None
) -> None:
    """ValueError unless ``limit`` and ``total`` (None or an int from 0 to MAX_LIMIT)
    and ``mode`` (None or a MODE) are valid and at least one is given; a total only
    for a ``config`` with TOTAL.  Everything is checked before anything is written."""
    if limit is None and mode is None and total is None:
        raise ValueError("Give a limit, a mode or a total (clear_override() goes back to the settings).")
    if limit is not None:
        checked_limit(limit)
    if total is not None:
        if config is None or config.total is None:
            name = "this semaphore" if config is None else f"semaphore {config.name!r}"
            raise ValueError(
                f"{name} has no TOTAL: a total can only be overridden for a semaphore whose "
                "settings set one (with KEY), or an ad-hoc Semaphore(..., total=n)."
            )
        checked_limit(total, what="total")
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, not {mode!r}.")


# -- the per-process cache --------------------------------------------------------------


class Snapshot(NamedTuple):
    """What the control HASH of one prefix holds: the overrides, and the adaptive
    limits (semaphore name -> limit)."""

    overrides: dict[str, Override]
    adaptive: dict[str, int]

    def of(self, name: str) -> tuple[Override | None, int | None]:
        """Semaphore ``name``'s override and adaptive limit (None where there is none)."""
        return self.overrides.get(name), self.adaptive.get(name)


#: Names whose configuration in force one :class:`_State` remembers at most (names
#: used once each, as an ad-hoc semaphore per job, are forgotten all at once).
RESOLVED_MAX = 1024


class _State:
    """A snapshot, and the configurations in force worked out from it so far (name ->
    the config, SEMAPHORE_ENABLED and the :class:`Effective` they gave): every acquire
    and release asks, and the answer changes only with the snapshot, the config or
    that setting.  Replaced whole with the snapshot, so that an answer worked out
    from an older snapshot is never remembered with a newer one."""

    __slots__ = ("snapshot", "resolved")

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.resolved: dict[str, tuple[SemaphoreConfig, bool, Effective]] = {}


class _Table:
    """The overrides and adaptive limits of one prefix, as last read."""

    __slots__ = ("state", "used", "read")

    def __init__(self, snapshot: Snapshot, read: bool = True) -> None:
        self.state = _State(snapshot)
        self.used = time.monotonic()
        self.read = read  # False: not read from Redis yet (the poller will)


def _decode(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _table_from(reply: Any) -> Snapshot:
    overrides: dict[str, Override] = {}
    limits: dict[str, int] = {}
    for field, raw in (reply or {}).items():
        if isinstance(field, bytes) and field.startswith(adaptive.FIELD_PREFIX):
            limit = adaptive.limit_from(raw)
            if limit is not None:
                limits[_decode(field[len(adaptive.FIELD_PREFIX) :])] = limit
            continue
        override = parse(raw)
        if override is not None:
            overrides[_decode(field)] = override
    return Snapshot(overrides, limits)


_EMPTY = Snapshot({}, {})


class Cache:
    """The overrides of every prefix in use, kept fresh by the ``control`` job of the
    process's scheduler."""

    def __init__(self) -> None:
        self._reset()
        self._job = scheduler().every("control", POLL_INTERVAL, self.tick)
        forks.in_child(self._reset)  # a forked child reads the overrides itself

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._tables: dict[str, _Table] = {}
        self._generation = 0
        self._failures = Bursts(quiet=None)
        self.ticks = 0  # completed polls, for tests

    def state(self, prefix: str) -> _State | None:
        """The overrides and adaptive limits of ``prefix`` as last read (``.snapshot``),
        with what was worked out from them, or None when ``prefix`` has not been read yet."""
        table = self._tables.get(prefix)
        if table is None:
            return None
        table.used = time.monotonic()
        return table.state if table.read else None

    def watch(self, prefix: str) -> None:
        """Poll ``prefix`` from now on (its first read is the poller's)."""
        with self._lock:
            if prefix not in self._tables:
                self._tables[prefix] = _Table(_EMPTY, read=False)
        self._ensure_polling()

    def store(self, prefix: str, snapshot: Snapshot, generation: int | None = None) -> None:
        """Replace the overrides and adaptive limits of ``prefix`` (unless the cache was
        cleared or changed by this process since ``generation``: the snapshot may be older)."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            table = self._tables.get(prefix)
            if table is None:
                self._tables[prefix] = _Table(snapshot)
            else:
                table.state = _State(snapshot)
                table.read = True
        self._ensure_polling()

    def update(self, prefix: str, name: str, override: Override | None) -> None:
        """Apply one change this process made (the next poll confirms it)."""
        with self._lock:
            # A poll that read Redis before this change must not store its older
            # snapshot over it: the generation moves, so that poll's store is skipped.
            self._generation += 1
            table = self._tables.get(prefix)
            if table is None or not table.read:
                return  # read whole at the next use
            overrides = dict(table.state.snapshot.overrides)
            if override is None:
                overrides.pop(name, None)
            else:
                overrides[name] = override
            table.state = _State(table.state.snapshot._replace(overrides=overrides))

    def clear(self) -> None:
        """Forget everything (another Redis server)."""
        with self._lock:
            self._tables = {}
            self._generation += 1

    @property
    def generation(self) -> int:
        return self._generation

    # -- the poller -----------------------------------------------------------------

    def _ensure_polling(self) -> None:
        """Schedule the poller, unless it is (cheap: every first read of a prefix calls it)."""
        if not self._job.active:
            self._job.schedule()

    def _active(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            for prefix in [p for p, t in self._tables.items() if now - t.used > KEEP_POLLING]:
                del self._tables[prefix]
            return list(self._tables)

    def tick(self) -> None:
        """One poll: send the adaptive windows, read the overrides and adaptive limits
        of every prefix in use, and flush the stats, in one pipeline."""
        generation = self._generation
        prefixes = self._active()
        windows = adaptive.drain()
        with stats.sending:  # a stats.flush() meanwhile returns once these counts are in Redis
            pending = stats.drain()
            reads = tuple(("HGETALL", control_key(p)) for p in prefixes)
            # The windows first: a limit they change is read in this same tick.
            commands = windows.commands + reads + pending.commands
            if not commands:
                self.ticks += 1
                return
            server = "Redis"
            try:
                # Straight to the client, not through scripting.run: a background
                # poll is no caller's operation, so it sends no backend_failed (the
                # metrics count callers' failures); it logs once per burst below.
                client = connection.get_client()
                server = f"Redis at {connection.server_name(client)}"
                # A command's error is its reply: a window refused with NOSCRIPT
                # must not make the stats flushed with it count twice.
                # Raw: the adaptive fields are not UTF-8 (a client may decode replies).
                replies = execute(client, Pipe(commands, transaction=False, raise_on_error=False, raw=True))
                # A command's error (the reply in its place): the first is reported
                # as the poll's failure; a window whose call failed is sent again.
                error = next((r for r in replies[len(windows.commands) :] if isinstance(r, Exception)), None)
            except Exception as exc:
                windows.settle(None)
                pending.restore()
                replies, error = None, exc
        if replies is not None:
            windows.settle(replies[: len(windows.commands)])
        if error is not None:
            if self._failures.event("poll") is not None:
                logger.warning(
                    "django-semaphore: could not read the runtime overrides: %s failed: %s: %s",
                    server,
                    type(error).__name__,
                    error,
                )
            if replies is None:
                self.ticks += 1
                return
        else:
            self._failures.end()
        assert replies is not None
        for prefix, reply in zip(prefixes, replies[len(windows.commands) :], strict=False):
            if isinstance(reply, Exception):
                continue
            self.store(prefix, _table_from(reply), generation)
        self.ticks += 1


_cache = Cache()


def cache() -> Cache:
    """This process's :class:`Cache`."""
    return _cache


@receiver(setting_changed)
def _forget_other_servers(*, setting: str, **kwargs: Any) -> None:
    if setting in ("SEMAPHORE_REDIS", "CACHES"):
        _cache.clear()
        stats.drain()  # counted against the other server: not flushed to this one
        adaptive.forget()


def _prefix() -> str:
    prefix: str = settings.setting("SEMAPHORE_KEY_PREFIX")
    return prefix


def _read(prefix: str) -> Operation[Snapshot]:
    reply = yield Command(("HGETALL", control_key(prefix)), raw=True)  # adaptive fields: not UTF-8
    return _table_from(reply)


def cached(config: SemaphoreConfig) -> Effective:
    """The configuration in force from the cache alone: never a Redis call.

    A prefix not read yet counts as without overrides, and is polled from now
    on (the guards use this when the settings say "off", to pass through
    without touching Redis).
    """
    prefix = _prefix()
    state = _cache.state(prefix)
    if state is None:
        _cache.watch(prefix)
        return _in_force(prefix, config, None, None)
    return _remembered(prefix, config, state)


def _in_force(
    prefix: str, config: SemaphoreConfig, override: Override | None, limit: int | None
) -> Effective:
    """:func:`resolve`, for a semaphore in use: an adaptive one's samples go to its
    controller from now on."""
    if config.adaptive is not None:
        adaptive.watch(prefix, config)
    return resolve(config, override, limit)


def _remembered(prefix: str, config: SemaphoreConfig, state: _State) -> Effective:
    """:func:`_in_force` from ``state``'s snapshot, worked out once per snapshot, config
    and SEMAPHORE_ENABLED."""
    enabled = settings.enabled()
    known = state.resolved.get(config.name)
    if known is not None and known[0] is config and known[1] is enabled:
        if config.adaptive is not None:
            adaptive.watch(prefix, config)
        return known[2]
    found = _in_force(prefix, config, *state.snapshot.of(config.name))
    resolved = state.resolved
    if len(resolved) >= RESOLVED_MAX:
        resolved.clear()
    resolved[config.name] = (config, enabled, found)
    return found


def effective(config: SemaphoreConfig, client: Client | None = None) -> Effective:
    """The configuration in force for ``config``: the cache, read once first if empty.

    A failed first read raises :class:`~django_semaphore.SemaphoreBackendError`
    (the acquire it comes before would fail as well: it fails once, in the
    same time), and the next call reads again.
    """
    prefix = _prefix()
    state = _cache.state(prefix)
    if state is not None:
        return _remembered(prefix, config, state)
    generation = _cache.generation
    snapshot = run(client or connection.get_client(), _read(prefix))
    _cache.store(prefix, snapshot, generation)
    return _in_force(prefix, config, *snapshot.of(config.name))


async def aeffective(config: SemaphoreConfig, client: Client | None = None) -> Effective:
    """The asyncio twin of :func:`effective` (the first read on the asyncio client)."""
    prefix = _prefix()
    state = _cache.state(prefix)
    if state is not None:
        return _remembered(prefix, config, state)
    generation = _cache.generation
    snapshot = await arun(client or connection.get_async_client(), _read(prefix))
    _cache.store(prefix, snapshot, generation)
    return _in_force(prefix, config, *snapshot.of(config.name))


def fresh(config: SemaphoreConfig) -> Operation[Effective]:
    """Read the overrides (and adaptive limits) of ``config``'s prefix from Redis now
    (and update the cache)."""
    prefix = _prefix()
    generation = _cache.generation
    snapshot = yield from _read(prefix)
    _cache.store(prefix, snapshot, generation)
    return resolve(config, *snapshot.of(config.name))


# -- writing --------------------------------------------------------------------------


def _user_label(user: Any) -> str:
    if user is None:
        return ""
    name = getattr(user, "get_username", None)
    return str(name() if callable(name) else user)


def write(config: SemaphoreConfig, change: Change, user: Any, cluster: bool) -> Operation[Effective]:
    """Apply ``change`` (or :data:`CLEAR`) to the override of ``config``'s semaphore; the
    configuration in force after.

    One script merges the change into the stored override (only the values
    given change).  On a server with connected replicas (Sentinel), the write
    then waits up to ``REPLICA_ACK_MS`` for one of them to have it, so that it
    survives a failover.
    """
    prefix = _prefix()
    args = (
        config.name,
        "clear" if change.clear else "set",
        "" if change.limit is None else change.limit,
        "" if change.mode is None else change.mode,
        int(time.time() * 1000),
        _user_label(user)[:200],
        MAX_LIMIT,
        "" if change.total is None else change.total,
    )
    reply = yield Script(CONTROL, (control_key(prefix),), args)
    override = None if change.clear or not reply else parse(reply)
    if not cluster:
        # Best effort once the change is written: a Redis user without INFO or WAIT (ACL
        # "-@dangerous") gets no replica wait, not an error for a change in force.
        (info,) = yield Pipe((("INFO", "replication"),), transaction=False, raise_on_error=False)
        if isinstance(info, dict) and int(info.get("connected_slaves", 0) or 0) > 0:
            yield Pipe((("WAIT", 1, REPLICA_ACK_MS),), transaction=False, raise_on_error=False)
    _cache.update(prefix, config.name, override)
    adaptive_limit = None
    if config.adaptive is not None:  # the limit in force after clearing a limit override
        state = yield from adaptive.read_state(prefix, config.name)
        adaptive_limit = None if state is None else state.limit
    return resolve(config, override, adaptive_limit)


def set_override(config: SemaphoreConfig, change: Change, user: Any = None) -> Effective:
    """Write an override (``change``; :data:`CLEAR` removes it) on the sync client; see
    :func:`write`.  The values are not checked here: :func:`validate` them first."""
    client = connection.get_client()
    return run(client, write(config, change, user, connection.is_cluster(client)))


async def aset_override(config: SemaphoreConfig, change: Change, user: Any = None) -> Effective:
    """The asyncio twin of :func:`set_override`."""
    client = connection.get_async_client()
    return await arun(client, write(config, change, user, connection.is_cluster(client)))


def overrides() -> Operation[dict[str, Override]]:
    """Every override stored under the current prefix, read from Redis now."""
    snapshot = yield from _read(_prefix())
    return snapshot.overrides


def total_in_force(config: SemaphoreConfig) -> int | None:
    """The total in force for ``config`` now, from the cache alone (never a Redis call):
    an override's, else TOTAL; None for a semaphore without TOTAL."""
    return cached(config).total


def limit_of(config: SemaphoreConfig) -> Callable[[], int]:
    """A function giving the limit in force for ``config`` now (from the cache), for waiters."""

    def current() -> int:
        return cached(config).limit

    return current
