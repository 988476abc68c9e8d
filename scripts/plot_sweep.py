#!/usr/bin/python3
"""Plots a `spillway sweep` CSV: time / lower bound against GPU capacity (fraction of the
trace's peak footprint), one line per policy, one panel per trace.

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
        print("plot_sweep.py: python3-matplotlib is not installed (apt-get install python3-matplotlib)", file=sys.stderr)
        return 1
    series = defaultdict(lambda: defaultdict(list))  # trace -> policy -> [(frac, ratio)]
    links = set()
    with open(src, newline="") as f:
        for row in csv.DictReader(f):
            ratio = int(row["time_ns"]) / max(1, int(row["bound_ns"]))
            # One line per policy and allocator view (the view is named when it is not `none`).
            view = row.get("allocator", "none")
            label = row["policy"] if view == "none" else f'{row["policy"]} ({view})'
            series[row["trace"]][label].append((float(row["capacity_frac"]), ratio))
            links.add(row["link"])
    if not series:
        print(f"plot_sweep.py: {src}: no rows", file=sys.stderr)
        return 1
    traces = sorted(series)
    cols = min(3, len(traces))
    rows = (len(traces) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(traces):]:
        ax.set_visible(False)
    for ax, trace in zip(flat, traces):
        for policy, points in series[trace].items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=policy)
        ax.set_title(trace)
        ax.set_xlabel("GPU capacity / peak footprint")
        ax.set_ylabel("time / lower bound")
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ratios = [r for pts in series[trace].values() for _, r in pts]
        if max(ratios) > 10 * min(ratios):
            ax.set_yscale("log")
        ax.invert_xaxis()  # less memory to the right
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"Spillway sweep ({', '.join(sorted(links))})")
    fig.tight_layout()
    fig.savefig(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
