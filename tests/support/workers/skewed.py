"""A process whose clock is wrong, for tests/system/test_clock_skew.py.

``python -m tests.support.workers.skewed OFFSET COMMAND_JSON``: ``time.time()`` is
shifted by OFFSET seconds *before* the engine is imported; then the process
tries to acquire the semaphore described by the command (``name``,
``limit``, ``timeout``, ``algorithm``), runs ``purge_expired()`` and prints
one JSON line: whether it got a slot (and the lease's token and expiry as
the engine reported them), how many entries the purge removed, and the
holders it saw.  A lease it gets is left held, as by a crashed process.

With ``"configured": true`` the semaphore is a SEMAPHORES entry (set with
override_settings) instead of an ad-hoc one.  With ``"inspect": true`` it
also reports, before purging, what status() and holders() see and what
``manage.py sema_cleanup --dry-run`` would remove, and after purging what a
real ``sema_cleanup`` removed (the counts of the commands' last lines).
"""

import io
import json
import re
import sys
import time


def main():
    offset = float(sys.argv[1])
    command = json.loads(sys.argv[2])
    real_time = time.time
    time.time = lambda: real_time() + offset  # before anything reads the clock

    import django

    django.setup()
    from django.test import override_settings

    from django_semaphore import Semaphore

    name = command["name"]
    if command.get("configured"):
        entry = {"LIMIT": command["limit"], "TIMEOUT": command["timeout"], "ALGORITHM": command["algorithm"]}
        with override_settings(SEMAPHORES={name: entry}):
            report = run(Semaphore(name), command)
    else:
        sem = Semaphore(
            name, limit=command["limit"], timeout=command["timeout"], algorithm=command["algorithm"]
        )
        report = run(sem, command)
    print(json.dumps(report), flush=True)


def cleanup(*args):
    """``manage.py sema_cleanup`` with ``args``: the N of its last line."""
    from django.core.management import call_command

    out = io.StringIO()
    call_command("sema_cleanup", *args, stdout=out)
    last = out.getvalue().strip().splitlines()[-1]
    return int(re.search(r"(\d+) expired entries", last).group(1))


def run(sem, command):
    lease = sem.acquire()
    report = {
        "token": lease and lease.token,
        "identifier": lease and lease.identifier,
        "expires_ms": lease and lease.expires_ms,
    }
    if command.get("inspect"):
        report["holders_before"] = [h.identifier for h in sem.holders()]
        report["in_use"] = sem.status().in_use
        report["available"] = sem.available()
        report["cleanup_dry_run"] = cleanup("--dry-run")
    report["purged"] = sem.purge_expired() if command.get("purge", True) else 0
    if command.get("inspect"):
        report["cleanup"] = cleanup()
    report["holders"] = [h.identifier for h in sem.holders()]
    return report


if __name__ == "__main__":
    main()
