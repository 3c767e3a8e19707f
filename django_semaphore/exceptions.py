"""Exceptions raised by django-semaphore, and the refusal's Retry-After."""

from __future__ import annotations

#: Why a caller was refused: no slot free (without waiting), its WAIT ran out,
#: the queue was full (MAX_WAITERS, reserved), the limit in force is 0, or
#: (TOTAL) its partition had room but the name's TOTAL was reached.
REASONS = ("full", "timeout", "queue_full", "paused", "total")


class RetryAfter(int):
    """Retry-After seconds of a refusal, which also says why: ``reason``.

    What :meth:`Semaphore.try_acquire <django_semaphore.Semaphore.try_acquire>`
    returns for a refusal: an ``int`` (older callers use it as one) carrying
    the refusal's reason (one of :data:`REASONS`).
    """

    reason: str

    def __new__(cls, seconds: int, reason: str = "full") -> RetryAfter:
        value = super().__new__(cls, seconds)
        value.reason = reason
        return value

    def __repr__(self) -> str:
        return f"RetryAfter({int(self)}, {self.reason!r})"


class SemaphoreError(Exception):
    """Base class of every error this app raises on purpose."""


class SemaphoreFull(SemaphoreError):
    """No slot was free (within the allowed wait).

    ``retry_after`` is an estimate, in whole seconds (>= 1, at most the
    semaphore's TIMEOUT), of when this caller could get a slot: with the
    default "lua" algorithm, from the partition's recent hold times and the
    queue ahead of the caller, never later than the earliest lease expiry (a
    0.3 s view under TIMEOUT 60 says 1 or 2, not 60); until a first release
    has been recorded, and with the Redis in Action variants, the time to the
    earliest expiry.  ``name`` is the semaphore's name and ``key`` the
    partition value, if any.  ``reason``
    says why: ``"full"`` (refused without waiting), ``"timeout"`` (waited
    WAIT in vain), ``"queue_full"`` (MAX_WAITERS), ``"paused"`` (the limit in
    force is 0) or ``"total"`` (refused without waiting: the partition had room,
    the name's TOTAL had none).  Without ``reason``, a :class:`RetryAfter` ``retry_after``
    gives its own, else ``"full"``.
    """

    def __init__(
        self, name: str, retry_after: int = 1, key: str | None = None, reason: str | None = None
    ) -> None:
        self.name = name
        self.retry_after = int(retry_after)
        self.key = key
        self.reason: str = reason or str(getattr(retry_after, "reason", "full"))
        if self.reason == "paused":
            message = f"Semaphore {name!r} is paused (limit 0); retry after {self.retry_after}s."
        elif self.reason == "total":
            message = f"Semaphore {name!r} has no permit left in its TOTAL; retry after {self.retry_after}s."
        else:
            message = f"Semaphore {name!r} has no free slot; retry after {self.retry_after}s."
        super().__init__(message)


class SemaphoreBackendError(SemaphoreError):
    """Redis could not be reached or answered with an error.

    ``server`` names the Redis server (``host:port``, a socket path or the
    cluster's nodes) so that the message says where to look.
    """

    def __init__(self, message: str, server: str | None = None) -> None:
        self.server = server
        super().__init__(message)
