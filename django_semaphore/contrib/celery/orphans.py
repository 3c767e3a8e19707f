"""Orphans: the slots of runs whose process died, given back at once instead of when their lease ends.

A worker process killed while its task runs (the OOM killer, a hard
``time_limit``, SIGKILL) takes its watchdog with it: without more, its slot
stays held until its lease expires, TIMEOUT after the watchdog's last
refresh.  Two records let the slot be given back as soon as the process is
known to be gone:

* the task id's **slot record** (:func:`runs.hold <.runs.hold>`,
  ``<partition>celery:s:<task id digest>``): a later run of the task id (an
  ``acks_late`` redelivery) is told of the dead run's slot when it claims the
  task id (:attr:`Run.orphan <.runs.Run.orphan>`) and gives it back
  (:func:`give_back`) before it takes one;
* this host's **runs on slots** (:func:`register`, the HASH
  ``<prefix>:celery:h:<host>``): every worker's main process looks at it once
  a second (:func:`reap_due`, from its dispatcher's thread) and gives back
  the slots of the runs whose process is gone, whether or not Celery delivers
  the task again.

Only a process known to be gone counts: one of this host (the same
:func:`runs.host_identity <.runs.host_identity>`) whose pid names no process.
A run of another host, or one merely cut off from Redis, may still be running
on its slot: it keeps it until its lease expires.  A slot the dead run handed
on (:meth:`Lease.handoff <django_semaphore.Lease.handoff>`) that another task
adopted is that task's, and is left alone; one not adopted yet is claimed
first, so that nobody adopts it after it was given back.  A slot adopted from
a ticket (a parked task) is taken over by its redelivered run instead, which
adopts the ticket again: the run claims the task id, which takes the slot
record over, before it adopts, so the reaper leaves it alone; or the reaper
was first, and the ticket can no longer be adopted (the run parks again).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from ...engine import handoff
from ...engine.semaphore import Semaphore
from ...engine.storage import PartitionKeys, in_child
from ...exceptions import SemaphoreBackendError
from . import parking, runs, store

logger = logging.getLogger("django_semaphore")

#: How often a worker's main process looks for the slots of its host's dead runs.
REAP_EVERY = 1.0
#: The TTL of a host's HASH of runs on slots, renewed with each run registered.
HOST_TTL_MS = 86_400_000
#: Seconds a slot adopted from a ticket is left to a redelivery of its task (``acks_late``),
#: which takes it over, after its run's process is first found gone.  The prefork pool
#: notices a killed child up to about 5 s after the kill (its maintenance timer), and only
#: then has the message delivered again; this finds it gone within a second.
ADOPTED_GRACE = 10.0


def give_back(semaphore: Semaphore, key: str | None, identifier: str, task_id: str) -> bool:
    """Give back holder ``identifier`` of partition ``key``, the slot of a dead run of
    ``task_id``; True if it was still held.

    Not if another task adopted it (the dead run handed it on): it is claimed
    for ``task_id`` first, which also refuses any adoption after this.
    """
    keys = semaphore.partition(key)
    if not handoff.claim(keys, identifier, semaphore.config.timeout, str(task_id)):
        return False
    return _release(semaphore, keys, identifier, task_id)


def _release(semaphore: Semaphore, keys: PartitionKeys, identifier: str, task_id: str) -> bool:
    given = semaphore.force_release(identifier, keys=keys)
    if given:
        logger.info(
            "Gave back the slot of semaphore %r held by a run of task %s whose process died (holder %s).",
            semaphore.name,
            task_id,
            identifier,
        )
    return given


def register(
    run: runs.Run, semaphore: Semaphore, key: str | None, identifier: str, task_id: str, adopted: bool
) -> None:
    """Note, for this host's reaper, that ``run`` (of ``task_id``) holds slot ``identifier``
    of ``semaphore``'s partition ``key`` (``adopted``: from a ticket).

    A Redis failure is logged, not raised: the run goes on (its slot, if its
    process dies, is then given back when its lease expires).
    """
    entry = {"e": parking.describe(semaphore, key), "i": identifier, "t": str(task_id), "a": adopted}
    try:
        store.script(store.REGISTER, (_host_key(),), _field(run), json.dumps(entry), HOST_TTL_MS)
    except SemaphoreBackendError as exc:
        logger.warning("Could not register the slot of a task's run: %s", exc)


def unregister(run: runs.Run) -> None:
    """Remove ``run`` from this host's runs on slots (it ended); a Redis failure is logged."""
    try:
        store.command("HDEL", _host_key(), _field(run))
    except SemaphoreBackendError as exc:
        logger.warning("Could not unregister the slot of a task's run: %s", exc)


def reap() -> int:
    """Give back the slots of this host's runs whose process is gone; how many were held still."""
    found = store.command("HGETALL", _host_key()) or {}
    now = time.monotonic()
    given = 0
    gone = set()
    for raw_field, raw_entry in found.items():
        field = store.text(raw_field)
        pid, _, slot = field.partition(":")
        if not pid.isdigit() or not runs.process_gone(runs.HOST, int(pid)):
            continue
        gone.add(field)
        try:
            entry = json.loads(store.text(raw_entry))
            if entry.get("a") and now - _gone_since.setdefault(field, now) < ADOPTED_GRACE:
                continue  # left to the task's redelivery a while
            given += _reap_one(slot, runs.owner(int(pid)), entry)
        except SemaphoreBackendError:
            raise  # Redis away: the entry stays for the next look
        except Exception as exc:  # damaged, another version's, or a name no longer configured
            logger.warning("Dropped a run on a slot that could not be given back: %r", exc)
        store.command("HDEL", _host_key(), raw_field)
        gone.discard(field)
    for field in set(_gone_since) - gone:  # handled, or gone from the HASH
        del _gone_since[field]
    if given:
        parking.wake.set()  # the dispatcher looks now: parked tasks may take those slots
    return given


def _reap_one(slot: str, owner: str, entry: dict[str, Any]) -> int:
    identifier, task_id = str(entry["i"]), str(entry["t"])
    semaphore = parking.rebuild(entry["e"])
    keys = semaphore.partition(entry["e"]["key"])
    # Only while the task id's slot record still names the dead run's slot (the run
    # did not end, and no later run claimed the task id), and no other task adopted
    # the slot; the slot can no longer be adopted then (celery_reap.lua).
    mark_ms = handoff.mark_ttl_ms(semaphore.config.timeout)
    if not store.script(store.REAP, (slot, keys.adopted(identifier)), owner + identifier, task_id, mark_ms):
        return 0
    return int(_release(semaphore, keys, identifier, task_id))


_reaped_at = -float("inf")
_reap_lock = threading.Lock()
#: When :func:`reap` first found gone the process of each entry it leaves for now.
_gone_since: dict[str, float] = {}


@in_child
def _forget_the_parents_reaper() -> None:
    global _reap_lock, _reaped_at
    # Forked while the parent's dispatcher reaped: that thread is not ours, nor its lock.
    _reap_lock, _reaped_at = threading.Lock(), -float("inf")
    _gone_since.clear()


def reap_due() -> None:
    """:func:`reap`, at most once a :data:`REAP_EVERY` (the dispatcher's loop calls this)."""
    global _reaped_at
    with _reap_lock:
        now = time.monotonic()
        if now - _reaped_at < REAP_EVERY:
            return
        _reaped_at = now
        reap()


def _host_key() -> str:
    return store.host_key(runs.HOST)


def _field(run: runs.Run) -> str:
    return f"{run.pid}:{run.slot}"
