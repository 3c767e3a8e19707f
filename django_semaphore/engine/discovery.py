"""Finding the partitions of semaphores in Redis: one SCAN walk, one error policy.

A partition exists in Redis while its timeout ZSET does, so partitions are
found by their timeout keys under SEMAPHORE_KEY_PREFIX, with SCAN on every
primary (:func:`django_semaphore.backend.connection.scan_iter`), never KEYS.  SCAN may
return a key more than once: every partition is given once.  A Redis error
becomes :class:`~django_semaphore.SemaphoreBackendError` through the driver
(:func:`django_semaphore.backend.scripting.backend_error`, which sends
``backend_failed``), as for any other Redis call.

Everything that lists partitions goes through here:
:meth:`Semaphore.partitions <django_semaphore.Semaphore.partitions>` and
its async twin, ``purge_expired``, the admin and ``sema_status``
(:mod:`~django_semaphore.ops.monitor`), the metrics' gauges and ``sema_cleanup``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from ..backend import connection
from ..backend.keys import PartitionKeys, name_hash, timeouts_pattern
from ..backend.scripting import Client, LuaScript, Operation, Script, arun, backend_error, run
from ..config import settings

TOTAL_PARTS = LuaScript("total_parts")


@dataclass
class Found:
    """The partitions in Redis of one semaphore, configured or not."""

    name: str  # the semaphore's name, or the key slug of one that is not configured
    configured: bool  # in SEMAPHORES now
    partitions: list[PartitionKeys] = field(default_factory=list)


def _partition(raw: bytes, prefix: str, seen: set[str]) -> PartitionKeys | None:
    """The partition whose timeout key is ``raw``, the first time it is found; None for a
    key seen before, or one that is not a partition's timeout key under ``prefix``
    exactly (another prefix that starts with this one, a stray key)."""
    try:
        keys = PartitionKeys.from_timeouts_key(raw, prefix)
    except ValueError:
        return None
    if keys.base in seen:
        return None
    seen.add(keys.base)
    return keys


def walk(client: Client, pattern: str, prefix: str) -> Iterator[PartitionKeys]:
    """The partitions under ``prefix`` whose timeout key matches ``pattern`` (each once),
    on a sync client.  Only ZSETs are scanned: a stray key of another type whose name
    looks like a timeout key is no partition."""
    seen: set[str] = set()
    try:
        for raw in connection.scan_iter(client, pattern, kind="zset"):
            keys = _partition(raw, prefix, seen)
            if keys is not None:
                yield keys
    except RedisError as exc:
        raise backend_error(client, exc) from exc


async def awalk(client: Client, pattern: str, prefix: str) -> AsyncIterator[PartitionKeys]:
    """The asyncio twin of :func:`walk`."""
    seen: set[str] = set()
    try:
        async for raw in connection.ascan_iter(client, pattern, kind="zset"):
            keys = _partition(raw, prefix, seen)
            if keys is not None:
                yield keys
    except (RedisError, OSError) as exc:  # asyncio connections can raise OSError unwrapped
        raise backend_error(client, exc) from exc


def within(keys: PartitionKeys) -> Operation[list[PartitionKeys]]:
    """The partitions inside the keys of a whole TOTAL name (``keys.shared``) that
    hold permits or have waiters; any other keys, as they are."""
    if not keys.shared or keys.part:
        return [keys]
    parts = yield Script(TOTAL_PARTS, keys.main, ())
    return [keys.within(part.decode() if isinstance(part, bytes) else part) for part in sorted(parts)]


def expand(found: Iterable[PartitionKeys]) -> list[PartitionKeys]:
    """``found`` with the keys of each whole TOTAL name replaced by its partitions."""
    client = connection.get_client()
    return [part for keys in found for part in run(client, within(keys))]


async def aexpand(found: Iterable[PartitionKeys]) -> list[PartitionKeys]:
    """The asyncio twin of :func:`expand`."""
    client = connection.get_async_client()
    return [part for keys in found for part in await arun(client, within(keys))]


def _prefix() -> str:
    return str(settings.setting("SEMAPHORE_KEY_PREFIX"))


def _pattern(name: str | None = None, name_digest: str | None = None) -> str:
    return timeouts_pattern(_prefix(), name, name_digest)


def partitions(name: str, name_digest: str | None = None) -> list[PartitionKeys]:
    """Every partition of semaphore ``name`` with keys in Redis.

    ``name_digest``: the name's digest when ``name`` is only its start (an
    ad-hoc semaphore's long name as the registry keeps it).
    """
    return list(walk(connection.get_client(), _pattern(name, name_digest), _prefix()))


async def apartitions(name: str) -> list[PartitionKeys]:
    """The asyncio twin of :func:`partitions`."""
    return [keys async for keys in awalk(connection.get_async_client(), _pattern(name), _prefix())]


def partition(name: str, key_hash: str, name_digest: str | None = None) -> PartitionKeys:
    """The keys of semaphore ``name``'s partition ``key_hash`` (``_`` or a key
    digest, as the admin's forms give it); ValueError if malformed.
    ``name_digest``: as for :func:`partitions`."""
    return PartitionKeys.for_hash(_prefix(), name, key_hash, name_digest)


def find(names: Iterable[str] | None = None) -> list[Found]:
    """Partitions in Redis under SEMAPHORE_KEY_PREFIX, grouped by semaphore, with one SCAN.

    ``names``: those semaphores only (configured or ad-hoc), in that order.
    Otherwise every configured semaphore (in settings order, with or without
    keys) followed by every semaphore found under the prefix that is not (or
    no longer) configured, named by its key slug.
    """
    configured = settings.names()
    wanted = configured if names is None else list(dict.fromkeys(names))
    if names is not None and not wanted:
        return []
    groups = {name_hash(name): Found(name, name in configured) for name in wanted}
    # One name: SCAN matches its keys only. Several: one walk over the prefix.
    pattern = _pattern(wanted[0]) if names is not None and len(wanted) == 1 else _pattern()
    for keys in walk(connection.get_client(), pattern, _prefix()):
        group = groups.get(keys.name_digest)
        if group is None:
            if names is not None:
                continue
            group = groups[keys.name_digest] = Found(keys.slug, False)
        group.partitions.append(keys)
    return list(groups.values())
