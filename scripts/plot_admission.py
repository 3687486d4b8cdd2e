#!/usr/bin/env python3
"""Plots the admission comparison (the fleet benchmark's `classes` workload).

- goodput.png: requests within their class's TTFT objective per second, against offered load;
- critical_p90.png: the Critical class's p90 TTFT against offered load, with its 1 s objective;
one line per arm (forwarding everything, and admission, in the 16-sidecar mesh and with one view).

Usage: python3 scripts/plot_admission.py [docs/benchmarks/admission/admission.csv] [docs/benchmarks/admission]
"""
import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks/admission/admission.csv")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks/admission")
    rows = [r for r in csv.DictReader(src.open()) if r["workload"] == "classes"]
    goodput = defaultdict(dict)
    critical = defaultdict(dict)
    for r in rows:
        load = float(r["load_rps"])
        goodput[r["strategy"]][load] = float(r["goodput_rps"])
        if r["group"] == "class" and r["name"] == "Critical":
            critical[r["strategy"]][load] = float(r["ttft_p90_ms"]) / 1e3
    for name, series, ylabel, slo in [
        ("goodput.png", goodput, "goodput (requests within SLO / s)", None),
        ("critical_p90.png", critical, "Critical p90 TTFT (s, log)", 1.0),
    ]:
        fig, ax = plt.subplots(figsize=(6, 4))
        for arm, pts in sorted(series.items()):
            xs = sorted(pts)
            style = "-" if "admission" in arm else "--"
            ax.plot(xs, [pts[x] for x in xs], style, marker="o", label=arm)
        if slo is not None:
            ax.axhline(slo, color="grey", linestyle=":", label="Critical SLO")
            ax.set_yscale("log")
        ax.set_xlabel("offered load (requests / s; saturation 32)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    main()
