#!/usr/bin/env python3
"""Plots the fleet benchmark.

- ttft_p90.png, ttft_p99.png: p90 and p99 TTFT against offered load, one panel per workload, one
  line per system as deployed (the peers central, Kinference as its 16-sidecar mesh) and the
  oracle (dashed); ablation arms (`@N`, `:no-load`, `:true-prior`) are left out;
- mesh.png: Kinference's p90 TTFT and MAPE against load at each number of sidecars, with the
  oracle's p90, one column of panels per workload.

Usage: python3 scripts/plot_fleet.py [docs/benchmarks/fleet/results.csv] [docs/benchmarks/fleet]
"""
import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def as_deployed(label: str) -> bool:
    return "@" not in label and ":" not in label


def series(rows, workload, label, col):
    pts = [(float(r["load_rps"]), r[col]) for r in rows if r["workload"] == workload and r["strategy"] == label]
    return sorted((x, float(y)) for x, y in pts if y not in ("", None))


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks/fleet/results.csv")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else src.parent)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(csv.DictReader(src.open()))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    labels = [s for s in dict.fromkeys(r["strategy"] for r in rows) if as_deployed(s)]
    for col, name in (("ttft_p90_ms", "p90"), ("ttft_p99_ms", "p99")):
        fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4.2), squeeze=False)
        for ax, w in zip(axes[0], workloads):
            for s in labels:
                pts = series(rows, w, s, col)
                if not pts:
                    continue
                style = dict(linewidth=1.2)
                if s == "kinference":
                    style = dict(linewidth=2.5, color="black")
                elif s == "oracle":
                    style = dict(linewidth=1.5, color="grey", linestyle="--")
                ax.plot([p[0] for p in pts], [p[1] / 1000.0 for p in pts], marker="o", markersize=3, label=s, **style)
            ax.set_title(w)
            ax.set_xlabel("offered load (req/s; sessions/s for multi-turn)")
            ax.set_ylabel(f"{name} TTFT (s)")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7, loc="upper left")
        fig.suptitle(f"{name} time to first token against load: peers central, Kinference as 16 sidecars, the oracle")
        fig.tight_layout()
        fig.savefig(out / f"ttft_{name}.png", dpi=110)
        plt.close(fig)

    mesh = defaultdict(str)
    for r in rows:
        if r["kind"] == "kinference" and ":" not in r["strategy"]:
            mesh[int(r["instances"])] = r["strategy"]
    if len(mesh) > 1:
        fig, axes = plt.subplots(2, len(workloads), figsize=(5 * len(workloads), 7.5), squeeze=False)
        for i, w in enumerate(workloads):
            for n in sorted(mesh):
                p90 = series(rows, w, mesh[n], "ttft_p90_ms")
                mape = series(rows, w, mesh[n], "prediction_mape")
                axes[0][i].plot([p[0] for p in p90], [p[1] / 1000.0 for p in p90], marker="o", markersize=3, label=f"{n} sidecars")
                axes[1][i].plot([p[0] for p in mape], [100 * p[1] for p in mape], marker="o", markersize=3, label=f"{n} sidecars")
            oracle = series(rows, w, "oracle", "ttft_p90_ms")
            if oracle:
                axes[0][i].plot([p[0] for p in oracle], [p[1] / 1000.0 for p in oracle], color="grey", linestyle="--", label="oracle")
            axes[0][i].set_title(w)
            axes[0][i].set_yscale("log")
            axes[0][i].set_ylabel("p90 TTFT (s)")
            axes[1][i].set_ylabel("MAPE (%)")
            axes[1][i].set_xlabel("offered load")
            for ax in (axes[0][i], axes[1][i]):
                ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7, loc="upper left")
        fig.suptitle("Kinference's mesh: p90 TTFT and prediction error against the number of sidecars")
        fig.tight_layout()
        fig.savefig(out / "mesh.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()
