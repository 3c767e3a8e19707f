"""docs/images/bench-cycles.png: cycle rate per algorithm and holder count against the PING-pair floor.

Bars are each contender's rate as a fraction of the floor measured right
before it (median over rounds), the figure the table's ratios give; the
right-hand axis reads the same bars in cycles/s at the run's median floor.
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
    fig, ax = plt.subplots(figsize=(10, 5), dpi=110)
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
    ax.axhline(0.9, color="#cf222e", linestyle=":", linewidth=1, label="0.9 x floor (target for lua)")
    ax.set_xticks(range(len(algorithms) + len(extras)))
    ax.set_xticklabels(algorithms + [label for label, _ in extras], fontsize=8)
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
