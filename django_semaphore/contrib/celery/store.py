"""The Redis keys of ``semaphore_task`` and the calls that reach them.

Every key is under SEMAPHORE_KEY_PREFIX; those of one partition share its
cluster hash tag (one slot).  ``<partition>`` is the start of the partition's
own keys (:attr:`PartitionKeys.own <django_semaphore.backend.keys.PartitionKeys.own>`):
each partition of a TOTAL name, whose semaphore keys are the whole name's,
has its own parked tasks, dispatcher lock and runs.

* ``<partition>celery:q``: a LIST of the tasks parked there, oldest first;
* ``<partition>celery:l``: the partition's dispatcher now (a lock);
* ``<partition>celery:r:<task id digest>``: a task id's run (:mod:`.runs`);
* ``<partition>celery:s:<task id digest>``: the slot its run holds (:mod:`.runs`);
* ``<prefix>:celery:parked``: a HASH of the partitions with parked tasks,
  announced on a channel of the same name;
* ``<prefix>:celery:h:<host>``: a HASH of a host's runs on slots they acquired
  (:mod:`.orphans`).

Each call goes through :mod:`django_semaphore.engine.storage`, so a Redis
failure is a :class:`~django_semaphore.SemaphoreBackendError` and the scripts
(``scripts/celery_*.lua``) are sent as EVALSHA, loaded again on NOSCRIPT.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ...engine.storage import LuaScript, PartitionKeys, command, key_prefix, script

QUEUE_SUFFIX = "celery:q"  # LIST of parked task messages, oldest first
LOCK_SUFFIX = "celery:l"  # STRING: the dispatcher of this partition now
RUN_SUFFIX = "celery:r:"  # STRING per task id: its run, live or done (runs.py)
SLOT_SUFFIX = "celery:s:"  # STRING per task id: the slot its live run holds (runs.py)
REGISTRY_SUFFIX = "celery:parked"
HOST_SUFFIX = "celery:h:"  # HASH per host: its runs on slots they acquired (orphans.py)

PUSH = LuaScript("celery_push")
POP_IF_HEAD = LuaScript("celery_pop_head")
KEEP = LuaScript("celery_keep")
REGISTER = LuaScript("celery_register")
UNREGISTER = LuaScript("celery_unregister")
CLAIM_RUN = LuaScript("celery_claim_run")
END_RUN = LuaScript("celery_end_run")
BEAT = LuaScript("celery_beat")
REAP = LuaScript("celery_reap")
RENEW_IF = LuaScript("renew_if")
SWAP_IF = LuaScript("swap_if")
UNLOCK = LuaScript("unlock")

__all__ = [
    "BEAT",
    "CLAIM_RUN",
    "END_RUN",
    "HOST_SUFFIX",
    "KEEP",
    "LOCK_SUFFIX",
    "POP_IF_HEAD",
    "PUSH",
    "QUEUE_SUFFIX",
    "REAP",
    "REGISTER",
    "REGISTRY_SUFFIX",
    "RENEW_IF",
    "RUN_SUFFIX",
    "SLOT_SUFFIX",
    "SWAP_IF",
    "UNLOCK",
    "UNREGISTER",
    "command",  # one command, and one of the scripts above, on the engine's Redis
    "host_key",
    "lock_key",
    "queue_key",
    "registry_key",
    "run_key",
    "script",
    "slot_key",
    "text",
]


def text(value: Any) -> str:
    """A reply as text (clients may or may not decode replies)."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def queue_key(keys: PartitionKeys) -> str:
    """The LIST of tasks parked on partition ``keys``."""
    return keys.own + QUEUE_SUFFIX


def lock_key(keys: PartitionKeys) -> str:
    """The lock of partition ``keys``'s dispatcher."""
    return keys.own + LOCK_SUFFIX


def run_key(keys: PartitionKeys, task_id: str) -> str:
    """The run of task ``task_id`` on partition ``keys`` (the id is hashed: any length, any bytes)."""
    return keys.own + RUN_SUFFIX + _digest(task_id)


def slot_key(keys: PartitionKeys, task_id: str) -> str:
    """The slot the live run of task ``task_id`` on partition ``keys`` holds."""
    return keys.own + SLOT_SUFFIX + _digest(task_id)


def _digest(task_id: str) -> str:
    return hashlib.sha256(str(task_id).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def host_key(host: str) -> str:
    """The HASH of ``host``'s runs on slots they acquired: ``<pid>:<slot record key>`` -> the slot."""
    return f"{key_prefix()}:{HOST_SUFFIX}{host}"


def registry_key() -> str:
    """The HASH of partitions that have (or recently had) parked tasks."""
    return f"{key_prefix()}:{REGISTRY_SUFFIX}"
