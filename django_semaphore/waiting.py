"""FIFO waiting for a slot.

A caller that may wait takes a ticket in the partition's queue (a ZSET
ordered by server time of arrival) inside the acquire script itself, then
blocks on its own wake-up list with BLPOP.  The release script pushes to the
lists of the first waiters, one per free slot, so a freed slot reaches the
next waiter in one push, not at the next poll.  A lease that expires instead
of being released wakes nobody, so the BLPOP timeout is also capped at the
earliest lease expiry the acquire script reported.  A waiter renews its
ticket every time it loops (at least every ``HEARTBEAT`` seconds); a crashed
waiter's ticket expires after ``TICKET_MS`` and stops holding up the queue.

Algorithms without a queue (the Redis in Action variants) wait by polling.
"""

from __future__ import annotations

import time
from typing import Any

from .algorithms import Granted, Outcome
from .connection import socket_timeout
from .keys import PartitionKeys
from .scripting import Client, Command, Operation, Sleep, arun, run

HEARTBEAT = 1.0  # seconds: longest BLPOP before a waiter renews its ticket
TICKET_MS = 3000  # a ticket not renewed within this is abandoned
POLL = 0.05  # seconds between attempts for algorithms without a queue
MIN_BLOCK = 0.001  # BLPOP 0 would block forever


def _block_for(client: Client, remaining: float, retry_after_ms: float) -> float:
    timeout = min(remaining, retry_after_ms / 1000.0 + 0.001, HEARTBEAT)
    read_timeout = socket_timeout(client)
    if read_timeout:
        timeout = min(timeout, read_timeout / 2)
    return max(timeout, MIN_BLOCK)


def wait_ops(
    algorithm: Any,
    keys: PartitionKeys,
    limit: int,
    timeout_ms: int,
    identifier: str,
    meta_json: str,
    wait: float,
    client: Client,
) -> Operation[Outcome]:
    """One waiting acquire as a generator of requests; returns the last outcome."""

    deadline = time.monotonic() + wait
    ticket_ms = TICKET_MS if algorithm.queues else 0
    while True:
        outcome: Outcome = yield from algorithm.acquire(
            keys, limit, timeout_ms, identifier, meta_json, ticket_ms
        )
        if isinstance(outcome, Granted):
            return outcome
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if algorithm.queues:
            timeout = _block_for(client, remaining, outcome.retry_after_ms)
            yield Command(("BLPOP", keys.wake(identifier), timeout))
        else:
            yield Sleep(max(MIN_BLOCK, min(remaining, POLL, outcome.retry_after_ms / 1000.0)))
    if algorithm.queues:
        yield from algorithm.abandon(keys, limit, identifier)
    return outcome


def wait_sync(client: Client, *args: Any) -> Outcome:
    return run(client, wait_ops(*args, client))  # type: ignore[call-arg]


async def wait_async(client: Client, *args: Any) -> Outcome:
    return await arun(client, wait_ops(*args, client))  # type: ignore[call-arg]
