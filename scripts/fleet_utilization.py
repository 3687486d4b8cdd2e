#!/usr/bin/env python3
"""Kinference's prediction error against how loaded the fleet is, over many seeds.

"Moderate load" needs a measure that means the same on every workload; the suite's loads are
requests per second on fleets of different sizes and models. Utilisation here is the offered
output rate over the fleet's capacity:

- capacity: the most output tokens per second Kinference's fleet of that workload sustains, over
  the suite's loads and a run past saturation (`--overload`, cells at loads well beyond the
  suite's, where throughput stops growing);
- offered: the load times the output tokens per request, measured at the workload's lightest
  load (where every request is served as it arrives).

Multi-turn's load is sessions per second and its throughput is bounded by the sessions' think
times, not by the engines, so it has no utilisation here.

Usage (the overload run takes about a minute):

    ./target/release/kinference-fleet --suite full --arms kinference \\
        --workloads shared-prefix,mooncake,azure,two-model --loads 5,6,8,10,12,16,24,40,60,80 \\
        --out /tmp/overload
    python3 scripts/fleet_utilization.py --kinference 'OUT/s{seed}' --seeds 1-12 \\
        --overload /tmp/overload [--arm kinference@1]
"""
import argparse
import csv
import statistics

from fleet_seeds import ORDER, seeds_of


def kinference_rows(path, arm="kinference"):
    return [r for r in csv.DictReader(open(f"{path}/results.csv")) if r["strategy"] == arm]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinference", required=True, help="directory pattern with {seed}")
    ap.add_argument("--seeds", required=True, help="e.g. 1-12")
    ap.add_argument("--overload", required=True, help="a results directory past saturation")
    ap.add_argument("--arm", default="kinference", help="the arm whose error is shown (e.g. kinference@1)")
    a = ap.parse_args()
    seeds = seeds_of(a.seeds)

    cells = {}
    capacity = {}
    for s in seeds:
        for r in kinference_rows(a.kinference.format(seed=s), a.arm):
            key = (r["workload"], float(r["load_rps"]))
            cells.setdefault(key, []).append(r)
            capacity[r["workload"]] = max(capacity.get(r["workload"], 0.0),
                                          float(r["output_tokens_per_s"]))
    for r in kinference_rows(a.overload):
        capacity[r["workload"]] = max(capacity.get(r["workload"], 0.0),
                                      float(r["output_tokens_per_s"]))

    print("| workload | load | utilisation | MAPE (mean over seeds) | MAPE of the ranked TTFT |")
    print("|---|---:|---:|---:|---:|")
    for w in ORDER:
        loads = sorted(l for (wl, l) in cells if wl == w)
        if not loads:
            continue
        lightest = cells[(w, loads[0])]
        per_request = statistics.mean(float(r["output_tokens_per_s"]) for r in lightest) / loads[0]
        for l in loads:
            rows = cells[(w, l)]
            mape = 100 * statistics.mean(float(r["prediction_mape"]) for r in rows)
            ranked = [float(r["ranked_mape"]) for r in rows if r.get("ranked_mape")]
            ranked_s = f"{100 * statistics.mean(ranked):.1f} %" if ranked else "-"
            rho = "-" if w == "multi-turn" else f"{l * per_request / capacity[w]:.2f}"
            print(f"| {w} | {l:g} | {rho} | {mape:.1f} % | {ranked_s} |")


if __name__ == "__main__":
    main()
