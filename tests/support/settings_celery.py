"""Settings of the Celery worker tests' workers (tests/system/test_celery_worker.py).

Those of the session, with a configured TOTAL semaphore for the fair-share tests:
``bg-fair`` (LIMIT 4 per tenant, TOTAL ``SEMAPHORE_CELERY_TOTAL`` in all). Its
tasks name their tenant themselves (``semaphore_task(key=...)``); KEY is there
because TOTAL needs one.  The test process applies ``CELERY_SEMAPHORES``
through the ``settings`` fixture.
"""

import os

from tests.support.settings import *  # noqa: F403
from tests.support.settings import SEMAPHORES

#: LIMIT of each tenant of the fair-share semaphores (configured and ad hoc).
FAIR_LIMIT = 4


def fair_entry(total):
    """The SEMAPHORES entry of ``bg-fair`` with TOTAL ``total``."""
    return {"LIMIT": FAIR_LIMIT, "KEY": "header:X-Tenant", "TOTAL": total, "TIMEOUT": 10}


CELERY_SEMAPHORES = {**SEMAPHORES, "bg-fair": fair_entry(int(os.environ.get("SEMAPHORE_CELERY_TOTAL", "1")))}
SEMAPHORES = CELERY_SEMAPHORES
