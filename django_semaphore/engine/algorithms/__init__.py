"""The semaphore algorithms, behind one Protocol (:class:`~.base.Algorithm`).

The ALGORITHM setting names one of them:

* ``lua`` (default, :mod:`.lua`): one atomic server-side script per operation,
  server clock, fair counter, FIFO waiting queue.
* ``fair_locked``, ``fair``, ``basic`` (:mod:`.redis_in_action`): the Redis
  in Action variants, on the client's clock, without a queue.

All of them use the same keys (:class:`~django_semaphore.backend.keys.PartitionKeys`)
with the same meaning, so ``holders()``, ``purge_expired()`` and the admin
work whatever the algorithm.  :data:`ALGORITHMS` is the registry.
"""

from __future__ import annotations

from .base import AcquireRequest, Algorithm, Granted, Outcome, Refused
from .lua import Lua
from .redis_in_action import Basic, Fair, FairLocked

__all__ = ["ALGORITHMS", "AcquireRequest", "Algorithm", "Granted", "Outcome", "Refused"]

#: Every algorithm, by the name the ALGORITHM setting gives it.
ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (Lua(), FairLocked(), Fair(), Basic())}
