//! The what-if replay checked against the live system (issue 23, "What it must show"): the local
//! stack (controller, one glm-5.3 and one qwen-3.6-27b simulator, the proxy binary) runs one
//! request schedule live under policy A (`examples/policy.yaml`: low-complexity glm-5.3 prompts may
//! go to qwen-3.6-27b) and again under policy B (the same without the widening rule), recording
//! traffic with `--traffic-log`; `kinfctl replay` then replays the recording of A through A and
//! through B, and each predicted TTFT p90 must be within the fleet benchmark's MAPE of the live
//! p90 of the same policy.
//!
//! The tolerance is the fleet benchmark's published MAPE goal, met at moderate load:
//! docs/benchmarks/fleet.md, "The goals, honestly (pass 9)": "MAPE ≤ 10 % at moderate load: met
//! on every workload at 0.35-0.48 of capacity" (two-model 8.7 % at 10 req/s).

use kinference_local::{Programs, Stack, StackOptions, workspace_root};
use serde_json::{Value, json};
use std::{path::Path, process::Command, time::Duration};

/// docs/benchmarks/fleet.md, pass 9: MAPE ≤ 10 % at moderate load.
const FLEET_MAPE: f64 = 0.10;

const SYSTEM: &str = "You are the support assistant of a hardware store. Answer politely and \
    briefly. The store sells tools, paint, garden supplies, plumbing and electrical parts, and \
    offers key cutting, paint mixing and tool rental. Opening hours are 8am to 8pm on weekdays \
    and 9am to 6pm on weekends. Returns are accepted within 30 days with a receipt. ";

const LOW: [&str; 4] = [
    "What time do you open on Saturday?",
    "Do you cut keys?",
    "Can I return paint?",
    "Hi, thanks!",
];

const HIGH: &str = "Design a distributed consensus protocol tolerant to Byzantine faults for a \
     geo-replicated database; derive its message complexity, prove safety and liveness under \
     partial synchrony, and compare it with PBFT and HotStuff in latency and throughput.";

/// A schedule both live runs send: (offset ms, prompt, max_tokens).
type Schedule = Vec<(u64, String, u32)>;

/// The light schedule: one glm-5.3 request every 80 ms, one in three the same long complex
/// prompt (cached after its first time), so queues stay short.
fn schedule() -> Schedule {
    (0..120u64)
        .map(|i| {
            let prompt = if i % 3 == 0 {
                HIGH.repeat(40)
            } else {
                LOW[i as usize % LOW.len()].to_string()
            };
            (i * 80, prompt, 24)
        })
        .collect()
}

/// The heavy schedule: one request every 40 ms, one in two complex, each complex prompt the
/// shared question plus ~1,500 tokens of its own, so the glm-5.3 replica queues prefill and the
/// widening rule's moves show in the tail.
fn heavy_schedule() -> Schedule {
    (0..160u64)
        .map(|i| {
            let prompt = if i % 2 == 0 {
                let own: String = (0..300).map(|w| format!("case{i}w{w} ")).collect();
                format!("{HIGH} Context for case {i}: {own}")
            } else {
                LOW[i as usize % LOW.len()].to_string()
            };
            (i * 40, prompt, 24)
        })
        .collect()
}

/// Policy B: the example without its widening rule.
fn without_rules(doc: &mut serde_yaml::Value) {
    if doc["kind"] == "InferencePolicy"
        && let Some(spec) = doc["spec"].as_mapping_mut()
    {
        spec.remove("rules");
    }
}

/// Policy C, a much worse candidate: every glm-5.3 request rewritten to the one qwen-3.6-27b
/// replica, as the "sends everything to one endpoint".
fn everything_to_qwen(doc: &mut serde_yaml::Value) {
    if doc["kind"] == "InferencePolicy"
        && let Some(spec) = doc["spec"].as_mapping_mut()
    {
        let rules: serde_yaml::Value = serde_yaml::from_str(
            "- name: everything-to-qwen\n  match:\n    models: [glm-5.3, default]\n  action:\n    rewriteTo: qwen-3.6-27b\n",
        )
        .unwrap();
        spec.insert("rules".into(), rules);
    }
}

/// How a live run's policy differs from `examples/policy.yaml`.
type Patch = fn(&mut serde_yaml::Value);

fn unchanged(_: &mut serde_yaml::Value) {}

/// One live run: the schedule through a fresh stack; the recorded traffic and the endpoints view.
async fn live(dir: &Path, name: &str, patch: Patch, schedule: &Schedule) -> (Vec<Value>, String) {
    let log = dir.join(format!("{name}.jsonl"));
    let opts = StackOptions {
        replicas: vec![("glm-5.3".into(), 1), ("qwen-3.6-27b".into(), 1)],
        proxy_args: vec!["--traffic-log".into(), log.display().to_string()],
        ..StackOptions::default()
    };
    let stack =
        tokio::task::spawn_blocking(move || Stack::start(&Programs::workspace(), &opts, &patch))
            .await
            .unwrap()
            .expect("the local stack starts");
    let client = reqwest::Client::new();
    let admin = format!("http://{}", stack.proxy.admin);
    let base = format!("http://{}", stack.proxy.listen);
    for _ in 0..300 {
        let ready = client.get(format!("{admin}/ready")).send().await;
        if ready.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the first scrapes land, so neither run starts on fallback decisions.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for (at, prompt, max_tokens) in schedule.iter().cloned() {
        let (client, base) = (client.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + Duration::from_millis(at)).await;
            let body = json!({
                "model": "glm-5.3",
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": max_tokens,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
            });
            let rsp = client
                .post(format!("{base}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert!(rsp.status().is_success(), "{}", rsp.status());
            rsp.bytes().await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let endpoints = client
        .get(format!("{admin}/debug/endpoints"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The ring holds what the file holds.
    let ring = client
        .get(format!("{admin}/debug/traffic"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(stack);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), ring.lines().count());
    assert!(
        !text.contains("hardware store"),
        "no prompt text in records"
    );
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (records, endpoints)
}

fn p90(records: &[Value]) -> f64 {
    let mut v: Vec<f64> = records
        .iter()
        .filter_map(|r| r["ttft_s"].as_f64())
        .collect();
    v.sort_by(f64::total_cmp);
    let pos = 0.9 * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

fn moved(records: &[Value]) -> usize {
    records
        .iter()
        .filter(|r| r["served_model"] != r["requested_model"])
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_predicts_the_live_p90_of_both_policies() {
    check(&schedule(), without_rules, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_predicts_the_live_p90_of_both_policies_under_queueing() {
    check(&heavy_schedule(), without_rules, 0.0).await;
}

/// Two policies far apart: A against C, which sends everything to the one qwen-3.6-27b
/// replica, on the heavy schedule (C's queue grows for the whole run). The replay must predict
/// C's p90 within the fleet MAPE too, and the two live p90s must be at least 1.5× apart (else
/// this check shows nothing the others do not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_predicts_a_much_worse_candidate() {
    let (live_a, live_c) = check(&heavy_schedule(), everything_to_qwen, 1.0).await;
    let ratio = live_c.max(live_a) / live_c.min(live_a);
    assert!(
        ratio >= 1.5,
        "the live p90s are only {ratio:.2}× apart: {live_a} s and {live_c} s"
    );
}

/// Runs `schedule` live under A and under the candidate (`candidate` applied to A), replays A's
/// recording through both, and checks the replay against both live runs; `candidate_moved` is
/// the share of requests the candidate serves on another model than the one asked for. Returns
/// the live p90s of A and the candidate.
async fn check(schedule: &Schedule, candidate: Patch, candidate_moved: f64) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let (a, endpoints) = live(dir.path(), "a", unchanged, schedule).await;
    let (b, _) = live(dir.path(), "b", candidate, schedule).await;
    assert_eq!(a.len(), schedule.len());
    assert_eq!(b.len(), schedule.len());
    // Every record is in vLLM's hash space, the first ones too (before any engine's first KV
    // event the decision hashes only approximate chunks, and the record hashes the prompt
    // itself), so every recorded prompt shares its prefix with the others in the replay.
    let precise = a.iter().filter(|r| r["hash_source"] == "precise").count();
    assert_eq!(precise, a.len(), "{precise} of {} precise", a.len());
    for r in &a {
        assert!(!r["block_hashes"].as_array().unwrap().is_empty(), "{r}");
        assert!(r["ttft_s"].as_f64().is_some(), "{r}");
    }
    // Shared prefixes share their leading hashes.
    let firsts: std::collections::BTreeSet<String> = a
        .iter()
        .filter(|r| r["hash_source"] == "precise")
        .map(|r| r["block_hashes"][0].to_string())
        .collect();
    assert_eq!(
        firsts.len(),
        1,
        "every prompt starts with the system prompt's block"
    );
    assert_eq!(
        moved(&b) as f64 / b.len() as f64,
        candidate_moved,
        "the candidate's moves"
    );

    let examples = workspace_root().join("examples");
    let candidate_yaml = dir.path().join("candidate.yaml");
    let text = std::fs::read_to_string(examples.join("policy.yaml")).unwrap();
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    candidate(&mut doc);
    std::fs::write(&candidate_yaml, serde_yaml::to_string(&doc).unwrap()).unwrap();
    let fleet = dir.path().join("endpoints.json");
    std::fs::write(&fleet, &endpoints).unwrap();
    let out = dir.path().join("report.json");
    let run = Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .arg("replay")
        .arg("--traffic")
        .arg(dir.path().join("a.jsonl"))
        .arg("--current")
        .arg(examples.join("policy.yaml"))
        .arg("--candidate")
        .arg(&candidate_yaml)
        .arg("--manifests")
        .arg(&examples)
        .arg("--fleet")
        .arg(&fleet)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    println!("{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let predicted_a = report["current"]["ttft_p90_s"].as_f64().unwrap();
    let predicted_b = report["candidate"]["ttft_p90_s"].as_f64().unwrap();
    let (live_a, live_b) = (p90(&a), p90(&b));
    let err = |p: f64, l: f64| (p - l).abs() / l;
    println!(
        "policy A (widening): predicted p90 {:.0} ms, live {:.0} ms, error {:.1}%; moved live {} / predicted {:.3}",
        predicted_a * 1e3,
        live_a * 1e3,
        err(predicted_a, live_a) * 100.0,
        moved(&a),
        report["current"]["moved_share"]
    );
    println!(
        "candidate: predicted p90 {:.0} ms, live {:.0} ms, error {:.1}%",
        predicted_b * 1e3,
        live_b * 1e3,
        err(predicted_b, live_b) * 100.0
    );
    assert_eq!(
        report["candidate"]["moved_share"].as_f64(),
        Some(candidate_moved)
    );
    // The routing is reproduced: the replay moves the share of A's requests that moved live,
    // within sampling error (decisions near a tie flip with timing, live and replayed alike):
    // 2.5 standard errors of the difference of two shares of n requests at their pooled share,
    // and at least 5 points.
    let predicted_moved = report["current"]["moved_share"].as_f64().unwrap();
    let live_moved = moved(&a) as f64 / a.len() as f64;
    let pooled = (predicted_moved + live_moved) / 2.0;
    let tolerance = (2.5 * (pooled * (1.0 - pooled) * 2.0 / a.len() as f64).sqrt()).max(0.05);
    assert!(
        (predicted_moved - live_moved).abs() <= tolerance,
        "moved: predicted {predicted_moved}, live {live_moved}, tolerance {tolerance:.3}"
    );
    assert!(predicted_moved > 0.0, "the widening rule moved nothing");
    // The bar: each predicted p90 within the fleet benchmark's MAPE of the live one.
    // The replay is calibrated on the recording (A's own live TTFTs against A replayed), so A is
    // the fit and B, never recorded, the prediction.
    let calibration = &report["calibration"];
    println!("calibration: {calibration}");
    assert!(
        calibration["samples"].as_u64().unwrap() >= 20,
        "{calibration}"
    );
    for (side, p, l) in [("A", predicted_a, live_a), ("B", predicted_b, live_b)] {
        assert!(
            err(p, l) <= FLEET_MAPE,
            "{side}: predicted p90 {p}, live {l}: error {:.1}% past the fleet MAPE of {:.0}%",
            err(p, l) * 100.0,
            FLEET_MAPE * 100.0
        );
    }
    (live_a, live_b)
}
