#!/usr/bin/env python3
"""Kinference against the field over many seeds of the fleet benchmark.

Reads one `results.csv` per seed for the peers and one for Kinference (directories named by a
pattern with `{seed}`), and prints:

- per seed and cell, the ratio of the best peer's p90 TTFT *in that seed* to Kinference's (an
  order statistic: the luckiest of nine noisy peers), summarised as the geometric mean over all
  cell-seeds, the worst, and how many fall below 0.95;
- per cell, the best peer *strategy* (lowest mean p90 over the seeds) and Kinference's ratio to
  it: the geometric mean over seeds with a 95 % t-interval, and the worst single seed.

Usage (what `just fleet-seeds` runs):

    python3 scripts/fleet_seeds.py --peers 'OUT/peers-s{seed}' --kinference 'OUT/k-s{seed}' --seeds 1-12
"""
import argparse
import csv
import math
import statistics

ORDER = ["shared-prefix", "mooncake", "azure", "multi-turn", "two-model"]
# Two-sided 95 % Student t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}


def seeds_of(text):
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def p90s(path, keep):
    rows = {}
    for r in csv.DictReader(open(f"{path}/results.csv")):
        if keep(r["strategy"]):
            rows[(r["workload"], float(r["load_rps"]), r["strategy"])] = float(r["ttft_p90_ms"])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", required=True, help="directory pattern with {seed}")
    ap.add_argument("--kinference", required=True, help="directory pattern with {seed}")
    ap.add_argument("--seeds", required=True, help="e.g. 1-12 or 1,2,5-8")
    a = ap.parse_args()
    seeds = seeds_of(a.seeds)
    peers = {s: p90s(a.peers.format(seed=s), lambda n: n != "kinference") for s in seeds}
    kin = {s: p90s(a.kinference.format(seed=s), lambda n: n == "kinference") for s in seeds}
    cells = sorted({(w, l) for (w, l, _) in kin[seeds[0]]}, key=lambda c: (ORDER.index(c[0]), c[1]))
    names = sorted({n for (_, _, n) in peers[seeds[0]]})

    per_seed = []
    rows = []
    for w, l in cells:
        k = {s: kin[s][(w, l, "kinference")] for s in seeds}
        oracle = [min(peers[s][(w, l, n)] for n in names) / k[s] for s in seeds]
        per_seed.extend(oracle)
        best = min(names, key=lambda n: statistics.mean(peers[s][(w, l, n)] for s in seeds))
        logs = [math.log(peers[s][(w, l, best)] / k[s]) for s in seeds]
        mean = statistics.mean(logs)
        half = T95.get(len(seeds) - 1, 1.96) * statistics.stdev(logs) / math.sqrt(len(seeds)) if len(seeds) > 1 else 0.0
        rows.append((w, l, best, statistics.mean(peers[s][(w, l, best)] for s in seeds),
                     statistics.mean(k.values()), math.exp(mean), math.exp(mean - half),
                     math.exp(mean + half), min(oracle)))

    gm = math.exp(statistics.mean(map(math.log, per_seed)))
    print(f"Seeds {a.seeds}: against the best peer of each seed, geometric mean {gm:.3f}, worst "
          f"{min(per_seed):.2f}, below 0.95 in {sum(r < 0.95 for r in per_seed)} of {len(per_seed)} cell-seeds.")
    print()
    print("| workload | load | best peer (lowest mean p90) | its mean p90 (ms) | Kinference mean p90 (ms) "
          "| p90 ratio (geometric mean) | 95 % interval | worst seed vs that seed's best peer |")
    print("|---|---:|---|---:|---:|---:|---|---:|")
    for w, l, best, pm, km, g, lo, hi, worst in rows:
        print(f"| {w} | {l:g} | {best} | {pm:.0f} | {km:.0f} | {g:.2f}× | {lo:.2f}-{hi:.2f} | {worst:.2f}× |")
    print()
    below = sum(r[5] < 0.95 for r in rows)
    wholly = sum(r[7] < 0.95 for r in rows)
    print(f"Cells whose geometric-mean ratio is below 0.95: {below} of {len(rows)}; whose 95 % interval "
          f"lies wholly below 0.95: {wholly}; lowest {min(r[5] for r in rows):.2f}×.")


if __name__ == "__main__":
    main()
