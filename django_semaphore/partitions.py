"""KEY functions: how a request is mapped to a semaphore partition.

Each function takes the request and returns a string; the string is hashed
into the Redis key (see :mod:`django_semaphore.keys`), so any value is safe.
"""

from __future__ import annotations

from django.http import HttpRequest


def by_ip(request: HttpRequest) -> str:
    """REMOTE_ADDR only: X-Forwarded-For is client-controlled and not trusted.

    Behind a proxy, set KEY to a callable of your own that reads the header
    your proxy sets and that you trust.
    """
    return request.META.get("REMOTE_ADDR") or ""


def by_user(request: HttpRequest) -> str:
    """The authenticated user's pk; anonymous requests are keyed by IP."""
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return f"ip:{by_ip(request)}"


class ByHeader:
    """The value of one request header; a missing header is its own partition."""

    def __init__(self, header: str) -> None:
        self.header = header

    def __call__(self, request: HttpRequest) -> str:
        value = request.headers.get(self.header)
        return "missing:" if value is None else "value:" + value

    def __repr__(self) -> str:
        return f"ByHeader({self.header!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByHeader) and other.header.lower() == self.header.lower()

    def __hash__(self) -> int:
        return hash(("ByHeader", self.header.lower()))
