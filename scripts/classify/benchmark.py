#!/usr/bin/env python3
"""Regenerate docs/benchmarks/classification.md in one command (`just classify-eval DATA`).

    python3 scripts/classify/benchmark.py --data /work/data/classify [--no-bench] [--chrt]

1. evaluate.py: the leave-one-benchmark-out run of the chosen design, the score's head, its
   P(weak wrong) and Platt variants and the length baseline; the level-confidence calibration;
   the everyday prompts; the final models, exported to DATA/export (never over the committed
   files) with their per-row answers in DATA/predictions.jsonl.
2. Whether DATA/export equals proxy/classify/model (the committed files are what the data fits).
3. kinference-classify-eval: the Rust classifier's own answers on every row and every everyday
   prompt, and its parity with the Python answers.
4. The latency percentiles of benches/classify.rs (KINFERENCE_BENCH_PERCENTILES_ONLY), with the
   load average; --no-bench keeps the last cost.json; --chrt runs it under `chrt -f 50` (root).
5. The plots and the tables between the generated markers of the doc.

DATA comes from the fetch tool and fetch_sets.py (see the doc); it is never committed.
"""
import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(ROOT, "docs", "benchmarks", "classification")
DOC = os.path.join(ROOT, "docs", "benchmarks", "classification.md")
MODEL = os.path.join(ROOT, "proxy", "classify", "model")
DESIGNS = ["tag+size (chosen levels)", "emb+dense", "emb+dense/difficulty", "emb+dense/platt", "length"]
BEGIN, END = "<!-- generated:begin (scripts/classify/benchmark.py) -->", "<!-- generated:end -->"


def run(cmd, env=None):
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, **(env or {})})


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def pct(x, d=1):
    return "–" if x is None else f"{100 * x:.{d}f}%"


def f3(x):
    return "–" if x is None or x != x else f"{x:.3f}"


def f2(x):
    return "–" if x is None or x != x else f"{x:.2f}"


def plots(res, rust):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=1)
    lc = res.get("level_calibration")
    if lc:
        pts = [(mp, my) for lo, hi, n, mp, my in lc["reliability"] if n >= 20]
        ax.plot(*zip(*pts), "o-", label=f"Python, held-out families (ECE {lc['pooled_ece']:.3f})")
    rel = rust["calibration_test_only"]
    pts = [(mp, my) for n, mp, my in rel["reliability"] if n >= 20]
    if pts:
        ax.plot(*zip(*pts), "s-", label=f"Rust, shipped, test-only rows (ECE {rel['ece']:.3f})")
    ax.set_xlabel("complexity confidence: predicted P(the level's promise holds)")
    ax.set_ylabel("observed rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "confidence_calibration.png"), dpi=110)


def lobo_tables(res):
    out = []
    fams = list(res["families"])
    names = {"tag+size (chosen levels)": "tag+size levels (shipped), ranked by expected loss",
             "emb+dense": "score head, needs-strong (shipped `score`)",
             "emb+dense/difficulty": "score head, P(weak wrong) target",
             "emb+dense/platt": "score head, Platt calibration",
             "length": "length (log bytes of the raw prompt)"}
    out.append("| design | " + " | ".join(fams) + " | mean AUC | share@95 > random p95 |")
    out.append("|---|" + "---|" * (len(fams) + 2))
    for d, v in res["designs"].items():
        cells = [f"{f3(v['per_family'][g]['auc'])}{' ✓' if v['per_family'][g]['beats_p95'] else ''}" for g in fams]
        s = v["summary"]
        out.append(f"| {names.get(d, d)} | " + " | ".join(cells) +
                   f" | {s['mean_auc']:.3f} | {s['families_beating_p95']}/{len(fams)} |")
    out.append("")
    out.append("Cells: AUC of needs-strong on the held-out family; ✓: share@95 above the 95th percentile of "
               "1,000 random orderings there.")
    out.append("")
    tts = res["designs"]["tag+size (chosen levels)"]["per_family"]
    ln = res["designs"]["length"]["per_family"]
    out.append("**Shipped levels per held-out family** (Python, refit without the family):")
    out.append("")
    out.append("| held-out family | AUC | share@95 | random mean / p95 | length AUC / share@95 | `low` share (rows) "
               "| weak / strong on `low` (ratio) | weak / strong overall | `high` share | weak/strong on `high` |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for g in fams:
        v = tts[g]
        low = (f"{pct(v['weak_q_low'])} / {pct(v['strong_q_low'])} ({f2(v['ratio_low'])})" if v["low_rows"] else "–")
        out.append(f"| {g} | {f3(v['auc'])} | {pct(v['share95'])}{' ✓' if v['beats_p95'] else ''} | "
                   f"{pct(v['random_mean'])} / {pct(v['random_p95'])} | {f3(ln[g]['auc'])} / {pct(ln[g]['share95'])} | "
                   f"{pct(v['low_share'])} ({v['low_rows']}) | {low} | {pct(v['weak_q_all'])} / {pct(v['strong_q_all'])} | "
                   f"{pct(v['high_share'])} | {f2(v['ratio_high'])} |")
    return "\n".join(out)


def rust_tables(rust):
    out = ["| family | rows (train_ok) | low / medium / high | weak / strong on `low` (ratio) | weak / strong overall "
           "| score AUC | score share@95 | confidence: mean / promise held / ECE | top family tags |",
           "|---|---|---|---|---|---|---|---|---|"]
    for g, v in rust["per_family"].items():
        ls = v["level_share"]
        low = (f"{pct(v['weak_q_low'])} / {pct(v['strong_q_low'])} ({f2(v['ratio_low'])})" if v["low_rows"] else "–")
        tags = ", ".join(f"{k} {n}" for k, n in sorted(v["family_tags"].items(), key=lambda x: -x[1])[:3])
        out.append(f"| {g} | {v['rows']} ({v['train_ok_rows']}) | {pct(ls['low'])} / {pct(ls['medium'])} / {pct(ls['high'])} | "
                   f"{low} | {pct(v['weak_q_all'])} / {pct(v['strong_q_all'])} | {f3(v['auc_score'])} | "
                   f"{pct(v['share95_score'])} | {f2(v['mean_confidence'])} / {f2(v['promise_rate'])} / {f3(v['ece_confidence'])} | {tags} |")
    return "\n".join(out)


def everyday_table(rust):
    e = rust["everyday"]
    out = [f"**{e['correct']} of {e['n']} ({pct(e['accuracy'])}) at the expected level** (goal: 90%, "
           f"{-(-9 * e['n'] // 10)} of {e['n']}); expected-`low` prompts tagged `low` with confidence > 0.5: "
           f"{e['low_with_confidence_over_half']} of {e['expected_low']}; family as labelled: {pct(e['family_accuracy'])}.",
           "",
           "| kind | n | expected | levels | mean confidence | families |",
           "|---|---|---|---|---|---|"]
    for k in e["by_kind"]:
        lv = ", ".join(f"{a} {b}" for a, b in sorted(k["levels"].items()))
        fam = ", ".join(f"{a} {b}" for a, b in sorted(k["families"].items(), key=lambda x: -x[1]))
        out.append(f"| {k['kind']} | {k['n']} | {k['expected']} | {lv} | {f2(k['mean_confidence'])} | {fam} |")
    out.append("")
    out.append("The misses, prompt by prompt:")
    out.append("")
    out.append("| kind | prompt | expected | got (confidence) | family |")
    out.append("|---|---|---|---|---|")
    for p in e["prompts"]:
        a = p["answer"]
        if a["level"] != p["expected"]:
            out.append(f"| {p['kind']} | {p['prompt'][:90]} | {p['expected']} | {a['level']} ({a['confidence']:.2f}) | {a['family']} |")
    return "\n".join(out)


def cost_table(cost):
    out = [f"Load average while measuring (1, 5, 15 min): {cost['load_average']} on {cost['cpus']} CPUs; "
           f"{cost['calls_per_case']:,} calls per case.", "",
           "| case | wall p50 | wall p99 | wall p99.9 | CPU p50 | CPU p99 |", "|---|---|---|---|---|---|"]
    for c in cost["cases"]:
        w, u = c["wall_us"], c["cpu_us"]
        out.append(f"| {c['case']} | {w[0]:.1f} µs | {w[1]:.1f} µs | {w[2]:.1f} µs | {u[0]:.1f} µs | {u[1]:.1f} µs |")
    return "\n".join(out)


def verdict(res, rust, cost):
    tts = res["designs"]["tag+size (chosen levels)"]
    head = res["designs"]["emb+dense"]
    e = rust["everyday"]
    p99 = next((c["wall_us"][1] for c in cost["cases"] if c["case"] == "default_set/4k_token_prompt"), None)
    fams = tts["per_family"]
    low_ok = [g for g, v in fams.items() if v["ratio_low"] is not None and v["ratio_low"] >= 0.95]
    low_any = [g for g, v in fams.items() if v["low_rows"]]
    lc = res.get("level_calibration", {})
    rows = [
        ("share@95 above the random-ordering p95 on every held-out family",
         f"shipped levels {tts['summary']['families_beating_p95']}/8, score head {head['summary']['families_beating_p95']}/8, "
         f"length {res['designs']['length']['summary']['families_beating_p95']}/8", "no"),
        ("mean AUC ≥ 0.65 over held-out families",
         f"shipped levels {tts['summary']['mean_auc']:.3f}, score head {head['summary']['mean_auc']:.3f}, length "
         f"{res['designs']['length']['summary']['mean_auc']:.3f}: short by {0.65 - head['summary']['mean_auc']:.2f}", "no"),
        ("everyday prompts ≥ 90% at the expected level",
         f"{e['correct']}/{e['n']} ({pct(e['accuracy'])})", "yes" if e["accuracy"] >= 0.9 else "no"),
        ("weak ≥ 95% of strong on `low`, every family",
         f"`low` fires on {len(low_any)} families; ≥ 0.95 on {len(low_ok)} ({', '.join(low_ok) or 'none'})", "no"),
        ("confidence is a calibrated probability",
         f"ECE {lc.get('pooled_ece', float('nan')):.3f} on held-out families (uncalibrated mass: "
         f"{lc.get('raw_mass_ece', float('nan')):.3f}); shipped, on test-only rows: {rust['calibration_test_only']['ece']:.3f}", "yes, coarsely"),
        ("Winogrande with and without few-shot examples: same tag",
         f"same family {pct(rust['winogrande']['family_same'])}, same level {pct(rust['winogrande']['level_same'])} "
         f"of {rust['winogrande']['rows']} (Rust)", "yes"),
        ("default set p99 ≤ 100 µs on a 4,000-token prompt",
         f"wall p99 {p99:.1f} µs (load {cost['load_average']})" if p99 else "not measured",
         "yes" if p99 and p99 <= 100 else "no"),
    ]
    out = ["| goal (issue 18) | measured | met? |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--chrt", action="store_true")
    ap.add_argument("--skip-python", action="store_true", help="reuse the last results.json (for editing)")
    a = ap.parse_args()
    data = os.path.abspath(a.data)
    os.makedirs(OUT, exist_ok=True)
    export = os.path.join(data, "export")
    preds = os.path.join(data, "predictions.jsonl")
    if not a.skip_python:
        run([sys.executable, os.path.join(HERE, "evaluate.py"), "--data", data, "--out", OUT, "--export", export,
             "--predictions", preds, "--designs", *DESIGNS], env={"HF_HUB_OFFLINE": "1"})
    # The files evaluate.py exports (an export directory may hold older files too).
    names = ["static-minilm-d64.kste", "family-tagger-v1.json", "complexity-head-v2.json", "levels-v2.json"]
    fresh = {f: sha(os.path.join(export, f)) for f in names if os.path.exists(os.path.join(export, f))}
    committed = {f: sha(os.path.join(MODEL, f)) for f in fresh if os.path.exists(os.path.join(MODEL, f))}
    stale = sorted(f for f in fresh if committed.get(f) != fresh[f])
    rust_json = os.path.join(OUT, "rust_eval.json")
    run(["cargo", "run", "--release", "-q", "-p", "kinference-classify-tools", "--bin", "kinference-classify-eval",
         "--", "--data", data, "--python-predictions", preds, "--out", rust_json])
    cost_json = os.path.join(OUT, "cost.json")
    if not a.no_bench:
        run(["cargo", "bench", "-p", "kinference-classify", "--bench", "classify", "--no-run"])
        exe = [p for p in glob.glob(os.path.join(ROOT, "target", "release", "deps", "classify-*"))
               if os.access(p, os.X_OK) and not p.endswith(".d")]
        exe = max(exe, key=os.path.getmtime)
        cmd = (["chrt", "-f", "50"] if a.chrt else []) + [exe, "--bench"]
        run(cmd, env={"KINFERENCE_BENCH_PERCENTILES_ONLY": "1", "KINFERENCE_BENCH_JSON": cost_json})
    res = json.load(open(os.path.join(OUT, "results.json")))
    rust = json.load(open(rust_json))
    cost = json.load(open(cost_json))
    plots(res, rust)
    par = rust.get("parity", {})
    gen = "\n\n".join([
        "### Against the goals\n\n" + verdict(res, rust, cost),
        "### Leave-one-benchmark-out (Python, refit per held-out family)\n\n" + lobo_tables(res),
        f"### The shipped Rust classifier on every family\n\n"
        f"Parity with the Python reference on {par.get('rows', 0):,} rows: same family {pct(par.get('family_same'), 2)}, "
        f"same level {pct(par.get('level_same'), 2)}, score within {par.get('score_mean_abs_diff', float('nan')):.1e} on "
        f"average (at most {par.get('score_max_abs_diff', float('nan')):.3f}, at a calibration step), confidence within "
        f"{par.get('confidence_max_abs_diff', float('nan')):.1e}. Committed model files "
        + ("equal a fresh export from this data." if not stale else f"DIFFER from a fresh export: {', '.join(stale)}.")
        + " In-sample for the train_ok rows; arc, winogrande and the test-only sources are out of sample.\n\n"
        + rust_tables(rust),
        "### Everyday prompts (Rust, `proxy/classify/tests/everyday.jsonl`)\n\n" + everyday_table(rust),
        "### Calibration\n\n![confidence calibration](classification/confidence_calibration.png)\n"
        "![score calibration](classification/calibration.png)\n\n"
        f"Confidence of the complexity tag, Python held-out families (nested: each family calibrated by a fit on the "
        f"others): pooled ECE {res['level_calibration']['pooled_ece']:.3f}; per family "
        + ", ".join(f"{g} {v['ece']:.3f}" for g, v in res["level_calibration"]["per_family"].items())
        + f". The score (head, isotonic) pooled over held-out families: ECE {res['designs']['emb+dense']['summary']['pooled_ece']:.3f}"
        f" (Platt: {res['designs']['emb+dense/platt']['summary']['pooled_ece']:.3f}).",
        "### Cost of each classifier (Rust, `benches/classify.rs`)\n\n" + cost_table(cost),
    ])
    doc = open(DOC).read()
    i, j = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    open(DOC, "w").write(doc[:i] + "\n\n" + gen + "\n\n" + doc[j:])
    print(f"wrote {DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
