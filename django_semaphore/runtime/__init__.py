"""Process-wide state and the background work that keeps it, shared by every semaphore.

* :mod:`.scheduler`: the background scheduler, one daemon thread per process
  that runs the periodic jobs (the control poll below, the engine's recovery
  retries);
* :mod:`.control`: runtime overrides of LIMIT and MODE kept in Redis, the
  per-process cache every acquire reads, and the poll (a scheduler job) that
  refreshes it;
* :mod:`.adaptive`: the adaptive limit's hold-time windows, sent by that poll;
* :mod:`.stats`: the admin's five-minute figures, flushed by it;
* :mod:`.adhoc`: the record of ad-hoc semaphores, sent by it, for the admin and
  the commands;
* :mod:`.tally`: this process's counts of grants, refusals, releases and waits,
  which the Prometheus metrics report;
* :mod:`.bursts`: logging once per burst of like events.

Uses :mod:`django_semaphore.backend` (its :mod:`~django_semaphore.backend.forks`
resets this layer's state in a forked child) and :mod:`django_semaphore.config`; knows no
Semaphore or Lease (the engine asks it for the limit in force and reports to it).
"""
