//! The evaluation command as a user runs it, on a small labelled data directory laid out as
//! `scripts/classify/fetch_sets.py` writes one.

use std::{fs, process::Command};

fn row(id: usize, family: &str, prompt: &str, strong: f64, weak: f64, train_ok: bool) -> String {
    serde_json::json!({
        "id": format!("{family}:{id}"), "family": family, "source": format!("{family}-src"),
        "prompt": prompt, "context": [], "q_strong": strong, "q_weak": weak,
        "needs_strong": strong > weak, "contaminated": false, "train_ok": train_ok,
    })
    .to_string()
}

#[test]
fn eval_writes_the_report_with_parity() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    fs::create_dir_all(data.join("gsm8k")).unwrap();
    fs::create_dir_all(data.join("arc")).unwrap();
    let gsm: Vec<String> = (0..20)
        .map(|i| {
            row(
                i,
                "gsm8k",
                &format!("Tom has {i} apples and buys 3 more bags of 12. How many apples now?"),
                1.0,
                if i % 2 == 0 { 1.0 } else { 0.0 },
                true,
            )
        })
        .collect();
    fs::write(data.join("gsm8k/src.jsonl"), gsm.join("\n")).unwrap();
    let arc = [row(
        0,
        "arc",
        "Which gas do plants take in? A. O2 B. CO2",
        1.0,
        1.0,
        false,
    )];
    fs::write(data.join("arc/src.jsonl"), arc.join("\n")).unwrap();
    let everyday = dir.path().join("everyday.jsonl");
    fs::write(
        &everyday,
        r#"{"prompt": "hi", "level": "low", "family": "chat", "kind": "greeting"}"#,
    )
    .unwrap();
    let py = dir.path().join("predictions.jsonl");
    fs::write(
        &py,
        r#"{"id": "arc:0", "family_tag": "trivia", "level": "high", "confidence": 0.3, "score": 0.2, "tokens": 14}"#,
    )
    .unwrap();
    let out = dir.path().join("out/rust_eval.json");
    let status = Command::new(env!("CARGO_BIN_EXE_kinference-classify-eval"))
        .args(["--data", data.to_str().unwrap()])
        .args(["--everyday", everyday.to_str().unwrap()])
        .args(["--python-predictions", py.to_str().unwrap()])
        .args(["--out", out.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let report: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(report["rows"], 21);
    assert_eq!(report["per_family"]["gsm8k"]["rows"], 20);
    assert_eq!(report["per_family"]["arc"]["train_ok_rows"], 0);
    assert_eq!(report["calibration_test_only"]["rows"], 1);
    assert_eq!(report["everyday"]["n"], 1);
    assert_eq!(report["everyday"]["prompts"][0]["answer"]["level"], "low");
    assert_eq!(report["parity"]["rows"], 1);
    // Math word problems are tagged math.
    assert!(
        report["per_family"]["gsm8k"]["family_tags"]["math"]
            .as_u64()
            .unwrap()
            >= 15
    );
}
