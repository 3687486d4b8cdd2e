#!/usr/bin/env python3
"""Plot the simulated engine's curves from `sim-curves` CSV into PNGs.

Usage:
    cargo run -p kinference-sim --bin sim-curves > docs/benchmarks/sim-engine/curves.csv
    python3 scripts/plot_sim_curves.py docs/benchmarks/sim-engine/curves.csv docs/benchmarks/sim-engine

Writes idle_ttft.png (TTFT vs prompt length on an idle engine) and closed_loop.png (output
tokens/s and mean TTFT vs concurrency), one line per profile.
"""

import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    rows = defaultdict(lambda: defaultdict(list))
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows[r["curve"]][r["profile"]].append(r)
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for profile, rs in sorted(rows["idle_ttft"].items()):
        ax.plot([int(r["x"]) for r in rs], [float(r["ttft_s"]) for r in rs], marker="o", label=profile)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens (no cache hit)")
    ax.set_ylabel("TTFT on an idle engine (s)")
    ax.set_title("Simulated TTFT vs prompt length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "idle_ttft.png", dpi=120)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for profile, rs in sorted(rows["closed_loop"].items()):
        x = [int(r["x"]) for r in rs]
        ax1.plot(x, [float(r["output_tokens_per_s"]) for r in rs], marker="o", label=profile)
        ax2.plot(x, [float(r["ttft_s"]) for r in rs], marker="o", label=profile)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    ax1.set_ylabel("output tokens/s")
    ax1.set_title("Throughput, ~2,000 in / ~200 out")
    ax2.set_yscale("log")
    ax2.set_ylabel("mean TTFT (s)")
    ax2.set_title("Mean TTFT, ~2,000 in / ~200 out")
    fig.tight_layout()
    fig.savefig(out / "closed_loop.png", dpi=120)


if __name__ == "__main__":
    main()
