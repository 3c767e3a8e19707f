"""A process whose clock is wrong, for tests/test_clock_skew.py.

``python -m tests.workers.skewed OFFSET COMMAND_JSON``: ``time.time()`` is
shifted by OFFSET seconds *before* the engine is imported; then the process
tries to acquire the semaphore described by the command (``name``,
``limit``, ``timeout``, ``algorithm``), runs ``purge_expired()`` and prints
one JSON line: whether it got a slot (and the lease's token and expiry as
the engine reported them), how many entries the purge removed, and the
holders it saw.  A lease it gets is left held, as by a crashed process.
"""

import json
import sys
import time


def main():
    offset = float(sys.argv[1])
    command = json.loads(sys.argv[2])
    real_time = time.time
    time.time = lambda: real_time() + offset  # before anything reads the clock

    import django

    django.setup()
    from django_semaphore import Semaphore

    sem = Semaphore(
        command["name"], limit=command["limit"], timeout=command["timeout"], algorithm=command["algorithm"]
    )
    lease = sem.acquire()
    purged = sem.purge_expired() if command.get("purge", True) else 0
    print(
        json.dumps(
            {
                "token": lease and lease.token,
                "identifier": lease and lease.identifier,
                "expires_ms": lease and lease.expires_ms,
                "purged": purged,
                "holders": [h.identifier for h in sem.holders()],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
