"""The same tiny view, unguarded and under ``@semaphore``, sync and async."""

from django.http import HttpResponse

from django_semaphore import semaphore

BODY = b"ok\n"


def plain(request):
    return HttpResponse(BODY, content_type="text/plain")


async def aplain(request):
    return HttpResponse(BODY, content_type="text/plain")


guarded = semaphore("web")(plain)
aguarded = semaphore("web")(aplain)
