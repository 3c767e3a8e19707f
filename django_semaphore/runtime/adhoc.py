"""The registry of ad-hoc semaphores, so that the admin and ``sema_status`` list them too.

An ad-hoc :class:`~django_semaphore.Semaphore` (``Semaphore("crawler",
limit=3, timeout=10)``, no SEMAPHORES entry) is known only to the code that
makes it.  So that operators see it, every process that uses one records its
name and configuration in ``<prefix>:adhoc``
(:func:`~django_semaphore.backend.keys.adhoc_key`), a HASH: name digest -> JSON
``{"name", "truncated", "limit", "timeout", "wait", "algorithm", "mode",
"until", "total"}``.  The monitor (:mod:`~django_semaphore.ops.monitor`) lists the
recorded semaphores that have live partitions beside the configured ones.

Pay for what you use.  A process records a name when it takes a slot of it
(or renews a lease of it) for the first time, and again at most every
:data:`RENEW_EVERY` seconds while it keeps using it: on the acquire path this
costs one lookup in a dict of this process (and nothing at all for a
configured semaphore).  The record is not sent by the caller: the control
poller sends it in its next tick, in the pipeline that flushes the stats
(:func:`django_semaphore.runtime.stats.drain`), so an acquire never waits for it.

* Bounded: the field is the name's digest (16 hex characters) whatever the
  name holds; the stored name is cut to :data:`MAX_NAME_CHARS` characters
  (and lone surrogates replaced): such a name is ``truncated`` and its
  semaphore named by its digest in URLs and commands.  The admin's
  templates escape it.
* Cluster: the key is outside any partition (no braces), its own slot, like
  ``<prefix>:control``.
* TTL: the script that writes a record gives the key a TTL of at least
  2 x TIMEOUT + 10 s (plus :data:`GRACE_MS`, which outlasts a renewal) of the
  semaphore written, in the same call (no interrupted write leaves it without
  one), and never shortens it.  A record's ``until`` (epoch ms, the writer's
  clock) is when it goes stale unless renewed: ``sema_cleanup`` removes the
  stale records of semaphores without a live partition (:func:`prune`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..backend import forks
from ..backend.keys import NAME_DIGEST_SIZE, adhoc_key, name_hash
from ..backend.scripting import Command, Operation

if TYPE_CHECKING:
    from ..config.validation import SemaphoreConfig

RENEW_EVERY = 30.0  # seconds: a process records a name it keeps using at most this often
GRACE_MS = 300_000  # a record outlives 2 x TIMEOUT + 10 s by this much (many renewals)
MAX_NAME_CHARS = 200  # characters of a name stored (the digest names it whole)
MAX_REMEMBERED = 10_000  # names this process remembers having recorded
BATCH = 200  # records per script call (Lua's unpack has a limit)

# KEYS[1] the registry; ARGV: the TTL (ms), then field, value pairs.  HSET, then a TTL
# of at least ARGV[1] that never shortens one (PEXPIRE ... GT is Redis 7.0's).
REGISTER_SOURCE = (
    "redis.call('HSET', KEYS[1], unpack(ARGV, 2)) "
    "local ttl = tonumber(ARGV[1]) "
    "if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end"
)
# KEYS[1] the registry; ARGV: field, value pairs.  Remove each field whose value is
# still the one read (a process that recorded it again meanwhile keeps it).
PRUNE_SOURCE = (
    "local n = 0 "
    "for i = 1, #ARGV, 2 do "
    "if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then "
    "n = n + redis.call('HDEL', KEYS[1], ARGV[i]) end "
    "end "
    "return n"
)

_DIGEST = re.compile(f"[0-9a-f]{{{2 * NAME_DIGEST_SIZE}}}")

__all__ = ["Entry", "entries", "forget", "lookup", "prune", "seen", "shown_name", "ttl_ms"]


def ttl_ms(timeout: float) -> int:
    """How long a record of a semaphore with lease ``timeout`` lasts without renewal."""
    return int(2 * timeout * 1000) + 10_000 + GRACE_MS


@dataclass(frozen=True, slots=True)
class Entry:
    """One recorded ad-hoc semaphore, as the registry has it."""

    digest: str  # the name's digest (keys.name_hash): the field
    name: str  # the name, cut to MAX_NAME_CHARS (shown_name)
    truncated: bool  # the name is not the whole name
    limit: int
    timeout: float
    wait: float
    algorithm: str
    mode: str
    until_ms: int
    total: int | None = None  # TOTAL (None: none)

    @property
    def ident(self) -> str:
        """What names it in URLs and commands: its name, or its digest when the name was cut."""
        return self.digest if self.truncated else self.name

    @classmethod
    def parse(cls, digest: Any, raw: Any) -> Entry | None:
        """The entry of field ``digest`` and JSON ``raw`` (None if either is malformed)."""
        try:
            digest = digest.decode() if isinstance(digest, bytes) else str(digest)
            data = json.loads(raw)
            entry = cls(
                digest,
                shown_name(str(data["name"])),
                bool(data.get("truncated", False)),
                int(data["limit"]),
                float(data["timeout"]),
                float(data.get("wait", 0)),
                str(data.get("algorithm", "lua")),
                str(data.get("mode", "enforce")),
                int(data.get("until", 0)),
                int(data["total"]) if data.get("total") is not None else None,
            )
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):  # JSON 1e400: inf
            return None
        return entry if _DIGEST.fullmatch(digest) else None


def shown_name(name: str) -> str:
    """What the registry keeps of ``name``: its first :data:`MAX_NAME_CHARS` characters,
    with any that UTF-8 cannot hold (lone surrogates) replaced."""
    return name[:MAX_NAME_CHARS].encode("utf-8", "replace").decode("utf-8")


def _record(config: SemaphoreConfig, now_ms: int) -> str:
    name = config.name
    shown = shown_name(name)
    return json.dumps(
        {
            "name": shown,
            "truncated": shown != name,  # not the whole name: it goes by its digest
            "limit": config.limit,
            "timeout": config.timeout,
            "wait": config.wait,
            "algorithm": config.algorithm,
            "mode": config.mode,
            "until": now_ms + ttl_ms(config.timeout),
            "total": config.total,
        },
        separators=(",", ":"),
    )


# -- recording (every process) ---------------------------------------------------------

_lock = threading.Lock()
#: (prefix, name) -> when (time.monotonic()) this process records it again.
_due: dict[tuple[str, str], float] = {}
#: What the next flush sends: (prefix, name) -> the configuration to record.
_pending: dict[tuple[str, str], SemaphoreConfig] = {}


@forks.in_child
def _forget_the_parents_records() -> None:
    global _lock, _due, _pending
    # The parent sends its own records; a child records what it uses itself.
    _lock, _due, _pending = threading.Lock(), {}, {}


def seen(prefix: str, config: SemaphoreConfig) -> None:
    """Ad-hoc semaphore ``config`` took (or kept) a slot under ``prefix``: record it,
    unless this process did less than :data:`RENEW_EVERY` seconds ago.  No Redis call."""
    key = (prefix, config.name)
    now = time.monotonic()
    if now < _due.get(key, 0.0):
        return
    with _lock:
        if len(_due) >= MAX_REMEMBERED:  # names used once (e.g. one per job): forget the old
            for old in [k for k, due in _due.items() if due <= now]:
                del _due[old]
        _due[key] = now + RENEW_EVERY
        _pending[key] = config


class Pending:
    """What :func:`drain` took: the commands that send it, and a way to put it back."""

    def __init__(self, taken: dict[tuple[str, str], SemaphoreConfig]) -> None:
        self.taken = taken
        self.commands = _commands(taken) if taken else ()

    def restore(self) -> None:
        """The send failed: keep the records for the next flush (newer ones win)."""
        if self.taken:
            with _lock:
                for key, config in self.taken.items():
                    _pending.setdefault(key, config)


def drain() -> Pending:
    """Take the records not sent yet (the stats flush sends them)."""
    global _pending
    if not _pending:
        return Pending({})
    with _lock:
        taken, _pending = _pending, {}
    return Pending(taken)


def _commands(taken: dict[tuple[str, str], SemaphoreConfig]) -> tuple[tuple[Any, ...], ...]:
    now_ms = int(time.time() * 1000)
    by_prefix: dict[str, list[SemaphoreConfig]] = {}
    for (prefix, _), config in taken.items():
        by_prefix.setdefault(prefix, []).append(config)
    commands: list[tuple[Any, ...]] = []
    for prefix, configs in by_prefix.items():
        for start in range(0, len(configs), BATCH):
            batch = configs[start : start + BATCH]
            ttl = max(ttl_ms(config.timeout) for config in batch)
            pairs = [item for c in batch for item in (name_hash(c.name), _record(c, now_ms))]
            commands.append(("EVAL", REGISTER_SOURCE, 1, adhoc_key(prefix), ttl, *pairs))
    return tuple(commands)


def forget() -> None:
    """Forget what this process recorded and has yet to send (another Redis server; tests)."""
    with _lock:
        _due.clear()
        _pending.clear()


@receiver(setting_changed)
def _other_server(*, setting: str, **kwargs: Any) -> None:
    if setting in ("SEMAPHORE_REDIS", "CACHES"):
        forget()  # the new server has none of this process's records


# -- reading (the monitor, the commands) -----------------------------------------------


def entries(prefix: str) -> Operation[dict[str, Entry]]:
    """Every well-formed record under ``prefix``, by name digest."""
    raw = yield Command(("HGETALL", adhoc_key(prefix)))
    found = {}
    for field, value in (raw or {}).items():
        entry = Entry.parse(field, value)
        if entry is not None:
            found[entry.digest] = entry
    return found


def lookup(prefix: str, ident: str) -> Operation[Entry | None]:
    """The record named ``ident``: an ad-hoc semaphore's name, or (a name that was cut)
    its digest; None if there is none."""
    key = adhoc_key(prefix)
    digest = name_hash(ident)
    entry = Entry.parse(digest, (yield Command(("HGET", key, digest))))
    if entry is not None and not entry.truncated and entry.name == ident:
        return entry
    if _DIGEST.fullmatch(ident):
        return Entry.parse(ident, (yield Command(("HGET", key, ident))))
    return None


def prune(prefix: str, live: Iterable[str], dry_run: bool = False) -> Operation[int]:
    """Remove (or count, with ``dry_run``) the stale records under ``prefix``: past their
    ``until`` and naming no semaphore whose digest is in ``live`` (those with live
    partitions).  Malformed records go too.  Returns how many."""
    key = adhoc_key(prefix)
    live = set(live)
    now_ms = int(time.time() * 1000)
    raw = yield Command(("HGETALL", key))
    stale = []
    for field, value in (raw or {}).items():
        entry = Entry.parse(field, value)
        if entry is None or (entry.digest not in live and entry.until_ms < now_ms):
            stale.append((field, value))
    if dry_run or not stale:
        return len(stale)
    removed = 0
    for start in range(0, len(stale), BATCH):
        pairs = [item for pair in stale[start : start + BATCH] for item in pair]
        removed += int((yield Command(("EVAL", PRUNE_SOURCE, 1, key, *pairs))))
    return removed
