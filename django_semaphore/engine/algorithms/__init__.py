"""The semaphore algorithms, behind one Protocol (:class:`~.base.Algorithm`).

The ALGORITHM setting names one of them:

* ``lua`` (default, :mod:`.lua`): one atomic server-side script per operation,
  server clock, fair counter, FIFO waiting queue.
* ``fair_locked``, ``fair``, ``basic`` (:mod:`.redis_in_action`): the Redis
  in Action variants, on the client's clock, without a queue.

A "lua" semaphore with TOTAL runs :class:`.total.TotalLua` instead
(:func:`algorithm_for` chooses).

All of them use the same keys (:class:`~django_semaphore.backend.keys.PartitionKeys`)
with the same meaning, so ``holders()``, ``purge_expired()`` and the admin
work whatever the algorithm.  :data:`ALGORITHMS` is the registry.
"""

from __future__ import annotations

import functools

from ...config.validation import SemaphoreConfig
from ...runtime import control
from .base import AcquireRequest, Algorithm, Granted, Outcome, Refused
from .lua import Lua
from .redis_in_action import Basic, Fair, FairLocked
from .total import TotalLua

__all__ = ["ALGORITHMS", "AcquireRequest", "Algorithm", "Granted", "Outcome", "Refused", "algorithm_for"]

#: Every algorithm, by the name the ALGORITHM setting gives it.
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (Lua(), FairLocked(), Fair(), Basic())}


def algorithm_for(config: SemaphoreConfig) -> Algorithm:
    """The algorithm that runs ``config``: its ALGORITHM's, or with TOTAL
    :class:`~.total.TotalLua`, which reads the TOTAL in force at each call."""
    if config.total is None:
        return ALGORITHMS[config.algorithm]
    return TotalLua(functools.partial(_total_in_force, config))


def _total_in_force(config: SemaphoreConfig) -> int:
    total = control.total_in_force(config)
    return config.total if total is None else total  # type: ignore[return-value]
