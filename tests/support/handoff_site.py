"""Views and URLs of the handoff tests: a guarded view hands its lease to a task or keeps it.

Used with ``@pytest.mark.urls("tests.support.handoff_site")`` by tests/engine/test_handoff.py
(the test client) and tests/system/test_celery_worker.py (a live server and a
real Celery worker).
"""

from django.contrib import admin
from django.http import JsonResponse
from django.urls import path

from django_semaphore.web.decorators import semaphore

#: The tickets handed off by the ``keep`` view, for the test to adopt.
TICKETS = []


@semaphore("reports")
def keep(request):
    """Hands its lease off and keeps the ticket: the slot must outlive the response."""
    lease = request.semaphore_leases["reports"]
    TICKETS.append(lease.handoff())
    return JsonResponse({"token": lease.token, "identifier": lease.identifier})


@semaphore("reports")
def plain(request):
    """Does not hand off: its slot is released at response end."""
    return JsonResponse({"token": request.semaphore_leases["reports"].token})


@semaphore("reports")
def export(request):
    """The background-export flow: the slot goes to a Celery task; 202 Accepted."""
    from tests.support.celery_app import export as export_task

    lease = request.semaphore_leases["reports"]
    result = export_task.delay(request.GET.get("report", "r1"), ticket=lease.handoff())
    return JsonResponse({"task_id": result.id, "identifier": lease.identifier}, status=202)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("handoff/keep/", keep),
    path("handoff/plain/", plain),
    path("handoff/export/", export),
]
