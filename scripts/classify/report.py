#!/usr/bin/env python3
"""Render the markdown tables of docs/benchmarks/classification-research.md from results.json.

    python3 scripts/classify/report.py docs/benchmarks/classification-research/results.json \
        > docs/benchmarks/classification-research/tables.md

evaluate.py calls this at the end of a run, so one evaluate.py command regenerates every table.
"""
import json
import sys


def pct(x, d=1):
    return "–" if x is None else f"{100 * x:.{d}f}%"


def f3(x):
    return "–" if x is None or x != x else f"{x:.3f}"


def f2(x):
    return "–" if x is None else f"{x:.2f}"


def lobo_table(r, name):
    d = r["designs"][name]
    out = [f"**{name}** — mean AUC {d['summary']['mean_auc']:.3f}; share@95 above the random p95 on "
           f"{d['summary']['families_beating_p95']}/{len(d['per_family'])} families; families with any `low`: "
           f"{d['summary']['families_with_low']}, of which weak >= 95% of strong there: "
           f"{d['summary']['families_low_ratio_ok']}" +
           (f"; pooled ECE {d['summary']['pooled_ece']:.3f}" if "pooled_ece" in d["summary"] else ""),
           "",
           "| held-out family | AUC | share@95 | random mean / p95 | `low` share (rows) | weak / strong on `low` | weak overall | `high` share | weak/strong on `high` |",
           "|---|---|---|---|---|---|---|---|---|"]
    for g, v in d["per_family"].items():
        beat = " ✓" if v["beats_p95"] else ""
        lowq = (f"{pct(v['weak_q_low'])} / {pct(v['strong_q_low'])} ({v['ratio_low']:.2f})"
                if v["low_rows"] else "–")
        out.append(f"| {g} | {f3(v['auc'])} | {pct(v['share95'])}{beat} | {pct(v['random_mean'])} / {pct(v['random_p95'])} | "
                   f"{pct(v['low_share'])} ({v['low_rows']}) | {lowq} | {pct(v['weak_q_all'])} | {pct(v['high_share'])} | "
                   f"{f2(v['ratio_high'])} |")
    return "\n".join(out)


def main():
    r = json.load(open(sys.argv[1]))
    print("## Families\n")
    print("| family | rows | train_ok rows | strong q | weak q | needs-strong rate | random share@95 mean / p95 | sources |")
    print("|---|---|---|---|---|---|---|---|")
    for g, v in r["families"].items():
        print(f"| {g} | {v['rows']} | {v['train_ok_rows']} | {pct(v['strong_q'])} | {pct(v['weak_q'])} | "
              f"{pct(v['needs_strong_rate'])} | {pct(v['random_share95_mean'])} / {pct(v['random_share95_p95'])} | "
              f"{', '.join(v['sources'])} |")
    print("\n## Leave-one-benchmark-out\n")
    for name in r["designs"]:
        print(lobo_table(r, name))
        print()
    if "everyday" in r:
        e = r["everyday"]
        print("## Everyday prompts\n")
        print(f"tag+size levels: {pct(e['accuracy'])} at the expected level ({e['n']} prompts); the benchmark head's "
              f"own thresholds: {pct(e['accuracy_head_only'])}. Expected-`low` prompts tagged `low` with confidence "
              f"> 0.5: {pct(e['low_with_conf_over_half'])}.\n")
        print("| kind | n | expected | levels (tag+size) | mean confidence | tags | levels (head alone) |")
        print("|---|---|---|---|---|---|---|")
        for k, v in e["by_kind"].items():
            lv = ", ".join(f"{a} {b}" for a, b in sorted(v["levels"].items()))
            hl = ", ".join(f"{a} {b}" for a, b in sorted(v["head_levels"].items()))
            tg = ", ".join(f"{a} {b}" for a, b in sorted(v["tags"].items(), key=lambda x: -x[1]))
            print(f"| {k} | {v['n']} | {v['expected']} | {lv} | {v['mean_conf']:.2f} | {tg} | {hl} |")
    if "winogrande_robustness" in r:
        print("\n## Winogrande: few-shot vs zero-shot\n")
        print("| features from | same tag (5-shot / re-formatted 3-shot vs 0-shot) | same level (tag+size) | same level (head) | levels 5-shot | levels 0-shot |")
        print("|---|---|---|---|---|---|")
        for k, v in r["winogrande_robustness"].items():
            print(f"| {k} | {pct(v['tag_same_fewshot_vs_zero'])} / {pct(v['tag_same_altfewshot_vs_zero'])} | "
                  f"{pct(v['level_same_fewshot_vs_zero'])} / {pct(v['level_same_altfewshot_vs_zero'])} | "
                  f"{pct(v['head_level_same_fewshot_vs_zero'])} | {v['levels_fewshot']} | {v['levels_zero']} |")
    if "tagger" in r:
        t = r["tagger"]
        print("\n## Family tagger\n")
        print(f"Everyday prompts: {pct(t['everyday_accuracy'])} of {t['everyday_n']} get their family; mean top "
              f"probability {t['everyday_mean_top_p_correct']:.2f} when right, "
              f"{f3(t['everyday_mean_top_p_wrong'])} when wrong. Benchmark rows not used as exemplars: " +
              ", ".join(f"{g} -> {pct(v)}" for g, v in t["benchmark_accuracy"].items()) + ".\n")
    if "final_priors" in r:
        print("Measured weak/strong ratio per tag (all train_ok rows, by tagger argmax; `null` = under 30 rows): " +
              ", ".join(f"{k} {('–' if v is None else f'{v:.3f}')}" for k, v in r["final_priors"].items()) +
              f". Small-request cut: {r['tts_small_tokens']:.0f} tokens.")
    d = r["designs"].get("emb+dense")
    if d and "reliability" in d["summary"]:
        print("\n## Reliability of the calibrated head (pooled held-out families)\n")
        print("| predicted bin | rows | mean predicted | observed |")
        print("|---|---|---|---|")
        for lo, hi, n, mp, my in d["summary"]["reliability"]:
            if n:
                print(f"| {lo:.1f}–{hi:.1f} | {n} | {mp:.3f} | {my:.3f} |")


if __name__ == "__main__":
    main()
