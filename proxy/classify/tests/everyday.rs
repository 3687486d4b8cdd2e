//! The built-in complexity tag on labelled everyday prompts (`everyday.jsonl`: short factual,
//! greetings, thanks, translation, rewrite, simple and harder code, multi-step reasoning, design),
//! each with the level a platform team would expect.
//!
//! The goal (issue 18) is 90% at the expected level. The shipped design reaches 70 of 91
//! (76.9%), so this test holds that measured floor and the per-kind facts that are met, and
//! `docs/benchmarks/classification.md` says where and why the rest miss. Nothing in the model is
//! fitted to these prompts; raising the floor needs a better model, not a lower goal.

use kinference_classify::{ClassifierSet, Prompt, Role, Turn};
use serde::Deserialize;

#[derive(Deserialize)]
struct Everyday {
    prompt: String,
    level: String,
    kind: String,
}

/// The goal: 90% of the prompts at their expected level.
const GOAL: f64 = 0.90;
/// The measured floor (70 of 91).
const FLOOR: usize = 70;

#[test]
fn everyday_prompts_get_their_expected_level() {
    let set = ClassifierSet::builtin();
    let prompts: Vec<Everyday> = include_str!("everyday.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut right = 0;
    let mut misses = Vec::new();
    for e in &prompts {
        let turns = [Turn {
            role: Role::User,
            text: &e.prompt,
        }];
        let tags = set.classify(Prompt::Chat(&turns));
        let c = tags.get("complexity").unwrap();
        if c.value == e.level {
            right += 1;
        } else {
            misses.push(format!(
                "{} ({}): {} not {}",
                e.prompt, e.kind, c.value, e.level
            ));
        }
        // The everyday short requests a policy would move are `low` and confident enough for the
        // example rule's minConfidence 0.5.
        if ["greeting", "thanks", "short-factual", "simple-math"].contains(&e.kind.as_str()) {
            assert_eq!(c.value, "low", "{}", e.prompt);
            assert!(c.confidence > 0.5, "{}: {}", e.prompt, c.confidence);
        }
    }
    let share = right as f64 / prompts.len() as f64;
    eprintln!(
        "{right}/{} ({:.1}%) at the expected level; goal {:.0}%. Misses:\n{}",
        prompts.len(),
        100.0 * share,
        100.0 * GOAL,
        misses.join("\n")
    );
    assert_eq!(prompts.len(), 91);
    assert!(
        right >= FLOOR,
        "{right} of {} at the expected level, under the measured floor {FLOOR}",
        prompts.len()
    );
}

#[test]
fn the_readme_example_and_greetings_are_low() {
    let set = ClassifierSet::builtin();
    for text in [
        "What is the capital of France?",
        "What is 2+2?",
        "hi",
        "Thanks!",
    ] {
        let tags = set.classify(Prompt::Completion(text));
        let c = tags.get("complexity").unwrap();
        assert_eq!(c.value, "low", "{text}");
        assert!(
            tags.matches("complexity", "low", 0.5),
            "{text}: {}",
            c.confidence
        );
    }
}
