//! `kinference-guard-replay`: the quality guard over a labelled replay.
//!
//! Every labelled row (`scripts/classify/fetch_sets.py` writes them) becomes one request for the
//! strong model, in an order shuffled with a fixed seed, so that the benchmarks' prompts are
//! interleaved as a platform's traffic is. The shipped classifier tags it, and the example rule
//! applies: `complexity=low` at confidence 0.5 or more may be served by the weak model, and is
//! (the cost objective at idle moves every such request). The guard is the product's own
//! [`GuardBook`], keyed by the classifier's family tag; a sampled request's verdict comes from
//! the row's labels, as the judge stand-in of `proxy/tests/quality_guard.rs` gives it: the
//! strong model's answer better (`q_strong > q_weak`), the weak model's, or a tie.
//!
//! It prints, per family tag and overall, what the rule moves with and without the guard and the
//! quality kept: the summed quality of the answers served over the all-strong quality. The
//! recorded run is in `docs/benchmarks/classification.md` (`just guard-replay DATA`).

use anyhow::{Context, Result};
use clap::Parser;
use kinference_classify::ClassifierSet;
use kinference_classify_tools::rows::{self, Row};
use kinference_decision::guard::{
    GuardBook, GuardKey, GuardState, Hold, Judge, QualityGuard, Verdict,
};
use rand::{Rng, SeedableRng, seq::SliceRandom};
use serde_json::json;
use std::{collections::BTreeMap, path::PathBuf, time::Duration};

#[derive(Parser, Debug)]
#[command(
    about = "Replays labelled prompts through the classifier, the example rule and its quality guard"
)]
struct Args {
    /// The rows' directory (`fetch_sets.py --out`).
    #[arg(long)]
    data: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 0.1)]
    sample_share: f64,
    #[arg(long, default_value_t = 0.05)]
    tolerance: f64,
    #[arg(long, default_value_t = 50)]
    min_samples: u32,
    #[arg(long, default_value_t = 0.1)]
    capped_share: f64,
    #[arg(long, default_value_t = 200)]
    window: u32,
    /// Which requests the rule applies to: `low` (the example rule: complexity=low at
    /// confidence 0.5 or more) or `all` (a rule that widens every request).
    #[arg(long, default_value = "low")]
    applies_to: String,
    /// Write the results as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// What one family tag (or the total) saw.
#[derive(Default, Debug)]
struct Tally {
    requests: u64,
    /// Requests the rule applied to.
    applied: u64,
    moved_guarded: u64,
    capped: u64,
    suspended: u64,
    sampled: u64,
    /// Summed answer quality: all strong, the rule alone, the rule with the guard.
    q_strong: f64,
    q_rule: f64,
    q_guarded: f64,
    /// Over the requests the rule applied to: summed weak and strong quality.
    applied_q_weak: f64,
    applied_q_strong: f64,
    /// Over the requests the guarded rule moved.
    moved_q_weak: f64,
    moved_q_strong: f64,
}

impl Tally {
    fn ratio(a: f64, b: f64) -> Option<f64> {
        (b > 0.0).then(|| a / b)
    }
}

fn tags(set: &ClassifierSet, row: &Row) -> (String, f32, String) {
    let e = row.explain(set);
    let c = e.get("complexity").expect("a complexity tag");
    let f = e.get("family").expect("a family tag");
    (c.tag.value.clone(), c.tag.confidence, f.tag.value.clone())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let set = ClassifierSet::builtin();
    let mut rows = rows::load(&args.data).context("loading the labelled rows")?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    rows.shuffle(&mut rng);
    let guard = QualityGuard {
        sample_share: args.sample_share,
        tolerance: args.tolerance,
        min_samples: args.min_samples,
        capped_share: args.capped_share,
        window: args.window,
        family_tag: "family".into(),
        judge: Judge {
            url: "labels".into(),
            model: "labels".into(),
            timeout: Duration::from_secs(1),
        },
    };
    let mut book = GuardBook::new();
    let mut by_family: BTreeMap<String, Tally> = BTreeMap::new();
    let mut total = Tally::default();
    let mut transitions = vec![];
    for (i, row) in rows.iter().enumerate() {
        let (level, confidence, family) = tags(&set, row);
        let applies = args.applies_to == "all" || (level == "low" && confidence >= 0.5);
        let mut served_weak = false;
        let mut outcome = None;
        if applies {
            let key = GuardKey {
                tenant: "replay".into(),
                rule: "low-complexity-may-use-weak".into(),
                family: family.clone(),
            };
            let hold = book.admit(&guard, &key, true);
            served_weak = hold.is_none();
            if rng.random_bool(guard.sample_share) {
                let verdict = if row.q_strong > row.q_weak {
                    Verdict::Requested
                } else if row.q_weak > row.q_strong {
                    Verdict::Added
                } else {
                    Verdict::Tie
                };
                if let Some(t) = book.record(&guard, &key, verdict) {
                    transitions.push(json!({
                        "request": i, "family": family, "from": t.from.as_str(),
                        "to": t.to.as_str(), "gap": t.status.gap, "samples": t.status.samples,
                    }));
                }
                outcome = Some(());
            }
            for t in [&mut total, by_family.entry(family.clone()).or_default()] {
                t.applied += 1;
                t.applied_q_weak += row.q_weak;
                t.applied_q_strong += row.q_strong;
                if served_weak {
                    t.moved_guarded += 1;
                    t.moved_q_weak += row.q_weak;
                    t.moved_q_strong += row.q_strong;
                }
                match hold {
                    Some(Hold::Capped) => t.capped += 1,
                    Some(Hold::Suspended) => t.suspended += 1,
                    None => {}
                }
                t.sampled += u64::from(outcome.is_some());
            }
        }
        for t in [&mut total, by_family.entry(family.clone()).or_default()] {
            t.requests += 1;
            t.q_strong += row.q_strong;
            t.q_rule += if applies { row.q_weak } else { row.q_strong };
            t.q_guarded += if served_weak {
                row.q_weak
            } else {
                row.q_strong
            };
        }
    }

    let states: BTreeMap<String, (GuardState, u32, Option<f64>)> = book
        .statuses(|_| Some(&guard))
        .into_iter()
        .map(|s| (s.key.family.clone(), (s.state, s.samples, s.gap)))
        .collect();
    println!(
        "{} rows, rule applies to {}, seed {}, sampleShare {}, tolerance {}, minSamples {}, cappedShare {}, window {}\n",
        rows.len(),
        args.applies_to,
        args.seed,
        guard.sample_share,
        guard.tolerance,
        guard.min_samples,
        guard.capped_share,
        guard.window
    );
    println!(
        "| family tag | requests | rule applies | moved, rule alone | moved, guarded | weak/strong on the applied | weak/strong on the moved | quality kept, rule alone | quality kept, guarded | guard at the end |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let pct = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:.1}%", v * 100.0));
    let mut out = serde_json::Map::new();
    let rows_of = by_family
        .iter()
        .map(|(f, t)| (f.clone(), t))
        .chain(std::iter::once(("all".to_string(), &total)));
    for (family, t) in rows_of {
        let end = states.get(&family).map_or("–".to_string(), |(s, n, gap)| {
            format!(
                "{} ({} samples{})",
                s.as_str(),
                n,
                gap.map_or(String::new(), |g| format!(", gap {g:.2}"))
            )
        });
        println!(
            "| {family} | {} | {} | {} | {} | {} | {} | {} | {} | {end} |",
            t.requests,
            t.applied,
            t.applied,
            t.moved_guarded,
            pct(Tally::ratio(t.applied_q_weak, t.applied_q_strong)),
            pct(Tally::ratio(t.moved_q_weak, t.moved_q_strong)),
            pct(Tally::ratio(t.q_rule, t.q_strong)),
            pct(Tally::ratio(t.q_guarded, t.q_strong)),
        );
        out.insert(
            family,
            json!({
                "requests": t.requests, "applied": t.applied, "moved_guarded": t.moved_guarded,
                "capped": t.capped, "suspended": t.suspended, "sampled": t.sampled,
                "weak_over_strong_applied": Tally::ratio(t.applied_q_weak, t.applied_q_strong),
                "weak_over_strong_moved": Tally::ratio(t.moved_q_weak, t.moved_q_strong),
                "quality_kept_rule": Tally::ratio(t.q_rule, t.q_strong),
                "quality_kept_guarded": Tally::ratio(t.q_guarded, t.q_strong),
            }),
        );
    }
    println!("\nTransitions:");
    for t in &transitions {
        println!("- {t}");
    }
    if let Some(path) = &args.json {
        let report = json!({"per_family": out, "transitions": transitions, "seed": args.seed});
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}
