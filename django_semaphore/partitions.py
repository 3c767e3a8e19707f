"""KEY functions: how a request is mapped to a semaphore partition.

Each function takes the request and returns a string; the string is hashed
into the Redis key (see :mod:`django_semaphore.keys`), so any value is safe.
"""


def by_ip(request):
    """REMOTE_ADDR only: X-Forwarded-For is client-controlled and not trusted.

    Behind a proxy, set KEY to a callable of your own that reads the header
    your proxy sets and that you trust.
    """
    return request.META.get("REMOTE_ADDR") or ""


def by_user(request):
    """The authenticated user's pk; anonymous requests are keyed by IP."""
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return f"ip:{by_ip(request)}"


class ByHeader:
    """The value of one request header; a missing header is its own partition."""

    def __init__(self, header):
        self.header = header

    def __call__(self, request):
        value = request.headers.get(self.header)
        return "missing:" if value is None else "value:" + value

    def __repr__(self):
        return f"ByHeader({self.header!r})"

    def __eq__(self, other):
        return isinstance(other, ByHeader) and other.header.lower() == self.header.lower()

    def __hash__(self):
        return hash(("ByHeader", self.header.lower()))
