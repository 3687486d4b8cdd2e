//! The reduced suite end to end: invariants that must hold for any seed, and the published
//! ordering of llm-d's shared-prefix result.

use std::{path::PathBuf, process::Command};

use kinference_fleet::{
    report::{self, CellResult},
    run::RunConfig,
    strategy::StrategyKind,
    suite::{self, Plan, Suite},
    workload::WorkloadKind,
};

fn traces() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces")
}

fn plan(workloads: Vec<WorkloadKind>, strategies: Vec<StrategyKind>, seed: u64) -> Plan {
    Plan {
        suite: Suite::Ci,
        workloads,
        strategies,
        loads: None,
        requests: None,
        run: RunConfig {
            seed,
            ..RunConfig::default()
        },
        traces_dir: traces(),
        threads: 2,
        dump_requests: None,
    }
}

fn cell<'a>(results: &'a [CellResult], workload: &str, strategy: &str) -> &'a CellResult {
    results
        .iter()
        .find(|r| r.workload == workload && r.strategy == strategy)
        .unwrap_or_else(|| panic!("no cell {workload}/{strategy}"))
}

#[test]
fn every_request_completes_or_is_counted_rejected() {
    let results = suite::run(&plan(
        WorkloadKind::ALL.to_vec(),
        StrategyKind::ALL.to_vec(),
        1,
    ))
    .unwrap();
    assert_eq!(
        results.len(),
        WorkloadKind::ALL.len() * StrategyKind::ALL.len()
    );
    for r in &results {
        assert!(r.requests > 0, "{}/{}", r.workload, r.strategy);
        assert_eq!(
            r.completed + r.rejected,
            r.requests,
            "{}/{}: lost requests",
            r.workload,
            r.strategy
        );
        assert!(r.ttft_p50_ms <= r.ttft_p90_ms && r.ttft_p90_ms <= r.ttft_p99_ms);
        assert!(r.ttft_p50_ms > 0.0 && r.output_tokens_per_s > 0.0);
        // Only Kinference predicts TTFT.
        assert_eq!(
            r.prediction_mape.is_some(),
            r.strategy == "kinference",
            "{}",
            r.strategy
        );
    }
    // The Azure trace has no shared prefixes: nothing can be a cache hit.
    assert_eq!(cell(&results, "azure", "random").prefix_hit_rate, 0.0);
    // Multi-turn sessions resend their history: the endpoint that served the last turn hits.
    assert!(cell(&results, "multi-turn", "llm-d-precise").prefix_hit_rate > 0.5);
    // Only Kinference may send low-complexity big-model prompts to the small pool; the others keep
    // every request in its own pool, so the per-pool request counts differ only for Kinference.
    let csv = report::to_csv(&results);
    assert_eq!(csv.lines().count(), results.len() + 1);
}

#[test]
fn the_same_seed_gives_identical_results_and_another_seed_does_not() {
    let run = |seed| {
        let p = plan(
            vec![WorkloadKind::SharedPrefix, WorkloadKind::MultiTurn],
            StrategyKind::ALL.to_vec(),
            seed,
        );
        report::to_csv(&suite::run(&p).unwrap())
    };
    let a = run(7);
    assert_eq!(a, run(7));
    assert_ne!(a, run(8));
}

#[test]
fn shared_prefix_reproduces_llm_d_ordering_precise_then_approximate_then_random() {
    let strategies = vec![
        StrategyKind::LlmdPrecise,
        StrategyKind::Gie,
        StrategyKind::Random,
    ];
    let results = suite::run(&plan(vec![WorkloadKind::SharedPrefix], strategies, 1)).unwrap();
    let precise = cell(&results, "shared-prefix", "llm-d-precise");
    let approx = cell(&results, "shared-prefix", "gie-default");
    let random = cell(&results, "shared-prefix", "random");
    assert!(
        precise.ttft_p90_ms < approx.ttft_p90_ms && approx.ttft_p90_ms < random.ttft_p90_ms,
        "p90 TTFT: precise {:.0} ms, approximate {:.0} ms, random {:.0} ms",
        precise.ttft_p90_ms,
        approx.ttft_p90_ms,
        random.ttft_p90_ms
    );
    assert!(
        precise.prefix_hit_rate > approx.prefix_hit_rate
            && approx.prefix_hit_rate > random.prefix_hit_rate
    );
}

#[test]
fn the_binary_writes_its_csv_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fleet");
    let status = Command::new(env!("CARGO_BIN_EXE_kinference-fleet"))
        .args([
            "--suite",
            "ci",
            "--workloads",
            "azure,two-model",
            "--strategies",
            "random,kinference",
        ])
        .arg("--traces")
        .arg(traces())
        .arg("--out")
        .arg(&out)
        .arg("--dump-requests")
        .arg(dir.path().join("requests"))
        .status()
        .unwrap();
    assert!(status.success());
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().next(), Some(report::CSV_HEADER));
    assert_eq!(csv.lines().count(), 1 + 2 * 2);

    // Per-request rows: one per request of the cell, every row as wide as the header; Kinference's
    // carry its prediction's inputs, every strategy's the replica's true state at arrival.
    let columns = report::REQUESTS_CSV_HEADER.split(',').count();
    for strategy in ["random", "kinference"] {
        let cell = csv
            .lines()
            .find(|l| l.starts_with(&format!("two-model,{strategy},")))
            .unwrap();
        let requests: usize = cell.split(',').nth(3).unwrap().parse().unwrap();
        let dump = std::fs::read_to_string(
            dir.path()
                .join(format!("requests/two-model-2-{strategy}.csv")),
        )
        .unwrap();
        let mut lines = dump.lines();
        assert_eq!(lines.next(), Some(report::REQUESTS_CSV_HEADER));
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.len(), requests);
        let col = |name: &str| {
            report::REQUESTS_CSV_HEADER
                .split(',')
                .position(|c| c == name)
                .unwrap()
        };
        for row in &rows {
            assert_eq!(row.len(), columns, "{row:?}");
            if row[col("ttft_s")].is_empty() {
                continue; // rejected
            }
            assert!(!row[col("true_running")].is_empty());
            let predicted = !row[col("pred_wait_s")].is_empty();
            assert_eq!(predicted, strategy == "kinference", "{row:?}");
        }
    }
    let md = std::fs::read_to_string(dir.path().join("fleet.md")).unwrap();
    assert!(
        md.contains("### two-model") && md.contains("Kinference against the best other strategy")
    );
    // Bad input is refused with a clear message.
    let bad = Command::new(env!("CARGO_BIN_EXE_kinference-fleet"))
        .args(["--suite", "ci", "--workloads", "nope"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown workload \"nope\""));
}
