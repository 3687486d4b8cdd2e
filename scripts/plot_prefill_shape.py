#!/usr/bin/env python3
"""Plots scripts/gpu_prefill_shape.py's measurement: prefill time against new tokens, one line per
cached-context length, with the TTFT model's fitted form (a + u / rate + pair_s × (u·c + u²/2)).

Usage: python3 scripts/plot_prefill_shape.py docs/benchmarks/gpu-prefill/prefill_shape.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    data = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    fit = data["prefill_fit"]
    a, per_token, pair = fit["overhead_s"], fit["prefill_token_s"], fit["prefill_attention_pair_s"]
    by_cached = {}
    for r in data["prefill"]:
        by_cached.setdefault(r["cached"], []).append((r["new"], r["seconds"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c, pts in sorted(by_cached.items()):
        pts.sort()
        us = [u for u, _ in pts]
        line = ax.plot(us, [t * 1000 for _, t in pts], "o", label=f"{c:,} cached")[0]
        model = [(a + u * per_token + pair * (u * c + u * u / 2)) * 1000 for u in us]
        ax.plot(us, model, "-", color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("new (uncached) prompt tokens")
    ax.set_ylabel("prefill time, whole 64-layer model (ms)")
    ax.set_title(
        f"{data['device']}: dense 27B, BF16 — points measured, lines "
        f"{a * 1000:.0f} ms + u/{1 / per_token:,.0f} + {pair * 1e9:.2f} ns × (u·c + u²/2)",
        fontsize=8,
    )
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
