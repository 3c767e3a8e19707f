"""Fork safety, one way for the whole package.

A process forked from one that used semaphores (a pre-forking server's
worker, a Celery prefork child, ``multiprocessing``) inherits its memory but
not its threads, and must not act on its parent's behalf: renew or release
the parent's leases, flush the parent's counts again, wait on a lock that a
parent thread held at the fork.  Two tools, and nothing else in the package
deals with fork():

* :func:`in_child`: a callback run in the child right after the fork, in
  registration order (a module registers its reset when it is imported, so a
  lower layer's state is reset before a higher one's).  It replaces the
  locks and forgets what belongs to the parent.  The one
  ``os.register_at_fork`` of the package runs them.
* :func:`pid`: this process's id, for an object that belongs to the process
  that made it (a :class:`~django_semaphore.Lease`: in a forked child its
  ``refresh()`` and ``release()`` return False).  It also catches a fork that
  ran no Python hook (a C-level fork, as uWSGI's without
  ``py-call-osafterfork``): the callbacks then run at the first call in the
  child.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

logger = logging.getLogger("django_semaphore")

__all__ = ["generation", "in_child", "pid"]

_callbacks: list[Callable[[], object]] = []
_pid = os.getpid()
_generation = 0
_lock = threading.Lock()  # guards the registration list (imports may run in threads)


def in_child(callback: Callable[[], object]) -> Callable[[], object]:
    """Run ``callback()`` in every child forked from now on, after the callbacks
    registered before it; returns it (usable as a decorator).

    A callback must not block or talk to Redis: it only resets state.  One that
    raises is logged, and the others still run.
    """
    with _lock:
        _callbacks.append(callback)
    return callback


def pid() -> int:
    """This process's id (a fork that ran no hook is noticed here, and its callbacks run)."""
    if os.getpid() != _pid:
        _after_fork_in_child()
    return _pid


def generation() -> int:
    """How many forks separate this process from the one that imported the package
    (0 there; a child's is its parent's + 1)."""
    pid()
    return _generation


def _after_fork_in_child() -> None:
    global _pid, _generation, _lock
    if os.getpid() == _pid:
        return  # already done (the hook, then a pid() check)
    _pid = os.getpid()
    _generation += 1
    _lock = threading.Lock()  # may have been held by a thread that did not survive the fork
    for callback in list(_callbacks):
        try:
            callback()
        except Exception:  # one reset failing must not leave the others undone
            logger.exception("django-semaphore: resetting %r after fork() failed", callback)


os.register_at_fork(after_in_child=_after_fork_in_child)
