"""What operators read: overviews of every semaphore and the Prometheus metrics.

* :mod:`.monitor`: read-only summaries of every semaphore and partition (limit
  in force, holders, waiters, recent figures) for the admin and the management
  commands, and the clean-up of expired entries;
* :mod:`.metrics`: the Prometheus receivers, collector and scrape view (the
  ``[prometheus]`` extra; public as ``django_semaphore.metrics``).

Uses :mod:`django_semaphore.engine` and the layers below it; knows nothing of
:mod:`django_semaphore.web`.
"""
