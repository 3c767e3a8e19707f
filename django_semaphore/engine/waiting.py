"""Waiting for a slot: by priority, then first come, first served.

A caller that may wait takes a ticket in the partition's queue (a ZSET
ordered by priority, then server time of arrival) inside the acquire script
itself, then blocks on its own wake-up list with BLPOP.  When permits come
free, the script that frees them (release, abandon) picks the first waiters
whose permits fit together (the first that does not fit blocks those behind
it: a large request is not starved by small ones), and the operation pushes
to their lists, so freed permits reach the next waiters in one push, not at
the next poll.  With MAX_WAITERS, a caller that would queue behind that many
waiters is refused at once (:attr:`Refused.queue_full
<django_semaphore.engine.algorithms.base.Refused.queue_full>`).

A woken waiter gets a short claim window (``CLAIM_MS`` in the scripts, 0.5 s)
instead of the rest of its ticket: a live one comes back within milliseconds
and takes the slot; a dead one (a crashed process) is dropped when the window
ends, and the waiters behind it take over.  Nothing pushes a wake-up when a
lease expires or a claim window ends, so a waiter's BLPOP is capped by the
``recheck_ms`` its last refusal reported (the earliest of those moments), and
the waiters next in line (fewer than two rounds of LIMIT ahead) also look
again every ``NEAR_HEARTBEAT``; an acquire that finds a slot free which a
waiter ahead is entitled to wakes that waiter (its claim window starts), so a
dead waiter delays the next by about a claim window, not a whole ticket.

A waiter renews its ticket every time it loops (at least every ``HEARTBEAT``
seconds); a crashed waiter's ticket expires after ``TICKET_MS`` at the latest.
A waiter that was dropped while it was only slow (stopped, swapped out) comes
back to its place in the queue: it passes the ticket number it was given.

A waiter on a Sentinel primary rides out a failover: a request that fails
(the connection dropped by the old primary, its BLPOP unblocked, a write it
refuses as a replica now, a timeout while no primary answers) is sent again
after a short pause (:data:`RECONNECT_PAUSE`, doubling up to
:data:`HEARTBEAT`), on a connection the pool opens to the primary the
sentinels name, until the waiter's deadline; only a failure then is the
caller's :class:`~django_semaphore.SemaphoreBackendError`.  Its acquire is
idempotent (its identifier): a grant that reached the new primary is found
again, not made twice.  It keeps its ticket number, so if replication had
not carried its queue entry to the new primary, it comes back to its place.
Elsewhere (one server, a cluster) a failure ends the wait at once, as any
call does.

Algorithms without a queue (the Redis in Action variants) wait by polling.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ConnectionError,
    MasterDownError,
    MaxConnectionsError,
    ReadOnlyError,
    ResponseError,
    TimeoutError,
)

from ..backend.connection import follows_sentinel, socket_timeout
from ..backend.keys import PartitionKeys
from ..backend.scripting import ASYNC_ERRORS, Client, Command, Operation, Sleep
from .algorithms import AcquireRequest, Algorithm, Granted, Outcome, Refused

HEARTBEAT = 1.0  # seconds: longest BLPOP before a waiter renews its ticket
NEAR_HEARTBEAT = 0.5  # seconds: the same for the waiters next in line
TICKET_MS = 3000  # a ticket not renewed within this is abandoned
POLL = 0.05  # seconds between attempts for algorithms without a queue
#: Seconds: the shortest BLPOP a waiter sends.  BLPOP 0 blocks forever, and Redis 6.2
#: truncates a timeout to whole milliseconds (7.0 rounds it up): 0.001 s became 0 there.
MIN_BLOCK = 0.002
#: Seconds a waiter on a Sentinel primary pauses after a failed request before it sends
#: it again; doubled after each failure in a row, up to HEARTBEAT.
RECONNECT_PAUSE = 0.05

# What a failover does to a waiter's requests: its connection dropped (the old primary
# kills its clients), a timeout while no primary answers, a write the demoted primary
# refuses, a blocked BLPOP unblocked by the role change ("UNBLOCKED ..."), a replica
# still loading.  Not a configuration that would fail the same way every time.
_FAILOVER_ERRORS = (ConnectionError, TimeoutError, OSError, ReadOnlyError, MasterDownError)
_NOT_FAILOVER = (AuthenticationError, AuthorizationError, MaxConnectionsError)
_FAILOVER_REPLIES = ("UNBLOCKED", "READONLY", "MASTERDOWN", "LOADING")


def _rides_out(client: Client, exc: BaseException) -> bool:
    """Whether a waiter on ``client`` goes on waiting after its request failed with ``exc``:
    only on a Sentinel primary, and only for what a failover does to a request."""
    if not follows_sentinel(client) or isinstance(exc, _NOT_FAILOVER):
        return False
    if isinstance(exc, _FAILOVER_ERRORS):
        return True
    # Redis 6.2 wraps a script's READONLY in its own error ("ERR Error running script ...").
    return isinstance(exc, ResponseError) and any(reply in str(exc) for reply in _FAILOVER_REPLIES)


def _block_for(client: Client, remaining: float, outcome: Refused, limit: int) -> float:
    """How long to block on the wake-up list after the refusal ``outcome``."""
    recheck_ms = outcome.retry_after_ms if outcome.recheck_ms is None else outcome.recheck_ms
    # A waiter with others ahead of it, but fewer than two rounds of slots,
    # takes over if one of those dies: it must notice within about a second.
    heartbeat = NEAR_HEARTBEAT if 0 < outcome.ahead < 2 * limit else HEARTBEAT
    timeout = min(remaining, recheck_ms / 1000.0 + 0.001, heartbeat)
    read_timeout = socket_timeout(client)
    if read_timeout:
        timeout = min(timeout, read_timeout / 2)
    return max(timeout, MIN_BLOCK)


def _claim(
    algorithm: Algorithm, keys: PartitionKeys, timeout_ms: int, identifier: str, granted: Granted
) -> Operation[Granted | None]:
    """Turn the claim lease a release granted (half a second) into a lease of the
    caller's own TIMEOUT: its first refresh.  None if the claim ran out first,
    or if ``granted`` is an earlier grant than the lease's (one whose claim ran
    out, popped late: the caller looks again, and finds its lease if it has one)."""
    expires = yield from algorithm.refresh(keys, timeout_ms, identifier, granted.token)
    if expires is None:
        return None
    granted.expires_ms = int(expires)
    return granted


def wait_ops(
    algorithm: Algorithm,
    keys: PartitionKeys,
    request: AcquireRequest,
    client: Client,
    limit_of: Callable[[], int],
    on_queued: Callable[[], None] | None = None,
) -> Operation[Outcome]:
    """One acquire that may wait ``request.wait`` seconds, as a generator of requests;
    returns the last outcome.  ``client`` is the one the operation runs on
    (its read timeout caps a blocking wait).  ``limit_of`` gives the limit in
    force at each attempt (a runtime override may change it while a caller
    waits).  ``request`` as for :meth:`Algorithm.acquire
    <django_semaphore.engine.algorithms.base.Algorithm.acquire>` (its
    ``ticket_ms`` is the ticket a waiter takes: :data:`TICKET_MS` if the algorithm
    queues); a caller refused because the queue is full returns at once.
    ``on_queued`` is called once, before the first wait (the caller had to queue)."""
    deadline = time.monotonic() + request.wait
    timeout_ms, identifier = request.timeout_ms, request.identifier
    ticket = ""  # our place in the queue, once we have one
    pause = RECONNECT_PAUSE  # after a failed request on a Sentinel primary
    while True:
        try:
            limit = limit_of()
            outcome = yield from algorithm.acquire(keys, limit, request, ticket)
            pause = RECONNECT_PAUSE
            if isinstance(outcome, Granted):
                outcome.ticket = ticket
                if ticket and outcome.expires_ms - outcome.acquired_ms != timeout_ms:
                    # Granted by a release while it looked away: a claim lease to make its own.
                    claimed = yield from _claim(algorithm, keys, timeout_ms, identifier, outcome)
                    if claimed is not None:
                        return claimed
                    continue  # too late: back to its place in the queue
                return outcome
            if outcome.queue_full:  # not queued: nothing to abandon
                return outcome
            ticket = outcome.ticket or ticket
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if on_queued is not None:
                on_queued()
                on_queued = None
            if algorithm.queues:
                timeout = _block_for(client, remaining, outcome, limit)
                woken = yield Command(("BLPOP", keys.wake(identifier), timeout), unparsed=True)
                granted = algorithm.grant_from(woken[1], request.permits, request.slots) if woken else None
                if granted is not None:  # a release granted it the permits (direct grant)
                    granted.ticket = ticket
                    claimed = yield from _claim(algorithm, keys, timeout_ms, identifier, granted)
                    if claimed is not None:
                        return claimed
            else:
                yield Sleep(max(MIN_BLOCK, min(remaining, POLL, outcome.retry_after_ms / 1000.0)))
        except ASYNC_ERRORS as exc:  # thrown in by the driver: a request failed
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not _rides_out(client, exc):
                raise
            # A failover: the same acquire again, with its ticket, once the pause is over.
            yield Sleep(min(pause, remaining))
            pause = min(pause * 2, HEARTBEAT)
    yield from algorithm.abandon(keys, limit_of(), identifier)  # a no-op without a queue
    return outcome
