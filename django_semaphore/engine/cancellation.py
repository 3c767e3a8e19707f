"""Giving back under cancellation: a give-back that cancelling its caller cannot cut short.

An async guarded function or request whose task is cancelled (a timeout, a
TaskGroup, an ASGI client that went away) must still release what it holds,
now rather than after TIMEOUT, even if the task is cancelled again while it
releases.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

# Strong references to give-backs still running after their caller was cancelled
# (the event loop keeps only weak references to tasks).
_finishing: set[asyncio.Future[Any]] = set()


def finish_soon(coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    """Run ``coro`` (a give-back) in a task of its own, kept referenced until it ends.

    For callbacks, which cannot await: e.g. a request's task that ended
    cancelled after its response had left the guard (see
    :meth:`~django_semaphore.web.request_guard.RequestGuard.hold_until_closed`).
    Needs a running event loop.
    """
    task = asyncio.ensure_future(coro)
    _finishing.add(task)
    task.add_done_callback(_finishing.discard)
    return task


async def run_to_completion(coro: Coroutine[Any, Any, Any]) -> None:
    """Await ``coro`` (a give-back) so that cancelling the caller cannot cut it short.

    The caller is usually being cancelled already (a CancelledError is on its
    way up); if it is cancelled again while this runs, CancelledError is
    raised here at once and ``coro`` still runs to its end in its own task.
    """
    await asyncio.shield(finish_soon(coro))
