"""Round trips per acquire with and without a runtime override.

Overrides reach every process through its poller thread (one HGETALL per
prefix every half second, in one pipeline with the stats flush), never through
the acquire path: an acquire+release cycle makes the same round trips whether
an override is in force or not.  Counted on the client: every request redis-py
writes to a socket (a pipeline is one), from every thread of this process, the
poller's included, over a fixed number of cycles with the override set and
cleared in turn; and, from the server's INFO commandstats, the script calls.
"""

import threading
import time
import uuid

from redis.connection import AbstractConnection

from django_semaphore import Semaphore
from django_semaphore.backend import connection

from .rediscost import _delta, _usec


class RoundTrips:
    """Counts the requests redis-py sends (``send_packed_command``), in every thread."""

    def __init__(self):
        self.count = 0
        self._lock = threading.Lock()
        self._original = AbstractConnection.send_packed_command

    def __enter__(self):
        original, counter = self._original, self

        def counted(conn, command, check_health=True):
            with counter._lock:
                counter.count += 1
            return original(conn, command, check_health)

        AbstractConnection.send_packed_command = counted
        return self

    def __exit__(self, *exc):
        AbstractConnection.send_packed_command = self._original


def measure(cycles=2000):
    """Round trips and script calls per acquire+release cycle, without and with an override."""
    client = connection.get_client()
    sem = Semaphore(f"override-{uuid.uuid4().hex[:6]}", limit=5, timeout=60)
    for _ in range(50):  # the poller has started, the scripts are loaded
        sem.acquire().release()
    result = {}
    for label, apply in (("settings", sem.clear_override), ("override", lambda: sem.override(limit=3))):
        apply()
        sem.acquire().release()
        before = _usec(client)
        with RoundTrips() as trips:
            started = time.perf_counter()
            for _ in range(cycles):
                sem.acquire().release()
            elapsed = time.perf_counter() - started
        after = _usec(client)
        result[label] = {
            "round_trips_per_cycle": trips.count / cycles,
            "scripts_per_cycle": _delta(after, before, "evalsha")[1] / cycles,
            "polls": _delta(after, before, "hgetall")[1],
            "cycle_us": elapsed / cycles * 1e6,
            "limit": sem.effective().limit,
        }
    sem.clear_override()
    return result
