"""Runs: at most one live run of a task id at a time, and none after one completed.

Celery delivers a message more than once in several ways: ``acks_late`` with
``task_reject_on_worker_lost`` redelivers the message of a run whose worker
process died; the broker's visibility timeout redelivers a message whose run
is still going; a dispatcher that died between sending a parked task and
removing it from the list leaves two messages with one task id.  Each worker
run of a ``semaphore_task`` therefore *claims* its task id in Redis before it
takes, adopts or parks a slot (``celery_claim_run.lua``):

* nothing there: the run claims it, as ``run:<host>:<pid>:<nonce>:<lease>``
  (``<host>``: :func:`host_identity`)
  with a short TTL that a thread of the running process renews every second
  (the heartbeat: a run whose process died lets go within
  :data:`HEARTBEAT_MS`);
* ``done``: a run of this task id completed; this message is a duplicate;
* another live run: this message waits until it ends or its heartbeat stops,
  at most :data:`HEARTBEAT_MS` plus a second (at once when that run's process,
  on this host, is gone).  Then it runs (the other died: a redelivery after a
  crash runs again) or is dropped (the other completed, or is alive: a
  duplicate).

A run that completes marks its task id ``done`` (kept :data:`DONE_TTL`); one
that raises, or retries (``self.retry()``), lets it go, so that Celery's next
delivery or retry of the task runs.

A run that holds a slot records it for its task id (:func:`hold`:
``<host>:<pid>:<lease identifier>``, renewed by the heartbeat to the lease's
TIMEOUT, so it lives as long as the lease can).  A later run that claims the
task id is told of the slot a run whose process is gone left behind
(:attr:`Run.orphan`: a ``acks_late`` redelivery after SIGKILL, however long
Celery took to redeliver), and gives it back at once instead of waiting out
its lease.  Only a process known gone counts: a run on another host, or one
whose heartbeat merely stopped, may still be running on its slot.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass

from ...engine.storage import PartitionKeys, in_child
from ...exceptions import SemaphoreBackendError
from . import store

logger = logging.getLogger("django_semaphore")

#: The TTL of a live run's claim: a run whose process died lets go of it within this long.
HEARTBEAT_MS = 5_000
#: How often the heartbeat thread renews the claims of the runs in its process.
HEARTBEAT_EVERY = 1.0
#: How long a completed run's ``done`` is kept: far longer than a duplicate can take to arrive.
DONE_TTL = 3600.0
#: How often a message that found another live run looks again.
POLL = 0.05

DONE = "done"


def host_identity() -> str:
    """The host as this process's claims name it (no ``:``): its hostname and, on
    Linux, a digest of the kernel's boot id and of this process's PID namespace.

    ``os.kill`` reaches only the processes of one PID namespace, and containers
    that share the host's network (``docker --network host``, Kubernetes
    ``hostNetwork``) share its hostname too: without the namespace, a worker
    would find a live run of another container "gone" (its pid means nothing
    here) and run the task again beside it.  The boot id tells hosts apart
    that have the same hostname and namespace numbers."""
    name = socket.gethostname().replace(":", "_")
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            seen = f"{boot.read().strip()}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # not Linux, or no /proc: the hostname alone
        return name
    return f"{name}/{hashlib.blake2b(seen.encode(), digest_size=6).hexdigest()}"


HOST = host_identity()


@dataclass(frozen=True, slots=True)
class Run:
    """A run of a task id claimed by this process: its key and the value it holds.

    ``slot``: the key of the task id's slot record; ``orphan``: the identifier of
    the slot an earlier run of the task id held when its process died ("" if none).
    """

    key: str
    value: str
    slot: str = ""
    orphan: str = ""

    @property
    def pid(self) -> int:
        """The process that claimed the run (its value: ``run:<host>:<pid>:...``)."""
        return int(self.value.split(":", 3)[2])


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Another run of the task id: ``done`` (it completed) or alive now, holding lease ``identifier``."""

    done: bool
    identifier: str = ""


@dataclass(frozen=True, slots=True)
class _Claimant:
    host: str
    pid: int
    identifier: str

    @classmethod
    def parse(cls, value: str) -> _Claimant | None:
        parts = value.split(":", 4)
        if len(parts) != 5 or parts[0] != "run":
            return None
        try:
            return cls(parts[1], int(parts[2]), parts[4])
        except ValueError:
            return None

    def dead(self) -> bool:
        """Whether the claimant's process is gone (only knowable on this host)."""
        return process_gone(self.host, self.pid)


def process_gone(host: str, pid: int) -> bool:
    """Whether process ``pid`` of ``host`` is gone: known only on this host, never of this process."""
    if host != HOST or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether process ``pid`` died and waits for its parent to reap it (Linux; False elsewhere).

    A pool child killed a moment ago is one until its worker reaps it: dead,
    though ``os.kill`` still finds it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # "pid (command) state ...": the command may hold spaces and parentheses.
            return stat.read().rpartition(b")")[2].split()[:1] == [b"Z"]
    except OSError:
        return False


def claim(keys: PartitionKeys, task_id: str, identifier: str = "") -> Run | Duplicate:
    """Claim the run of ``task_id`` (holding lease ``identifier``, if known yet).

    Waits while another run of the task id is alive, at most until its
    heartbeat would have stopped: the result is this process's :class:`Run`,
    or the :class:`Duplicate` it found.
    """
    key, slot = store.run_key(keys, task_id), store.slot_key(keys, task_id)
    value = f"run:{HOST}:{os.getpid()}:{os.urandom(6).hex()}:{identifier}"
    deadline = time.monotonic() + HEARTBEAT_MS / 1000.0 + 1.0
    while True:
        found = store.script(store.CLAIM_RUN, (key, slot), value, HEARTBEAT_MS, owner(os.getpid()))
        if isinstance(found, list):
            heartbeat.add(key, value, slot)
            return Run(key, value, slot, _orphan(store.text(found[1])))
        found = store.text(found)
        if found == DONE:
            return Duplicate(done=True)
        other = _Claimant.parse(found)
        if other is not None and other.dead():
            # Its process died on this host (a SIGKILLed pool child): take over at once.
            store.script(store.END_RUN, (key,), found, "", 0)
            continue
        if time.monotonic() >= deadline:  # renewed all along: a live run
            return Duplicate(done=False, identifier=other.identifier if other else "")
        time.sleep(POLL)


def owner(pid: int) -> str:
    """How a slot record names the process ``pid`` of this host: ``<host>:<pid>:`` (the
    lease identifier follows)."""
    return f"{HOST}:{pid}:"


def _orphan(record: str) -> str:
    """The lease identifier of slot record ``record`` if the process that wrote it is gone, else ""."""
    parts = record.split(":", 2)
    if len(parts) != 3:
        return ""
    try:
        gone = process_gone(parts[0], int(parts[1]))
    except ValueError:
        return ""
    return parts[2] if gone else ""


def hold(run: Run, identifier: str, timeout: float) -> None:
    """Record that ``run`` holds the slot of lease ``identifier`` (TIMEOUT ``timeout`` seconds):
    kept, by the heartbeat, as long as the lease can live; removed by :func:`end`.

    A Redis failure is logged, not raised: the run goes on (a redelivery after
    its death then waits out its lease, as without the record).
    """
    value = owner(os.getpid()) + identifier
    ttl_ms = int(timeout * 1000) + 1000
    heartbeat.hold(run.key, value, ttl_ms)
    try:
        store.command("SET", run.slot, value, "PX", ttl_ms)
    except SemaphoreBackendError as exc:
        logger.warning("Could not record the slot of a task's run: %s", exc)


def end(run: Run, *, done: bool, ttl: float = DONE_TTL) -> None:
    """End ``run``: mark the task id ``done`` (kept ``ttl`` seconds), or let it go; its
    slot record goes.

    A Redis failure is logged, not raised: the task's own outcome stands (the
    claim then expires with its heartbeat).
    """
    beat = heartbeat.remove(run.key)
    held = beat.held if beat is not None else ""
    try:
        store.script(
            store.END_RUN, (run.key, run.slot), run.value, DONE if done else "", int(ttl * 1000), held
        )
    except SemaphoreBackendError as exc:
        logger.warning("Could not record the end of a task's run: %s", exc)


@dataclass(frozen=True, slots=True)
class _Beat:
    """What the heartbeat renews for one live run: its claim and, once it holds one, its slot record."""

    value: str
    slot: str
    held: str = ""
    held_ttl_ms: int = 0


class Heartbeat:
    """The thread that renews the claims of this process's live runs (one per process)."""

    def __init__(self) -> None:
        self._reset()
        in_child(self._reset)  # forked: the parent's runs and thread are not ours

    def _reset(self) -> None:
        self._runs: dict[str, _Beat] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._changed = threading.Event()  # a run added: renew on the new schedule at once

    def add(self, key: str, value: str, slot: str) -> None:
        with self._lock:
            self._runs[key] = _Beat(value, slot)
            self._changed.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="django-semaphore-celery-heartbeat", daemon=True
                )
                self._thread.start()

    def hold(self, key: str, held: str, ttl_ms: int) -> None:
        """Renew the slot record ``held`` of run ``key`` too, to ``ttl_ms``."""
        with self._lock:
            beat = self._runs.get(key)
            if beat is not None:
                self._runs[key] = dataclasses.replace(beat, held=held, held_ttl_ms=ttl_ms)

    def remove(self, key: str) -> _Beat | None:
        with self._lock:
            return self._runs.pop(key, None)

    def _run(self) -> None:
        while True:
            self._changed.wait(HEARTBEAT_EVERY)
            self._changed.clear()
            with self._lock:
                runs = list(self._runs.items())
            for key, beat in runs:
                try:
                    renewed = store.script(
                        store.BEAT, (key, beat.slot), beat.value, HEARTBEAT_MS, beat.held, beat.held_ttl_ms
                    )
                    if not renewed:
                        self._lost(key, beat.value)
                except SemaphoreBackendError as exc:
                    logger.warning("Could not renew a task's run claim: %s", exc)
                except Exception:  # never let the thread die: live runs depend on it
                    logger.exception("Unexpected error renewing a task's run claim")

    def _lost(self, key: str, value: str) -> None:
        with self._lock:
            beat = self._runs.get(key)
            live = beat is not None and beat.value == value  # not ended meanwhile
            if live:
                del self._runs[key]
        if live:
            logger.warning(
                "A task's run claim was lost while it ran (its heartbeat stopped for over %s ms): "
                "a redelivery of the task may run it again.",
                HEARTBEAT_MS,
            )


heartbeat = Heartbeat()
