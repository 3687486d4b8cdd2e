#!/usr/bin/env python3
"""Plots the fleet benchmark: p90 and p99 TTFT against offered load, one panel per workload,
one line per strategy.

Usage: python3 scripts/plot_fleet.py [docs/benchmarks/fleet/results.csv] [docs/benchmarks/fleet]
Writes ttft_p90.png and ttft_p99.png into the output directory.
"""
import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks/fleet/results.csv")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else src.parent)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(csv.DictReader(src.open()))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    for col, name in (("ttft_p90_ms", "p90"), ("ttft_p99_ms", "p99")):
        fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4.2), squeeze=False)
        for ax, w in zip(axes[0], workloads):
            series = defaultdict(list)
            for r in rows:
                if r["workload"] == w:
                    series[r["strategy"]].append((float(r["load_rps"]), float(r[col]) / 1000.0))
            for s in strategies:
                pts = sorted(series.get(s, []))
                if not pts:
                    continue
                style = dict(linewidth=2.5, color="black") if s == "kinference" else dict(linewidth=1.2)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=s, **style)
            ax.set_title(w)
            ax.set_xlabel("offered load (req/s; sessions/s for multi-turn)")
            ax.set_ylabel(f"{name} TTFT (s)")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7, loc="upper left")
        fig.suptitle(f"{name} time to first token against load, per strategy")
        fig.tight_layout()
        fig.savefig(out / f"ttft_{name}.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()
