"""The one table of a run, as a reStructuredText simple table (pasteable into docs/benchmarks.rst)."""


def _fmt(value, spec):
    if value is None or value != value:  # NaN
        return "-"
    return format(value, spec)


def _verdict(ok):
    return "met" if ok else "NOT met"


def table(r, targets):
    rows = []  # (section, measure, figure, ratio, target)

    def add(section, measure, figure, ratio="", target=""):
        rows.append((section, measure, figure, ratio, target))

    cyc = r["cycles"]
    floor = cyc["floor"]
    add("floor", "PING pairs/s, same client + connection", _fmt(floor, ",.0f"), "1.00")
    row = cyc["script floor"]
    add("floor", "EVALSHA 'return 1' pairs/s", _fmt(row["rate"], ",.0f"), f"{row['vs_floor']:.2f}")
    row = cyc["raw scripts"]
    add(
        "cycles/s lua",
        "raw: our 2 scripts, no Python layer",
        _fmt(row["rate"], ",.0f"),
        f"{row['vs_floor']:.2f}",
    )
    if "lua, no signal receivers" in cyc:
        row = cyc["lua, no signal receivers"]
        add(
            "cycles/s lua",
            "empty, metrics receivers off",
            _fmt(row["rate"], ",.0f"),
            f"{row['vs_floor']:.2f}",
        )
    for algorithm, by_count in cyc["algorithms"].items():
        for count, row in by_count.items():
            label = "empty" if count == 0 else f"{count:,} holders"
            target = ""
            if algorithm == "lua" and count == 0:
                t = targets["lua_vs_floor"]
                target = f">= {t} x floor: {_verdict(row['vs_floor'] >= t)}"
            elif algorithm == "lua" and count == max(by_count):
                t = targets["holders_10000_vs_empty"]
                target = f"{row['vs_empty']:.2f} x empty (>= {t}): {_verdict(row['vs_empty'] >= t)}"
            elif count:
                target = f"{row['vs_empty']:.2f} x empty"
            add(f"cycles/s {algorithm}", label, _fmt(row["rate"], ",.0f"), f"{row['vs_floor']:.2f}", target)
    t = targets["lua_vs_fair_locked"]
    x = cyc["lua_vs_fair_locked"]
    add("cycles/s", "lua / fair_locked, empty", f"{x:.2f} x", "", f">= {t} x: {_verdict(x >= t)}")
    if "weighted" in cyc:
        row = cyc["weighted"]
        t = targets["weighted_vs_plain"]
        slower = 1 / row["plain_vs_weighted"] if row["plain_vs_weighted"] else float("nan")
        add(
            "cycles/s lua",
            "weighted: permits=2, priority=5",
            _fmt(row["rate"], ",.0f"),
            f"{row['vs_floor']:.2f}",
        )
        add(
            "cycles/s lua",
            "plain / weighted cycles/s",
            f"{slower:.3f} x",
            "",
            f"<= {t} x: {_verdict(slower <= t)}",
        )
    for peer, row in cyc["peers"].items():
        add("peer (one slot)", peer, _fmt(row["rate"], ",.0f"), f"{row['vs_floor']:.2f}")

    for holders, row in r["rediscost"].items():
        t = targets["acquire_vs_seed"]
        add(
            "Redis usec/call",
            f"acquire script, {holders:,} holders",
            f"{row['acquire']:.1f}",
            f"{row['ratio']:.2f} x seed",
            f"<= {t} x seed: {_verdict(row['ratio'] <= t)}",
        )
        add("Redis usec/call", f"release script, {holders:,} holders", f"{row['release']:.1f}")
        add(
            "Redis usec/call", f"seeds' 11.2.3 Lua acquire, {holders:,}", f"{row['seed_acquire']:.1f}", "1.00"
        )
        add("Redis usec/call", f"seeds' ZREM release, {holders:,}", f"{row['seed_release']:.1f}")
    for algorithm, usec in r["cost_per_cycle"].items():
        if algorithm == "weighted_ratio":
            continue
        label = "lua weighted (permits=2, priority=5)" if algorithm == "lua weighted" else algorithm
        add("Redis usec/cycle", f"{label}: every command it sends", f"{usec:.1f}")
    if "weighted_ratio" in r["cost_per_cycle"]:
        t = targets["weighted_vs_plain"]
        x = r["cost_per_cycle"]["weighted_ratio"]
        add(
            "Redis usec/cycle",
            "lua weighted / plain (paired)",
            f"{x:.3f} x",
            "",
            f"<= {t} x: {_verdict(x <= t)}",
        )
    if "overrides" in r:
        o = r["overrides"]
        same = abs(o["override"]["round_trips_per_cycle"] - o["settings"]["round_trips_per_cycle"]) < 0.05
        for label in ("settings", "override"):
            row = o[label]
            add(
                "round trips/cycle",
                f"limit from {label} ({row['limit']})",
                f"{row['round_trips_per_cycle']:.3f}",
                f"{row['scripts_per_cycle']:.2f} scripts, {row['polls']} polls",
                f"no extra round trip: {_verdict(same)}" if label == "override" else "",
            )

    w = r["waiting"]
    add(
        "wake-up ms",
        f"release -> waiter holds (n={w['samples']})",
        f"p50 {w['p50_ms']:.2f}",
        "",
        f"< {targets['wake_p50_ms']}: {_verdict(w['p50_ms'] < targets['wake_p50_ms'])}",
    )
    add(
        "wake-up ms",
        "",
        f"p99 {w['p99_ms']:.2f}",
        "",
        f"< {targets['wake_p99_ms']}: {_verdict(w['p99_ms'] < targets['wake_p99_ms'])}",
    )

    for kind, row in r.get("parking", {}).items():
        label = "parked (semaphore_task)" if kind == "parked" else "retry(countdown=1)"
        add(
            "Celery start ms",
            f"{label}, after a release (n={row['samples']})",
            f"p50 {row['p50_ms']:.0f} / p99 {row['p99_ms']:.0f}",
            "",
            f"< 1000: {_verdict(row['max_ms'] < 1000)}" if kind == "parked" else "",
        )

    for (algorithm, processes), row in r["contention"].items():
        target = ""
        if algorithm in ("lua", "fair_locked"):
            target = f"0 above: {_verdict(row['above_limit'] == 0)}"
        add(
            f"contention {algorithm}",
            f"{processes} procs, LIMIT 5",
            f"{row['grants_per_s']:,.0f} grants/s",
            f"{row['refusals_per_s']:,.0f} refused/s",
            f"{row['above_limit']} above LIMIT (peak {row['peak']}) {target}".strip(),
        )

    for server, web in r.get("web", {}).items():
        for label in ("plain", "guarded"):
            row = web[label]
            extra = f", {row['non_2xx']} non-2xx" if row["non_2xx"] else ""
            add(
                f"web {server}",
                f"{label} view: p50 {row['p50_ms']:.2f} / p99 {row['p99_ms']:.2f} ms{extra}",
                f"{row['rps']:,.0f} req/s",
            )
        t = targets["guarded_vs_plain"]
        add(
            f"web {server}",
            "guarded / plain",
            f"{web['ratio']:.2f} x",
            "",
            f">= {t}: {_verdict(web['ratio'] >= t)}",
        )

    headers = ("section", "measure", "figure", "x floor / other", "target")
    widths = [max(len(h), *(len(str(row[i])) for row in rows)) for i, h in enumerate(headers)]
    rule = "  ".join("=" * w for w in widths)
    lines = [rule, "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)).rstrip(), rule]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
    lines.append(rule)
    m = r["machine"]
    lines.insert(
        0,
        f"{m['nproc']} cores, {m['cpu']}, Redis {m['redis']}, Python {m['python']}, "
        f"Django {m['django']}, redis-py {m['redis_py']}"
        + (f"; load: {r['load_generator']}" if r.get("load_generator") else "")
        + ("; prometheus metrics on" if m.get("metrics") else "")
        + f"; run took {r['elapsed_s']:.0f} s",
    )
    lines.insert(1, "")
    return "\n".join(lines)
