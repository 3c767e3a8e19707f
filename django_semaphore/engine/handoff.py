"""Leases across processes: hand a held slot to another process (a Celery worker).

:meth:`Lease.handoff <django_semaphore.Lease.handoff>` turns a held lease
into a *ticket*: a string signed with ``SECRET_KEY`` (:mod:`django.core.signing`,
a salt of this module's own) that expires with the lease.  From then on the
process that acquired the slot neither refreshes nor releases it (a guarded
view's slot stays held after the response).  :meth:`Lease.adopt
<django_semaphore.Lease.adopt>` in another process rebuilds the lease
from the ticket: the same holder (identifier) and fencing token, whose
``refresh()`` and ``release()`` work there.

The ticket holds what the adopter needs and nothing it could not be trusted
with: the semaphore's name and partition value, the holder's identifier, token
and slot numbers (permits), when it was granted and when it expires, the partition's keys (their
hash tag), the TIMEOUT and algorithm to refresh and release with, and, for an
ad-hoc semaphore (``Semaphore(name, limit=...)``), its limit so that adopt can
rebuild it.  A tampered, expired or malformed ticket, or one naming a
semaphore this process does not know, raises :class:`HandoffError`.

This module knows tickets, not leases: :class:`Ticket` is what travels, and
the lease and its semaphore are built from it where both classes live
(:func:`django_semaphore.engine.semaphore.lease_from_ticket`), so nothing here
reaches up to them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from dataclasses import dataclass
from typing import Any

from django.core import signing
from django.core.exceptions import ImproperlyConfigured

from ..backend import connection
from ..backend.keys import PartitionKeys, name_hash
from ..backend.scripting import Command, LuaScript, Operation, Script, one, run
from ..config import settings
from ..config.validation import SemaphoreConfig, validate_entry
from ..exceptions import SemaphoreError
from .algorithms import ALGORITHMS, Granted
from .algorithms.total import partition_of

#: The signing salt: a ticket is no other signed value of the site.
SALT = "django_semaphore.handoff.ticket"
#: Seconds a ticket stays valid after the lease it was made from would expire (clock skew, transit).
MARGIN = 5.0
#: The ticket format's version.
VERSION = 1


class HandoffError(SemaphoreError):
    """A ticket that cannot be adopted: tampered, expired, malformed, or naming an
    unknown semaphore; adopted already; or (when adopt verifies) a slot no longer held."""


class AlreadyAdopted(HandoffError):
    """The ticket was adopted already (by another adopter): a ticket is single-use."""


@dataclass(frozen=True)
class Ticket:
    """What a ticket carries: a held slot, as another process rebuilds its lease from it."""

    name: str
    key: str | None
    identifier: str
    #: The holder's token, when it was granted and expires, its slots and permits.
    granted: Granted
    #: The partition's keys.
    keys: PartitionKeys
    #: TIMEOUT and ALGORITHM to refresh and release with (as when the slot was taken).
    timeout: float
    algorithm: str
    #: An ad-hoc semaphore's LIMIT, to rebuild it; None for one configured in SEMAPHORES.
    limit: int | None = None
    #: An ad-hoc semaphore's TOTAL, to rebuild it (None: none, or configured).
    total: int | None = None

    def remaining(self) -> float:
        """Seconds until the slot expires (as of its last refresh), within [0, TIMEOUT]."""
        left = self.granted.expires_ms / 1000.0 - time.time()
        return max(0.0, min(left, float(self.timeout)))


def sign(ticket: Ticket) -> str:
    """The signed text of ``ticket`` (what :meth:`Lease.handoff <django_semaphore.Lease.handoff>` returns)."""
    granted = ticket.granted
    payload: dict[str, Any] = {
        "v": VERSION,
        "n": ticket.name,
        "k": ticket.key,
        "i": ticket.identifier,
        "t": granted.token,
        "a": granted.acquired_ms,
        "e": granted.expires_ms,
        "b": ticket.keys.base,
        "s": list(granted.slots),  # the slot numbers held (SLOTS True: as many as its permits)
        "p": granted.permits,
        "to": ticket.timeout,
        "al": ticket.algorithm,
        # How long the ticket is good for: until the lease would expire, plus a margin.
        "ttl": ticket.remaining() + MARGIN,
    }
    if ticket.limit is not None:
        payload["l"] = ticket.limit
    if ticket.total is not None:
        payload["tt"] = ticket.total
    return signing.dumps(payload, salt=SALT, compress=True)


def read_payload(text: str) -> dict[str, Any]:
    """The payload of a genuine, unexpired ticket ``text``; HandoffError otherwise."""
    if not isinstance(text, str) or not text:
        raise HandoffError(f"A semaphore ticket is a non-empty string, not {type(text).__name__}.")
    try:
        payload = signing.loads(text, salt=SALT)
    except signing.BadSignature as exc:
        raise HandoffError(
            "The semaphore ticket is not genuine (tampered with, or signed with another SECRET_KEY)."
        ) from exc
    except Exception as exc:  # a signature that matches but a body that does not decode
        raise HandoffError(f"The semaphore ticket could not be read: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("v") != VERSION:
        raise HandoffError("The semaphore ticket is of an unknown format.")
    try:
        # Checked again with the age this ticket's lease allowed it.
        signing.loads(text, salt=SALT, max_age=datetime.timedelta(seconds=float(payload["ttl"])))
    except signing.SignatureExpired as exc:
        raise HandoffError(
            f"The ticket for semaphore {payload.get('n')!r} (token {payload.get('t')}) has expired "
            "with its lease: the slot may have gone to someone else."
        ) from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise HandoffError("The semaphore ticket is of an unknown format.") from exc
    return payload


def read(text: str) -> Ticket:
    """The :class:`Ticket` a genuine, unexpired ticket ``text`` stands for (no Redis round trip).

    HandoffError for a tampered, expired or malformed ticket, or one whose keys
    are not those of its semaphore under this process's SEMAPHORE_KEY_PREFIX.
    """
    payload = read_payload(text)
    try:
        name, base, identifier = payload["n"], payload["b"], payload["i"]
        if not isinstance(name, str) or not isinstance(base, str) or not isinstance(identifier, str):
            raise TypeError
        if payload["al"] not in ALGORITHMS:
            raise HandoffError(f"The ticket for semaphore {name!r} names an unknown algorithm.")
        keys = PartitionKeys(base)
        if keys.shared:  # TOTAL: the partition is in the identifier ("part/...")
            keys = keys.within(partition_of(identifier))
        if keys.name_digest != name_hash(name) or not base.startswith(
            str(settings.setting("SEMAPHORE_KEY_PREFIX"))
        ):
            raise HandoffError(
                f"The ticket's keys are not those of semaphore {name!r} under this SEMAPHORE_KEY_PREFIX."
            )
        slots = tuple(int(n) for n in payload.get("s", ()))
        permits = int(payload.get("p", len(slots) or 1))
        granted = Granted(int(payload["t"]), int(payload["a"]), int(payload["e"]), False, slots, permits)
        return Ticket(
            name,
            payload["k"],
            identifier,
            granted,
            keys,
            payload["to"],
            payload["al"],
            payload.get("l"),
            payload.get("tt"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise HandoffError("The semaphore ticket is of an unknown format.") from exc


def config_of(ticket: Ticket) -> SemaphoreConfig:
    """The configuration to refresh and release ``ticket``'s slot with.

    An ad-hoc semaphore's is rebuilt from the ticket; a configured one's is
    this process's SEMAPHORES entry, with the ticket's TIMEOUT and algorithm
    (a rolling deploy may have changed the settings meanwhile).  HandoffError
    for an invalid one, or a name this process does not know.
    """
    name = ticket.name
    if ticket.limit is not None:  # ad-hoc: rebuilt from the ticket
        entry: dict[str, Any] = {
            "LIMIT": ticket.limit,
            "TIMEOUT": ticket.timeout,
            "ALGORITHM": ticket.algorithm,
        }
        if ticket.total is not None:
            entry["TOTAL"] = ticket.total
        config, problems = validate_entry(name, entry, ad_hoc=True)
        if config is None or any(not p.warning for p in problems):
            raise HandoffError(f"The ticket for semaphore {name!r} holds an invalid configuration.")
        return config
    try:
        config = settings.get_config(name)
    except ImproperlyConfigured as exc:
        raise HandoffError(
            f"The ticket names semaphore {name!r}, which is not configured in this process's "
            f"SEMAPHORES: {exc}"
        ) from exc
    if config.algorithm != ticket.algorithm or config.timeout != ticket.timeout:
        config = dataclasses.replace(config, timeout=ticket.timeout, algorithm=ticket.algorithm)
    return config


#: Adds fields to a live holder's meta (one key: one cluster slot).
ANNOTATE = LuaScript("annotate")
#: Marks a ticket adopted: a second adoption by another adopter is refused.
ADOPT = LuaScript("adopt")


def annotate_op(keys: PartitionKeys, identifier: str, fields: dict[str, Any]) -> Operation[bool]:
    """Add ``fields`` to the meta stored with holder ``identifier`` of partition ``keys`` (the
    admin shows it); False if it is not held."""
    text = json.dumps(fields, separators=(",", ":"), default=str)
    reply = yield Script(ANNOTATE, (keys.holds,), (identifier, text))
    return bool(reply)


def annotate(keys: PartitionKeys, identifier: str, fields: dict[str, Any]) -> bool:
    """:func:`annotate_op`, run now on this process's client."""
    return run(connection.get_client(), annotate_op(keys, identifier, fields))


def claim_op(keys: PartitionKeys, identifier: str, timeout: float, adopter: str) -> Operation[bool]:
    """Mark the ticket of holder ``identifier`` adopted by ``adopter``; False if another adopter has it.

    The mark lives as long as the ticket can be read (TIMEOUT + :data:`MARGIN`
    after the handoff at most), so a ticket is adopted once: by one adopter,
    which may adopt it again (a Celery task redelivered after its run died).
    """
    reply = yield Script(ADOPT, (keys.adopted(identifier),), (adopter, mark_ttl_ms(timeout)))
    return bool(reply)


def mark_ttl_ms(timeout: float) -> int:
    """How long an adoption mark lives (ms): as long as a ticket of a lease of TIMEOUT
    ``timeout`` can be read, and a second more."""
    return int((timeout + MARGIN) * 1000) + 1000


def claim(keys: PartitionKeys, identifier: str, timeout: float, adopter: str) -> bool:
    """:func:`claim_op`, run now on this process's client."""
    return run(connection.get_client(), claim_op(keys, identifier, timeout, adopter))


def adopted(keys: PartitionKeys, identifier: str) -> bool:
    """Whether the ticket of holder ``identifier`` has been adopted (one round trip)."""
    return bool(run(connection.get_client(), one(Command(("EXISTS", keys.adopted(identifier))))))


def already_adopted(ticket: Ticket) -> AlreadyAdopted:
    """The error for a ticket another adopter has adopted already."""
    return AlreadyAdopted(
        f"The ticket for semaphore {ticket.name!r} (token {ticket.granted.token}) was already adopted: "
        "a ticket is single-use."
    )


def no_longer_held(ticket: Ticket) -> HandoffError:
    """The error for a ticket whose slot expired or was released before it was adopted."""
    return HandoffError(
        f"The slot of semaphore {ticket.name!r} (token {ticket.granted.token}) handed off by the ticket is "
        "no longer held: it expired or was released before it was adopted."
    )
