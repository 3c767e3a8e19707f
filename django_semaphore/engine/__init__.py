"""The engine: semaphores and their leases, with no HTTP in it.

* :mod:`.semaphore`: :class:`~django_semaphore.Semaphore`,
  :class:`~django_semaphore.Lease` and the ``semaphores`` registry -- the front;
* :mod:`.algorithms`: one Protocol, one module per family (``lua``; the Redis in
  Action variants);
* :mod:`.waiting`: queueing for a slot; :mod:`.recovery`: acquires and releases
  whose reply never came; :mod:`.watchdog`: renewing held leases;
* :mod:`.guards`: a semaphore as a decorator of plain functions, and the current
  lease; :mod:`.cancellation`: a give-back that cancelling cannot cut short;
* :mod:`.handoff`: the signed tickets that hand a lease to another process;
* :mod:`.inspection` (holders, waiters, status) and :mod:`.discovery` (the SCAN
  for partitions);
* :mod:`.storage`: the engine's Redis for integrations (``contrib/``).

Uses :mod:`django_semaphore.runtime`, :mod:`django_semaphore.backend` and
:mod:`django_semaphore.config`; the web layer, the operators' tools and the
integrations use it.
"""
