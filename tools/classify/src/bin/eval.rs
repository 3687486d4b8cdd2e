//! `kinference-classify-eval`: what the shipped Rust classifier answers on the labelled rows and
//! the everyday prompts, and whether it answers as the Python reference does.
//!
//!     cargo run --release -p kinference-classify-tools --bin kinference-classify-eval -- \
//!         --data /work/data/classify --python-predictions /work/data/classify/predictions.jsonl \
//!         --out docs/benchmarks/classification/rust_eval.json
//!
//! Every row is classified as the proxy would classify it (its earlier turns, then the prompt as
//! the last user turn) by the compiled-in complexity and family tags. Written per family: the
//! levels, the weak and strong models' quality where `low` fires, the score's AUC and share@95,
//! and the calibration of the confidence against what the level promises. Families and sources
//! the shipped model was not fitted on (licence: test only) are the honest out-of-sample part.
//! `scripts/classify/report.py` renders the file into `docs/benchmarks/classification.md`.

use anyhow::{Context, Result};
use clap::Parser;
use kinference_classify::{
    ClassifierSet, Explanation, Prompt, Role, Turn, complexity::model::FAMILIES,
};
use kinference_classify_tools::{
    metrics::{auc, ece, share_at},
    rows::{self, Row},
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::{collections::BTreeMap, fs, path::PathBuf};

#[derive(Debug, Parser)]
struct Args {
    /// The fetched rows (`scripts/classify/fetch_sets.py --out`).
    #[arg(long)]
    data: PathBuf,
    /// The labelled everyday prompts.
    #[arg(long, default_value = "proxy/classify/tests/everyday.jsonl")]
    everyday: PathBuf,
    /// The Python reference's answers (`evaluate.py --predictions`), for the parity check.
    #[arg(long)]
    python_predictions: Option<PathBuf>,
    #[arg(long, default_value = "docs/benchmarks/classification/rust_eval.json")]
    out: PathBuf,
}

/// What the shipped tags say of one prompt.
#[derive(Clone, Debug, Serialize)]
struct Answer {
    level: String,
    confidence: f32,
    family: String,
    family_p: f32,
    score: f32,
}

fn answer(e: &Explanation) -> Answer {
    let c = e.get("complexity").expect("a complexity tag");
    let f = e.get("family").expect("a family tag");
    Answer {
        level: c.tag.value.clone(),
        confidence: c.tag.confidence,
        family: f.tag.value.clone(),
        family_p: f.tag.confidence,
        score: c.score.unwrap_or(f32::NAN),
    }
}

fn classify(set: &ClassifierSet, row: &Row) -> Answer {
    answer(&row.explain(set))
}

/// Whether the level's promise held on a row: `low` and `medium` that the weak model was not
/// worse, `high` that the strong model was needed.
fn promise_held(level: &str, row: &Row) -> bool {
    if level == "high" {
        row.q_strong > row.q_weak
    } else {
        row.q_weak >= row.q_strong
    }
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| s / n as f64)
}

fn family_report(rows: &[&Row], answers: &[&Answer]) -> Value {
    let n = rows.len();
    let share = |l: &str| answers.iter().filter(|a| a.level == l).count() as f64 / n as f64;
    let low: Vec<usize> = (0..n).filter(|&i| answers[i].level == "low").collect();
    let weak_low = mean(low.iter().map(|&i| rows[i].q_weak));
    let strong_low = mean(low.iter().map(|&i| rows[i].q_strong));
    let weak_all = mean(rows.iter().map(|r| r.q_weak)).unwrap_or(0.0);
    let strong_all = mean(rows.iter().map(|r| r.q_strong)).unwrap_or(0.0);
    let score: Vec<f32> = answers.iter().map(|a| a.score).collect();
    let needs: Vec<bool> = rows.iter().map(|r| r.needs_strong).collect();
    let qs: Vec<f64> = rows.iter().map(|r| r.q_strong).collect();
    let qw: Vec<f64> = rows.iter().map(|r| r.q_weak).collect();
    let conf: Vec<f32> = answers.iter().map(|a| a.confidence).collect();
    let held: Vec<bool> = (0..n)
        .map(|i| promise_held(&answers[i].level, rows[i]))
        .collect();
    let mut tags: BTreeMap<&str, usize> = BTreeMap::new();
    for a in answers {
        *tags.entry(a.family.as_str()).or_default() += 1;
    }
    json!({
        "rows": n,
        "train_ok_rows": rows.iter().filter(|r| r.train_ok).count(),
        "level_share": {"low": share("low"), "medium": share("medium"), "high": share("high")},
        "low_rows": low.len(),
        "weak_q_low": weak_low,
        "strong_q_low": strong_low,
        "ratio_low": match (weak_low, strong_low) {
            (Some(w), Some(s)) if s > 0.0 => Some(w / s),
            _ => None,
        },
        "weak_q_all": weak_all,
        "strong_q_all": strong_all,
        "auc_score": auc(&score, &needs),
        "share95_score": share_at(&score, &qs, &qw, 0.95),
        "ece_confidence": ece(&conf, &held, 10).0,
        "mean_confidence": mean(conf.iter().map(|c| f64::from(*c))),
        "promise_rate": mean(held.iter().map(|h| f64::from(u8::from(*h)))),
        "family_tags": tags,
    })
}

#[derive(Deserialize)]
struct Everyday {
    prompt: String,
    level: String,
    family: String,
    kind: String,
}

fn everyday(set: &ClassifierSet, path: &PathBuf) -> Result<Value> {
    let text = fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let prompts: Vec<Everyday> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("everyday prompts")?;
    let mut out = Vec::new();
    let mut kinds: Vec<&str> = Vec::new();
    let mut by_kind: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, e) in prompts.iter().enumerate() {
        let turns = [Turn {
            role: Role::User,
            text: &e.prompt,
        }];
        let a = answer(&set.explain(Prompt::Chat(&turns)));
        out.push(
            json!({"kind": e.kind, "expected": e.level, "expected_family": e.family,
                        "prompt": e.prompt, "answer": a}),
        );
        if !kinds.contains(&e.kind.as_str()) {
            kinds.push(&e.kind);
        }
        by_kind.entry(&e.kind).or_default().push(i);
    }
    let level = |i: usize| out[i]["answer"]["level"].as_str().unwrap_or("").to_string();
    let correct = (0..prompts.len())
        .filter(|&i| level(i) == prompts[i].level)
        .count();
    let lows: Vec<usize> = (0..prompts.len())
        .filter(|&i| prompts[i].level == "low")
        .collect();
    let low_confident = lows
        .iter()
        .filter(|&&i| level(i) == "low" && out[i]["answer"]["confidence"].as_f64() > Some(0.5))
        .count();
    let family_right = (0..prompts.len())
        .filter(|&i| out[i]["answer"]["family"] == prompts[i].family.as_str())
        .count();
    let kinds_json: Vec<Value> = kinds
        .iter()
        .map(|k| {
            let idx = &by_kind[k];
            let mut levels: BTreeMap<String, usize> = BTreeMap::new();
            let mut fams: BTreeMap<String, usize> = BTreeMap::new();
            for &i in idx {
                *levels.entry(level(i)).or_default() += 1;
                let f = out[i]["answer"]["family"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                *fams.entry(f).or_default() += 1;
            }
            let conf = mean(
                idx.iter()
                    .map(|&i| out[i]["answer"]["confidence"].as_f64().unwrap_or(0.0)),
            );
            json!({"kind": k, "n": idx.len(), "expected": prompts[idx[0]].level,
                   "levels": levels, "mean_confidence": conf, "families": fams})
        })
        .collect();
    Ok(json!({
        "n": prompts.len(),
        "correct": correct,
        "accuracy": correct as f64 / prompts.len().max(1) as f64,
        "expected_low": lows.len(),
        "low_with_confidence_over_half": low_confident,
        "family_accuracy": family_right as f64 / prompts.len().max(1) as f64,
        "by_kind": kinds_json,
        "prompts": out,
    }))
}

#[derive(Deserialize)]
struct PythonAnswer {
    id: String,
    family_tag: String,
    level: String,
    confidence: f32,
    score: f32,
    tokens: usize,
}

fn parity(rows: &[Row], answers: &[Answer], path: &PathBuf) -> Result<Value> {
    let text = fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let mut py: BTreeMap<String, PythonAnswer> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let p: PythonAnswer = serde_json::from_str(line).context("python predictions")?;
        py.insert(p.id.clone(), p);
    }
    let (mut n, mut fam, mut lvl) = (0usize, 0usize, 0usize);
    let (mut max_score, mut sum_score, mut max_conf) = (0f32, 0f64, 0f32);
    let mut examples = Vec::new();
    for (r, a) in rows.iter().zip(answers) {
        let Some(p) = py.get(&r.id) else { continue };
        n += 1;
        fam += usize::from(p.family_tag == a.family);
        lvl += usize::from(p.level == a.level);
        let d = (p.score - a.score).abs();
        max_score = max_score.max(d);
        sum_score += f64::from(d);
        max_conf = max_conf.max((p.confidence - a.confidence).abs());
        if (p.family_tag != a.family || p.level != a.level) && examples.len() < 10 {
            examples.push(
                json!({"id": r.id, "python": [p.family_tag, p.level, p.tokens],
                                 "rust": [a.family, a.level]}),
            );
        }
    }
    Ok(json!({
        "rows": n,
        "family_same": fam as f64 / n.max(1) as f64,
        "level_same": lvl as f64 / n.max(1) as f64,
        "score_max_abs_diff": max_score,
        "score_mean_abs_diff": sum_score / n.max(1) as f64,
        "confidence_max_abs_diff": max_conf,
        "differing_ids": examples,
    }))
}

/// Winogrande's questions 5-shot (as RouterBench asks them) against the bare question (the text
/// after the last solved example, a format-specific cut that does not use the extraction).
fn winogrande(set: &ClassifierSet, rows: &[Row]) -> Value {
    let (mut n, mut tag, mut level) = (0usize, 0usize, 0usize);
    for r in rows.iter().filter(|r| r.family == "winogrande") {
        let p = &r.prompt;
        let Some(k) = p.rfind("without explanation. Answer:\n") else {
            continue;
        };
        let Some(cut) = p[k..].find("\n\n").map(|c| k + c + 2) else {
            continue;
        };
        let few = answer(&set.explain(Prompt::Completion(p)));
        let zero = answer(&set.explain(Prompt::Completion(&p[cut..])));
        n += 1;
        tag += usize::from(few.family == zero.family);
        level += usize::from(few.level == zero.level);
    }
    json!({"rows": n, "family_same": tag as f64 / n.max(1) as f64,
           "level_same": level as f64 / n.max(1) as f64})
}

fn main() -> Result<()> {
    let args = Args::parse();
    let set = ClassifierSet::builtin();
    let rows = rows::load(&args.data)?;
    eprintln!("classifying {} rows", rows.len());
    let answers: Vec<Answer> = rows.iter().map(|r| classify(&set, r)).collect();
    let mut families: BTreeMap<&str, (Vec<&Row>, Vec<&Answer>)> = BTreeMap::new();
    for (r, a) in rows.iter().zip(&answers) {
        let e = families.entry(r.family.as_str()).or_default();
        e.0.push(r);
        e.1.push(a);
    }
    let per_family: BTreeMap<&str, Value> = families
        .iter()
        .map(|(f, (r, a))| (*f, family_report(r, a)))
        .collect();
    // Calibration where the shipped model saw no labels: test-only rows.
    let test_only: Vec<usize> = (0..rows.len()).filter(|&i| !rows[i].train_ok).collect();
    let conf: Vec<f32> = test_only.iter().map(|&i| answers[i].confidence).collect();
    let held: Vec<bool> = test_only
        .iter()
        .map(|&i| promise_held(&answers[i].level, &rows[i]))
        .collect();
    let (test_ece, reliability) = ece(&conf, &held, 10);
    let mut report = json!({
        "families_known": FAMILIES,
        "rows": rows.len(),
        "per_family": per_family,
        "calibration_test_only": {"rows": test_only.len(), "ece": test_ece,
                                  "reliability": reliability},
        "everyday": everyday(&set, &args.everyday)?,
        "winogrande": winogrande(&set, &rows),
    });
    if let Some(p) = &args.python_predictions {
        report["parity"] = parity(&rows, &answers, p)?;
    }
    if let Some(dir) = args.out.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    eprintln!(
        "everyday {}/{}; wrote {}",
        report["everyday"]["correct"],
        report["everyday"]["n"],
        args.out.display()
    );
    Ok(())
}
