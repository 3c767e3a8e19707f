"""Signals sent by django-semaphore.

The first four are sent with ``sender=Semaphore`` and the keyword ``semaphore``
(the :class:`~django_semaphore.Semaphore`), plus:

* ``acquired``: ``lease``, ``waited`` (seconds spent queueing);
* ``refused``: ``key`` (partition value), ``retry_after`` (seconds), ``waited``,
  ``dry_run`` (True: MODE "dry_run" or "off" admitted a caller that enforcing
  would have refused; it holds a slot, with ``lease.over_limit``);
* ``released``: ``lease``, ``held`` (False if the slot had been lost before);
* ``lease_lost``: ``lease`` — a refresh or release found the slot gone
  (expired, purged, force-released, or Redis lost it). Sent once per lease.
* ``backend_failed``: ``error`` (the :class:`~django_semaphore.SemaphoreBackendError`
  about to be raised) and ``server`` (``host:port``, socket path or cluster
  nodes) — Redis failed or was unreachable.  Sent by the Redis driver for
  every operation (web, tasks, admin, commands), below any one semaphore, so
  its sender is :class:`~django_semaphore.SemaphoreBackendError` (not
  Semaphore) and it has no ``semaphore`` keyword; sent with ``send_robust``,
  so a failing receiver never hides the error.
* ``config_changed``: sender=Semaphore; ``semaphore``, ``limit``, ``mode`` and
  ``total`` (the effective values after the change; ``total`` is None unless
  the semaphore has a TOTAL) and ``user`` (who made it: None outside the
  admin) — a runtime override was set or cleared
  (:meth:`Semaphore.override <django_semaphore.Semaphore.override>`).
  Sent by the process that made the change only.
"""

from django.dispatch import Signal

# use_caching: the receivers are looked up once per sender (Semaphore, or
# SemaphoreBackendError), not at every acquire and release.
acquired = Signal(use_caching=True)
refused = Signal(use_caching=True)
released = Signal(use_caching=True)
lease_lost = Signal(use_caching=True)
backend_failed = Signal(use_caching=True)
config_changed = Signal(use_caching=True)
