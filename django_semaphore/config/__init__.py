"""Configuration: the lowest layer, which talks to no Redis.

* :mod:`.settings`: the SEMAPHORE_* settings and SEMAPHORES entries, read lazily
  with their defaults (``override_settings`` takes effect at the next call);
* :mod:`.validation`: judging them -- :class:`~.validation.SemaphoreConfig` (one
  validated entry) and the problems the system checks report;
* :mod:`.key_functions`: the KEY functions ``"ip"``, ``"user"`` and
  ``"header:<Name>"`` that turn a request into a partition value.

Imports nothing of the package but :mod:`django_semaphore.exceptions` and
:mod:`django_semaphore.signals`.
"""
