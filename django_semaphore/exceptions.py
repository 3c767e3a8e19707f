"""Exceptions raised by django-semaphore."""

from __future__ import annotations


class SemaphoreError(Exception):
    """Base class of every error this app raises on purpose."""


class SemaphoreFull(SemaphoreError):
    """No slot was free (within the allowed wait).

    ``retry_after`` is the number of whole seconds (>= 1, capped at the
    semaphore's TIMEOUT) until the earliest current lease expires; ``name`` is
    the semaphore's name and ``key`` the partition value, if any.
    """

    def __init__(self, name: str, retry_after: int = 1, key: str | None = None) -> None:
        self.name = name
        self.retry_after = int(retry_after)
        self.key = key
        super().__init__(f"Semaphore {name!r} has no free slot; retry after {self.retry_after}s.")


class SemaphoreBackendError(SemaphoreError):
    """Redis could not be reached or answered with an error.

    ``server`` names the Redis server (``host:port``, a socket path or the
    cluster's nodes) so that the message says where to look.
    """

    def __init__(self, message: str, server: str | None = None) -> None:
        self.server = server
        super().__init__(message)
