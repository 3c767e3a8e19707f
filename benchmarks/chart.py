"""The charts of a run: docs/images/bench-cycles.png and docs/images/bench-cpu.png.

bench-cycles.png: cycle rate per algorithm and holder count against the
PING-pair floor.  Bars are each contender's rate as a fraction of the floor
measured right before it (median over rounds), the figure the table's ratios
give (the node peer's against its own ioredis floor); the right-hand axis
reads the same bars in cycles/s at the run's median floor.

bench-cpu.png: Redis server CPU and client CPU per acquire+release cycle above
the PING pair's, ours beside the seed and the peers (benchmarks/cpu.py).
"""


def draw(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cycles = results["cycles"]
    floor = cycles["floor"]
    algorithms = list(cycles["algorithms"])
    counts = list(next(iter(cycles["algorithms"].values())))
    extras = [(name + "\n(one slot)", row["vs_floor"]) for name, row in cycles["peers"].items()]
    extras.insert(0, ("EVALSHA no-op\npair", cycles["script floor"]["vs_floor"]))
    extras.insert(1, ("lua scripts,\nno Python layer", cycles["raw scripts"]["vs_floor"]))
    node = cycles.get("node") or {}
    for name, row in node.get("peers", {}).items():  # against its own (ioredis) floor
        extras.append((f"redis-semaphore\n(node) {name.split(', ')[-1]}", row["vs_floor"]))
    fig, ax = plt.subplots(figsize=(11, 5), dpi=110)
    width = 0.8 / len(counts)
    colours = ["#1f6feb", "#54aeff", "#8cc8ff", "#c6e2ff"]
    for i, count in enumerate(counts):
        xs = [a + (i - (len(counts) - 1) / 2) * width for a in range(len(algorithms))]
        ys = [cycles["algorithms"][a][count]["vs_floor"] for a in algorithms]
        label = "empty" if count == 0 else f"{count:,} holders"
        ax.bar(xs, ys, width, label=label, color=colours[i % len(colours)])
    for j, (_, value) in enumerate(extras):
        ax.bar([len(algorithms) + j], [value], 0.3, color="#999999")
    ax.axhline(
        1.0, color="#cf222e", linestyle="--", linewidth=1.5, label=f"floor: PING pairs ({floor:,.0f}/s)"
    )
    ax.axhline(0.85, color="#cf222e", linestyle=":", linewidth=1, label="0.85 x floor (target for lua)")
    ax.set_xticks(range(len(algorithms) + len(extras)))
    ax.set_xticklabels(algorithms + [label for label, _ in extras], fontsize=7)
    ax.set_ylabel("acquire + release cycles, x the PING-pair floor")
    ax.set_ylim(0, 1.1)
    right = ax.secondary_yaxis("right", functions=(lambda y: y * floor, lambda c: c / floor))
    right.set_ylabel("cycles / s at the median floor")
    ax.set_title(
        f"django-semaphore: cycle rate against the floor, medians of {cycles['rounds']} interleaved rounds\n"
        f"{results['machine']['summary']}",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def draw_cpu(results, path):
    """bench-cpu.png: server and client usec per cycle above the PING pair's, ours vs seed vs peers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import GOALS

    c = results["cpu"]
    rows = {name: row for name, row in c["rows"].items() if name != "PING pair"}
    labels = [
        f"{name[0]}\n{name[1]:,} other\nholder{'s' if name[1] != 1 else ''}"
        if isinstance(name, tuple)
        else name.replace(", ", "\n").replace("signal receivers", "signal\nreceivers")
        for name in rows
    ]

    def colour_of(name):
        if isinstance(name, tuple):
            return "#1f6feb" if name[0] == "ours" else "#bf8700"
        return "#8cc8ff" if name.startswith("ours") else "#999999"

    colour = [colour_of(name) for name in rows]
    server = [row["server_above_ping"] for row in rows.values()]
    client = [row["client_above_ping"] for row in rows.values()]
    node = c.get("node") or {}
    if "above_ping_usec" in node:
        labels.append(f"redis-\nsemaphore\n(node)\nLIMIT {node['limit']}")
        server.append(node["above_ping_usec"])
        client.append(float("nan"))
        colour.append("#999999")
    fig, axes = plt.subplots(2, 1, figsize=(11, 8), dpi=110, sharex=True)
    xs = range(len(labels))
    for ax, values, what in (
        (axes[0], server, "Redis server CPU (INFO cpu)"),
        (axes[1], client, "client CPU (process_time, this process)"),
    ):
        ax.bar(xs, values, 0.6, color=colour)
        for x, v in zip(xs, values, strict=True):
            if v == v:
                ax.annotate(f"{v:.1f}", (x, v), ha="center", va="bottom", fontsize=7)
        ax.set_ylabel("usec per cycle\nabove a PING pair", fontsize=8)
        ax.set_title(what, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    seed = next((r for n, r in rows.items() if isinstance(n, tuple) and n[0] == "seed"), None)
    if seed is not None:  # the goals' lines: a multiple of the seed's cost (fewest holders)
        for ax, measure, goal, label in (
            (axes[0], "server_above_ping", "server_cpu_vs_seed", "x the seed, fewest holders"),
            (axes[1], "client_above_ping", "client_cpu_vs_seed", "x the seed"),
        ):
            t = GOALS[goal]
            ax.axhline(t * seed[measure], color="#cf222e", linestyle=":", linewidth=1, label=f"{t} {label}")
            ax.legend(fontsize=8)
    axes[1].set_xticks(list(xs))
    axes[1].set_xticklabels(labels, fontsize=7)
    fig.suptitle(
        f"django-semaphore: CPU per acquire+release cycle above its two round trips, medians of "
        f"{c['rounds']} rounds of {c['cycles']} cycles\n{results['machine']['summary']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
