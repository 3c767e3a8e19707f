"""A contending process for tests/system/test_contention.py.

Prints ``ready`` once Django is set up, then for every JSON command read on
stdin (``algorithm``, ``name``, ``limit``, ``timeout``, ``seconds``) takes
and releases the semaphore in a loop for ``seconds`` and prints one JSON
line: the hold intervals (``time.monotonic()`` just after acquire returned,
just before release was called; monotonic time is system-wide on Linux, so
intervals of different processes compare), and counters.
"""

import json
import os
import random
import sys
import time


def contend(algorithm, name, limit, timeout, seconds):
    from django_semaphore import Semaphore

    sem = Semaphore(name, limit=limit, timeout=timeout, algorithm=algorithm)
    intervals, refused, lost = [], 0, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lease = sem.acquire()
        if lease is None:
            refused += 1
            time.sleep(random.uniform(0, 0.001))
            continue
        start = time.monotonic()
        time.sleep(random.uniform(0, 0.002))
        end = time.monotonic()
        if not lease.release():
            lost += 1
        intervals.append((start, end))
    return {"intervals": intervals, "refused": refused, "lost": lost}


def main():
    import django

    django.setup()
    print("ready", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        print(json.dumps(contend(**command)), flush=True)
    # Stdin closed: the test is over. Skip the interpreter's slow tear-down.
    os._exit(0)


if __name__ == "__main__":
    main()
