"""The Lease: a held slot, refreshed and released by the process that took it.

A lease is made by :meth:`Semaphore.try_acquire
<django_semaphore.core.Semaphore.try_acquire>`.  A release that Redis does not
answer is handed to :mod:`~django_semaphore.recovery`, which sends it again;
whichever answer comes first (the caller's own retry or the recovery
thread's) settles it, with one ``released`` signal.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from . import adhoc, conf, connection, control, handoff, recovery, signals, stats
from .algorithms import ALGORITHMS, Algorithm, Granted
from .inspection import to_datetime
from .keys import PartitionKeys
from .scripting import Operation, arun, run

if TYPE_CHECKING:
    from .core import Semaphore
    from .validation import SemaphoreConfig


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
        "keys",
        "config",
        "over_limit",
        "permits",
        "slots",
        "ticket",
        "_started",
        "_done",
        "_lost",
        "_retrying",
        "_pid",
        "_handed_off",
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
        #: The Redis keys of the partition held.
        self.keys = keys
        #: The semaphore's configuration when the slot was granted (TIMEOUT, algorithm...).
        self.config = config
        #: True only in MODE "dry_run" (or "off") when enforcing would have refused this caller.
        self.over_limit = granted.over_limit
        #: The slot numbers held, one per permit: distinct among the partition's
        #: live holders, in range(limit) (SLOTS True; empty otherwise).
        self.slots = granted.slots
        #: How many of the limit this lease holds.
        self.permits = granted.permits
        #: Its queue ticket number (server microseconds when it queued) if it
        #: waited in the queue, else "": with the token, the server's own
        #: record of arrival and grant order.
        self.ticket = granted.ticket
        self._started = time.monotonic()  # for the hold time (stats)
        self._done = False
        self._lost = False
        self._retrying = False  # a release went unanswered: recovery retries it
        self._pid = os.getpid()
        self._handed_off = False  # handoff(): another process refreshes and releases it

    def __repr__(self) -> str:
        return f"<Lease {self.semaphore.name!r} token={self.token} key={self.key!r}>"

    @property
    def name(self) -> str:
        """The semaphore's name."""
        return self.semaphore.name

    @property
    def acquired_at(self) -> datetime.datetime:
        """When the slot was granted (server time for the "lua" algorithm)."""
        return to_datetime(self.acquired_ms)

    @property
    def expires_at(self) -> datetime.datetime:
        """When the slot is lost unless refreshed (as of the last refresh)."""
        return to_datetime(self.expires_ms)

    @property
    def released(self) -> bool:
        """True once release() has been called."""
        return self._done

    @property
    def lost(self) -> bool:
        """True once a refresh or release found the slot gone."""
        return self._lost

    @property
    def handed_off(self) -> bool:
        """True once :meth:`handoff` gave the slot to another process."""
        return self._handed_off

    def handoff(self) -> str:
        """Hand the slot to another process: a ticket for :meth:`adopt` there.

        The ticket is signed with SECRET_KEY and expires with the lease.  From
        now on this process neither refreshes nor releases the slot (release()
        and refresh() return False): a guarded view's slot stays held after its
        response, until the adopter releases it or it expires.  ValueError if
        the lease was already released, lost or handed off.
        """
        if self._done or self._lost or self._handed_off or self._pid != os.getpid():
            raise ValueError(f"{self!r} is no longer held by this process: it cannot be handed off.")
        ticket = handoff.make_ticket(self)
        self._handed_off = True
        return ticket

    @classmethod
    def adopt(cls, ticket: str, *, verify: bool = True, meta: dict[str, Any] | None = None) -> Lease:
        """The lease a :meth:`handoff` ticket stands for, held by this process now.

        Same semaphore, partition, identifier and token: refresh() and
        release() work here.  With ``verify`` (the default) the slot is
        refreshed at once, which checks that it is still held (one round trip).
        ``meta`` (e.g. ``{"task_id": ...}``) is added to the meta stored with
        the holder, for the admin to show who holds it now.  A ticket is
        single-use: a second adopt raises
        :class:`~django_semaphore.handoff.AlreadyAdopted`.  Raises
        :class:`~django_semaphore.handoff.HandoffError` (a SemaphoreError) for
        a tampered, expired or malformed ticket, an unknown semaphore, one
        adopted already, or (``verify``) a slot no longer held.
        """
        return handoff.adopt(cls, ticket, verify, meta)

    @classmethod
    async def aadopt(cls, ticket: str, *, verify: bool = True, meta: dict[str, Any] | None = None) -> Lease:
        """The asyncio twin of :meth:`adopt`."""
        return await handoff.aadopt(cls, ticket, verify, meta)

    @property
    def _algorithm(self) -> Algorithm:
        return ALGORITHMS[self.config.algorithm]

    def _after_refresh(self, expires: float | None) -> bool:
        if expires:
            self.expires_ms = int(expires)
            if self.semaphore.ad_hoc:  # a long run keeps its ad-hoc semaphore recorded
                adhoc.seen(conf.setting("SEMAPHORE_KEY_PREFIX"), self.config)
            return True
        self._mark_lost()
        return False

    def _mark_lost(self) -> None:
        if not self._lost:
            self._lost = True
            # The sender is the semaphore's class, as for every semaphore signal.
            signals.lease_lost.send(sender=type(self.semaphore), semaphore=self.semaphore, lease=self)

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
            elif held and not retried:  # a hold that ended with its release: its length
                stats.record_hold(self.semaphore.name, time.monotonic() - self._started)
            signals.released.send(
                sender=type(self.semaphore), semaphore=self.semaphore, lease=self, held=held
            )
        return held

    def _hand_over_release(self) -> None:
        """The release failed or was interrupted: the recovery thread sends it
        again until Redis answers (or the slot has expired)."""
        with _settling:
            if self._done and not self._retrying:
                return  # settled meanwhile: an earlier attempt's retry got through
            self._done = self._retrying = True
        recovery.remember_release(self.config, self.keys, self.identifier, self._after_release)

    def _caller_release(self, held: bool) -> bool:
        if self._retrying:  # the caller's own retry got through: none in the background
            recovery.drop_release(self.identifier)
        return self._after_release(held)

    def _refresh_op(self) -> Operation[float | None]:
        return self._algorithm.refresh(self.keys, self.config.timeout_ms, self.identifier)

    def _release_op(self) -> Operation[bool]:
        # acquired_ms lets "lua" record the hold time (for Retry-After estimates).
        # The limit in force (an override) decides how many waiters to wake.
        limit = control.cached(self.config).limit
        return self._algorithm.release(self.keys, limit, self.identifier, self.acquired_ms)

    def _usable(self) -> bool:
        return not (self._done or self._lost or self._handed_off or self._pid != os.getpid())

    def refresh(self) -> bool:
        """Extend the lease by TIMEOUT. False if the slot was already lost.

        A lost slot is never re-acquired: the caller must stop relying on it.
        """
        if not self._usable():
            return False
        return self._after_refresh(run(connection.get_client(), self._refresh_op()))

    async def arefresh(self) -> bool:
        """The asyncio twin of :meth:`refresh`."""
        if not self._usable():
            return False
        return self._after_refresh(await arun(connection.get_async_client(), self._refresh_op()))

    def _releasable(self) -> bool:
        return self._pid == os.getpid() and not self._handed_off and not (self._done and not self._retrying)

    def release(self) -> bool:
        """Give the slot back. True if it was still held, False if it had been lost.

        If Redis fails, :class:`~django_semaphore.SemaphoreBackendError` is
        raised and the release is sent again in the background until Redis
        answers (:mod:`~django_semaphore.recovery`); calling release() again
        retries it at once (False once it has gone through).
        """
        if not self._releasable():
            return False
        op = self._release_op()
        try:
            held = run(connection.get_client(), op)
        except BaseException:  # Redis failed, or interrupted: the release may not have run
            self._hand_over_release()
            raise
        return self._caller_release(held)

    async def arelease(self) -> bool:
        """The asyncio twin of :meth:`release`."""
        if not self._releasable():
            return False
        op = self._release_op()
        try:
            held = await arun(connection.get_async_client(), op)
        except BaseException:  # Redis failed, or cancelled: the release may not have run
            self._hand_over_release()
            raise
        return self._caller_release(held)


# Settles a release once, whether the caller's call or the recovery thread gets
# Redis's answer first (see Lease._after_release).
_settling = threading.Lock()


def _new_settling_lock() -> None:
    global _settling
    _settling = threading.Lock()  # it may have been held by a thread that did not survive fork()


os.register_at_fork(after_in_child=_new_settling_lock)
