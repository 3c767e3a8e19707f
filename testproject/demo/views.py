"""The demo endpoints: each one guarded by a semaphore in a different way.

See testproject/settings.py for the SEMAPHORES they use.
"""

import asyncio
import os
import time
import uuid

from django.conf import settings
from django.http import FileResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import cache_control

from django_semaphore import semaphore

from . import tasks

DEFAULT_SECONDS = 3.0
MAX_SECONDS = 10.0


def _seconds(request, default=DEFAULT_SECONDS):
    """How long the endpoint works: ?seconds=N (0 to 10), else ``default``."""
    try:
        seconds = float(request.GET.get("seconds", default))
    except ValueError:
        seconds = default
    return min(max(seconds, 0.0), MAX_SECONDS)


def _wants_json(request):
    return "application/json" in request.headers.get("Accept", "")


def _done(request, name, seconds, what):
    """The reply of a guarded endpoint: JSON for scripts, a small page for people."""
    lease = getattr(request, "semaphore_leases", {}).get(name)
    data = {
        "ok": True,
        "semaphore": name,
        "limit": settings.SEMAPHORES[name]["LIMIT"],
        "token": lease.token if lease else None,
        "seconds": seconds,
        "what": what,
    }
    if _wants_json(request):
        return JsonResponse(data)
    return render(request, "demo/done.html", data)


DEMOS = [
    {
        "url_name": "report",
        "title": "Slow report",
        "semaphore": "reports",
        "how": '@semaphore("reports") on a view that works for 3 s',
        "try": (
            "Open ?tab=1, ?tab=2 and ?tab=3 in three tabs at once: two get the report, the third "
            "a 429 page. (Give each tab its own query string: Chromium holds a second request for "
            "the very same URL back until the first one answers.)"
        ),
    },
    {
        "url_name": "per-user",
        "title": "Per-user view",
        "semaphore": "per-user",
        "how": '@semaphore("per-user"), KEY "user": one at a time per user',
        "try": (
            "Two tabs as the same user (?tab=1, ?tab=2): one is refused. Another user (or a private "
            "window) is not."
        ),
    },
    {
        "url_name": "api-items",
        "title": "API under the middleware",
        "semaphore": "api",
        "how": 'no decorator: SemaphoreMiddleware with PATHS [r"^/api/"]',
        "try": "Fire the burst at it: three get JSON, the rest a JSON 429.",
    },
    {
        "url_name": "download",
        "title": "Streaming download",
        "semaphore": "downloads",
        "how": '@semaphore("downloads"), LIMIT 1, on a StreamingHttpResponse of 5 s',
        "try": "The slot is held until the last byte is sent: start a second download meanwhile.",
    },
    {
        "url_name": "async-work",
        "title": "Async view",
        "semaphore": "async-work",
        "how": '@semaphore("async-work") on an async def view (asyncio Redis client)',
        "try": "Waits with await asyncio.sleep(): the event loop keeps serving other requests.",
    },
    {
        "url_name": "export",
        "title": "Background export",
        "semaphore": "exports",
        "how": '@semaphore("exports"); the view hands its lease to a task: lease.handoff() / Lease.adopt()',
        "try": "Start one: 202 at once; the slot is held until the task ends; the admin shows its task id.",
    },
]


def home(request):
    """What the demo shows, the endpoints, and the burst button."""
    demos = []
    for demo in DEMOS:
        config = settings.SEMAPHORES[demo["semaphore"]]
        demos.append(
            {
                **demo,
                "url": reverse(demo["url_name"]),
                "limit": config["LIMIT"],
                "key": config.get("KEY") or "",
            }
        )
    return render(
        request,
        "demo/home.html",
        {
            "demos": demos,
            "admin_url": reverse("admin:django_semaphore_semaphore_changelist"),
            "embedded_redis": not settings.REDIS_URL,
            # Set by ``manage.py demo``: the admin user it made sure exists.
            "demo_admin": getattr(settings, "DEMO_ADMIN", None),
        },
    )


FAVICON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static", "demo", "favicon.ico")


@cache_control(public=True, max_age=24 * 3600)
def favicon(request):
    """/favicon.ico, which browsers fetch on every site (the admin's pages name no icon)."""
    return FileResponse(open(FAVICON, "rb"), content_type="image/x-icon")


@semaphore("reports")
def report(request):
    """A report that takes a while to build: at most 2 at once."""
    seconds = _seconds(request)
    time.sleep(seconds)
    return _done(request, "reports", seconds, "Your report is ready.")


@semaphore("per-user")
def per_user(request):
    """Something each user may run only once at a time."""
    seconds = _seconds(request)
    time.sleep(seconds)
    return _done(request, "per-user", seconds, "Your personal job is done.")


def api_items(request):
    """A JSON API endpoint: not decorated; SemaphoreMiddleware guards /api/."""
    seconds = _seconds(request, 2.0)
    time.sleep(seconds)
    lease = getattr(request, "semaphore_leases", {}).get("api")
    token = lease.token if lease else None  # None: Redis was down and SEMAPHORE_FAIL_OPEN let it through
    return JsonResponse({"ok": True, "semaphore": "api", "token": token, "items": [1, 2, 3]})


@semaphore("downloads")
def download(request):
    """A 5-second stream; the slot is released only when the last chunk has been sent."""
    seconds = _seconds(request, 5.0)
    chunks = 10

    async def lines():
        # An async iterator: under ASGI Django streams it chunk by chunk.
        for n in range(1, chunks + 1):
            await asyncio.sleep(seconds / chunks)
            yield f"line {n} of {chunks}\n"

    response = StreamingHttpResponse(lines(), content_type="text/plain; charset=utf-8")
    if not _wants_json(request) and "inline" not in request.GET:
        response["Content-Disposition"] = 'attachment; filename="demo-download.txt"'
    return response


@semaphore("async-work")
async def async_work(request):
    """An async view: the semaphore is taken and released without blocking the event loop."""
    seconds = _seconds(request, 2.0)
    await asyncio.sleep(seconds)
    return _done(request, "async-work", seconds, "The async work is done.")


@semaphore("exports")
def export(request):
    """Start a background export: the view's slot is handed to the task (202 Accepted).

    The slot is not released at the response's end: the task adopts the lease,
    holds it while it works (renewed), and releases it when done.
    """
    seconds = _seconds(request, 8.0)
    lease = request.semaphore_leases["exports"]
    task_id = str(uuid.uuid4())
    tasks.run_in_thread(lease.handoff(), task_id, seconds)
    data = {
        "ok": True,
        "semaphore": "exports",
        "limit": settings.SEMAPHORES["exports"]["LIMIT"],
        "token": lease.token,
        "task_id": task_id,
        "seconds": seconds,
        "admin_url": reverse("admin:django_semaphore_semaphore_change", args=["exports"]),
    }
    if _wants_json(request):
        return JsonResponse(data, status=202)
    return render(request, "demo/export.html", data, status=202)
