"""The Redis backend: how to reach Redis and what to call things there.

* :mod:`.connection`: the clients (a django-redis alias or a URL; Cluster,
  Sentinel), one sync client per process and one asyncio client per event loop;
* :mod:`.scripting`: the requests an operation yields (a script of
  ``django_semaphore/scripts/``, a pipeline, a command) and the sync and async
  drivers that send them (EVALSHA, with EVAL on NOSCRIPT), Redis errors turned
  into :class:`~django_semaphore.SemaphoreBackendError`;
* :mod:`.keys`: key naming -- the prefix, a partition's hash tag and suffixes.

Knows nothing of semaphores, leases or requests. Uses :mod:`django_semaphore.config`.
"""
