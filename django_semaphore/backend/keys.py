"""Redis key naming.

Every key of one semaphore partition looks like::

    <prefix>:<slug>:{<name hash>.<key hash>}:<suffix>

* ``<prefix>`` is SEMAPHORE_KEY_PREFIX;
* ``<slug>`` is a readable, sanitised and truncated copy of the semaphore name,
  for people reading ``redis-cli --scan`` output only;
* the ``{...}`` part is the cluster hash tag: it is made of hex digests only,
  so whatever the name or the key value holds (braces, NUL, newlines, 100 kB),
  all keys of the partition share one slot, keys stay short, and two names can
  never share keys (``"x:owner"`` hashes differently from ``"x"``);
* the key hash is ``_`` for the unpartitioned semaphore (``key=None``), which no
  digest can equal, so ``key=None`` and ``key=""`` are different partitions.

A semaphore with TOTAL keeps one set of keys for all its partitions, whose
key hash is ``+`` (:data:`WHOLE_NAME`): one script must see the whole name to
share TOTAL between the partitions, so they share one slot.  Its
:class:`PartitionKeys` carry the partition's key hash in :attr:`~PartitionKeys.part`
(the scripts find a holder's partition in its identifier, ``part/...``).

Two more kinds of keys live under the prefix, outside any partition (no
braces: each is its own cluster slot, and no partition SCAN pattern matches
them):

* ``<prefix>:control`` (:func:`control_key`): a HASH of the runtime overrides,
  semaphore name -> JSON (:mod:`django_semaphore.runtime.control`), and of the
  adaptive limits' state, in fields ``b"\xffa:" + name`` that no name sent as
  UTF-8 can be (:mod:`django_semaphore.runtime.adaptive`).  It is configuration, not a
  partition: it has no TTL.
* ``<prefix>:stats:<name hash>:c`` and ``...:h`` (:func:`stats_keys`): the
  recent refusals (a HASH of 10-second buckets) and hold times (a LIST) of one
  semaphore (:mod:`django_semaphore.runtime.stats`), with a TTL of a few minutes.
* ``<prefix>:adhoc`` (:func:`adhoc_key`): a HASH of the ad-hoc semaphores
  in use, name hash -> JSON of the name and configuration
  (:mod:`django_semaphore.runtime.adhoc`), with a TTL that its writes renew.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field

_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
# A partition's key hash: "_" (unpartitioned) or a key digest.  Matched with
# fullmatch: "$" would also match before a trailing newline ("_\n").
_KEY_HASH = re.compile(r"_|\+|[0-9a-f]{20}")

SLUG_LENGTH = 40
NAME_DIGEST_SIZE = 8  # bytes -> 16 hex characters
KEY_DIGEST_SIZE = 10  # bytes -> 20 hex characters
UNPARTITIONED = "_"
WHOLE_NAME = "+"  # the key hash of the keys a TOTAL name's partitions share
CACHED_KEY_LENGTH = 200  # longer partition values are hashed at every call
CACHED_NAME_LENGTH = 200  # longer semaphore names (ad hoc ones come from runtime input) too

# Suffixes of the keys of one partition.
TIMEOUTS = "t"  # ZSET identifier -> expiry ms (server time; client time for the seed variants)
OWNERS = "o"  # ZSET identifier -> fair counter value (the token); TOTAL: the ready ZSET
HOLDS = "h"  # HASH identifier -> "token:acquired_ms:meta json"; field "#" = counter;
#              "@" + identifier -> its slot numbers, "3,5" or runs "0-9999,10002" ("lua")
QUEUE = "q"  # ZSET "ticket:permits:identifier" -> -priority (serving order: priority, then ticket)
QUEUE_DEADLINES = "d"  # ZSET the same members -> ticket expiry (ms)
LOCK = "l"  # STRING the fair_locked variant's lock
RANKS = "r"  # ZSET scratch "fair" ranks live owners in; created and deleted in one MULTI
WAKE = "w:"  # LIST per waiter: a push here wakes it (suffix + identifier)
WAITERS = "m"  # HASH waiter identifier -> "ticket:permits:meta json" ("lua"), while it is queued
SLOTS = "s"  # STRING bitmap: bit n set while a live holder has slot n ("lua")
ADOPTED = "a:"  # STRING per handed-off holder: who adopted its ticket (suffix + identifier)

CONTROL = "control"  # <prefix>:control, the runtime overrides
ADHOC = "adhoc"  # <prefix>:adhoc, the ad-hoc semaphores in use
STATS = "stats"  # <prefix>:stats:<name hash>:<c|h>


def _digest(value: object, size: int) -> str:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=size).hexdigest()


def name_hash(name: str) -> str:
    """The hex digest identifying a semaphore name inside key hash tags."""
    return _digest(name, NAME_DIGEST_SIZE)


def key_hash(key: object) -> str:
    """The hex digest identifying a partition value (``_`` for ``None``)."""
    if key is None:
        return UNPARTITIONED
    return _digest(key, KEY_DIGEST_SIZE)


def slug(name: str) -> str:
    """A readable, key-safe, bounded rendering of a semaphore name."""
    text = _SLUG_UNSAFE.sub("_", str(name))[:SLUG_LENGTH]
    return text or "_"


def glob_escape(text: str) -> str:
    """Escape ``text`` for a Redis SCAN MATCH pattern."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


@dataclass(frozen=True, slots=True)
class PartitionKeys:
    """The Redis keys of one semaphore partition, all in one hash slot."""

    base: str
    #: TOTAL: the partition's key hash (``_`` or a digest) inside the keys of
    #: the whole name (:data:`WHOLE_NAME`); "" for a partition with keys of its
    #: own, and for the whole name.
    part: str = ""
    # Derived once, not at every call: each acquire and release passes them.
    main: tuple[str, str, str, str, str, str, str] = field(init=False, repr=False, compare=False)
    wake_prefix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        base = self.base
        # Keys every script takes, in the order the scripts expect them.
        main = (
            base + TIMEOUTS,
            base + OWNERS,
            base + HOLDS,
            base + QUEUE,
            base + QUEUE_DEADLINES,
            base + WAITERS,
            base + SLOTS,
        )
        object.__setattr__(self, "main", main)
        object.__setattr__(self, "wake_prefix", base + WAKE)

    @classmethod
    def build(cls, prefix: str, name: str, key: object = None) -> PartitionKeys:
        # Cached for short names, unpartitioned or with short partition values
        # (two digests and a regex per call otherwise); long, user-controlled
        # names and values are not kept in memory.
        if cls is PartitionKeys and _cacheable(name, key):
            return _build_cached(prefix, name, key)
        return cls(_base(prefix, name, key))

    @classmethod
    def for_total(cls, prefix: str, name: str, key: object = None) -> PartitionKeys:
        """The keys of partition ``key`` of semaphore ``name``, which has TOTAL:
        the whole name's keys, with the partition's key hash as :attr:`part`."""
        if _cacheable(name, key):
            return _total_cached(prefix, name, key)
        return cls(_base(prefix, name, WHOLE_NAME, hashed=True), key_hash(key))

    def within(self, part: str) -> PartitionKeys:
        """Partition ``part`` (a key hash) of these keys of a whole TOTAL name."""
        if not isinstance(part, str) or part == WHOLE_NAME or not _KEY_HASH.fullmatch(part):
            raise ValueError(f"{part!r} is not a partition hash.")
        return PartitionKeys(self.base, part)

    @property
    def own(self) -> str:
        """The start of keys of this partition alone, for records kept beside it
        (``semaphore_task``'s parked tasks): :attr:`base`, or within a TOTAL
        name's keys ``base + part + ":"`` (the same hash tag: the same slot)."""
        return f"{self.base}{self.part}:" if self.part else self.base

    @property
    def whole(self) -> PartitionKeys:
        """The keys of the whole TOTAL name (no :attr:`part`)."""
        return PartitionKeys(self.base) if self.part else self

    @property
    def shared(self) -> bool:
        """True for the keys of a TOTAL name (all partitions in one set of keys)."""
        return self.key_hash_in_tag == WHOLE_NAME

    @classmethod
    def for_hash(cls, prefix: str, name: str, key_hash: str, name_digest: str | None = None) -> PartitionKeys:
        """The keys of semaphore ``name``'s partition whose key hash is ``key_hash``
        (as :attr:`key_digest` gives it, e.g. from a form); ValueError if malformed.

        ``name_digest``: the name's :func:`name_hash` when ``name`` is only the
        start of the name (at least its first :data:`SLUG_LENGTH` characters,
        which make the slug), as the registry of ad-hoc semaphores keeps long ones.
        """
        if not isinstance(key_hash, str) or not _KEY_HASH.fullmatch(key_hash):
            raise ValueError(f"{key_hash!r} is not a partition hash.")
        return cls(f"{prefix}:{slug(name)}:{{{name_digest or name_hash(name)}.{key_hash}}}:")

    @classmethod
    def from_timeouts_key(cls, key: str | bytes, prefix: str) -> PartitionKeys:
        """The keys of the partition whose timeout ZSET is ``key`` (found by SCAN) under
        ``prefix``; ValueError if ``key`` is not one this package writes there.

        The SCAN pattern (:func:`timeouts_pattern`) also matches keys of a longer
        prefix (its ``*`` matches ``:``: prefix ``sema`` would find ``sema:other``'s
        keys) and any stray key ending the same way: only the exact shape,
        ``<prefix>:<slug>:{<name digest>.<key hash>}:t``, is a partition's.
        """
        if isinstance(key, bytes):
            key = key.decode("utf-8", "surrogateescape")
        if not _timeouts_shape(prefix).fullmatch(key):
            raise ValueError(f"{key!r} is not the timeout key of a partition under {prefix!r}.")
        return cls(key[: -len(TIMEOUTS)])

    @property
    def timeouts(self) -> str:
        return self.base + TIMEOUTS

    @property
    def owners(self) -> str:
        return self.base + OWNERS

    @property
    def holds(self) -> str:
        return self.base + HOLDS

    @property
    def queue(self) -> str:
        return self.base + QUEUE

    @property
    def queue_deadlines(self) -> str:
        return self.base + QUEUE_DEADLINES

    @property
    def waiters(self) -> str:
        return self.base + WAITERS

    @property
    def slots(self) -> str:
        return self.base + SLOTS

    @property
    def lock(self) -> str:
        return self.base + LOCK

    def wake(self, identifier: str) -> str:
        return self.wake_prefix + identifier

    def adopted(self, identifier: str) -> str:
        """The mark that holder ``identifier``'s handoff ticket has been adopted (single use)."""
        return self.base + ADOPTED + identifier

    @property
    def partition_hash(self) -> str:
        """The ``name.key`` digests inside the hash tag."""
        return self.base[self.base.rindex("{") + 1 : self.base.rindex("}")]

    @property
    def name_digest(self) -> str:
        """The semaphore name's digest (:func:`name_hash`)."""
        return self.partition_hash.split(".", 1)[0]

    @property
    def key_hash_in_tag(self) -> str:
        """The key hash inside the hash tag: the partition's, or :data:`WHOLE_NAME`."""
        return self.partition_hash.split(".", 1)[1]

    @property
    def key_digest(self) -> str:
        """The partition value's digest (:func:`key_hash`): ``_`` for the unpartitioned semaphore;
        :data:`WHOLE_NAME` for the keys of a whole TOTAL name."""
        return self.part or self.key_hash_in_tag

    @property
    def slug(self) -> str:
        """The readable slug of the semaphore name (all that is left of a name
        no longer configured)."""
        # "<prefix>:<slug>:{<digests>}:": a slug holds no ":" and no "{".
        return self.base[: self.base.rindex(":{")].rsplit(":", 1)[1]


def _base(prefix: str, name: str, key: object, hashed: bool = False) -> str:
    digest = key if hashed else key_hash(key)
    return f"{prefix}:{slug(name)}:{{{name_hash(name)}.{digest}}}:"


@functools.lru_cache(maxsize=64)
def _timeouts_shape(prefix: str) -> re.Pattern[str]:
    """The exact shape of a partition's timeout key under ``prefix`` (see :func:`slug`,
    :func:`name_hash` and :func:`key_hash`)."""
    return re.compile(
        rf"{re.escape(prefix)}:[A-Za-z0-9_.-]{{1,{SLUG_LENGTH}}}:"
        rf"\{{[0-9a-f]{{{2 * NAME_DIGEST_SIZE}}}\.(?:{_KEY_HASH.pattern})\}}:{TIMEOUTS}"
    )


def _cacheable(name: str, key: object) -> bool:
    """Whether the keys of ``name``'s partition ``key`` are kept in the caches below: a
    short name (:data:`CACHED_NAME_LENGTH`), and no key or a short one
    (:data:`CACHED_KEY_LENGTH`), so that 1,024 entries of each cache stay about 2 MB at most
    (measured: 2.2 MB with names and keys of 200 characters)."""
    return (
        type(name) is str
        and len(name) <= CACHED_NAME_LENGTH
        and (key is None or (type(key) is str and len(key) <= CACHED_KEY_LENGTH))
    )


@functools.lru_cache(maxsize=1024)
def _build_cached(prefix: str, name: str, key: str | None) -> PartitionKeys:
    return PartitionKeys(_base(prefix, name, key))


@functools.lru_cache(maxsize=1024)
def _total_cached(prefix: str, name: str, key: str | None) -> PartitionKeys:
    return PartitionKeys(_base(prefix, name, WHOLE_NAME, hashed=True), key_hash(key))


def timeouts_pattern(prefix: str, name: str | None = None, name_digest: str | None = None) -> str:
    """SCAN MATCH pattern for the timeout ZSETs of one semaphore (or of all).

    ``name_digest``: as for :meth:`PartitionKeys.for_hash`, when ``name`` is only its start.
    """
    if name is None:
        return f"{glob_escape(prefix)}:*:{{*}}:{TIMEOUTS}"
    digest = name_digest or name_hash(name)
    return f"{glob_escape(prefix)}:{glob_escape(slug(name))}:{{{glob_escape(digest)}.*}}:{TIMEOUTS}"


def control_key(prefix: str) -> str:
    """The HASH of the runtime overrides under ``prefix`` (no TTL: configuration)."""
    return f"{prefix}:{CONTROL}"


def adhoc_key(prefix: str) -> str:
    """The HASH of the ad-hoc semaphores in use under ``prefix`` (name hash -> JSON)."""
    return f"{prefix}:{ADHOC}"


def stats_keys(prefix: str, name: str) -> tuple[str, str]:
    """The recent-stats keys of semaphore ``name``: (refusal counts HASH, hold times LIST)."""
    base = f"{prefix}:{STATS}:{name_hash(name)}:"
    return base + "c", base + "h"
