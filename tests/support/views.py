"""Views for the web-layer tests (tests/support/web_urls.py), served in-process and by uvicorn.

The ``probe`` helpers count how many requests run a view at once in Redis
(INCR/DECR with the highest value recorded), so the count holds across
processes.  Every probe key lives under SEMAPHORE_KEY_PREFIX, which each test
sets to its own value and cleans up.
"""

import asyncio
import time

import redis
import redis.asyncio
from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_semaphore import semaphore

ENTER = """
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], 120000)
local m = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > m then redis.call('SET', KEYS[2], n, 'PX', 120000) end
if ARGV[1] ~= '' then redis.call('RPUSH', KEYS[3], ARGV[1]); redis.call('PEXPIRE', KEYS[3], 120000) end
return n
"""

_client = None


def probe_keys(label):
    base = f"{settings.SEMAPHORE_KEY_PREFIX}:probe:{label}"
    return (f"{base}:now", f"{base}:max", f"{base}:order")


def _sync_client():
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL)
    return _client


def enter(label, ident=""):
    return _sync_client().eval(ENTER, 3, *probe_keys(label), ident)


def leave(label):
    _sync_client().decr(probe_keys(label)[0])


async def aenter(client, label, ident=""):
    return await client.eval(ENTER, 3, *probe_keys(label), ident)


def _sleep_for(request, default=1.0):
    return float(request.GET.get("sleep", default))


def _lease(lease):
    return {
        "token": lease.token,
        "key": lease.key,
        "lost": lease.lost,
        "permits": lease.permits,
        "slots": list(lease.slots),
    }


def leases_json(request, **extra):
    leases = getattr(request, "semaphore_leases", {})
    body = {"leases": {name: _lease(lease) for name, lease in leases.items()}}
    body.update(extra)
    return JsonResponse(body)


def gate_key(label):
    return f"{probe_keys(label)[0]}:gate"


def _probe_sync(request, label):
    label = request.GET.get("label", label)
    enter(label, request.GET.get("id", ""))
    try:
        if "gate" in request.GET:
            _sync_client().blpop([gate_key(label)], timeout=30)
        else:
            time.sleep(_sleep_for(request))
    finally:
        leave(label)
    return leases_json(request)


async def _probe_async(request, label):
    label = request.GET.get("label", label)
    client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    try:
        await aenter(client, label, request.GET.get("id", ""))
        try:
            if "gate" in request.GET:
                await client.blpop([gate_key(label)], timeout=30)
            else:
                await asyncio.sleep(_sleep_for(request))
        finally:
            await client.decr(probe_keys(label)[0])
    finally:
        await client.aclose()
    return leases_json(request)


@semaphore("web-slow")
def slow(request):
    return _probe_sync(request, "slow")


@semaphore("web-slow")
async def aslow(request):
    return await _probe_async(request, "aslow")


@method_decorator(semaphore("web-slow"), name="dispatch")
class SlowView(View):
    def get(self, request):
        return _probe_sync(request, "cbv")


@method_decorator(semaphore("web-slow"), name="dispatch")
class ASlowView(View):
    async def get(self, request):
        return await _probe_async(request, "acbv")


@semaphore("web-queue")
def queue(request):
    return _probe_sync(request, "queue")


@semaphore("web-queue")
async def aqueue(request):
    return await _probe_async(request, "aqueue")


@semaphore("web-user")
def by_user(request):
    return leases_json(request)


@semaphore("web-user")
async def aby_user(request):
    return leases_json(request)


@semaphore("web-ip")
def by_ip(request):
    return leases_json(request)


@semaphore("web-header")
def by_header(request):
    return leases_json(request)


@semaphore("web-total")
def by_tenant_total(request):
    return leases_json(request)


@semaphore("web-one", key="ip", wait=0)
def override(request):
    return leases_json(request)


@semaphore("web-one", key="tests.support.views.tenant_key")
def dotted(request):
    return leases_json(request)


def tenant_key(request):
    return request.GET.get("tenant", "none")


def permits_of(request):
    """PERMITS per request: ?permits=n (default 1)."""
    return int(request.GET.get("permits", 1))


def priority_of(request):
    """PRIORITY per request: staff-like callers (?vip=1) first."""
    return 10 if request.GET.get("vip") else 0


@semaphore("web-weighted", permits="tests.support.views.permits_of", priority=priority_of)
def weighted(request):
    return leases_json(request)


@semaphore("web-weighted")
def weighted_settings(request):
    """PERMITS and PRIORITY from the settings entry."""
    return leases_json(request)


@semaphore("web-one")
def boom(request):
    raise ValueError("the view failed")


@semaphore("web-one")
async def aboom(request):
    raise ValueError("the view failed")


def _gate(label):
    """Block until the test pushes to the probe's gate list (bounded)."""
    _sync_client().blpop([gate_key(label)], timeout=30)


@semaphore("web-one")
def stream(request):
    def chunks():
        yield b"first\n"
        _gate("stream")
        yield b"second\n"

    return StreamingHttpResponse(chunks(), content_type="text/plain")


@semaphore("web-one")
async def astream(request):
    async def chunks():
        yield b"first\n"
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            await client.blpop([gate_key("astream")], timeout=30)
        finally:
            await client.aclose()
        yield b"second\n"

    return StreamingHttpResponse(chunks(), content_type="text/plain")


@semaphore("web-short")
def long(request):
    time.sleep(_sleep_for(request, 2.5))
    lease = request.semaphore_leases["web-short"]
    return leases_json(request, refreshed_until=lease.expires_ms, acquired=lease.acquired_ms)


@semaphore("web-short")
async def along(request):
    await asyncio.sleep(_sleep_for(request, 2.5))
    lease = request.semaphore_leases["web-short"]
    return leases_json(request, refreshed_until=lease.expires_ms, acquired=lease.acquired_ms)


@semaphore("pair-x")
@semaphore("pair-y")
def pair_xy(request):
    return _probe_sync(request, "pair")


@semaphore("pair-y")
@semaphore("pair-x")
def pair_yx(request):
    return _probe_sync(request, "pair")


@semaphore("pair-x")
@semaphore("pair-y")
async def apair_xy(request):
    """Async, two semaphores with WAIT: holds pair-x while it waits for pair-y."""
    return leases_json(request)


async def aprobe_plain(request):
    """Undecorated async view with a probe: guarded only by the middleware rules."""
    return await _probe_async(request, "mw-async")


def probe_plain(request):
    """Undecorated sync view with a probe: guarded only by the middleware rules."""
    return _probe_sync(request, "mw-sync")


def plain(request):
    """Undecorated: guarded only by the middleware rules."""
    return leases_json(request)


async def aplain(request):
    return leases_json(request)


@semaphore("web-one")
def pair_decorated(request):
    return leases_json(request)


def hello(request):
    return HttpResponse("hello")
