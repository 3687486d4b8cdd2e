//! `kinference-classify-eval`: routing quality of the compiled-in complexity model on the held-out
//! split of RouteLLM's MMLU and GSM8K prompts (contaminated prompts excluded).
//!
//! Writes `classification/curve_<dataset>.csv` and `classification/quality.json` under `--out`, and
//! replaces the quality section of `--out/classification.md` between its markers.
//!
//!     cargo run --release -p kinference-classify --bin kinference-classify-eval -- \
//!         --data ../shared/classify --out docs/benchmarks

use anyhow::{Context, Result, bail};
use clap::Parser;
use kinference_classify::{
    ClassifierSet, Limits, Prompt,
    complexity::{self, model::Model, quality, train::Outcome},
    dataset::{self, Dataset, Split},
};
use std::{fmt::Write as _, path::PathBuf};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value = "../shared/classify")]
    data: PathBuf,
    #[arg(long, default_value = "docs/benchmarks")]
    out: PathBuf,
    /// Evaluate this weights file instead of the compiled-in one (levels from its thresholds).
    #[arg(long)]
    weights: Option<PathBuf>,
}

const BEGIN: &str = "<!-- quality:begin (written by kinference-classify-eval) -->";
const END: &str = "<!-- quality:end -->";

/// RouteLLM's published GPT-4 call reduction at 95% of GPT-4's quality (arXiv 2406.18665).
fn published(d: Dataset) -> f32 {
    match d {
        Dataset::Mmlu => 0.45,
        Dataset::Gsm8k => 0.35,
    }
}

#[derive(serde::Serialize)]
struct Report {
    dataset: String,
    test_prompts: usize,
    contaminated_excluded: usize,
    weak_accuracy: f32,
    strong_accuracy: f32,
    auc: f32,
    /// 95% bootstrap interval (1,000 resamples of the test prompts, fixed seed).
    auc_ci95: (f32, f32),
    weak_share_at_95: f32,
    weak_share_at_95_ci95: (f32, f32),
    random_weak_share_at_95: f32,
    routellm_published_at_95: f32,
    low_share: f32,
    low_prompts: usize,
    weak_accuracy_on_low: f32,
    strong_accuracy_on_low: f32,
    high_share: f32,
    weak_accuracy_on_high: f32,
    strong_accuracy_on_high: f32,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rows = dataset::load(&args.data).context("loading the labelled prompts")?;
    let set = args.weights.is_none().then(ClassifierSet::builtin);
    let model = match &args.weights {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            Some(Model::from_json(&bytes).with_context(|| format!("loading {}", path.display()))?)
        }
        None => None,
    };
    let dir = args.out.join("classification");
    std::fs::create_dir_all(&dir)?;
    let mut reports = Vec::new();
    for d in [Dataset::Mmlu, Dataset::Gsm8k] {
        let test: Vec<_> = rows
            .iter()
            .filter(|r| r.dataset == d && r.split() == Split::Test)
            .collect();
        let contaminated = test.iter().filter(|r| r.contaminated).count();
        let mut outcomes = Vec::new();
        let mut levels = Vec::new();
        for r in test.iter().filter(|r| !r.contaminated) {
            let prompt = Prompt::Completion(&r.prompt);
            let (score, level) = match &model {
                Some(m) => {
                    let s = m.score_prompt(prompt, Limits::default());
                    (s, complexity::level(s, m.thresholds).0.to_string())
                }
                None => {
                    let Some(set) = &set else {
                        bail!("no classifier set")
                    };
                    let e = set.explain(prompt);
                    let Some(c) = e.get("complexity") else {
                        bail!("no complexity tag")
                    };
                    (c.score.unwrap_or(0.0), c.tag.value.clone())
                }
            };
            outcomes.push(Outcome {
                score,
                weak_correct: r.weak_correct,
                strong_correct: r.strong_correct,
            });
            levels.push(level);
        }
        let pick = |level: &str| -> Vec<Outcome> {
            outcomes
                .iter()
                .zip(&levels)
                .filter(|(_, l)| *l == level)
                .map(|(o, _)| *o)
                .collect()
        };
        let (low, high) = (pick("low"), pick("high"));
        let n = outcomes.len() as f32;
        let report = Report {
            dataset: d.to_string(),
            test_prompts: outcomes.len(),
            contaminated_excluded: contaminated,
            weak_accuracy: quality::weak_accuracy(&outcomes),
            strong_accuracy: quality::strong_accuracy(&outcomes),
            auc: quality::auc(&outcomes),
            auc_ci95: quality::bootstrap_ci95(&outcomes, 1000, 0x5eed, quality::auc),
            weak_share_at_95: quality::weak_share_at_quality(&outcomes, 0.95),
            weak_share_at_95_ci95: quality::bootstrap_ci95(&outcomes, 1000, 0x5eed, |o| {
                quality::weak_share_at_quality(o, 0.95)
            }),
            random_weak_share_at_95: quality::random_weak_share_at_quality(&outcomes, 0.95),
            routellm_published_at_95: published(d),
            low_share: low.len() as f32 / n,
            low_prompts: low.len(),
            weak_accuracy_on_low: quality::weak_accuracy(&low),
            strong_accuracy_on_low: quality::strong_accuracy(&low),
            high_share: high.len() as f32 / n,
            weak_accuracy_on_high: quality::weak_accuracy(&high),
            strong_accuracy_on_high: quality::strong_accuracy(&high),
        };
        let mut csv = String::from("weak_share,accuracy,random_accuracy\n");
        for p in quality::curve(&outcomes, 100) {
            writeln!(
                csv,
                "{:.2},{:.5},{:.5}",
                p.weak_share, p.accuracy, p.random_accuracy
            )?;
        }
        std::fs::write(
            dir.join(format!("curve_{}.csv", d.to_string().to_lowercase())),
            csv,
        )?;
        reports.push(report);
    }
    std::fs::write(
        dir.join("quality.json"),
        serde_json::to_string_pretty(&reports)?,
    )?;

    let pct = |x: f32| format!("{:.1}%", 100.0 * x);
    let mut md = String::new();
    writeln!(md, "{BEGIN}")?;
    writeln!(
        md,
        "| dataset | test prompts (contaminated excluded) | weak acc | strong acc | AUC (needs strong) [95% CI] | weak share at 95% of strong: classifier [95% CI] | random | RouteLLM published | tagged low (prompts) | weak acc on low | strong acc on low | tagged high | weak / strong acc on high |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    for r in &reports {
        writeln!(
            md,
            "| {} | {} ({}) | {} | {} | {:.3} [{:.3}, {:.3}] | {} [{}, {}] | {} | {} | {} ({}) | {} | {} | {} | {} / {} |",
            r.dataset,
            r.test_prompts,
            r.contaminated_excluded,
            pct(r.weak_accuracy),
            pct(r.strong_accuracy),
            r.auc,
            r.auc_ci95.0,
            r.auc_ci95.1,
            pct(r.weak_share_at_95),
            pct(r.weak_share_at_95_ci95.0),
            pct(r.weak_share_at_95_ci95.1),
            pct(r.random_weak_share_at_95),
            pct(r.routellm_published_at_95),
            pct(r.low_share),
            r.low_prompts,
            pct(r.weak_accuracy_on_low),
            pct(r.strong_accuracy_on_low),
            pct(r.high_share),
            pct(r.weak_accuracy_on_high),
            pct(r.strong_accuracy_on_high),
        )?;
    }
    writeln!(md, "{END}")?;
    print!("{md}");

    let doc = args.out.join("classification.md");
    let old = std::fs::read_to_string(&doc).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{}{}", &old[..b], md.trim_end(), &old[e + END.len()..])
        }
        _ => format!("{old}\n{md}"),
    };
    std::fs::write(&doc, new).with_context(|| format!("writing {}", doc.display()))?;
    eprintln!("wrote {} and {}", doc.display(), dir.display());
    Ok(())
}
