//! The training and evaluation commands as a user runs them, on a small labelled dataset laid out
//! like `shared/classify`.

use kinference_classify::{
    complexity::model::Model,
    dataset::{Split, split_of},
};
use std::{fs, path::Path, process::Command};

/// Writes a dataset with `n` MMLU-like and `n` GSM8K-like prompts; returns the prompts.
fn write_dataset(root: &Path, n: usize) -> (Vec<String>, Vec<String>) {
    let mmlu = root.join("routellm/mmlu");
    let gsm = root.join("routellm/gsm8k");
    fs::create_dir_all(&mmlu).unwrap();
    fs::create_dir_all(&gsm).unwrap();
    let header = "prompt,mistralai/Mixtral-8x7B-Instruct-v0.1,gpt-4-1106-preview";
    let mut mmlu_prompts = Vec::new();
    let mut csv = format!("{header}\n");
    for i in 0..n {
        // Hard questions (only the strong model right) say "prove"; easy ones do not.
        let hard = i % 3 == 0;
        let p = if hard {
            format!("Prove, step by step, statement {i} about groups.\nA. yes\nB. no\nAnswer:")
        } else {
            format!("What colour is object {i}?\nA. red\nB. blue\nAnswer:")
        };
        let (weak, strong) = if hard {
            ("False", "True")
        } else {
            ("True", "True")
        };
        csv.push_str(&format!("\"{p}\",{weak},{strong}\n"));
        mmlu_prompts.push(p);
    }
    fs::write(mmlu.join("mmlu_test_subject.csv"), csv).unwrap();
    let mut gsm_prompts = Vec::new();
    let mut csv = format!("{header},a,b\n");
    for i in 0..n {
        let p = format!(
            "Ann has {i} apples and buys {} more. How many does she have?",
            i % 7
        );
        let weak = if i % 4 == 0 { "False" } else { "True" };
        csv.push_str(&format!("{p},{weak},True,x,y\n"));
        gsm_prompts.push(p);
    }
    fs::write(gsm.join("gsm8k_responses.csv"), csv).unwrap();
    (mmlu_prompts, gsm_prompts)
}

fn contaminate(root: &Path, dataset: &str, prompts: &[&String]) {
    let lines: Vec<String> = prompts
        .iter()
        .map(|p| serde_json::json!({"train_prompt": p, "eval_prompt": p}).to_string())
        .collect();
    fs::write(
        root.join(format!("routellm/{dataset}/contaminated_prompts.jsonl")),
        lines.join("\n"),
    )
    .unwrap();
}

#[test]
fn train_writes_a_loadable_calibrated_model() {
    let dir = tempfile::tempdir().unwrap();
    let (mmlu, gsm) = write_dataset(dir.path(), 300);
    contaminate(dir.path(), "mmlu", &[]);
    contaminate(dir.path(), "gsm8k", &[]);
    let out = dir.path().join("weights.json");
    let status = Command::new(env!("CARGO_BIN_EXE_kinference-classify-train"))
        .args([
            "--data",
            dir.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .args(["--folds", "2", "--epochs", "2"])
        .status()
        .unwrap();
    assert!(status.success());
    let model = Model::from_json(&fs::read(&out).unwrap()).unwrap();
    let train_rows = mmlu
        .iter()
        .chain(&gsm)
        .filter(|p| split_of(p) == Split::Train)
        .count();
    assert_eq!(model.training["train_rows"], train_rows);
    assert!(model.thresholds.low <= model.thresholds.high);
    // "prove" prompts are the ones that need the strong model: the calibrated `low` cut keeps them
    // out, so some prompts fall below it (the easy ones) and the weak model matches the strong one
    // there.
    let cal = &model.training["calibration"];
    assert!(cal["low_share"].as_f64().unwrap() > 0.0, "{cal}");
    let gap = cal["strong_accuracy_below_low"].as_f64().unwrap()
        - cal["weak_accuracy_below_low"].as_f64().unwrap();
    assert!(gap <= 0.01 + 1e-6, "{cal}");
}

#[test]
fn eval_excludes_contaminated_and_updates_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let (mmlu, gsm) = write_dataset(dir.path(), 200);
    let mmlu_test: Vec<&String> = mmlu.iter().filter(|p| split_of(p) == Split::Test).collect();
    let gsm_test: Vec<&String> = gsm.iter().filter(|p| split_of(p) == Split::Test).collect();
    // Three contaminated MMLU test prompts, and one training prompt that changes nothing.
    let train_one = mmlu.iter().find(|p| split_of(p) == Split::Train).unwrap();
    contaminate(
        dir.path(),
        "mmlu",
        &[mmlu_test[0], mmlu_test[1], mmlu_test[2], train_one],
    );
    contaminate(dir.path(), "gsm8k", &[]);
    let out = dir.path().join("bench");
    fs::create_dir_all(&out).unwrap();
    fs::write(
        out.join("classification.md"),
        "# Title\n\nbefore\n<!-- quality:begin (written by kinference-classify-eval) -->\nstale\n<!-- quality:end -->\nafter\n",
    )
    .unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_kinference-classify-eval"))
        .args([
            "--data",
            dir.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let md = fs::read_to_string(out.join("classification.md")).unwrap();
    assert!(md.starts_with("# Title\n\nbefore\n"));
    assert!(md.ends_with("after\n"));
    assert!(!md.contains("stale"));
    assert!(
        md.contains(&format!("| MMLU | {} (3) |", mmlu_test.len() - 3)),
        "{md}"
    );
    assert!(
        md.contains(&format!("| GSM8K | {} (0) |", gsm_test.len())),
        "{md}"
    );
    let q: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join("classification/quality.json")).unwrap())
            .unwrap();
    // Every GSM8K prompt here is right for the strong model, 1 in 4 wrong for the weak one.
    let gsm_weak = gsm_test.iter().filter(|p| {
        let i: usize = p.split(' ').nth(2).unwrap().parse().unwrap();
        !i.is_multiple_of(4)
    });
    let expected = gsm_weak.count() as f64 / gsm_test.len() as f64;
    assert!((q[1]["weak_accuracy"].as_f64().unwrap() - expected).abs() < 1e-5);
    assert_eq!(q[1]["strong_accuracy"].as_f64().unwrap(), 1.0);
    let curve = fs::read_to_string(out.join("classification/curve_mmlu.csv")).unwrap();
    assert_eq!(curve.lines().count(), 102);
}
