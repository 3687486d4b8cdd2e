//! `kinference-classify-train`: fits the complexity model on the training split of RouteLLM's
//! labelled prompts and writes the weights file with calibrated default thresholds.
//!
//!     cargo run --release -p kinference-classify --bin kinference-classify-train -- \
//!         --data ../shared/classify --out proxy/classify/model/complexity-v1.json

use anyhow::{Context, Result};
use clap::Parser;
use kinference_classify::{
    complexity::train::{self, Example, Outcome, Params},
    dataset::{self, Split},
};
use std::path::PathBuf;

#[derive(Debug, Parser)]
struct Args {
    /// The `shared/classify` folder.
    #[arg(long, default_value = "../shared/classify")]
    data: PathBuf,
    /// Where to write the weights.
    #[arg(long, default_value = "proxy/classify/model/complexity-v1.json")]
    out: PathBuf,
    /// Weak accuracy below `low` may trail strong accuracy by at most this much.
    #[arg(long, default_value_t = 0.01)]
    tolerance: f32,
    /// One-sided confidence margin of the `low` calibration, in standard errors (1.645: 95%).
    #[arg(long, default_value_t = 1.645)]
    margin_z: f32,
    /// Folds for the out-of-fold scores the thresholds are calibrated on.
    #[arg(long, default_value_t = 5)]
    folds: usize,
    #[arg(long, default_value_t = Params::default().epochs)]
    epochs: usize,
    #[arg(long, default_value_t = Params::default().learning_rate)]
    learning_rate: f32,
    #[arg(long, default_value_t = Params::default().l2)]
    l2: f32,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rows = dataset::load(&args.data).context("loading the labelled prompts")?;
    let train_rows: Vec<_> = rows.iter().filter(|r| r.split() == Split::Train).collect();
    let params = Params {
        epochs: args.epochs,
        learning_rate: args.learning_rate,
        l2: args.l2,
        ..Params::default()
    };
    let examples: Vec<Example> = train_rows
        .iter()
        .map(|r| Example::new(&r.prompt, r.needs_strong(), params.hash_bits))
        .collect();
    eprintln!(
        "{} rows, {} in the training split ({} need the strong model)",
        rows.len(),
        examples.len(),
        examples.iter().filter(|e| e.label).count()
    );
    let fold = |i: usize| {
        (xxhash_rust::xxh3::xxh3_64_with_seed(train_rows[i].prompt.as_bytes(), 7)
            % args.folds as u64) as usize
    };
    let oof = train::out_of_fold(&examples, args.folds, fold, &params);
    let outcomes: Vec<Outcome> = train_rows
        .iter()
        .zip(&oof)
        .map(|(r, s)| Outcome {
            score: *s,
            weak_correct: r.weak_correct,
            strong_correct: r.strong_correct,
        })
        .collect();
    let thresholds = train::calibrate_with_margin(&outcomes, args.tolerance, args.margin_z);
    let oof_auc = kinference_classify::complexity::quality::auc(&outcomes);
    let below: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.score < thresholds.low)
        .collect();
    let share = |f: fn(&Outcome) -> bool, v: &[&Outcome]| {
        v.iter().filter(|o| f(o)).count() as f32 / v.len().max(1) as f32
    };
    let low_weak = share(|o| o.weak_correct, &below);
    let low_strong = share(|o| o.strong_correct, &below);
    eprintln!(
        "out-of-fold AUC {oof_auc:.3}; thresholds low {:.4} high {:.4}; below low: {} prompts ({:.1}%), weak {:.1}% vs strong {:.1}%",
        thresholds.low,
        thresholds.high,
        below.len(),
        100.0 * below.len() as f32 / outcomes.len() as f32,
        100.0 * low_weak,
        100.0 * low_strong
    );
    let mut model = train::fit(&examples, &params);
    model.thresholds = thresholds;
    model.training = serde_json::json!({
        "data": "RouteLLM MMLU + GSM8K (shared/classify/routellm), weak = mistralai/Mixtral-8x7B-Instruct-v0.1, strong = gpt-4-1106-preview",
        "label": "needs strong = strong correct and weak incorrect",
        "split": "train when xxh3_64(prompt bytes) % 100 < 80",
        "train_rows": examples.len(),
        "params": {
            "hash_bits": params.hash_bits, "epochs": params.epochs,
            "learning_rate": params.learning_rate, "l2": params.l2, "seed": params.seed,
        },
        "calibration": {
            "on": format!("{}-fold out-of-fold scores of the training split", args.folds),
            "tolerance": args.tolerance,
            "margin_z": args.margin_z,
            "oof_auc": oof_auc,
            "low_share": below.len() as f32 / outcomes.len() as f32,
            "weak_accuracy_below_low": low_weak,
            "strong_accuracy_below_low": low_strong,
        },
    });
    let json = serde_json::to_string(&model)?;
    std::fs::write(&args.out, json).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
