"""Read-only overviews of the semaphores in Redis, for the admin and the commands.

Nothing here writes to Redis except :func:`cleanup`, which only runs the
purge script (expired entries only, never a live holder).  Partitions are
found by :mod:`~django_semaphore.discovery` (SCAN on every primary, never KEYS).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from . import conf, connection, discovery, inspection, partitions
from .algorithms import ALGORITHMS, Algorithm
from .core import Semaphore, semaphores
from .discovery import Found
from .inspection import Holder
from .keys import UNPARTITIONED, PartitionKeys
from .scripting import run
from .validation import SemaphoreConfig

#: How many partitions of one semaphore an overview reads (busiest first).
MAX_PARTITIONS = 100


def describe_key(config: SemaphoreConfig) -> str:
    """How a semaphore is partitioned, in words ("" for one semaphore)."""
    key = config.key
    if key is None:
        return ""
    if key is partitions.by_ip:
        return "per IP"
    if key is partitions.by_user:
        return "per user"
    if isinstance(key, partitions.ByHeader):
        return f"per {key.header} header"
    return "per " + getattr(key, "__qualname__", getattr(key, "__name__", type(key).__name__))


@dataclass
class PartitionView:
    """One partition's figures and (optionally) its holders, at one moment."""

    name: str
    key_hash: str
    label: str
    limit: int
    in_use: int
    waiting: int
    retry_after: int
    holders: list[Holder] = field(default_factory=list)

    @property
    def free(self) -> int:
        return max(0, self.limit - self.in_use)

    @property
    def unpartitioned(self) -> bool:
        return self.key_hash == UNPARTITIONED

    @property
    def utilisation(self) -> int:
        """Percentage of the slots in use (0-100)."""
        return min(100, round(100 * self.in_use / self.limit)) if self.limit else 0

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
        return data


@dataclass
class SemaphoreView:
    """A configured semaphore and its partitions (busiest first)."""

    name: str
    limit: int = 0
    timeout: float = 0
    algorithm: str = ""
    partitioned_by: str = ""
    partitions: list[PartitionView] = field(default_factory=list)
    hidden: int = 0  # partitions not read (beyond MAX_PARTITIONS)
    error: str = ""

    @property
    def in_use(self) -> int:
        return sum(p.in_use for p in self.partitions)

    @property
    def waiting(self) -> int:
        return sum(p.waiting for p in self.partitions)

    def as_dict(self, now: datetime.datetime | None = None, holders: bool = False) -> dict[str, Any]:
        return {
            "name": self.name,
            "limit": self.limit,
            "timeout": self.timeout,
            "algorithm": self.algorithm,
            "partitioned_by": self.partitioned_by,
            "error": self.error,
            "hidden_partitions": self.hidden,
            "partitions": [p.as_dict(now, holders) for p in self.partitions],
        }


def expires_in(holder: Holder, now: datetime.datetime | None = None) -> int:
    """Whole seconds until ``holder``'s lease ends (0 once it has)."""
    now = now or timezone.now()
    return max(0, round((holder.expires_at - now).total_seconds()))


def holder_dict(holder: Holder, now: datetime.datetime | None = None) -> dict[str, Any]:
    """A holder for JSON: token, times and meta. Never the lease identifier."""
    return {
        "token": holder.token,
        "acquired_at": holder.acquired_at.isoformat() if holder.acquired_at else None,
        "expires_at": holder.expires_at.isoformat(),
        "expires_in": expires_in(holder, now),
        "meta": holder.meta,
    }


def _label(key_hash: str, holders: Iterable[Holder]) -> str:
    if key_hash == UNPARTITIONED:
        return ""
    for holder in holders:
        key = holder.meta.get("key")
        if key:
            return str(key)
    return key_hash


def _partition_view(sem: Semaphore, keys: PartitionKeys) -> PartitionView:
    status = sem.status(keys=keys)
    key_hash = keys.key_digest
    return PartitionView(
        sem.name, key_hash, key_hash, status.limit, status.in_use, status.waiting, status.retry_after
    )


def _add_holders(sem: Semaphore, view: PartitionView, keys: PartitionKeys) -> None:
    view.holders = sem.holders(keys=keys)
    view.label = _label(view.key_hash, view.holders)


def read_semaphore(
    name: str, key_hash: str | None = None, max_partitions: int = MAX_PARTITIONS, with_holders: bool = True
) -> SemaphoreView:
    """A :class:`SemaphoreView` of semaphore ``name``: every live partition, or only ``key_hash``.

    An unpartitioned semaphore always shows its one partition, even with no
    keys in Redis.  Partitions are sorted busiest first and cut at
    ``max_partitions``.  Holders are read with ``with_holders`` (else only
    as much as needed to label busy partitions).  Raises
    :class:`~django_semaphore.SemaphoreBackendError` if Redis fails; a
    semaphore whose settings are invalid gets ``error`` set instead.
    """
    view = SemaphoreView(name)
    try:
        config = conf.get_config(name)
    except ImproperlyConfigured as exc:
        view.error = str(exc)
        return view
    view.limit, view.timeout, view.algorithm = config.limit, config.timeout, config.algorithm
    view.partitioned_by = describe_key(config)
    sem = Semaphore(name)
    if key_hash is not None:
        found = [discovery.partition(name, key_hash)]
    else:
        found = sem.partitions()
        if config.key is None and not any(k.key_digest == UNPARTITIONED for k in found):
            found.insert(0, sem.partition(None))
    rows = [(_partition_view(sem, keys), keys) for keys in found]
    rows.sort(key=lambda row: (not row[0].unpartitioned, -row[0].in_use, -row[0].waiting, row[0].key_hash))
    if len(rows) > max_partitions:
        view.hidden = len(rows) - max_partitions
        del rows[max_partitions:]
    for partition, keys in rows:
        if with_holders or partition.in_use:
            _add_holders(sem, partition, keys)
        else:
            partition.label = _label(partition.key_hash, [])
    view.partitions = [partition for partition, _ in rows]
    return view


def read_all(max_partitions: int = MAX_PARTITIONS, with_holders: bool = False) -> list[SemaphoreView]:
    """A :class:`SemaphoreView` of every configured semaphore, in settings order."""
    return [read_semaphore(name, None, max_partitions, with_holders) for name in semaphores]


# -- cleanup ------------------------------------------------------------------


def cleanup(found: Found, dry_run: bool = False) -> int:
    """Purge (or count, with ``dry_run``) the expired entries of ``found``'s partitions.

    Live holders are never touched: the purge script removes entries whose
    expiry has passed, atomically, on the clock that wrote them (the server's
    for "lua", the client's for the seed variants).  A semaphore no longer in
    SEMAPHORES (or whose entry is invalid) has no known algorithm: its entries
    are removed only once they have ended on both clocks.
    """
    algorithm: Algorithm | None = None
    if found.configured:
        try:
            algorithm = ALGORITHMS[conf.get_config(found.name).algorithm]
        except ImproperlyConfigured:
            pass
    client = connection.get_client()
    return sum(run(client, inspection.purge(keys, algorithm, dry_run)) for keys in found.partitions)
