#!/usr/bin/env python3
"""Reproduces docs/benchmarks/classification.md's quality section and its plots in one command.

    python3 scripts/plot_classify.py            # runs kinference-classify-eval, then plots
    python3 scripts/plot_classify.py --no-eval  # plots the CSVs already written

Runs from the project root. Needs matplotlib (pip install matplotlib). The eval reads
../shared/classify (RouteLLM's labelled prompts) and writes
docs/benchmarks/classification/curve_<dataset>.csv and quality.json; this script draws
accuracy against the share of prompts sent to the weak model, for the complexity classifier and
for random routing, into docs/benchmarks/classification/curve_<dataset>.png.
"""

import argparse
import csv
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "benchmarks"
DIR = OUT / "classification"


def run_eval(data: str) -> None:
    cmd = [
        "cargo", "run", "--release", "-p", "kinference-classify",
        "--bin", "kinference-classify-eval", "--",
        "--data", data, "--out", str(OUT),
    ]
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, cwd=ROOT, check=True)


def plot(dataset: str, report: dict) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(open(DIR / f"curve_{dataset.lower()}.csv")))
    share = [100 * float(r["weak_share"]) for r in rows]
    acc = [100 * float(r["accuracy"]) for r in rows]
    rnd = [100 * float(r["random_accuracy"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    ax.plot(share, acc, label=f"complexity classifier (AUC {report['auc']:.3f})", color="tab:blue")
    ax.plot(share, rnd, label="random routing (expectation)", color="tab:gray", linestyle="--")
    target = 95 * report["strong_accuracy"]
    ax.axhline(target, color="tab:red", linewidth=0.8, label="95% of strong-model accuracy")
    ax.axvline(100 * report["weak_share_at_95"], color="tab:blue", linewidth=0.8, linestyle=":")
    ax.axvline(100 * report["routellm_published_at_95"], color="tab:green", linewidth=0.8,
               linestyle=":", label=f"RouteLLM published ({100 * report['routellm_published_at_95']:.0f}%)")
    ax.set_xlabel("prompts sent to the weak model (%)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{dataset}: held-out split, {report['test_prompts']} prompts")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path = DIR / f"curve_{dataset.lower()}.png"
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--no-eval", action="store_true", help="plot the CSVs already written")
    p.add_argument("--data", default="../shared/classify", help="the shared/classify folder")
    args = p.parse_args()
    if not args.no_eval:
        run_eval(args.data)
    reports = json.load(open(DIR / "quality.json"))
    for r in reports:
        print(plot(r["dataset"], r))


if __name__ == "__main__":
    main()
