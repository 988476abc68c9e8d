#!/usr/bin/python3
"""Plots a `spillway sweep` CSV against GPU capacity (fraction of the trace's peak
footprint), one line per policy, two panels per trace: above, how many times faster than
`demand` (plain unified memory: the CSV's speedup_vs_demand, when demand was swept); below,
time / lower bound.

    python3 scripts/plot_sweep.py SWEEP.csv OUT.png|OUT.svg|OUT.pdf

Needs python3-matplotlib (Debian). `spillway sweep --plot FILE` runs this script.
"""
import csv
import sys
from collections import defaultdict


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    src, out = argv[1], argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"plot_sweep.py: matplotlib is not installed for {sys.executable} (pip install 'spillway-cuda[plot]', "
              "or apt-get install python3-matplotlib for /usr/bin/python3)", file=sys.stderr)
        return 1
    series = defaultdict(lambda: defaultdict(list))  # trace -> policy -> [(frac, time / bound)]
    speedups = defaultdict(lambda: defaultdict(list))  # trace -> policy -> [(frac, x faster than demand)]
    with open(src, newline="") as f:
        table = list(csv.DictReader(f))
    links = {row["link"] for row in table}
    for row in table:
        ratio = int(row["time_ns"]) / max(1, int(row["bound_ns"]))
        # One line per policy, allocator view and link (the view is named when it is not
        # `none`, the link when the sweep had several).
        view = row.get("allocator", "none")
        extra = ([view] if view != "none" else []) + ([row["link"]] if len(links) > 1 else [])
        label = row["policy"] + (f' ({", ".join(extra)})' if extra else "")
        frac = float(row["capacity_frac"])
        series[row["trace"]][label].append((frac, ratio))
        if row.get("speedup_vs_demand"):
            speedups[row["trace"]][label].append((frac, float(row["speedup_vs_demand"])))
    if not series:
        print(f"plot_sweep.py: {src}: no rows", file=sys.stderr)
        return 1
    styles = {link: s for link, s in zip(sorted(links), ["-", "--", ":", "-."] * 4)}
    traces = sorted(series)
    cols = min(3, len(traces))
    rows = (len(traces) + cols - 1) // cols
    # Two rows of panels per row of traces: speed-up over demand above, time / bound below.
    fig, axes = plt.subplots(2 * rows, cols, figsize=(5.2 * cols, 7.6 * rows), squeeze=False)
    for i in range(len(traces), rows * cols):
        axes[2 * (i // cols)][i % cols].set_visible(False)
        axes[2 * (i // cols) + 1][i % cols].set_visible(False)
    for i, trace in enumerate(traces):
        top, bottom = axes[2 * (i // cols)][i % cols], axes[2 * (i // cols) + 1][i % cols]
        panel(top, speedups[trace], trace, "x faster than demand", False, styles)
        panel(bottom, series[trace], trace, "time / lower bound", True, styles)
    fig.suptitle("Spillway sweep (" + ", ".join(f"{link}: {styles[link]}" if len(links) > 1 else link for link in sorted(links)) + ")")
    fig.tight_layout()
    fig.savefig(out)
    return 0


def panel(ax, lines, trace, ylabel, log_if_wide, styles):
    """One panel: a line per policy against capacity, less memory to the right; one colour per
    policy (and view), one line style per link."""
    colours = {}
    for label, points in lines.items():
        points.sort()
        link = next((l for l in styles if label.endswith(l + ")") and len(styles) > 1), None)
        key = label.replace(f", {link})", ")").replace(f" ({link})", "") if link else label
        colours.setdefault(key, f"C{len(colours) % 10}")
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label, color=colours[key],
                linestyle=styles.get(link, "-"))
    ax.set_title(trace)
    ax.set_xlabel("GPU capacity / peak footprint")
    ax.set_ylabel(ylabel)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    values = [v for pts in lines.values() for _, v in pts]
    if not values:
        ax.text(0.5, 0.5, "demand not swept", ha="center", va="center", transform=ax.transAxes)
        return
    if log_if_wide and max(values) > 10 * min(values):
        ax.set_yscale("log")
    ax.invert_xaxis()
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", loc="best")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
