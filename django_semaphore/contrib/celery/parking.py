"""Parked tasks: the message of a task that found no slot, kept in Redis until one comes free.

A parked message holds the task's name, id, arguments and the options Celery
itself sends a request again with (``Task.retry`` does): routing (its queue) and
priority, ``ignore_result``, the chain and callbacks that follow, errbacks,
chord and group, expiry, time limits, the workflow's ids.  It waits in its partition's LIST, in arrival
order, and the partition is noted in the registry the dispatchers read.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from kombu import serialization
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
# And on kombu's serializers (pickle, yaml, msgpack...): (content type, encoding, data).
_encode = cast(Callable[[Any, str], tuple[str, str, bytes | str]], serialization.dumps)
_decode = cast(Callable[..., Any], serialization.loads)
_content_types = cast(Callable[[Any], set[str]], serialization.prepare_accept_content)

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
    """The parked message of ``task``'s request with ``args`` and ``kwargs`` (JSON).

    The arguments and options are kept as the request's serializer encodes them
    (:func:`serializer_of`): under JSON, in the message itself; under another
    (``pickle``, ``yaml``, ``msgpack``), as its encoded bytes in ``body``, and
    the task is sent again with that serializer (:func:`opened` decodes them).
    """
    request = task.request
    delivery = getattr(request, "delivery_info", None) or {}
    options = {
        k: v for k, v in request.as_execution_options().items() if v is not None and k not in _NOT_OPTIONS
    }
    options.update(_routing(delivery))
    options["ignore_result"] = _ignore_result(task, request)
    parked_message: dict[str, Any] = {**entry, "task": task.name, "id": request.id, "parked_at": time.time()}
    serializer = serializer_of(task)
    if serializer == "json":
        parked_message.update(args=list(args), kwargs=kwargs, options=options)
    else:
        content_type, content_encoding, data = _encode((list(args), kwargs, options), serializer)
        raw = data if isinstance(data, bytes) else data.encode(content_encoding or "utf-8")
        parked_message["body"] = {
            "serializer": serializer,
            "content_type": content_type,
            "content_encoding": content_encoding,
            "data": base64.b64encode(raw).decode("ascii"),
        }
        # What the dispatcher reads without decoding: a task that expired while parked is not sent.
        parked_message["options"] = {k: options[k] for k in ("expires",) if k in options}
    return dumps(parked_message)


def serializer_of(task: Any) -> str:
    """The serializer of ``task``'s request: its content type where the broker says it
    (AMQP), else the task's ``serializer`` (``task_serializer``), as ``Task.retry`` sends."""
    properties = getattr(task.request, "properties", None)
    content_type = properties.get("content_type") if isinstance(properties, dict) else None
    name = serialization.registry.type_to_name.get(content_type) if content_type else None
    app = getattr(task, "app", None)
    default = getattr(getattr(app, "conf", None), "task_serializer", None)
    return str(name or getattr(task, "serializer", None) or default or "json")


def accepted(app: Any) -> set[str]:
    """The content types Celery app ``app`` accepts (``accept_content``)."""
    return _content_types(app.conf.accept_content)


def opened(parked_message: dict[str, Any], accept: set[str] | None = None) -> dict[str, Any]:
    """``parked_message`` with its ``args``, ``kwargs`` and ``options`` readable: those a
    serializer other than JSON encoded (:func:`message`) decoded, if ``accept`` (content
    types; None: the current Celery app's ``accept_content``) has theirs; else kombu's
    ContentDisallowed."""
    body = parked_message.get("body")
    if not isinstance(body, dict):
        return parked_message
    if accept is None:
        from celery import current_app

        accept = accepted(current_app)
    data = base64.b64decode(body["data"])
    args, kwargs, options = _decode(data, body["content_type"], body["content_encoding"], accept=accept)
    return {**parked_message, "args": args, "kwargs": kwargs, "options": options}


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
    """The messages of the tasks parked on partition ``keys``, in the order they will be sent
    (:func:`opened`: arguments this process does not accept stay encoded, in ``body``)."""
    raw = store.command("LRANGE", store.queue_key(keys), 0, -1) or []
    return [_readable(cast(dict[str, Any], loads(store.text(item)))) for item in raw]


def _readable(parked_message: dict[str, Any]) -> dict[str, Any]:
    try:
        return opened(parked_message)
    except Exception:  # a content type not accepted here (or undecodable): as it is
        return parked_message


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
