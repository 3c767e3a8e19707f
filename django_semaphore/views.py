"""The default response for a refused request."""

from django.http import HttpResponse, JsonResponse


def rejected(request, exception):
    """429 Too Many Requests with Retry-After (placeholder; the web layer grows it)."""
    body = {"error": "semaphore_full", "semaphore": exception.name, "retry_after": exception.retry_after}
    if "application/json" in request.headers.get("Accept", ""):
        response = JsonResponse(body, status=429)
    else:
        response = HttpResponse("Too many requests", status=429)
    response["Retry-After"] = str(exception.retry_after)
    return response
