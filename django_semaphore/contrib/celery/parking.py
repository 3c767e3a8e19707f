"""Parked tasks: the message of a task that found no slot, kept in Redis until one comes free.

A parked message holds the task's name, id, arguments and the options Celery
itself sends a request again with (``Task.retry`` does): routing (its queue) and
priority, ``ignore_result``, the chain and callbacks that follow, errbacks,
chord and group, expiry, time limits, the workflow's ids.  It waits in its partition's LIST, in arrival
order, and the partition is noted in the registry the dispatchers read.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from kombu.utils import json as kombu_json  # Celery's own JSON: dates, UUIDs, decimals

from ...engine.semaphore import Semaphore, semaphores
from ...engine.storage import PartitionKeys
from . import store

#: How long parked tasks (and the registry) stay in Redis without any park, nor any
#: dispatcher serving them: a day.
PARK_TTL = 24 * 3600.0

# Typed handles on kombu's JSON (the task arguments are encoded as Celery encodes them).
loads = cast(Callable[[str], Any], kombu_json.loads)
dumps = cast(Callable[[Any], str], kombu_json.dumps)

#: Set by a park or a release in this process: the dispatcher looks now.
wake = threading.Event()

#: Execution options not sent again: the id is the message's own.
_NOT_OPTIONS = frozenset({"task_id"})


def describe(semaphore: Semaphore, key: str | None) -> dict[str, Any]:
    """What a dispatcher needs to rebuild ``semaphore`` (ad-hoc ones carry their whole
    validated configuration: ADAPTIVE, MAX_WAITERS, MODE, SLOTS... as well as LIMIT)."""
    entry: dict[str, Any] = {"name": semaphore.name, "key": key}
    if semaphore.ad_hoc:
        config = semaphore.config
        adhoc: dict[str, Any] = {
            "limit": config.limit,
            "timeout": config.timeout,
            "wait": config.wait,
            "algorithm": config.algorithm,
            "mode": config.mode,
            "max_waiters": config.max_waiters,
            "slots": config.slots,
        }
        # An ad-hoc semaphore's PERMITS and PRIORITY are ints (only settings take callables).
        adhoc.update((k, v) for k, v in (("permits", config.permits), ("priority", config.priority)) if v)
        if config.adaptive is not None:
            adaptive = config.adaptive
            adhoc["adaptive"] = {
                "MIN": adaptive.min,
                "MAX": adaptive.max,
                "INTERVAL": adaptive.interval,
                "TOLERANCE": adaptive.tolerance,
                "MIN_SAMPLES": adaptive.min_samples,
                "PROBE_INTERVAL": adaptive.probe_interval,
            }
        if config.total is not None:
            adhoc["total"] = config.total
        entry["adhoc"] = adhoc
    return entry


def rebuild(entry: dict[str, Any]) -> Semaphore:
    """The semaphore :func:`describe` described (an older entry's missing options: defaults)."""
    adhoc = entry.get("adhoc")
    if adhoc:
        return Semaphore(
            entry["name"],
            adhoc["limit"],
            adhoc["timeout"],
            wait=adhoc.get("wait", 0),
            algorithm=adhoc["algorithm"],
            mode=adhoc.get("mode", "enforce"),
            max_waiters=adhoc.get("max_waiters"),
            permits=adhoc.get("permits", 1),
            priority=adhoc.get("priority", 0),
            adaptive=adhoc.get("adaptive"),
            slots=adhoc.get("slots", False),
            total=adhoc.get("total"),
        )
    return semaphores[entry["name"]]


def message(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], entry: dict[str, Any]) -> str:
    """The parked message of ``task``'s request with ``args`` and ``kwargs`` (JSON)."""
    request = task.request
    delivery = getattr(request, "delivery_info", None) or {}
    options = {
        k: v for k, v in request.as_execution_options().items() if v is not None and k not in _NOT_OPTIONS
    }
    options.update(_routing(delivery))
    options["ignore_result"] = _ignore_result(task, request)
    parked_message = {
        **entry,
        "task": task.name,
        "id": request.id,
        "args": list(args),
        "kwargs": kwargs,
        "options": options,
        "parked_at": time.time(),
    }
    return dumps(parked_message)


def _routing(delivery: dict[str, Any]) -> dict[str, Any]:
    """Where the request was sent, as Celery's ``Task.signature_from_request`` sends it again:
    a message routed to a queue came by the anonymous exchange (``''``), so its
    ``routing_key`` is that queue's name; else its exchange and routing key."""
    routing: dict[str, Any] = {}
    if delivery.get("priority") is not None:
        routing["priority"] = delivery["priority"]
    exchange, routing_key = delivery.get("exchange"), delivery.get("routing_key")
    if exchange == "" and routing_key:
        routing["queue"] = routing_key
    else:
        routing.update((k, v) for k, v in (("exchange", exchange), ("routing_key", routing_key)) if v)
    return routing


def _ignore_result(task: Any, request: Any) -> bool:
    """The request's ``ignore_result`` (``apply_async(ignore_result=...)``), else the task's."""
    # Only one the message gave, not Context's class default.
    given = getattr(request, "__dict__", {}).get("ignore_result")
    return bool(getattr(task, "ignore_result", False) if given is None else given)


def expired(parked_message: dict[str, Any], now: float | None = None) -> bool:
    """Whether the parked task's ``expires`` (an ISO 8601 time, as Celery sends it) has passed."""
    expires = parked_message.get("options", {}).get("expires")
    if isinstance(expires, datetime.datetime):  # (kombu's JSON gives dates back as such)
        when = expires
    elif isinstance(expires, str):
        try:
            when = datetime.datetime.fromisoformat(expires)
        except ValueError:
            return False
    else:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp() <= (time.time() if now is None else now)


def ttl_ms(semaphore: Semaphore) -> int:
    """The TTL (ms) of ``semaphore``'s parked tasks and of the registry: :data:`PARK_TTL`,
    or longer than a slot's TIMEOUT."""
    return int(max(PARK_TTL, semaphore.config.timeout + 1) * 1000)


def keep(semaphore: Semaphore, key: str | None) -> None:
    """Lengthen the TTL of partition ``key``'s parked tasks and of the registry back to
    :func:`ttl_ms` (never shorten it): a dispatcher serving them keeps them."""
    ttl = ttl_ms(semaphore)
    store.script(store.KEEP, (store.queue_key(semaphore.partition(key)),), ttl)
    store.script(store.KEEP, (store.registry_key(),), ttl)


def park(semaphore: Semaphore, key: str | None, parked_message: str, *, front: bool = False) -> int:
    """Park a task message on its partition (at the back, or ``front``); the number parked there."""
    keys = semaphore.partition(key)
    ttl = ttl_ms(semaphore)
    count = int(
        store.script(store.PUSH, (store.queue_key(keys),), "LPUSH" if front else "RPUSH", parked_message, ttl)
    )
    entry = describe(semaphore, key)
    entry["nonce"] = os.urandom(8).hex()  # a new value at each park: see celery_unregister.lua
    store.script(store.REGISTER, (store.registry_key(),), keys.own, json.dumps(entry), ttl)
    store.command("PUBLISH", store.registry_key(), keys.own)  # dispatchers subscribed look now
    wake.set()
    return count


def parked(keys: PartitionKeys) -> list[dict[str, Any]]:
    """The messages of the tasks parked on partition ``keys``, in the order they will be sent."""
    raw = store.command("LRANGE", store.queue_key(keys), 0, -1) or []
    return [cast(dict[str, Any], loads(store.text(item))) for item in raw]


def count(keys: PartitionKeys) -> int:
    """How many tasks are parked on partition ``keys``."""
    return int(store.command("LLEN", store.queue_key(keys)) or 0)


def _pairs(registry: str) -> Iterator[tuple[str, str]]:
    reply = store.command("HGETALL", registry) or {}
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    for field, value in items:
        yield store.text(field), store.text(value)


def parked_partitions() -> Iterator[tuple[str, Semaphore, str | None]]:
    """(the partition's keys' :attr:`~PartitionKeys.own` start, semaphore, partition value) of
    every partition with parked tasks (each partition of a TOTAL name on its own).

    Partitions found empty are forgotten on the way.
    """
    registry = store.registry_key()
    for field, value in _pairs(registry):
        try:
            entry = json.loads(value)
            semaphore, key = rebuild(entry), entry["key"]
        except Exception:  # an entry of a semaphore no longer configured here: leave it to others
            continue
        if semaphore.partition(key).own != field:
            continue
        if not count(semaphore.partition(key)):
            store.script(store.UNREGISTER, (registry,), field, value)
            continue
        yield field, semaphore, key
