"""A URLconf whose view has @semaphore(wait=10**400): its import raises (tests/test_checks.py)."""

from django.http import HttpResponse
from django.urls import path

from django_semaphore import semaphore


@semaphore("chk", wait=10**400)
def huge_wait(request):
    return HttpResponse("never")


urlpatterns = [path("huge-wait/", huge_wait)]
