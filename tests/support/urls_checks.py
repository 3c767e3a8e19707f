"""The URLconf of the E027 tests (tests/test_checks.py): views guarded well and badly,
as functions, class-based views and under include().  Badly: against their SEMAPHORES
entry, or with a dotted path that does not import; an argument no entry could accept
(wait=10**400, permits=0, key="header:") is refused by @semaphore itself, at import."""

from django.http import HttpResponse
from django.urls import include, path
from django.utils.decorators import method_decorator
from django.views import View

from django_semaphore import semaphore


def ok(request):
    return HttpResponse("ok")


good = semaphore("chk", key="ip", permits=2, priority=lambda request: 1)(ok)
unknown = semaphore("chk-missing")(ok)
bad_key = semaphore("chk", key="no.such.module.key")(ok)
too_many = semaphore("chk", permits=5)(ok)
bad_priority = semaphore("chk", priority="no.such.module.func")(ok)
seed = semaphore("chk-seed", permits=2)(ok)


@method_decorator(semaphore("chk-missing-cbv"), name="dispatch")
class Guarded(View):
    def get(self, request):
        return HttpResponse("ok")


nested = [path("deep/", semaphore("chk", permits="no.such.module.permits")(ok))]

urlpatterns = [
    path("good/", good),
    path("unknown/", unknown),
    path("bad-key/", bad_key),
    path("too-many/", too_many),
    path("bad-priority/", bad_priority),
    path("seed/", seed),
    path("cbv/", Guarded.as_view()),
    path("nested/", include(nested)),
]
