#!/usr/bin/env python3
"""The fleet benchmark over many seeds: every headline table of fleet.md with intervals.

Each seed replays its own window of each trace with its own token contents, and its own draws of
the synthetic workloads, so an interval over seeds covers workloads as well as router randomness.
Reads one `results.csv` per seed (a directory pattern with `{seed}`), each holding every arm of
one run (`kinference-fleet --suite full --seed N`), and prints markdown:

- Kinference (16 sidecars) against the best central peer per cell, metric by metric (the peer
  with the lowest mean over the seeds at p90, at p99, at the top-decile p99): the geometric mean
  over seeds of peer / Kinference, with 95 % t-intervals, and the worst seed against that seed's
  best peer at p90;
- Kinference / oracle at p90, per cell;
- the mesh: p90 and MAPE at 1, 4, 16 and 64 sidecars, beside the oracle;
- MAPE with the measured priors and with the true ones, and the oracle's (the model's form alone);
- the `/load` ablation: without / with, per strategy and workload;
- goodput at each workload's SLO, per arm: the median over seeds and the range;
- the two-model mix: p90, the never-eligible prompts' p90, the moved share and the cost per
  1,000 requests, per load and arm.

Usage (what `just fleet-seeds` runs):

    python3 scripts/fleet_seeds.py --runs 'OUT/s{seed}' --seeds 1-12

`--extra LABEL=PATTERN:ARM` adds the arm ARM of other runs (a directory pattern with `{seed}`) as
an arm named LABEL, e.g. Kinference restricted to the requested model by
`--kinference-set substitute_margin=1e12`:

    python3 scripts/fleet_seeds.py --runs 'OUT/s{seed}' --seeds 1-12 \
        --extra 'kinference-requested-only=RO/s{seed}:kinference'
"""
import argparse
import csv
import math
import statistics

ORDER = ["shared-prefix", "mooncake", "azure", "multi-turn", "two-model"]
# Two-sided 95 % Student t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}
# p90 TTFT SLOs in ms (`WorkloadKind::slo_ttft_p90_s`).
SLO_MS = {"shared-prefix": 2000, "mooncake": 6000, "azure": 2000, "multi-turn": 2000, "two-model": 2000}
MESH = ["kinference@1", "kinference@4", "kinference", "kinference@64"]
KIN = "kinference"


def seeds_of(text):
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def is_peer(label):
    return "@" not in label and ":" not in label and label not in (KIN, "oracle") \
        and not label.startswith("kinference")


def load(path):
    rows = {}
    for r in csv.DictReader(open(f"{path}/results.csv")):
        rows[(r["workload"], float(r["load_rps"]), r["strategy"])] = r
    return rows


def f(row, col):
    v = row.get(col, "")
    return float(v) if v not in ("", None) else None


def interval(values):
    """Geometric mean of positive ratios and its 95 % t-interval (on the logs)."""
    logs = [math.log(v) for v in values if v and v > 0]
    if not logs:
        return float("nan"), float("nan"), float("nan")
    m = statistics.mean(logs)
    half = T95.get(len(logs) - 1, 1.96) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0.0
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def mean_ci(values):
    values = [v for v in values if v is not None]
    if not values:
        return float("nan"), float("nan")
    m = statistics.mean(values)
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return m, half


def fmt_ratio(g):
    return f"{g[0]:.2f}× [{g[1]:.2f}, {g[2]:.2f}]" if math.isfinite(g[0]) else ""


def fmt_pct(m):
    return f"{100 * m[0]:.1f} ± {100 * m[1]:.1f}%" if math.isfinite(m[0]) else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True, help="directory pattern with {seed}")
    ap.add_argument("--seeds", required=True, help="e.g. 1-12 or 1,2,5-8")
    ap.add_argument("--extra", action="append", default=[], help="LABEL=PATTERN:ARM, repeatable")
    a = ap.parse_args()
    seeds = seeds_of(a.seeds)
    runs = {s: load(a.runs.format(seed=s)) for s in seeds}
    extras = []
    for e in a.extra:
        label, _, rest = e.partition("=")
        pattern, _, arm = rest.rpartition(":")
        extras.append(label)
        for s in seeds:
            for (w, l, n), r in load(pattern.format(seed=s)).items():
                if n == arm:
                    runs[s][(w, l, label)] = dict(r, strategy=label)
    first = runs[seeds[0]]
    cells = sorted({(w, l) for (w, l, _) in first}, key=lambda c: (ORDER.index(c[0]) if c[0] in ORDER else 99, c[1]))
    labels = list(dict.fromkeys(n for (_, _, n) in first))
    first = runs[seeds[0]]
    peers = [n for n in labels if is_peer(n)]

    def get(s, w, l, n, col):
        r = runs[s].get((w, l, n))
        return f(r, col) if r else None

    def have(w, l, n):
        return all((w, l, n) in runs[s] for s in seeds)

    print(f"Seeds {a.seeds} ({len(seeds)} workload windows each).\n")

    # Kinference against the best peer.
    print("#### Kinference (16 sidecars) against the best central peer, over seeds\n")
    print("Geometric mean over seeds of peer / Kinference (above 1: Kinference is lower) with its 95 % interval; "
          "`worst` is the lowest single seed against that seed's best peer at p90.\n")
    print("| workload | load | best peer (lowest mean p90) | its p90 (ms) | K p90 (ms) | p90 ratio | p99 ratio | "
          "top-decile p99 ratio | worst seed | K / oracle p90 |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    per_seed, summary = [], []
    for w, l in cells:
        if not have(w, l, KIN):
            continue
        ps = [p for p in peers if have(w, l, p)]
        best = min(ps, key=lambda p: statistics.mean(get(s, w, l, p, "ttft_p90_ms") for s in seeds))
        # Each metric against the peer best at it (lowest mean over the seeds).
        def ratio(col):
            p = min(ps, key=lambda q: statistics.mean(get(s, w, l, q, col) for s in seeds))
            return [get(s, w, l, p, col) / max(get(s, w, l, KIN, col), 1e-9) for s in seeds]
        worst = [min(get(s, w, l, p, "ttft_p90_ms") for p in ps) / get(s, w, l, KIN, "ttft_p90_ms") for s in seeds]
        per_seed.extend(worst)
        g90 = interval(ratio("ttft_p90_ms"))
        g99 = interval(ratio("ttft_p99_ms"))
        gtop = interval(ratio("top_decile_p99_ms"))
        summary.append((w, l, g90, g99, gtop))
        oracle = interval([get(s, w, l, KIN, "ttft_p90_ms") / get(s, w, l, "oracle", "ttft_p90_ms")
                           for s in seeds]) if have(w, l, "oracle") else (float("nan"),) * 3
        print(f"| {w} | {l:g} | {best} | {statistics.mean(get(s, w, l, best, 'ttft_p90_ms') for s in seeds):.0f} | "
              f"{statistics.mean(get(s, w, l, KIN, 'ttft_p90_ms') for s in seeds):.0f} | {fmt_ratio(g90)} | "
              f"{fmt_ratio(g99)} | {fmt_ratio(gtop)} | "
              f"{min(worst):.2f}× | {fmt_ratio(oracle)} |")
    if per_seed:
        gm = math.exp(statistics.mean(map(math.log, per_seed)))
        print(f"\nAgainst the best peer of each seed: geometric mean {gm:.3f}, worst {min(per_seed):.2f}, below 0.95 "
              f"in {sum(r < 0.95 for r in per_seed)} of {len(per_seed)} cell-seeds. Of {len(summary)} cells, geometric "
              f"mean below 0.95 (interval wholly below): at p90 {sum(x[2][0] < 0.95 for x in summary)} "
              f"({sum(x[2][2] < 0.95 for x in summary)}), at p99 {sum(x[3][0] < 0.95 for x in summary)} "
              f"({sum(x[3][2] < 0.95 for x in summary)}), at the top-decile p99 {sum(x[4][0] < 0.95 for x in summary)} "
              f"({sum(x[4][2] < 0.95 for x in summary)}); p90 interval wholly above 1.2: "
              f"{sum(x[2][1] > 1.2 for x in summary)}.\n")

    # The mesh.
    mesh = [m for m in MESH if m in labels]
    if len(mesh) > 1:
        print("#### The mesh over seeds: p90 (ms, mean) and MAPE (mean ± 95 % half-width) per sidecar count\n")
        print("| workload | load | " + " | ".join(f"p90 {m}" for m in mesh) + " | p90 oracle | "
              + " | ".join(f"MAPE {m}" for m in mesh) + " | MAPE kinference:true-prior | MAPE oracle |")
        print("|---|---:|" + "---:|" * (2 * len(mesh) + 3))
        for w, l in cells:
            if not all(have(w, l, m) for m in mesh):
                continue
            p90 = [f"{statistics.mean(get(s, w, l, m, 'ttft_p90_ms') for s in seeds):.0f}" for m in mesh]
            orc = f"{statistics.mean(get(s, w, l, 'oracle', 'ttft_p90_ms') for s in seeds):.0f}" if have(w, l, "oracle") else ""
            mp = [fmt_pct(mean_ci([get(s, w, l, m, "prediction_mape") for s in seeds])) for m in mesh]
            tp = fmt_pct(mean_ci([get(s, w, l, "kinference:true-prior", "prediction_mape") for s in seeds])) \
                if have(w, l, "kinference:true-prior") else ""
            om = fmt_pct(mean_ci([get(s, w, l, "oracle", "prediction_mape") for s in seeds])) if have(w, l, "oracle") else ""
            print(f"| {w} | {l:g} | " + " | ".join(p90) + f" | {orc} | " + " | ".join(mp) + f" | {tp} | {om} |")
        print()

    # /load.
    ablated = [n for n in labels if n.endswith(":no-load") and "@" not in n]
    if ablated:
        print("#### `GET /load` over seeds: p90 without / with, geometric mean over loads and seeds [95 % interval]\n")
        print("| strategy | " + " | ".join(w for w in ORDER if any(c[0] == w for c in cells)) + " |")
        print("|---|" + "---:|" * len({c[0] for c in cells}))
        for n in ablated:
            base = n[: -len(":no-load")]
            row = []
            for w in ORDER:
                ls = [l for (x, l) in cells if x == w and have(x, l, n) and have(x, l, base)]
                vals = [get(s, w, l, n, "ttft_p90_ms") / get(s, w, l, base, "ttft_p90_ms") for l in ls for s in seeds]
                row.append(fmt_ratio(interval(vals)) if vals else "")
            print(f"| {base} | " + " | ".join(row) + " |")
        print()

    # Goodput at the SLO.
    print("#### Goodput at the SLO over seeds: the highest load meeting p90 ≤ SLO\n")
    print("Median over seeds [min, max]; 0: no load of the sweep met it in that seed; `<`: in no seed. "
          "A value at the sweep's top load may be an underestimate.\n")
    ws = [w for w in ORDER if any(c[0] == w for c in cells)]
    print("| arm | " + " | ".join(f"{w} (≤ {SLO_MS[w]} ms)" for w in ws) + " |")
    print("|---|" + "---:|" * len(ws))
    # Kinference's other variants (e.g. a requested-only strategy) as they come, after the mesh.
    variants = [n for n in labels if n.startswith("kinference") and n not in MESH and n not in extras
                and "@" not in n and ":" not in n]
    shown = peers + [m for m in MESH if m in labels] + variants + extras \
        + [n for n in ("kinference:true-prior", "oracle") if n in labels]
    for n in shown:
        row = []
        for w in ws:
            if not any(have(x, l, n) for (x, l) in cells if x == w):
                row.append("")
                continue
            per = []
            for s in seeds:
                ok = [l for (x, l) in cells if x == w and (get(s, w, l, n, "ttft_p90_ms") or math.inf) <= SLO_MS[w]]
                per.append(max(ok) if ok else 0.0)
            lo, hi = min(per), max(per)
            med = statistics.median(per)
            row.append("<" if hi == 0 else f"{med:g} [{lo:g}, {hi:g}]")
        print(f"| {n} | " + " | ".join(row) + " |")
    print()

    # The two-model mix.
    tm = [(w, l) for (w, l) in cells if w == "two-model"]
    if tm:
        print("#### Two-model over seeds: means of p90, never-eligible p90, moved share and cost per 1,000 requests\n")
        print("| load | arm | p90 (ms) | never-eligible p90 (ms) | moved share | cost / 1k req |")
        print("|---:|---|---:|---:|---:|---:|")
        for w, l in tm:
            ps = [p for p in peers if have(w, l, p)]
            best = min(ps, key=lambda p: statistics.mean(get(s, w, l, p, "ttft_p90_ms") for s in seeds))
            for n in [best, *variants, *extras, KIN, "kinference@1", "oracle"]:
                if not have(w, l, n):
                    continue
                m = lambda col: mean_ci([get(s, w, l, n, col) for s in seeds])
                p90, nev, mv, cost = m("ttft_p90_ms"), m("never_eligible_p90_ms"), m("moved_share"), m("cost_per_1k_usd")
                print(f"| {l:g} | {n} | {p90[0]:.0f} ± {p90[1]:.0f} | {nev[0]:.0f} ± {nev[1]:.0f} | "
                      f"{fmt_pct(mv)} | ${cost[0]:.3f} ± {cost[1]:.3f} |")
        print()


if __name__ == "__main__":
    main()
