"""Read-only overviews of the semaphores in Redis, for the admin and the commands.

Nothing here writes to Redis except :func:`cleanup`, which only runs the
purge script (expired entries only, never a live holder).  Partitions are
found by :mod:`~django_semaphore.engine.discovery` (SCAN on every primary, never KEYS),
and their statuses read in pipelines (:meth:`Semaphore.statuses
<django_semaphore.engine.semaphore.Semaphore.statuses>`), not a round trip each.
Beside the partitions, a summary carries the semaphore's runtime control (the
effective limit and mode, and whether they come from settings or an
override) and its figures of the last five minutes from
:mod:`~django_semaphore.runtime.stats` (every process's, flushed to Redis): all read
when an overview is asked for, never on the acquire path.

Beside the configured semaphores, the overviews list the ad-hoc ones
(``Semaphore(name, limit=...)``, no SEMAPHORES entry) that have live
partitions, with the limit and timeout that the processes using them
recorded (:mod:`~django_semaphore.runtime.adhoc`): ``SemaphoreSummary.ad_hoc``.

A semaphore with TOTAL keeps all its partitions in one set of keys (the whole
name's, key hash ``+``): a summary lists the partitions inside them that hold
permits or have waiters (:func:`~django_semaphore.engine.discovery.expand`),
never the whole name's keys as a partition, and carries the whole name's
figures against the TOTAL in force apart (``SemaphoreSummary.whole``).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from redis.exceptions import ResponseError

from ..backend import connection
from ..backend.keys import UNPARTITIONED, WHOLE_NAME, PartitionKeys
from ..backend.scripting import Command, Operation, run
from ..config import key_functions, settings
from ..config.validation import SemaphoreConfig
from ..engine import discovery, inspection
from ..engine.algorithms import ALGORITHMS, Algorithm
from ..engine.discovery import Found
from ..engine.inspection import Holder, PartitionStatus, Waiter
from ..engine.semaphore import Semaphore
from ..exceptions import SemaphoreBackendError
from ..runtime import adaptive, adhoc, stats
from ..runtime.control import Effective
from ..runtime.stats import Recent

logger = logging.getLogger("django_semaphore.ops.monitor")

#: How many partitions of one semaphore an overview reads (busiest first).
MAX_PARTITIONS = 100
#: Waiters listed per partition on a semaphore's page (serving order).
MAX_WAITERS_SHOWN = 50
#: Ad-hoc semaphores an overview of every semaphore reads (by name).
MAX_AD_HOC = 100


def describe_key(config: SemaphoreConfig) -> str:
    """How a semaphore is partitioned, in words ("" for one semaphore)."""
    key = config.key
    if key is None:
        return ""
    if key is key_functions.by_ip:
        return "per IP"
    if key is key_functions.by_user:
        return "per user"
    if isinstance(key, key_functions.ByHeader):
        return f"per {key.header} header"
    return "per " + getattr(key, "__qualname__", getattr(key, "__name__", type(key).__name__))


@dataclass
class PartitionSummary:
    """One partition's figures and (optionally) its holders, at one moment."""

    name: str
    key_hash: str
    label: str
    limit: int
    in_use: int
    waiting: int
    retry_after: int
    holders: list[Holder] = field(default_factory=list)
    waiters: list[Waiter] = field(default_factory=list)
    #: TOTAL: the whole name's free permits when the partition was read (what a
    #: new caller of the partition could get is the smaller of the two); None: no TOTAL.
    total_free: int | None = None

    @property
    def free(self) -> int:
        """Free permits: the limit minus the permits held (never below 0); with TOTAL,
        no more than the name's free permits."""
        free = max(0, self.limit - self.in_use)
        return free if self.total_free is None else min(free, self.total_free)

    @property
    def waiters_not_shown(self) -> int:
        """Waiters beyond the :data:`MAX_WAITERS_SHOWN` listed (0 when the list is not cut)."""
        if len(self.waiters) < MAX_WAITERS_SHOWN:
            return 0
        return max(0, self.waiting - len(self.waiters))

    @property
    def held_back(self) -> bool:
        """TOTAL: the partition has room under its limit, but the name's total has none left."""
        return self.total_free == 0 and self.in_use < self.limit

    @property
    def unpartitioned(self) -> bool:
        return self.key_hash == UNPARTITIONED

    @property
    def utilisation(self) -> int:
        """Percentage of the slots in use (0-100); 100 for permits held under a limit of 0
        (paused: the holders keep their slots)."""
        if not self.limit:
            return 100 if self.in_use else 0
        return min(100, round(100 * self.in_use / self.limit))

    @property
    def level(self) -> str:
        """ "idle", "low", "high" or "full": how close the partition is to its limit."""
        if self.in_use == 0:
            return "idle"
        if self.in_use >= self.limit:
            return "full"
        return "high" if self.utilisation >= 75 else "low"

    def as_dict(self, now: datetime.datetime | None = None, holders: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "partition": self.key_hash,
            "label": self.label,
            "limit": self.limit,
            "in_use": self.in_use,
            "free": self.free,
            "waiting": self.waiting,
            "utilisation": self.utilisation,
        }
        if holders:
            data["holders"] = [holder_dict(h, now) for h in self.holders]
            data["waiters"] = [waiter_dict(w, now) for w in self.waiters]
        return data


@dataclass
class SemaphoreSummary:
    """A semaphore (configured, or ad hoc) and its partitions (busiest first)."""

    name: str
    limit: int = 0  # the limit in force (an override's, else LIMIT)
    timeout: float = 0
    algorithm: str = ""
    partitioned_by: str = ""
    partitions: list[PartitionSummary] = field(default_factory=list)
    hidden: int = 0  # partitions not read (before ``offset`` and beyond MAX_PARTITIONS from it)
    offset: int = 0  # partitions before the first one listed (busiest first): a page's start
    # The permits held and callers waiting in those hidden partitions (they count in the totals).
    hidden_in_use: int = 0
    hidden_waiting: int = 0
    error: str = ""
    mode: str = ""  # the mode in force
    source: str = ""  # where the limit comes from: "settings", "override" or "adaptive"
    settings_limit: int = 0  # LIMIT and MODE as settings have them
    settings_mode: str = ""
    recent: Recent | None = None  # the last five minutes, every process
    adaptive_bounds: tuple[int, int] | None = None  # ADAPTIVE's (MIN, MAX); None: not adaptive
    adaptive: adaptive.State | None = None  # the controller's state (None before its first window)
    # Not in SEMAPHORES: an ad-hoc semaphore, as recorded by the processes that use it.
    ad_hoc: bool = False
    # What names it in URLs and commands: the name (an ad-hoc semaphore's digest if its name was cut).
    ident: str = ""
    total: int | None = None  # TOTAL: the total in force (an override's, else TOTAL); None: no TOTAL
    settings_total: int | None = None  # TOTAL as settings have it
    # TOTAL: the whole name's figures, every partition together (``limit`` is the total in force).
    whole: PartitionSummary | None = None

    def __post_init__(self) -> None:
        self.ident = self.ident or self.name

    @property
    def in_use(self) -> int:
        """Permits held: every partition's, those not listed too."""
        if self.whole is not None:
            return self.whole.in_use
        return sum(p.in_use for p in self.partitions) + self.hidden_in_use

    @property
    def waiting(self) -> int:
        """Callers waiting: in every partition, those not listed too."""
        if self.whole is not None:
            return self.whole.waiting
        return sum(p.waiting for p in self.partitions) + self.hidden_waiting

    @property
    def rows(self) -> int:
        """Lines the semaphore takes in the list page's table: the whole name's (TOTAL),
        then one per partition listed; at least one."""
        return max(1, len(self.partitions) + (self.whole is not None))

    @property
    def partition_count(self) -> int:
        """Partitions in Redis (listed or not; with TOTAL, those holding permits or with waiters)."""
        return len(self.partitions) + self.hidden

    @property
    def overridden(self) -> bool:
        return self.source == "override"

    @property
    def paused(self) -> bool:
        return not self.error and self.limit == 0

    @property
    def hold_p50(self) -> str:
        """The median hold time of recent leases, for display ("" without samples)."""
        return format_seconds(self.recent.hold_p50 if self.recent else None)

    @property
    def hold_p95(self) -> str:
        return format_seconds(self.recent.hold_p95 if self.recent else None)

    @property
    def adaptive_baseline(self) -> str:
        """The controller's baseline (uncontended) hold time, for display ("" before a probe)."""
        state = self.adaptive
        return format_seconds(state.baseline_ms / 1000) if state and state.baseline_ms > 0 else ""

    @property
    def adaptive_mean(self) -> str:
        """The mean hold of the controller's last window, for display."""
        state = self.adaptive
        return format_seconds(state.mean_ms / 1000) if state and state.mean_ms > 0 else ""

    def adaptive_dict(self) -> dict[str, Any] | None:
        if self.adaptive_bounds is None:
            return None
        state = self.adaptive
        return {
            "min": self.adaptive_bounds[0],
            "max": self.adaptive_bounds[1],
            "limit": state.limit if state else None,
            "baseline_ms": state.baseline_ms if state else None,
            "mean_ms": state.mean_ms if state else None,
            "probing": state.probing if state else False,
        }

    def as_dict(self, now: datetime.datetime | None = None, holders: bool = False) -> dict[str, Any]:
        return {
            "name": self.name,
            "ad_hoc": self.ad_hoc,
            "limit": self.limit,
            "mode": self.mode,
            "source": self.source,
            "total": self.total,
            "settings": {
                "limit": self.settings_limit,
                "mode": self.settings_mode,
                "total": self.settings_total,
            },
            "all_partitions": whole_dict(self.whole),
            "timeout": self.timeout,
            "algorithm": self.algorithm,
            "partitioned_by": self.partitioned_by,
            "error": self.error,
            "waiting": self.waiting,
            "recent": recent_dict(self.recent),
            "adaptive": self.adaptive_dict(),
            "hidden_partitions": self.hidden,
            "partition_offset": self.offset,
            "partitions": [p.as_dict(now, holders) for p in self.partitions],
        }


def format_seconds(seconds: float | None) -> str:
    """``0.042`` -> ``"42 ms"``, ``3.5`` -> ``"3.5 s"``; ``""`` for None."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s" if seconds < 100 else f"{seconds:.0f} s"


def whole_dict(whole: PartitionSummary | None) -> dict[str, Any] | None:
    """A TOTAL name's figures, every partition together, for JSON (None without TOTAL)."""
    if whole is None:
        return None
    return {
        "limit": whole.limit,
        "in_use": whole.in_use,
        "free": whole.free,
        "waiting": whole.waiting,
        "utilisation": whole.utilisation,
    }


def recent_dict(recent: Recent | None) -> dict[str, Any] | None:
    """The figures of the last five minutes for JSON (None if they were not read)."""
    if recent is None:
        return None
    return {
        "window_seconds": stats.WINDOW,
        "refused": recent.refused,
        "dry_run_refused": recent.dry_run_refused,
        "hold_p50": recent.hold_p50,
        "hold_p95": recent.hold_p95,
        "hold_samples": recent.samples,
    }


def describe_change(old: Effective, new: Effective) -> str:
    """``"limit 5 -> 2, mode enforce -> dry_run"``: a runtime control change, for logs and output;
    ``", total 8 -> 4"`` follows for a semaphore with TOTAL."""
    text = f"limit {old.limit} -> {new.limit}, mode {old.mode} -> {new.mode}"
    if old.total is not None or new.total is not None:
        text += f", total {old.total} -> {new.total}"
    return text


@dataclass
class Totals:
    """The figures of every semaphore together (the list page's first line)."""

    semaphores: int = 0
    in_use: int = 0
    waiting: int = 0
    refused: int = 0
    dry_run_refused: int = 0
    overridden: list[str] = field(default_factory=list)
    ad_hoc_not_listed: int = 0  # ad-hoc semaphores in use beyond MAX_AD_HOC: not in the figures

    def as_dict(self) -> dict[str, Any]:
        return {
            "semaphores": self.semaphores,
            "in_use": self.in_use,
            "waiting": self.waiting,
            "refused": self.refused,
            "dry_run_refused": self.dry_run_refused,
            "overridden": self.overridden,
            "ad_hoc_not_listed": self.ad_hoc_not_listed,
        }


def totals(summaries: Iterable[SemaphoreSummary], ad_hoc_not_listed: int = 0) -> Totals:
    """Sum the figures of ``summaries`` (cluster-wide: every process's, as Redis has them);
    ``ad_hoc_not_listed``: the ad-hoc semaphores left out of them (:attr:`Overview.ad_hoc_not_listed`)."""
    total = Totals(ad_hoc_not_listed=ad_hoc_not_listed)
    for summary in summaries:
        total.semaphores += 1
        total.in_use += summary.in_use
        total.waiting += summary.waiting
        if summary.recent is not None:
            total.refused += summary.recent.refused
            total.dry_run_refused += summary.recent.dry_run_refused
        if summary.overridden:
            total.overridden.append(summary.name)
    return total


def holders_clock(sem: Semaphore) -> datetime.datetime:
    """Now, on the clock ``sem``'s holder expiries are written with: the Redis server's
    (``TIME``) for "lua", whose scripts also stamp the waiters' arrival; this process's
    for the Redis in Action variants, which write expiries on their client's clock.
    What :func:`expires_in` and a waiter's wait are counted against, so that a web
    server whose clock is off from Redis's shows them right.  Aware (UTC), as the
    expiries are, whatever USE_TZ says.  Raises
    :class:`~django_semaphore.SemaphoreBackendError` if Redis fails."""
    if ALGORITHMS[sem.config.algorithm].clock():
        return datetime.datetime.now(datetime.UTC)
    seconds, micros = run(connection.get_client(), _server_time())
    return datetime.datetime.fromtimestamp(seconds + micros / 1e6, tz=datetime.UTC)


def _server_time() -> Operation[tuple[int, int]]:
    seconds, micros = yield Command(("TIME",))
    return int(seconds), int(micros)


def expires_in(holder: Holder, now: datetime.datetime | None = None) -> int:
    """Whole seconds until ``holder``'s lease ends (0 once it has)."""
    now = now or timezone.now()
    return max(0, round((holder.expires_at - now).total_seconds()))


def holder_dict(holder: Holder, now: datetime.datetime | None = None) -> dict[str, Any]:
    """A holder for JSON: token, times, permits, slots and meta. Never the lease identifier."""
    return {
        "token": holder.token,
        "acquired_at": holder.acquired_at.isoformat() if holder.acquired_at else None,
        "expires_at": holder.expires_at.isoformat(),
        "expires_in": expires_in(holder, now),
        "permits": holder.permits,
        "slots": list(holder.slots),
        "meta": holder.meta,
    }


def waiter_dict(waiter: Waiter, now: datetime.datetime | None = None) -> dict[str, Any]:
    """A waiter for JSON: since when, priority, permits and meta. Never its identifier."""
    now = now or timezone.now()
    return {
        "since": waiter.since.isoformat(),
        "waited": max(0.0, round((now - waiter.since).total_seconds(), 3)),
        "priority": waiter.priority,
        "permits": waiter.permits,
        "meta": waiter.meta,
    }


def _label(key_hash: str, holders: Iterable[Holder], waiters: Iterable[Waiter] = ()) -> str:
    """A partition's label: the partition value its holders (or waiters) recorded, else its hash."""
    if key_hash == UNPARTITIONED:
        return ""
    metas = [holder.meta for holder in holders] + [waiter.meta for waiter in waiters]
    for meta in metas:
        key = meta.get("key")
        if key:
            return str(key)
    return key_hash


def _summary(name: str, status: PartitionStatus) -> PartitionSummary:
    key_hash = status.key_hash
    summary = PartitionSummary(
        name, key_hash, key_hash, status.limit, status.in_use, status.waiting, status.retry_after
    )
    if status.total is not None:
        summary.total_free = max(0, status.total - status.total_in_use)
    return summary


def _add_holders(sem: Semaphore, summary: PartitionSummary, keys: PartitionKeys) -> None:
    summary.holders = sem.holders(keys=keys)
    if summary.waiting:
        summary.waiters = sem.waiters(keys=keys)[:MAX_WAITERS_SHOWN]
    summary.label = _label(summary.key_hash, summary.holders, summary.waiters)


def partition_keys(sem: Semaphore, key_hash: str, name_digest: str | None = None) -> PartitionKeys:
    """The keys of ``sem``'s partition ``key_hash`` (``_`` or a key digest, as the admin's
    links and forms give it): with TOTAL, the partition inside the whole name's keys.

    ValueError if ``key_hash`` is malformed, and for ``+``: the whole name's keys
    are no partition.  ``name_digest``: as for :func:`~django_semaphore.engine.discovery.partitions`
    (an ad-hoc semaphore's whose name was cut).
    """
    if key_hash == WHOLE_NAME:
        raise ValueError(f"{key_hash!r} is not a partition hash.")
    if sem.config.total is not None:
        return discovery.partition(sem.name, WHOLE_NAME, name_digest).within(key_hash)
    return discovery.partition(sem.name, key_hash, name_digest)


def checked_max_partitions(value: object) -> int:
    """``value`` if it is a number of partitions to list (an int >= 1); ValueError otherwise
    (0 or a negative one used to cut the list wrongly and report false figures)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f"max_partitions must be an int >= 1, not {value!r}.")


def checked_offset(value: object) -> int:
    """``value`` if it is a number of partitions to skip (an int >= 0); ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"offset must be an int >= 0, not {value!r}.")


def read_semaphore(
    name: str,
    key_hash: str | None = None,
    max_partitions: int = MAX_PARTITIONS,
    with_holders: bool = True,
    found: list[PartitionKeys] | None = None,
    offset: int = 0,
) -> SemaphoreSummary:
    """A :class:`SemaphoreSummary` of semaphore ``name``: every live partition, or only ``key_hash``.

    ``name`` is a SEMAPHORES name, or else an ad-hoc semaphore's (its digest
    if its name was cut: :attr:`SemaphoreSummary.ident`) as recorded in the
    registry (:func:`read_ad_hoc`).  An unpartitioned configured semaphore
    always shows its one partition, even with no keys in Redis.  Partitions
    are sorted busiest first and ``max_partitions`` of them listed from the
    ``offset``-th (0: the busiest; a page of them); ``found`` gives
    them when the caller has already looked (else a SCAN does).  Holders are
    read with ``with_holders`` (else only as much as needed to label busy
    partitions).  Raises :class:`~django_semaphore.SemaphoreBackendError` if
    Redis fails; a semaphore whose settings are invalid (or unknown) gets
    ``error`` set instead.
    """
    checked_max_partitions(max_partitions)
    checked_offset(offset)
    summary = SemaphoreSummary(name)
    try:
        config = settings.get_config(name)
    except ImproperlyConfigured as exc:
        entry = None if name in settings.names() else find_ad_hoc(name)
        if entry is not None:
            return read_ad_hoc(entry, key_hash, max_partitions, with_holders, found, offset)
        summary.error = str(exc)
        return summary
    sem = Semaphore(name)
    if key_hash is not None:
        found = [partition_keys(sem, key_hash)]
    elif found is None:
        found = sem.partitions()
    if key_hash is None and config.key is None and not any(k.key_digest == UNPARTITIONED for k in found):
        found = [sem.partition(None), *found]
    return _read(summary, sem, found, Page(max_partitions, offset, with_holders))


def find_ad_hoc(ident: str) -> adhoc.Entry | None:
    """The registry's record of the ad-hoc semaphore named ``ident`` (a name, or the
    digest of a name that was cut), None if there is none."""
    return run(connection.get_client(), adhoc.lookup(settings.setting("SEMAPHORE_KEY_PREFIX"), ident))


def ad_hoc_entries() -> dict[str, adhoc.Entry]:
    """Every ad-hoc semaphore recorded in the registry, by name digest."""
    return run(connection.get_client(), adhoc.entries(settings.setting("SEMAPHORE_KEY_PREFIX")))


def ad_hoc_semaphore(entry: adhoc.Entry) -> Semaphore:
    """The ad-hoc Semaphore ``entry`` records (ValueError if the record is not valid)."""
    # TOTAL, once the registry records it (an Entry without ``total``: none).
    total: int | None = entry.total
    return Semaphore(
        entry.name,
        entry.limit,
        entry.timeout,
        wait=entry.wait,
        algorithm=entry.algorithm,
        mode=entry.mode,
        total=total,
    )


def read_ad_hoc(
    entry: adhoc.Entry,
    key_hash: str | None = None,
    max_partitions: int = MAX_PARTITIONS,
    with_holders: bool = True,
    found: list[PartitionKeys] | None = None,
    offset: int = 0,
) -> SemaphoreSummary:
    """A :class:`SemaphoreSummary` (``ad_hoc``) of the ad-hoc semaphore that ``entry`` records:
    its live partitions only, found by its name's digest (a name may have been cut)."""
    checked_max_partitions(max_partitions)
    checked_offset(offset)
    summary = SemaphoreSummary(entry.name, ad_hoc=True, ident=entry.ident)
    try:
        sem = ad_hoc_semaphore(entry)
    except ValueError as exc:  # a record no version of this app wrote
        summary.error = str(exc)
        return summary
    if key_hash is not None:
        found = [partition_keys(sem, key_hash, entry.digest)]
    elif found is None:
        found = discovery.partitions(entry.name, entry.digest)
    page = Page(max_partitions, offset, with_holders)
    return _read(summary, sem, found, page, recent=not entry.truncated)


@dataclass(frozen=True)
class Page:
    """Which partitions an overview lists: ``size`` of them from the ``offset``-th (busiest
    first), with their holders (``holders``), else only as much as labels busy ones."""

    size: int
    offset: int = 0
    holders: bool = True


def _read(
    summary: SemaphoreSummary,
    sem: Semaphore,
    found: list[PartitionKeys],
    page: Page,
    recent: bool = True,
) -> SemaphoreSummary:
    config = sem.config
    summary.timeout, summary.algorithm = config.timeout, config.algorithm
    summary.settings_limit, summary.settings_mode = config.limit, config.mode
    summary.settings_total = config.total
    summary.partitioned_by = describe_key(config)
    if config.total is not None:
        # The whole name's figures (limit: the total in force), apart from its partitions'.
        whole = next((keys.whole for keys in found if keys.shared), None) or sem.partition(None).whole
        summary.whole = _summary(sem.name, sem.status(keys=whole))
    # A TOTAL name's keys stand for its partitions: those that hold permits or have waiters.
    found = discovery.expand(found)
    # In pipelines, not a round trip per partition: tens of thousands of them are live at times.
    rows = [
        (_summary(sem.name, status), keys) for status, keys in zip(sem.statuses(found), found, strict=True)
    ]
    rows.sort(key=lambda row: (not row[0].unpartitioned, -row[0].in_use, -row[0].waiting, row[0].key_hash))
    offset, end = page.offset, page.offset + page.size
    if offset or len(rows) > end:
        unlisted = rows[:offset] + rows[end:]
        rows = rows[offset:end]
        summary.hidden, summary.offset = len(unlisted), offset
        summary.hidden_in_use = sum(partition.in_use for partition, _ in unlisted)
        summary.hidden_waiting = sum(partition.waiting for partition, _ in unlisted)
    for partition, keys in rows:
        if page.holders or partition.in_use or partition.waiting:
            _add_holders(sem, partition, keys)
        else:
            partition.label = _label(partition.key_hash, [])
    summary.partitions = [partition for partition, _ in rows]
    # After the partitions: with Redis down, the first read has already failed.
    effective = sem.effective()
    summary.limit, summary.mode, summary.source = effective.limit, effective.mode, effective.source
    summary.total = effective.total
    # (The stats keys are named by the whole name: a cut one has none to read.)
    summary.recent = stats.recent(sem) if recent else None
    if config.adaptive is not None:
        summary.adaptive_bounds = (config.adaptive.min, config.adaptive.max)
        prefix = settings.setting("SEMAPHORE_KEY_PREFIX")
        summary.adaptive = run(connection.get_client(), adaptive.read_state(prefix, config.name))
    return summary


def read_all(max_partitions: int = MAX_PARTITIONS, with_holders: bool = False) -> list[SemaphoreSummary]:
    """A :class:`SemaphoreSummary` of every configured semaphore, in settings order, then of
    every ad-hoc semaphore with live partitions, by name (at most :data:`MAX_AD_HOC`).

    One SCAN finds the partitions of all of them; one read of the registry
    names the ad-hoc ones (partitions of a semaphore in neither are left out).
    """
    return overview(max_partitions, with_holders).semaphores


@dataclass
class Overview:
    """What :func:`overview` read: the summaries, and how many ad-hoc semaphores in use
    were left out of them (beyond :data:`MAX_AD_HOC`, by name)."""

    semaphores: list[SemaphoreSummary]
    ad_hoc_not_listed: int = 0


def overview(max_partitions: int = MAX_PARTITIONS, with_holders: bool = False) -> Overview:
    """:func:`read_all`, saying how many ad-hoc semaphores in use it left out."""
    checked_max_partitions(max_partitions)
    groups = discovery.find()
    summaries = [
        read_semaphore(g.name, None, max_partitions, with_holders, g.partitions)
        for g in groups
        if g.configured
    ]
    others = {g.partitions[0].name_digest: g for g in groups if not g.configured and g.partitions}
    if not others:
        return Overview(summaries)
    recorded = ad_hoc_entries()
    ad_hoc = sorted((recorded[digest] for digest in others if digest in recorded), key=lambda e: e.name)
    for entry in ad_hoc[:MAX_AD_HOC]:
        found = others[entry.digest].partitions
        summaries.append(read_ad_hoc(entry, None, max_partitions, with_holders, found))
    return Overview(summaries, max(0, len(ad_hoc) - MAX_AD_HOC))


def purge_ad_hoc(entry: adhoc.Entry, dry_run: bool = False) -> int:
    """Purge (or count) the expired entries of every partition of the ad-hoc semaphore
    that ``entry`` records (``Semaphore.purge_expired``, found by its name's digest)."""
    found = Found(entry.name, False, discovery.partitions(entry.name, entry.digest))
    return cleanup(found, dry_run, entry.algorithm)


def prune_ad_hoc(live: Iterable[str], dry_run: bool = False) -> int:
    """Remove (or count) the registry's stale records of ad-hoc semaphores that have no
    live partition (``live``: the name digests of those that do); see :func:`adhoc.prune`."""
    prefix = settings.setting("SEMAPHORE_KEY_PREFIX")
    return run(connection.get_client(), adhoc.prune(prefix, live, dry_run))


# -- cleanup ------------------------------------------------------------------


def cleanup(found: Found, dry_run: bool = False, algorithm_name: str | None = None) -> int:
    """Purge (or count, with ``dry_run``) the expired entries of ``found``'s partitions.

    Live holders are never touched: the purge script removes entries whose
    expiry has passed, atomically, on the clock that wrote them (the server's
    for "lua", the client's for the seed variants).  A semaphore not in
    SEMAPHORES has the algorithm ``algorithm_name`` (an ad-hoc one's, as
    recorded); one without (no longer in SEMAPHORES, or whose entry is
    invalid) has no known algorithm: its entries are removed only once they
    have ended on both clocks.
    """
    algorithm: Algorithm | None = ALGORITHMS.get(algorithm_name) if algorithm_name else None
    if found.configured:
        try:
            algorithm = ALGORITHMS[settings.get_config(found.name).algorithm]
        except ImproperlyConfigured:
            pass
    client = connection.get_client()
    removed = 0
    for keys in found.partitions:
        try:
            removed += run(client, inspection.purge(keys, algorithm, dry_run))
        except SemaphoreBackendError as exc:
            # A partition one of whose keys another writer replaced with a value of
            # another type: skipped (and logged), not the end of the cleanup.
            # (Redis 6.2 wraps a script's error: "Error running script ...: WRONGTYPE ...".)
            if not (isinstance(exc.__cause__, ResponseError) and "WRONGTYPE" in str(exc.__cause__)):
                raise
            logger.warning("Skipped the partition %s: %s", keys.base, exc.__cause__)
    return removed
