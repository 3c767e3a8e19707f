"""Redis beside the semaphores, for integrations (:mod:`django_semaphore.contrib`).

An integration that keeps records of its own next to a semaphore's partition
(``semaphore_task``'s parked messages, its runs, its dispatcher locks) uses the
engine's Redis the way the engine does, through this module alone: one command
or one script from ``scripts/`` on the process's client (EVALSHA, loaded again on
NOSCRIPT; a Redis failure is a :class:`~django_semaphore.SemaphoreBackendError`),
keys that share a partition's hash tag (:class:`PartitionKeys`, from
:meth:`Semaphore.partition <django_semaphore.Semaphore.partition>`), and the
SEMAPHORE_KEY_PREFIX every key starts with.  And the package's one fork-safety
mechanism (:func:`in_child`, from :mod:`~django_semaphore.backend.forks`), for
the state such records come with (a heartbeat's runs, a dispatcher thread).
"""

from __future__ import annotations

from typing import Any

from ..backend import connection
from ..backend.forks import in_child
from ..backend.keys import PartitionKeys
from ..backend.scripting import Command, LuaScript, Script, one, run
from ..config import settings

__all__ = ["LuaScript", "PartitionKeys", "command", "in_child", "key_prefix", "pubsub", "script"]


def command(*words: Any) -> Any:
    """Send one command (``command("LLEN", key)``); its reply."""
    return run(connection.get_client(), one(Command(words)))


def script(lua: LuaScript, keys: tuple[str, ...], *args: Any) -> Any:
    """Run one script of ``scripts/`` (a :class:`LuaScript`) on ``keys`` with ``args``; its reply."""
    return run(connection.get_client(), one(Script(lua, keys, args)))


def pubsub() -> Any:
    """A PubSub of this process's client (a cluster's, on Redis Cluster), ignoring subscribe
    confirmations."""
    return connection.get_client().pubsub(ignore_subscribe_messages=True)


def key_prefix() -> str:
    """SEMAPHORE_KEY_PREFIX: the start of every key."""
    return str(settings.setting("SEMAPHORE_KEY_PREFIX"))
