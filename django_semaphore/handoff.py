"""Leases across processes: hand a held slot to another process (a Celery worker).

:meth:`Lease.handoff <django_semaphore.lease.Lease.handoff>` turns a held lease
into a *ticket*: a string signed with ``SECRET_KEY`` (:mod:`django.core.signing`,
a salt of this module's own) that expires with the lease.  From then on the
process that acquired the slot neither refreshes nor releases it (a guarded
view's slot stays held after the response).  :meth:`Lease.adopt
<django_semaphore.lease.Lease.adopt>` in another process rebuilds the lease
from the ticket: the same holder (identifier) and fencing token, whose
``refresh()`` and ``release()`` work there.

The ticket holds what the adopter needs and nothing it could not be trusted
with: the semaphore's name and partition value, the holder's identifier, token
and slot numbers (permits), when it was granted and when it expires, the partition's keys (their
hash tag), the TIMEOUT and algorithm to refresh and release with, and, for an
ad-hoc semaphore (``Semaphore(name, limit=...)``), its limit so that adopt can
rebuild it.  A tampered, expired or malformed ticket, or one naming a
semaphore this process does not know, raises :class:`HandoffError`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import time
from typing import TYPE_CHECKING, Any

from django.core import signing
from django.core.exceptions import ImproperlyConfigured

from . import conf, connection
from .algorithms import ALGORITHMS, Granted
from .exceptions import SemaphoreError
from .keys import PartitionKeys, name_hash
from .scripting import Command, LuaScript, Operation, Script, arun, one, run
from .validation import validate_entry

if TYPE_CHECKING:
    from .core import Semaphore
    from .lease import Lease
    from .validation import SemaphoreConfig

#: The class that rebuilds a ticket's semaphore.  The engine's front
#: (:mod:`django_semaphore.core`) registers :class:`~django_semaphore.Semaphore`
#: here when it is imported (:func:`register_semaphore_class`): the dependency
#: points from core to this module only, as core -> lease -> handoff does.
_semaphore_class: type[Semaphore] | None = None


def register_semaphore_class(cls: type[Semaphore]) -> None:
    """Make ``cls`` the class adopted tickets rebuild their semaphore with (core does this)."""
    global _semaphore_class
    _semaphore_class = cls


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


def remaining(lease: Lease) -> float:
    """Seconds until ``lease`` expires (as of its last refresh), within [0, TIMEOUT]."""
    left = lease.expires_ms / 1000.0 - time.time()
    return max(0.0, min(left, float(lease.config.timeout)))


def make_ticket(lease: Lease) -> str:
    """The signed ticket of ``lease`` (what :meth:`Lease.handoff` returns)."""
    config = lease.config
    payload: dict[str, Any] = {
        "v": VERSION,
        "n": lease.name,
        "k": lease.key,
        "i": lease.identifier,
        "t": lease.token,
        "a": lease.acquired_ms,
        "e": lease.expires_ms,
        "b": lease.keys.base,
        "s": list(lease.slots),  # the slot numbers held (SLOTS True: as many as its permits)
        "p": lease.permits,
        "to": config.timeout,
        "al": config.algorithm,
        # How long the ticket is good for: until the lease would expire, plus a margin.
        "ttl": remaining(lease) + MARGIN,
    }
    if lease.semaphore.ad_hoc:
        payload["l"] = config.limit
    return signing.dumps(payload, salt=SALT, compress=True)


def read_ticket(ticket: str) -> dict[str, Any]:
    """The payload of a genuine, unexpired ``ticket``; HandoffError otherwise."""
    if not isinstance(ticket, str) or not ticket:
        raise HandoffError(f"A semaphore ticket is a non-empty string, not {type(ticket).__name__}.")
    try:
        payload = signing.loads(ticket, salt=SALT)
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
        signing.loads(ticket, salt=SALT, max_age=datetime.timedelta(seconds=float(payload["ttl"])))
    except signing.SignatureExpired as exc:
        raise HandoffError(
            f"The ticket for semaphore {payload.get('n')!r} (token {payload.get('t')}) has expired "
            "with its lease: the slot may have gone to someone else."
        ) from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise HandoffError("The semaphore ticket is of an unknown format.") from exc
    return payload


def _semaphore(payload: dict[str, Any]) -> tuple[Semaphore, SemaphoreConfig]:
    semaphore_class = _semaphore_class
    if semaphore_class is None:  # importing django_semaphore imports core, which registers it
        raise HandoffError("django_semaphore.core is not loaded: import django_semaphore first.")
    name = payload["n"]
    if "l" in payload:  # ad-hoc: rebuilt from the ticket
        config, problems = validate_entry(
            name, {"LIMIT": payload["l"], "TIMEOUT": payload["to"], "ALGORITHM": payload["al"]}
        )
        if config is None or any(not p.warning for p in problems):
            raise HandoffError(f"The ticket for semaphore {name!r} holds an invalid configuration.")
        semaphore = semaphore_class(
            name, limit=config.limit, timeout=config.timeout, algorithm=config.algorithm
        )
        return semaphore, semaphore.config
    try:
        config = conf.get_config(name)
    except ImproperlyConfigured as exc:
        raise HandoffError(
            f"The ticket names semaphore {name!r}, which is not configured in this process's "
            f"SEMAPHORES: {exc}"
        ) from exc
    if config.algorithm != payload["al"] or config.timeout != payload["to"]:
        # Refresh and release the way the slot was taken (a rolling deploy may
        # have changed the settings meanwhile).
        config = _with(config, timeout=payload["to"], algorithm=payload["al"])
    return semaphore_class(name), config


def _with(config: SemaphoreConfig, **changes: Any) -> SemaphoreConfig:
    return dataclasses.replace(config, **changes)


def lease_from_ticket(lease_class: type[Lease], ticket: str) -> Lease:
    """The lease (of class ``lease_class``) a ticket stands for, in this process (no Redis round trip)."""
    payload = read_ticket(ticket)
    try:
        name, base, identifier = payload["n"], payload["b"], payload["i"]
        if not isinstance(name, str) or not isinstance(base, str) or not isinstance(identifier, str):
            raise TypeError
        if payload["al"] not in ALGORITHMS:
            raise HandoffError(f"The ticket for semaphore {name!r} names an unknown algorithm.")
        keys = PartitionKeys(base)
        if keys.name_digest != name_hash(name) or not base.startswith(
            str(conf.setting("SEMAPHORE_KEY_PREFIX"))
        ):
            raise HandoffError(
                f"The ticket's keys are not those of semaphore {name!r} under this SEMAPHORE_KEY_PREFIX."
            )
        slots = tuple(int(n) for n in payload.get("s", ()))
        permits = int(payload.get("p", len(slots) or 1))
        granted = Granted(int(payload["t"]), int(payload["a"]), int(payload["e"]), False, slots, permits)
    except (KeyError, TypeError, ValueError) as exc:
        raise HandoffError("The semaphore ticket is of an unknown format.") from exc
    semaphore, config = _semaphore(payload)
    return lease_class(semaphore, payload["k"], identifier, granted, keys, config)


#: Adds fields to a live holder's meta (one key: one cluster slot).
ANNOTATE = LuaScript("annotate")
#: Marks a ticket adopted: a second adoption by another adopter is refused.
ADOPT = LuaScript("adopt")


def annotate_op(lease: Lease, fields: dict[str, Any]) -> Operation[bool]:
    """Add ``fields`` to the meta stored with ``lease``'s holder (the admin shows it); False if not held."""
    text = json.dumps(fields, separators=(",", ":"), default=str)
    reply = yield Script(ANNOTATE, (lease.keys.holds,), (lease.identifier, text))
    return bool(reply)


def claim_op(lease: Lease, adopter: str) -> Operation[bool]:
    """Mark ``lease``'s ticket adopted by ``adopter``; False if another adopter has it.

    The mark lives as long as the ticket can be read (TIMEOUT + :data:`MARGIN`
    after the handoff at most), so a ticket is adopted once: by one adopter,
    which may adopt it again (a Celery task redelivered after its run died).
    """
    ttl_ms = int((lease.config.timeout + MARGIN) * 1000) + 1000
    reply = yield Script(ADOPT, (lease.keys.adopted(lease.identifier),), (adopter, ttl_ms))
    return bool(reply)


def adopted(lease: Lease) -> bool:
    """Whether ``lease``'s ticket has been adopted (one round trip)."""
    return bool(run(connection.get_client(), one(Command(("EXISTS", lease.keys.adopted(lease.identifier))))))


def _claimed(lease: Lease, claimed: bool) -> Lease:
    if not claimed:
        raise AlreadyAdopted(
            f"The ticket for semaphore {lease.name!r} (token {lease.token}) was already adopted: "
            "a ticket is single-use."
        )
    return lease


def _verified(lease: Lease, live: bool) -> Lease:
    if not live:
        raise HandoffError(
            f"The slot of semaphore {lease.name!r} (token {lease.token}) handed off by the ticket is no "
            "longer held: it expired or was released before it was adopted."
        )
    return lease


def adopt(
    lease_class: type[Lease],
    ticket: str,
    verify: bool = True,
    meta: dict[str, Any] | None = None,
    adopter: str | None = None,
) -> Lease:
    """:meth:`Lease.adopt <django_semaphore.lease.Lease.adopt>`: see there.

    ``adopter`` names who adopts (a Celery task id): the same adopter may adopt
    a ticket again; by default each call is an adopter of its own.
    """
    lease = lease_from_ticket(lease_class, ticket)
    client = connection.get_client()
    if verify:
        _verified(lease, lease.refresh())
    _claimed(lease, run(client, claim_op(lease, adopter or os.urandom(8).hex())))
    if meta:
        run(client, annotate_op(lease, meta))
    return lease


async def aadopt(
    lease_class: type[Lease],
    ticket: str,
    verify: bool = True,
    meta: dict[str, Any] | None = None,
    adopter: str | None = None,
) -> Lease:
    """The asyncio twin of :func:`adopt`."""
    lease = lease_from_ticket(lease_class, ticket)
    client = connection.get_async_client()
    if verify:
        _verified(lease, await lease.arefresh())
    _claimed(lease, await arun(client, claim_op(lease, adopter or os.urandom(8).hex())))
    if meta:
        await arun(client, annotate_op(lease, meta))
    return lease
