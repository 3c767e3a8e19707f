"""Commands per acquire with and without a runtime override.

Overrides reach every process through its poller thread (one HGETALL per
prefix every half second), never through the acquire path: an acquire+release
cycle sends the same commands whether an override is in force or not.  Counted
from INFO commandstats (calls, top-level commands only, the poller's included),
over a fixed number of cycles, with the override set and cleared in turn.
"""

import time
import uuid

from django_semaphore import Semaphore, connection

from .rediscost import _delta, _usec

COUNTED = ("evalsha", "eval", "multi", "exec", "set", "get", "hgetall", "hget", "zadd", "zrem")


def _commands(client, before, after):
    return sum(_delta(after, before, name)[1] for name in COUNTED)


def measure(cycles=2000):
    """Commands sent per acquire+release cycle, and cycle time, without and with an override."""
    client = connection.get_client()
    sem = Semaphore(f"override-{uuid.uuid4().hex[:6]}", limit=5, timeout=60)
    for _ in range(50):  # the poller has started, the scripts are loaded
        sem.acquire().release()
    result = {}
    for label, apply in (("settings", sem.clear_override), ("override", lambda: sem.override(limit=3))):
        apply()
        before, started = _usec(client), time.perf_counter()
        for _ in range(cycles):
            sem.acquire().release()
        elapsed = time.perf_counter() - started
        after = _usec(client)
        # INFO itself is one call of "info", not counted.
        result[label] = {
            "commands_per_cycle": _commands(client, before, after) / cycles,
            "cycle_us": elapsed / cycles * 1e6,
            "limit": sem.effective().limit,
        }
    sem.clear_override()
    return result
