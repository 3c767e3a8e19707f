"""The same tiny view, unguarded, under ``@semaphore``, and with two PINGs (sync and async).

The "pinged" view sends two ``PING`` on the semaphore's own Redis client, one
before and one after the plain view: the two round trips any Redis-backed
guard needs (acquire, release) and nothing else, the web floor of goal 4.
"""

from django.http import HttpResponse

from django_semaphore import semaphore
from django_semaphore.backend import connection

BODY = b"ok\n"


def plain(request):
    return HttpResponse(BODY, content_type="text/plain")


async def aplain(request):
    return HttpResponse(BODY, content_type="text/plain")


guarded = semaphore("web")(plain)
aguarded = semaphore("web")(aplain)


def pinged(request):
    client = connection.get_client()
    client.ping()
    response = plain(request)
    client.ping()
    return response


async def apinged(request):
    client = connection.get_async_client()
    await client.ping()
    response = await aplain(request)
    await client.ping()
    return response
