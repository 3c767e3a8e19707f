"""KEY functions: how a request is mapped to a semaphore partition.

Each function takes the request and returns the **raw partition value**, the
same string that ``sem.acquire(key=...)`` takes, so code outside a view can
share a request's partition: for KEY "user" it is ``str(user.pk)``, for "ip"
the address, for "header:<Name>" the header's value.  The string is hashed
into the Redis key (see :mod:`django_semaphore.backend.keys`), so any value is safe.
"""

from __future__ import annotations

from django.http import HttpRequest


def by_ip(request: HttpRequest) -> str:
    """REMOTE_ADDR only: X-Forwarded-For is client-controlled and not trusted.

    Behind a proxy, set KEY to a callable of your own that reads the header
    your proxy sets and that you trust.  No REMOTE_ADDR: ``""``.
    """
    return request.META.get("REMOTE_ADDR") or ""


def by_user(request: HttpRequest) -> str:
    """The authenticated user's pk, ``str(user.pk)``; anonymous requests are keyed by IP.

    The two share one namespace without a prefix (API.md: the partition value
    is the raw value ``acquire(key=...)`` takes).  An address never equals an
    integer or UUID primary key; a user model whose pk is free text that can
    look like an address should use a KEY callable of its own.
    """
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return str(user.pk)
    return by_ip(request)


class ByHeader:
    """The value of one request header, as sent; a missing header is ``""``.

    A missing header and an empty one are the same partition (``key=""``),
    which is not the unpartitioned semaphore (``key=None``).
    """

    def __init__(self, header: str) -> None:
        self.header = header

    def __call__(self, request: HttpRequest) -> str:
        return request.headers.get(self.header) or ""

    def __repr__(self) -> str:
        return f"ByHeader({self.header!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByHeader) and other.header.lower() == self.header.lower()

    def __hash__(self) -> int:
        return hash(("ByHeader", self.header.lower()))
