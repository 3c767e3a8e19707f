"""The one table of a run, as a reStructuredText simple table (pasteable into docs/benchmarks.rst)."""

from .common import SEED, quartiles


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
    if "lua, metrics off" in cyc:
        row = cyc["lua, metrics off"]
        add(
            "cycles/s lua",
            "empty, metrics off",
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
    if "vs_seed" in cyc:  # goal 2's comparisons, both ways of measuring them
        pairs = cyc.get("paired", {}).get("vs", {})
        for name, x in _interleaved_vs(cyc).items():
            q = pairs.get(name)
            how = f"adjacent pairs: {q[1]:.2f} x ({q[0]:.2f}..{q[2]:.2f})" if q else ""
            add("cycles/s lua", f"10 holders / {name}, interleaved", f"{x:.2f} x", "", how)
    node = cyc.get("node")
    if node and "skipped" in node:
        add("peer (node)", f"redis-semaphore: skipped ({node['skipped']})", "-")
    elif node:
        add("peer (node)", "ioredis PING pairs/s (its own floor)", _fmt(node["floor"], ",.0f"), "1.00")
        for name, row in node["peers"].items():
            add("peer (node)", f"redis-semaphore {name}", _fmt(row["rate"], ",.0f"), f"{row['vs_floor']:.2f}")

    for holders, row in r["rediscost"].items():
        t = targets["acquire_vs_seed"]
        add(
            "Redis usec/call",
            f"acquire script, {holders:,} holders",
            f"{row['acquire']:.1f}",
            f"{row['ratio']:.2f} x seed",
            f"<= {t} x seed: {_verdict(row['ratio'] <= t)}",
        )
        add(
            "Redis usec/call", f"quiet release (plain commands), {holders:,} holders", f"{row['release']:.1f}"
        )
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
    if "minimal_bound" in r:
        b = r["minimal_bound"]
        add(
            "Redis usec/cycle",
            "our acquire script / its calls in minimal Lua, + the same quiet release",
            f"{b['ours']:.1f} / {b['minimal']:.1f}",
            f"{b['ratio']:.2f} x",
        )
        if "fast" in b:
            f = b["fast"]
            add(
                "Redis usec/cycle",
                "the common case's script (acquire_fast.lua) / its calls in minimal Lua, + the same",
                f"{f['ours']:.1f} / {f['minimal']:.1f}",
                f"{f['ratio']:.2f} x",
            )
    if "options" in r:
        _option_rows(r["options"], add)
    if "fairness" in r:
        from .fairness import cost_rows

        for row in cost_rows(r["fairness"]):
            add(*row)
    if "cpu" in r:
        _cpu_rows(r["cpu"], add)
    if "instructions" in r:
        _instruction_rows(r["instructions"], add)
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

    if "contention_goal" in r:
        _contention_goal_rows(r["contention_goal"], add)
    if "fairness" in r:
        from .fairness import scenario_rows

        for row in scenario_rows(r["fairness"]):
            add(*row)
    if "fairness_error" in r:
        add("fair share", f"failed: {r['fairness_error']}", "-")
    if "memory" in r:
        m = r["memory"]
        add(
            "memory",
            f"used_memory before {m['partitions']:,} abandoned partitions",
            f"{m['baseline_bytes']:,} B",
            f"{m['baseline_keys']:,} keys",
        )
        add(
            "memory", f"peak (TIMEOUT {m['timeout']} s)", f"{m['peak_bytes']:,} B", f"{m['peak_keys']:,} keys"
        )
        back = m["back_within_5pc_s"]
        add(
            "memory",
            f"{m['waited_s']} s after the last acquire",
            f"{m['final_bytes']:,} B",
            f"{m['final_keys']:,} keys",
            f"{m['final_vs_baseline']:.3f} x baseline"
            + (f"; within 5 % after {back:.1f} s" if back is not None else ""),
        )
    for server, web in r.get("web", {}).items():
        for label in ("plain", "guarded", "pinged"):
            if label not in web:
                continue
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
        if "pinged_ratio" in web:
            add(
                f"web {server}",
                "pinged (2 PING, no guard) / plain: the floor",
                f"{web['pinged_ratio']:.2f} x",
                f"guarded {web['ratio'] / web['pinged_ratio']:.2f} x pinged",
            )

    if "adaptive" in r:
        for row in r.get("adaptive_rows") or []:
            add(*row)
        for name, value, target, ok in _generic_figures(r["adaptive"]):
            add("adaptive", name, value, "", f"{target}: {_verdict(ok)}" if target else "")
    if "adaptive_error" in r:
        add("adaptive", f"failed: {r['adaptive_error']}", "-")

    lines = _simple_table(("section", "measure", "figure", "x floor / other", "target"), rows)
    lines += ["", "Goals (issue 15)", ""]
    lines += _simple_table(("goal", "measured", "target", "met"), goals(r))
    lines += ["", "Goals (issue 23: engine v2, pay for what you use)", ""]
    lines += _simple_table(("goal", "measured", "target", "met"), engine_goals(r))
    if "fairness" in r:
        from .fairness import goals as fairness_goals

        lines += ["", "Goals (issue 25: fair share across partitions)", ""]
        total_rows = fairness_goals(r["fairness"]) + _total_instruction_goal(r.get("instructions", {}))
        lines += _simple_table(("goal", "measured", "target", "met"), total_rows)
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


def _simple_table(headers, rows):
    widths = [max(len(h), *(len(str(row[i])) for row in rows)) for i, h in enumerate(headers)]
    rule = "  ".join("=" * w for w in widths)
    lines = [rule, "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=False)).rstrip(), rule]
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
    lines.append(rule)
    return lines


def _cpu_label(name):
    if isinstance(name, tuple):
        who, holders = name
        label = "ours (acquire+release)" if who == "ours" else "seed (11.2.3 Lua + ZREM)"
        return f"{label}, {holders:,} other holder{'s' if holders != 1 else ''}"
    return name


def _option_rows(o, add):
    plain = o["plain"]
    add(
        "option cost/cycle",
        "plain (LIMIT 5, no option)",
        f"{plain['usec']:.1f} usec",
        f"{plain['calls']:.1f} calls",
    )
    for name, row in o["options"].items():
        add(
            "option cost/cycle",
            name,
            f"{row['usec']:.1f} usec",
            f"{row['calls']:.1f} calls",
            f"{row['vs_plain']:.2f} x plain (paired)",
        )


def _instruction_rows(ins, add):
    if "skipped" in ins:
        add("instructions/cycle", f"valgrind: skipped ({ins['skipped']})", "-")
        return
    sides = [("client", "client (this process's Python)")]
    if ins["server"]:
        sides.append(("server", f"server (Redis {ins['server_binary']}, reading + running + replying)"))
    else:
        add("instructions/cycle", f"server: skipped ({ins['server_skipped']})", "-")
    for side, label in sides:
        counts, above = ins[side], ins[f"{side}_above_ping"]
        add(
            "instructions/cycle",
            f"{label}: PING pair / seed / ours",
            f"{counts['ping']:,.0f} / {counts['seed']:,.0f} / {counts['ours']:,.0f}",
            f"+{above['seed']:,.0f} / +{above['ours']:,.0f}",
            f"ours {ins[f'{side}_vs_seed']:.2f} x seed above the PING pair",
        )
    if "weighted_vs_plain" in ins:
        counts = ins["server"]
        add(
            "instructions/cycle",
            "server: ours with permits=2 (PERMITS 2)",
            f"{counts['weighted']:,.0f}",
            f"+{counts['weighted'] - counts['ping']:,.0f}",
            f"{ins['weighted_vs_plain']:.2f} x ours above the PING pair",
        )
    if "total_vs_partitioned" in ins:
        counts = ins["server"]
        add(
            "instructions/cycle",
            "server: a partition with TOTAL / without (the fair-share cost rows' cycles)",
            f"{counts['total']:,.0f} / {counts['partitioned']:,.0f}",
            f"+{counts['total'] - counts['ping']:,.0f} / +{counts['partitioned'] - counts['ping']:,.0f}",
            f"TOTAL {ins['total_vs_partitioned']:.2f} x above the PING pair",
        )
    for side, _ in sides:
        counts = ins[side]
        if "handover" in counts:
            add(
                "instructions/hand-over",
                f"{side}: one FIFO hand-over, LIMIT 1, 15 waiters (release, claim, queue again)",
                f"{counts['handover']:,.0f}",
                f"{counts['handover'] / counts['ours']:.2f} x our cycle",
            )


def _instruction_goals(ins):
    """The counted bounds of goals 1 and 2: instructions above the PING pair, ours / the seed's."""
    rows = []
    for goal, side in (("1", "server"), ("2", "client")):
        if f"{side}_vs_seed" in ins:
            rows.append(
                (
                    f"{goal} (counted) {side} instructions above PING pair (valgrind)",
                    f"{ins[f'{side}_vs_seed']:.2f} x seed",
                    "(the work; CPU is the goal)",
                    "-",
                )
            )
    return rows


def _weighted_instruction_goal(ins):
    """The counted bound of goal 4's PERMITS 2 row: server instructions above the PING pair."""
    if "weighted_vs_plain" not in ins:
        return []
    return [
        (
            "4 (counted) PERMITS 2 / plain server instructions above PING pair",
            f"{ins['weighted_vs_plain']:.2f} x",
            "(the work; Redis usec is the goal)",
            "-",
        )
    ]


def _total_instruction_goal(ins):
    """The counted bound of issue 25's cost goal: server instructions above the PING pair."""
    if "total_vs_partitioned" not in ins:
        return []
    return [
        (
            "2 (counted) TOTAL / partitioned server instructions above PING pair",
            f"{ins['total_vs_partitioned']:.2f} x",
            "(the work; Redis usec is the goal)",
            "-",
        )
    ]


def _cpu_rows(c, add):
    for name, row in c["rows"].items():
        if name == "PING pair":
            add(
                "CPU usec/cycle",
                "PING pair (floor): server / client",
                f"{row['server_usec']:.1f} / {row['client_usec']:.1f}",
            )
            continue
        add(
            "CPU usec/cycle",
            f"{_cpu_label(name)}: server / client",
            f"{row['server_usec']:.1f} / {row['client_usec']:.1f}",
            f"+{row['server_above_ping']:.1f} / +{row['client_above_ping']:.1f}",
        )
    paired = c.get("paired")
    if paired:
        spread = f"{_pairs(paired['pairs'])} of {paired['cycles']} cycles; resampled quartiles"
        for holders, (q1, x, q3) in paired["server"].items():
            mine, seed = paired["server_above"][holders]
            add(
                "CPU usec/cycle",
                f"ours / seed above the PING pair, server, {_holders(holders)}, adjacent pairs",
                f"{x:.2f} x",
                f"+{mine:.1f} / +{seed:.1f} usec (medians); {spread} {q1:.2f}..{q3:.2f}",
            )
        q1, x, q3 = paired["client"]
        mine, seed = paired["client_above"]
        add(
            "CPU usec/cycle",
            f"ours / seed above the PING pair, client, {_holders(c['holder_counts'][0])}, adjacent pairs",
            f"{x:.2f} x",
            f"+{mine:.1f} / +{seed:.1f} usec (medians); {spread} {q1:.2f}..{q3:.2f}",
        )
    node = c.get("node")
    if node and "skipped" in node:
        add("CPU usec/cycle", f"redis-semaphore (node): skipped ({node['skipped']})", "-")
    elif node:
        add(
            "CPU usec/cycle",
            f"redis-semaphore (node), LIMIT {node['limit']}: server",
            f"{node['cycle_usec']:.1f}",
            f"+{node['above_ping_usec']:.1f} (its PING pair {node['ping_pair_usec']:.1f})",
        )


def _contention_goal_rows(g, add):
    for name, row in g["rows"].items():
        add(
            f"contention {g['processes']} procs",
            f"{name}, waiting, hold {g['hold'] * 1000:g} ms",
            f"{row['grants_per_s']:,.0f} grants/s",
            f"wait p50 {row['wait_p50_ms']:.1f} / p99 {row['wait_p99_ms']:.1f} ms",
            f"{row['above_limit']} above LIMIT (peak {row['peak']}); "
            f"{row['out_of_order'] * 100:.1f} % out of order, max {row['max_overtaken']} overtaken"
            + (
                f" (server: {row['server_out_of_order'] * 100:.2f} %, max {row['server_max_overtaken']})"
                if row.get("server_out_of_order") is not None
                else ""
            ),
        )
    if "fifo_floor" in g:
        add(
            f"contention {g['processes']} procs",
            f"FIFO hand-over floor (a BLPOP/RPUSH baton, no semaphore), hold {g['hold'] * 1000:g} ms",
            f"{g['fifo_floor']:,.0f} grants/s",
            "the ceiling of any in-order hand-over between processes",
        )
    if "fifo_floor_limit" in g:
        n = g["floor_batons"]
        add(
            f"contention {g['processes']} procs",
            f"FIFO hand-over floor, {n} batons at once (LIMIT {n}), hold {g['hold'] * 1000:g} ms",
            f"{g['fifo_floor_limit']:,.0f} grants/s",
            f"the ceiling of any in-order hand-over at LIMIT {n}",
        )
    if "node_skipped" in g:
        add(f"contention {g['processes']} procs", f"redis-semaphore: skipped ({g['node_skipped']})", "-")
    paired = g.get("paired", {})
    for name, pair in paired.get("peers", {}).items():
        q1, x, q3 = quartiles(pair["grants"])
        w1, w, w3 = quartiles(pair["wait_p99"])
        add(
            f"contention {g['processes']} procs",
            f"{pair['mine']} / {name}, adjacent pairs of {paired['duration']:g} s runs",
            f"{x:.2f} x grants/s",
            f"quartiles {q1:.2f}..{q3:.2f}, {_pairs(paired['pairs'])}; "
            f"p99 wait {w:.2f} x ({w1:.2f}..{w3:.2f}); "
            f"ours: {pair['above_limit']} above LIMIT, "
            f"{pair['server_out_of_order'] * 100:.2f} % out of queue order",
        )


def _generic_figures(result):
    """(name, value, target, met) of a section's "figures" entries shaped {value, target, met} or a triple."""
    out = []
    for name, entry in (result.get("figures") or {}).items():
        if isinstance(entry, dict) and {"value", "met"} <= entry.keys():
            out.append((str(name), _show(entry["value"]), str(entry.get("target", "")), bool(entry["met"])))
        elif isinstance(entry, (list, tuple)) and len(entry) == 3:
            out.append((str(name), _show(entry[0]), str(entry[1]), bool(entry[2])))
    return out


def _show(value):
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _goal(ok):
    return "met" if ok else "NOT MET"


#: Issue 15's goals; the cycle and web targets are also in __main__.TARGETS.
GOALS = {
    "cycle_vs_floor": 0.85,
    "server_cpu_vs_seed": 1.5,
    "server_cpu_flat": 1.25,  # 10,000 holders / 1 holder, above the PING pair
    "client_cpu_vs_seed": 1.25,
    "fifo_out_of_order": 0.01,
    "guarded_vs_plain": 0.85,
    "memory_vs_baseline": 1.05,
}


#: Issue 23's goals (engine v2).
ENGINE_GOALS = {
    "nested_calls": 10,
    "server_cpu_vs_seed": 2.0,
    "cycles_vs_seed": 0.95,
    "cycles_vs_lock": 0.95,
    "client_cpu_vs_seed": 1.5,
    "option_vs_plain": 1.1,
}


def _holders(n):
    return f"{n:,} holder{'s' if n != 1 else ''}"


def _pairs(n):
    return f"{n} pair{'s' if n != 1 else ''}"


def _server_cpu_goals(c, number, target):
    """Goal rows: the server CPU above a PING pair against the seed's, per holder count:
    from the adjacent pairs when the run measured them (the ratio of their
    medians, resampled quartiles in brackets), else from the rounds."""
    paired = c.get("paired")
    rows = []
    for holders, x in c["server_vs_seed"].items():
        measured = f"{x:.2f} x seed"
        if paired:
            q1, x, q3 = paired["server"][holders]
            measured = f"{x:.2f} x seed ({q1:.2f}..{q3:.2f}, {_pairs(paired['pairs'])})"
        rows.append(
            (
                f"{number} server CPU above PING pair, {_holders(holders)}",
                measured,
                f"<= {target} x",
                _goal(x <= target),
            )
        )
    return rows


def _client_cpu_goal(c, label, target):
    """The goal row of the client CPU above a PING pair against the seed's (paired when measured so)."""
    x, measured = c["client_vs_seed"], f"{c['client_vs_seed']:.2f} x seed"
    paired = c.get("paired")
    if paired:
        q1, x, q3 = paired["client"]
        measured = f"{x:.2f} x seed ({q1:.2f}..{q3:.2f}, {_pairs(paired['pairs'])})"
    return (label, measured, f"<= {target} x", _goal(x <= target))


def engine_goals(r):
    """Issue 23's goals block: (goal, measured, target, met) rows."""
    rows = []
    for holders, row in r["rediscost"].items():
        calls = row.get("calls")
        if not calls:
            continue
        n = calls["acquire"] + calls["release"]
        seed = calls["seed_acquire"] + 1  # its release: one ZREM
        t = ENGINE_GOALS["nested_calls"]
        rows.append(
            (
                f"1 Redis calls per uncontended cycle, {holders:,} holders",
                f"{n:.1f} ({calls['acquire']:.1f} + {calls['release']:.1f}; seed {seed:.0f})",
                f"<= {t}",
                _goal(n <= t),
            )
        )
    if "cpu" in r:
        c = r["cpu"]
        rows.extend(_server_cpu_goals(c, "1", ENGINE_GOALS["server_cpu_vs_seed"]))
        rows.append(_client_cpu_goal(c, "2 client CPU above PING pair", ENGINE_GOALS["client_cpu_vs_seed"]))
    if "instructions" in r:
        rows.extend(_instruction_goals(r["instructions"]))
    cyc = r["cycles"]
    if "vs_seed" in cyc:
        rows.extend(_cycle_goals(cyc))
    if "contention_goal" in r:
        rows.extend(_engine_contention_goals(r["contention_goal"]))
    if "options" in r:
        t = ENGINE_GOALS["option_vs_plain"]
        from .options import BOUNDED

        for name, row in r["options"]["options"].items():
            bounded = name in BOUNDED
            rows.append(
                (
                    f"4 {name} / plain, Redis usec per cycle",
                    f"{row['vs_plain']:.2f} x ({row['calls']:.1f} calls)",
                    f"<= {t} x" if bounded else "(priced)",
                    _goal(row["vs_plain"] <= t) if bounded else "-",
                )
            )
    if "instructions" in r:
        rows.extend(_weighted_instruction_goal(r["instructions"]))
    return rows


def _interleaved_vs(cyc):
    """Ours at 10 holders against the seed and each peer, from the interleaved rounds."""
    return {SEED: cyc["vs_seed"], **cyc.get("vs_peers", {})}


def _cycle_goals(cyc):
    """Goal 2's cycles/s rows: ours at 10 holders against the seed's Lua and each peer,
    from the adjacent pairs when the run measured them (median, quartiles in brackets),
    else from the interleaved rounds."""
    if "paired" in cyc:
        p = cyc["paired"]
        figures = {name: q[1] for name, q in p["vs"].items()}
        spread = {name: f" ({q[0]:.2f}..{q[2]:.2f}, {_pairs(p['pairs'])})" for name, q in p["vs"].items()}
    else:
        figures = _interleaved_vs(cyc)
        spread = dict.fromkeys(figures, "")
    rows = []
    for name, x in figures.items():
        t = ENGINE_GOALS["cycles_vs_seed" if name == SEED else "cycles_vs_lock"]
        label = "seed Lua" if name == SEED else name
        measured = f"{x:.2f} x {label}{spread[name]}"
        rows.append(("2 cycles/s, 10 holders", measured, f">= {t} x", _goal(x >= t)))
    return rows


def _engine_contention_goals(g):
    """Target 3: LIMIT 1 against the mutexes (grants/s, p99 wait at most half of redis-py Lock's),
    LIMIT 5 against the node peer, 0 moments above LIMIT, exact queue order on the server."""
    rows = _versus_peers(g, waits=True)
    floor = g.get("fifo_floor")
    if floor and "ours, LIMIT 1" in g["rows"]:
        rows.append(
            (
                "3 (bound) LIMIT 1 / FIFO hand-over floor (BLPOP/RPUSH baton)",
                f"{g['rows']['ours, LIMIT 1']['grants_per_s'] / floor:.2f} x ({floor:,.0f} grants/s)",
                "(the ceiling in order)",
                "-",
            )
        )
    floor, n = g.get("fifo_floor_limit"), g.get("floor_batons")
    if floor and f"ours, LIMIT {n}" in g["rows"]:
        rows.append(
            (
                f"3 (bound) LIMIT {n} / FIFO hand-over floor ({n} batons)",
                f"{g['rows'][f'ours, LIMIT {n}']['grants_per_s'] / floor:.2f} x ({floor:,.0f} grants/s)",
                "(the ceiling in order)",
                "-",
            )
        )
    paired = g.get("paired", {}).get("peers", {}).values()
    for name, row in g["rows"].items():
        if row["peer"]:
            continue
        # Over every run of ours: the single one and those beside the peers.
        mine = [p for p in paired if p["mine"] == name]
        above = row["above_limit"] + sum(p["above_limit"] for p in mine)
        more = f" ({1 + len(mine) * g['paired']['pairs']} runs)" if mine else ""
        rows.append((f"3 {name}: moments above LIMIT", f"{above}{more}", "0", _goal(above == 0)))
        if row.get("server_out_of_order") is not None:
            out = max([row["server_out_of_order"], *(p["server_out_of_order"] for p in mine)])
            most = max([row["server_max_overtaken"], *(p["server_max_overtaken"] for p in mine)])
            rows.append(
                (
                    f"3 {name}: grants out of queue order (server's tokens and tickets)",
                    f"{out * 100:.2f} % (max {most} overtaken){more}",
                    "0",
                    _goal(out == 0),
                )
            )
    return rows


def _versus_peers(g, waits=False):
    """Goal 3's rows of ours beside each peer: grants/s, and with ``waits`` the p99
    wait against redis-py Lock's (at most half).  From the adjacent pairs when
    the run measured them (the median of the per-pair ratios, the quartiles in
    brackets, then the single runs' figures), else from the single runs."""
    rows = []
    paired = g.get("paired", {})
    for name, row in g["rows"].items():
        if not row["peer"]:
            continue
        mine = g["rows"][row["peer"]]
        single = f"{mine['grants_per_s']:,.0f} vs {row['grants_per_s']:,.0f} grants/s"
        pair = paired.get("peers", {}).get(name)
        if pair:
            q1, x, q3 = quartiles(pair["grants"])
            measured = f"{x:.2f} x ({q1:.2f}..{q3:.2f}, {_pairs(paired['pairs'])}); one run {single}"
            rows.append((f"3 {row['peer']} vs {name}", measured, ">= 1.00 x (peer)", _goal(x >= 1.0)))
        else:
            ok = mine["grants_per_s"] >= row["grants_per_s"]
            rows.append((f"3 {row['peer']} vs {name}", single, ">= peer", _goal(ok)))
        if not (waits and name.startswith("redis-py Lock")):
            continue
        single = f"{mine['wait_p99_ms']:.1f} vs {row['wait_p99_ms']:.1f} ms"
        if pair:
            q1, x, q3 = quartiles(pair["wait_p99"])
            measured = f"{x:.2f} x ({q1:.2f}..{q3:.2f}, {_pairs(paired['pairs'])}); one run {single}"
            rows.append(
                (f"3 {row['peer']}: p99 wait vs {name}", measured, "<= 0.50 x (half)", _goal(x <= 0.5))
            )
        else:
            half = row["wait_p99_ms"] / 2
            ok = mine["wait_p99_ms"] <= half
            rows.append(
                (f"3 {row['peer']}: p99 wait vs {name}", single, f"<= {half:.1f} ms (half)", _goal(ok))
            )
    return rows


def goals(r):
    """The goals block: (goal, measured, target, met) rows, one per figure of issue 15."""
    rows = []
    cyc = r["cycles"]
    ours = cyc["algorithms"]["lua"][min(cyc["algorithms"]["lua"])]
    t = GOALS["cycle_vs_floor"]
    rows.append(
        (
            "1 cycle / PING-pair floor",
            f"{ours['vs_floor']:.2f} x ({ours['rate']:,.0f}/s)",
            f">= {t} x",
            _goal(ours["vs_floor"] >= t),
        )
    )
    for peer, row in cyc["peers"].items():
        rows.append(
            (
                f"1 ahead of {peer}",
                f"{ours['vs_floor']:.2f} vs {row['vs_floor']:.2f} x floor",
                "ours higher",
                _goal(ours["vs_floor"] > row["vs_floor"]),
            )
        )
    node = cyc.get("node")
    if node and "skipped" not in node:
        name, best = max(node["peers"].items(), key=lambda item: item[1]["vs_floor"])
        rows.append(
            (
                f"1 ahead of redis-semaphore ({name})",
                f"{ours['vs_floor']:.2f} vs {best['vs_floor']:.2f} x own floor",
                "ours higher",
                _goal(ours["vs_floor"] > best["vs_floor"]),
            )
        )
    elif node:
        rows.append(("1 ahead of redis-semaphore", f"skipped: {node['skipped']}", "ours higher", "-"))
    if "cpu" in r:
        c = r["cpu"]
        rows.extend(_server_cpu_goals(c, "2", GOALS["server_cpu_vs_seed"]))
        t = GOALS["server_cpu_flat"]
        counts = c["holder_counts"]
        rows.append(
            (
                f"2 server CPU flat, {counts[-1]:,} / {counts[0]:,} holders",
                f"{c['server_flat']:.2f} x",
                f"<= {t} x",
                _goal(c["server_flat"] <= t),
            )
        )
        rows.append(_client_cpu_goal(c, "2 client CPU above floor", GOALS["client_cpu_vs_seed"]))
    if "contention_goal" in r:
        g = r["contention_goal"]
        rows.extend(_versus_peers(g))
        for name, row in g["rows"].items():
            if row["peer"]:
                continue
            rows.append(
                (
                    f"3 {name}: moments above LIMIT",
                    str(row["above_limit"]),
                    "0",
                    _goal(row["above_limit"] == 0),
                )
            )
            t = GOALS["fifo_out_of_order"]
            rows.append(
                (
                    f"3 {name}: FIFO (grants out of order)",
                    f"{row['out_of_order'] * 100:.2f} %",
                    f"<= {t * 100:g} % (by > {g['margin'] * 1000:g} ms)",
                    _goal(row["out_of_order"] <= t),
                )
            )
    t = GOALS["guarded_vs_plain"]
    for server, web in r.get("web", {}).items():
        rows.append(
            (f"4 guarded / plain, {server}", f"{web['ratio']:.2f} x", f">= {t} x", _goal(web["ratio"] >= t))
        )
        if "pinged_ratio" in web:
            rows.append(
                (
                    f"4 (bound) 2 PING, no guard / plain, {server}",
                    f"{web['pinged_ratio']:.2f} x",
                    "(the floor)",
                    "-",
                )
            )
    if "memory" in r:
        m = r["memory"]
        t = GOALS["memory_vs_baseline"]
        rows.append(
            (
                f"5 used_memory {m['waited_s']} s after {m['partitions']:,} abandoned",
                f"{m['final_vs_baseline']:.3f} x baseline",
                f"<= {t} x",
                _goal(m["final_vs_baseline"] <= t),
            )
        )
    for name, value, target, ok in _generic_figures(r.get("adaptive") or {}):
        rows.append((f"adaptive: {name}", value, target, _goal(ok)))
    return rows
