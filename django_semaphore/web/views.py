"""The responses sent instead of a guarded view.

``rejected`` is the default SEMAPHORE_REJECT_VIEW (no slot free: 429);
``unavailable`` answers when Redis is unreachable and the app fails closed
(503).  Both send ``Retry-After`` and speak JSON to clients whose Accept header
prefers ``application/json``, HTML (an overridable template) to the others.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import loader
from django.utils.cache import patch_vary_headers

from ..exceptions import SemaphoreError, SemaphoreFull

#: Seconds a client is told to wait when Redis is unreachable.
UNAVAILABLE_RETRY_AFTER = 5

_HTML = "text/html"
_JSON = "application/json"


def _parse_accept(header: str) -> list[tuple[str, str, float]]:
    """[(type, subtype, q)] from an Accept header; malformed parts are skipped."""
    ranges = []
    for part in header.split(","):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        if "/" not in media:
            continue
        main, sub = media.split("/", 1)
        q = 1.0
        for param in fields[1:]:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = min(1.0, max(0.0, float(value.strip())))
                except ValueError:
                    q = 0.0
        ranges.append((main.strip(), sub.strip(), q))
    return ranges


def _quality(ranges: list[tuple[str, str, float]], media: str) -> tuple[float, int]:
    """(q, specificity) of ``media`` under the most specific matching range."""
    main, sub = media.split("/")
    best = None
    for r_main, r_sub, q in ranges:
        if (r_main, r_sub) == (main, sub):
            specificity = 2
        elif r_main == main and r_sub == "*":
            specificity = 1
        elif (r_main, r_sub) == ("*", "*"):
            specificity = 0
        else:
            continue
        if best is None or specificity > best[1]:
            best = (q, specificity)
    return best or (0.0, -1)


def prefers_json(request: HttpRequest) -> bool:
    """True when the request's Accept header ranks application/json above text/html.

    Q-values count first, then how specifically each type was named:
    ``application/json, */*`` prefers JSON, ``text/html, application/json;q=0.9``
    and a browser's ``*/*`` do not.  No Accept header means HTML.
    """
    ranges = _parse_accept(request.headers.get("Accept", ""))
    if not ranges:
        return False
    json_q = _quality(ranges, _JSON)
    return json_q[0] > 0 and json_q > _quality(ranges, _HTML)


def _respond(
    request: HttpRequest,
    status: int,
    body: dict[str, Any],
    template: str,
    context: dict[str, Any],
    retry_after: int,
) -> HttpResponse:
    response: HttpResponse
    if prefers_json(request):
        response = JsonResponse(body, status=status)
    else:
        response = HttpResponse(loader.render_to_string(template, context, request), status=status)
    response["Retry-After"] = str(retry_after)
    response["Cache-Control"] = "no-store"
    patch_vary_headers(response, ["Accept"])
    return response


def rejected(request: HttpRequest, exception: SemaphoreFull) -> HttpResponse:
    """429 Too Many Requests with ``Retry-After``: the default SEMAPHORE_REJECT_VIEW.

    ``exception`` is the :class:`~django_semaphore.SemaphoreFull` (``name``,
    ``retry_after``, ``key``).  JSON body
    ``{"error": "semaphore_full", "semaphore": name, "retry_after": n}`` for
    clients preferring JSON, else the template ``django_semaphore/429.html``
    (context: ``semaphore``, ``retry_after``).  Write your own view with the
    same signature and point SEMAPHORE_REJECT_VIEW at it to change this.
    """
    retry_after = max(1, int(exception.retry_after))
    body = {"error": "semaphore_full", "semaphore": exception.name, "retry_after": retry_after}
    context = {"semaphore": exception.name, "retry_after": retry_after}
    return _respond(request, 429, body, "django_semaphore/429.html", context, retry_after)


def unavailable(request: HttpRequest, exception: SemaphoreError) -> HttpResponse:
    """503 Service Unavailable with ``Retry-After``: Redis could not be reached.

    Sent when failing closed (SEMAPHORE_FAIL_OPEN = False).  JSON body
    ``{"error": "semaphore_unavailable", "retry_after": n}`` or the template
    ``django_semaphore/503.html``.  The Redis error itself is logged, not shown.
    """
    retry_after = UNAVAILABLE_RETRY_AFTER
    body = {"error": "semaphore_unavailable", "retry_after": retry_after}
    context = {"retry_after": retry_after}
    return _respond(request, 503, body, "django_semaphore/503.html", context, retry_after)
