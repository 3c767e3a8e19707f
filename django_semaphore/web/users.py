"""Loading ``request.user`` before a request's semaphores are taken.

KEY "user" and KEY callables read ``request.user``, and the holder's meta
names the user.  Django's AuthenticationMiddleware makes the user lazy: the
sync path loads it on first use; the async path must load it without sync
database access (:func:`aload_user`) before any KEY callable reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils.functional import empty

if TYPE_CHECKING:
    from django.http import HttpRequest


def load_user(request: HttpRequest) -> Any:
    """``request.user`` loaded (a lazy user is fetched now), or None if the request has none."""
    user = getattr(request, "user", None)
    if user is not None:
        user.is_authenticated  # noqa: B018 - load a lazy user in the sync world
    return user


async def aload_user(request: HttpRequest) -> Any:
    """Load ``request.user`` without sync database access in async code.

    With Django's AuthenticationMiddleware the user is lazy; ``request.auser()``
    loads it asynchronously, and ``request.user`` is then bound to the loaded
    user so KEY callables may read it.  Returns the user, or None if the
    request has none.
    """
    user = getattr(request, "user", None)
    if user is None:
        return None
    if getattr(user, "_wrapped", None) is empty:
        if hasattr(request, "auser"):
            user = await request.auser()
        else:  # Django < 5.0 has no request.auser()
            from asgiref.sync import sync_to_async

            user = await sync_to_async(load_user)(request)
            user = getattr(user, "_wrapped", user)
        request.user = user
    return user


def user_label(user: Any) -> str | None:
    """How the holder's meta names ``user``: its pk as a string, None if anonymous or absent."""
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(user.pk)
