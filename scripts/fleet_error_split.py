#!/usr/bin/env python3
"""Splits Kinference's TTFT prediction error in the fleet benchmark by what the engine was doing.

Reads the per-request CSVs that `kinference-fleet --dump-requests DIR` writes (one per cell), and
for each Kinference cell prints the prediction's MAPE, then the MAPE it would have if the
prediction's wait were replaced by what was true when the request arrived:

- backlog + residual: the replica's uncomputed prompt tokens (`true_backlog_tokens`) over the
  endpoint's learned prefill rate, plus the rest of the engine step in progress
  (`true_step_residual_s`), with everything else of the prediction kept;
- residual only: the prediction's own wait, with its half-step guess of the step in progress
  replaced by the true rest of that step.

What is left with the true state is the error of the model's form; the difference is what the
sidecar could not see. Usage:

    ./target/release/kinference-fleet --suite full --seed 1 --strategies kinference \\
        --workloads azure --loads 8 --dump-requests /tmp/dump --out /tmp/dump/out
    python3 scripts/fleet_error_split.py /tmp/dump/*-kinference.csv
"""
import csv
import statistics
import sys


def num(row, key):
    v = row[key]
    return float(v) if v else float("nan")


def mape(rows, predict):
    return 100 * statistics.mean(abs(predict(r) - num(r, "ttft_s")) / num(r, "ttft_s") for r in rows)


def main() -> None:
    print(f"{'cell':<40} {'MAPE':>7} {'true backlog+residual':>22} {'true residual only':>19}")
    for path in sys.argv[1:]:
        rows = [
            r for r in csv.DictReader(open(path))
            if r["ttft_s"] and r["predicted_ttft_s"] and r["pred_wait_s"]
        ]
        if not rows:
            continue

        def predicted(r):
            return num(r, "predicted_ttft_s")

        def without_wait(r):
            return predicted(r) - num(r, "pred_wait_s") * num(r, "pred_correction")

        def true_state(r):
            return (without_wait(r) + num(r, "true_backlog_tokens") / num(r, "pred_rate_tps")
                    + num(r, "true_step_residual_s"))

        def true_residual(r):
            return (predicted(r) - num(r, "pred_step_residual_s") * num(r, "pred_correction")
                    + num(r, "true_step_residual_s"))

        name = path.rsplit("/", 1)[-1].removesuffix(".csv")
        print(f"{name:<40} {mape(rows, predicted):6.1f}% {mape(rows, true_state):21.1f}% "
              f"{mape(rows, true_residual):18.1f}%")


if __name__ == "__main__":
    main()
