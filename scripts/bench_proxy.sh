#!/usr/bin/env bash
# The proxy overhead benchmark, in one run: the instant upstream directly, through nginx and
# through kinference-proxy, non-streaming and streaming, at a constant arrival rate; the proxy's
# memory idle and under load. Writes docs/benchmarks/proxy/results.{json,csv,md} and latency.png.
#
#   scripts/bench_proxy.sh                  # 3 rounds x 6 scenarios x (5 s warm-up + 20 s)
#   scripts/bench_proxy.sh --rounds 1 --duration-s 5   # a quick look
#
# Needs nginx on PATH (Debian: apt-get install -y nginx; only this benchmark uses it) and
# python3 with matplotlib for the plot. Extra flags go to `kinference-loadgen bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/benchmarks/proxy

command -v nginx >/dev/null || { echo "nginx not found: apt-get install -y nginx" >&2; exit 1; }
cargo build --release -p kinference-proxy --bin kinference-proxy
cargo build --release -p kinference-loadgen --bin kinference-loadgen
target=${CARGO_TARGET_DIR:-target}
# The controller only serves policy here; any debug build of it will do.
[ -x "$target/debug/kinference-policy-controller" ] ||
  cargo build -p kinference-policy-controller --bin kinference-policy-controller

"$target/release/kinference-loadgen" bench \
  --proxy-bin "$target/release/kinference-proxy" \
  --controller-bin "$target/debug/kinference-policy-controller" \
  --examples examples --out-dir "$out" \
  --rate-per-s 1000 --warmup-s 5 --duration-s 20 --rounds 3 "$@"

python3 - "$out" <<'PY'
"""Plots p50/p99 latency (median over rounds) per target and mode from results.json."""
import json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

out = sys.argv[1]
r = json.load(open(f"{out}/results.json"))
targets = ["direct", "nginx", "kinference-proxy"]
modes = ["non-stream", "stream"]
fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
for ax, mode in zip(axes, modes):
    rows = {t: [s["summary"] for s in r["scenarios"]
                if s["summary"]["target"] == t and s["summary"]["mode"] == mode] for t in targets}
    stats = [("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms")]
    width = 0.26
    for i, t in enumerate(targets):
        vals = [statistics.median(x["latency"][k] for x in rows[t]) for _, k in stats]
        xs = [j + (i - 1) * width for j in range(len(stats))]
        bars = ax.bar(xs, vals, width, label=t)
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(stats)), [s for s, _ in stats])
    ax.set_ylabel("latency from intended send, ms")
    rate = r["settings"]["rate_per_s"]
    ax.set_title(f"{mode}, {rate} req/s (median of {r['settings']['rounds']} rounds)")
    ax.legend(fontsize=8)
fig.suptitle(f"Added latency: direct vs nginx vs kinference-proxy, {r['machine']['cores']} shared cores")
fig.tight_layout()
fig.savefig(f"{out}/latency.png", dpi=110)
print(f"wrote {out}/latency.png")
PY
