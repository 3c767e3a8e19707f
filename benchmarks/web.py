"""Django end to end: an unguarded view and the same view under ``@semaphore``.

gunicorn (WSGI, gthread worker) serves the sync views, uvicorn (ASGI) the
async ones; the load generator is wrk where installed, else a Python
keep-alive client.  Plain and guarded runs alternate, and the medians of the
rounds are compared.
"""

import http.client
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

from tests.support.servers import free_port, stop_process

from .common import median, percentile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONNECTIONS = 8


def _bin(name):
    return os.path.join(os.path.dirname(sys.executable), name)


SERVERS = {
    "gunicorn (WSGI)": (
        lambda port: [
            _bin("gunicorn"),
            "benchmarks.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--worker-class",
            "gthread",
            "--threads",
            str(CONNECTIONS),
            "--log-level",
            "warning",
        ],
        ("/plain/", "/guarded/", "/pinged/"),
    ),
    "uvicorn (ASGI)": (
        lambda port: [
            _bin("uvicorn"),
            "benchmarks.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        ("/aplain/", "/aguarded/", "/apinged/"),
    ),
}


def _wait_for(port, process, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server on {port} did not start")


def _check(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"GET {path} -> {response.status}")


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text):
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(number) * _UNITS[unit]


def _wrk(port, path, seconds):
    out = subprocess.run(
        [
            "wrk",
            "-t",
            "1",
            "-c",
            str(CONNECTIONS),
            "-d",
            f"{seconds}s",
            "--latency",
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: .*", out)
    return {
        "rps": rps,
        "p50_ms": p50,
        "p99_ms": p99,
        "non_2xx": int(bad.group(1)) if bad else 0,
        "socket_errors": errors.group(0) if errors else "",
    }


def _python_client(port, path, seconds):
    """Keep-alive GETs from CONNECTIONS threads (when wrk is not installed)."""
    latencies, bad = [], [0]
    end = time.monotonic() + seconds
    lock = threading.Lock()

    def loop():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine, wrong = [], 0
        while time.monotonic() < end:
            t0 = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            mine.append((time.perf_counter() - t0) * 1000.0)
            wrong += response.status != 200
        conn.close()
        with lock:
            latencies.extend(mine)
            bad[0] += wrong

    started = time.monotonic()
    threads = [threading.Thread(target=loop) for _ in range(CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "non_2xx": bad[0],
        "socket_errors": "",
    }


def load_generator():
    return "wrk" if shutil.which("wrk") else "python keep-alive client"


def measure(redis_url, rounds, seconds):
    generate = _wrk if shutil.which("wrk") else _python_client
    env = dict(os.environ, BENCH_REDIS_URL=redis_url, DJANGO_SETTINGS_MODULE="benchmarks.settings")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    result = {}
    for server, (command, (plain, guarded, pinged)) in SERVERS.items():
        port = free_port()
        process = subprocess.Popen(
            command(port), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            _wait_for(port, process)
            for path in (plain, guarded, pinged):
                _check(port, path)
                generate(port, path, 1)  # warm-up
            runs = {plain: [], guarded: [], pinged: []}
            order = [plain, guarded, pinged]
            for r in range(rounds):
                for path in order[r % 3 :] + order[: r % 3]:
                    runs[path].append(generate(port, path, seconds))
        finally:
            stop_process(process, grace=10)
        rows = {}
        for label, path in (("plain", plain), ("guarded", guarded), ("pinged", pinged)):
            rows[label] = {
                "rps": median([x["rps"] for x in runs[path]]),
                "p50_ms": median([x["p50_ms"] for x in runs[path]]),
                "p99_ms": median([x["p99_ms"] for x in runs[path]]),
                "non_2xx": sum(x["non_2xx"] for x in runs[path]),
            }
        rows["ratio"] = median(
            [g["rps"] / p["rps"] for g, p in zip(runs[guarded], runs[plain], strict=False)]
        )
        # The floor: two round trips and nothing else, on the same client.
        rows["pinged_ratio"] = median(
            [g["rps"] / p["rps"] for g, p in zip(runs[pinged], runs[plain], strict=False)]
        )
        result[server] = rows
    return result
