//! Cost of the default classifier set (complexity + every detector) per request, on a short chat
//! turn and on a ~4,000-token prompt, plus the exemplar and rules classifiers.
//!
//!     cargo bench -p kinference-classify --bench classify
//!
//! After criterion's estimates it prints p50/p99/p99.9 from a separate loop of individually timed
//! calls, in wall time and in thread CPU time (which leaves out time spent descheduled, the bulk of
//! the wall-time tail on a machine shared with builds).

use criterion::{Criterion, black_box, criterion_group};
use kinference_classify::{
    ClassifierDefinition, ClassifierSet, DetectorKind, EmbeddingKind, Limits, Prompt, Role,
    TagDefinition, TagKind, Turn,
    definition::{KeywordRule, RegexRule},
};
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

const SHORT: &str = "Can you explain why my Python list comprehension is slower than a for loop?";

fn long_prompt() -> String {
    // ~16,000 bytes = ~4,000 approximate tokens of mixed prose, code and numbers.
    let para = "The quarterly report shows revenue of 4,120 units across 12 regions. Explain the \
                variance step by step, then write a function `fn variance(xs: &[f64]) -> f64 { ... }` \
                that computes it, and ensure it handles empty input. Contact ops@example.com. ";
    let mut s = String::new();
    while s.len() < 16_000 {
        s.push_str(para);
    }
    s
}

fn custom_set() -> ClassifierSet {
    let mut examples = BTreeMap::new();
    examples.insert(
        "billing".to_string(),
        vec!["I was charged twice on my invoice".to_string(); 8],
    );
    examples.insert(
        "outage".to_string(),
        vec!["The API is down and returns 503 errors".to_string(); 8],
    );
    let mut def = ClassifierDefinition::builtin();
    def.tags.push(TagDefinition {
        name: "topic".into(),
        kind: TagKind::Exemplars {
            examples,
            k: 3,
            min_similarity: 0.2,
            embedding: EmbeddingKind::Static,
        },
    });
    def.tags.push(TagDefinition {
        name: "legal".into(),
        kind: TagKind::Rules {
            value: "true".into(),
            otherwise: Some("false".into()),
            keywords: vec![KeywordRule {
                values: ["contract", "liability", "indemnity", "clause", "NDA"]
                    .map(String::from)
                    .to_vec(),
                weight: 0.7,
                case_sensitive: false,
            }],
            regexes: vec![RegexRule {
                patterns: vec![r"(?i)\bsection \d+(\.\d+)*".into()],
                weight: 1.0,
            }],
            min_confidence: 0.5,
        },
    });
    def.limits = Limits::default();
    ClassifierSet::new(&def).expect("valid")
}

fn bench(c: &mut Criterion) {
    let builtin = ClassifierSet::builtin();
    let custom = custom_set();
    let long = long_prompt();
    let short_chat = [
        Turn {
            role: Role::System,
            text: "You are a helpful assistant.",
        },
        Turn {
            role: Role::User,
            text: SHORT,
        },
    ];
    let long_chat = [Turn {
        role: Role::User,
        text: long.as_str(),
    }];
    let mut g = c.benchmark_group("classify");
    g.bench_function("default_set/short_chat_turn", |b| {
        b.iter(|| builtin.classify(black_box(Prompt::Chat(&short_chat))))
    });
    g.bench_function("default_set/4k_token_prompt", |b| {
        b.iter(|| builtin.classify(black_box(Prompt::Chat(&long_chat))))
    });
    g.bench_function("default_plus_rules_exemplars/4k_token_prompt", |b| {
        b.iter(|| custom.classify(black_box(Prompt::Chat(&long_chat))))
    });
    g.bench_function("default_set/explain_short_chat_turn", |b| {
        b.iter(|| builtin.explain(black_box(Prompt::Chat(&short_chat))))
    });
    g.finish();
}

criterion_group!(benches, bench);

/// Thread CPU time now: unlike wall time, it does not count the time the thread waits descheduled
/// on a busy machine.
fn cpu_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn percentiles(name: &str, mut f: impl FnMut()) {
    for _ in 0..1_000 {
        f();
    }
    let (mut wall, mut cpu): (Vec<u128>, Vec<u128>) = (0..20_000)
        .map(|_| {
            let (t, c) = (Instant::now(), cpu_now());
            f();
            let c = cpu_now().saturating_sub(c);
            (t.elapsed().as_nanos(), c.as_nanos())
        })
        .unzip();
    wall.sort_unstable();
    cpu.sort_unstable();
    let at = |v: &[u128], q: f64| v[((v.len() as f64 - 1.0) * q) as usize] as f64 / 1000.0;
    println!(
        "{name}: wall p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs; thread CPU p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs (20,000 calls)",
        at(&wall, 0.5),
        at(&wall, 0.99),
        at(&wall, 0.999),
        at(&cpu, 0.5),
        at(&cpu, 0.99),
        at(&cpu, 0.999)
    );
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let builtin = ClassifierSet::builtin();
    let custom = custom_set();
    let long = long_prompt();
    let short_chat = [
        Turn {
            role: Role::System,
            text: "You are a helpful assistant.",
        },
        Turn {
            role: Role::User,
            text: SHORT,
        },
    ];
    let long_chat = [Turn {
        role: Role::User,
        text: long.as_str(),
    }];
    percentiles("default_set/short_chat_turn", || {
        black_box(builtin.classify(black_box(Prompt::Chat(&short_chat))));
    });
    percentiles("default_set/4k_token_prompt", || {
        black_box(builtin.classify(black_box(Prompt::Chat(&long_chat))));
    });
    percentiles("default_plus_rules_exemplars/4k_token_prompt", || {
        black_box(custom.classify(black_box(Prompt::Chat(&long_chat))));
    });
    // Each classifier alone on the long prompt (the code and math detectors and complexity share
    // one scan of the text when they run together, so these do not add up to the set).
    let alone = |detectors: Vec<DetectorKind>, tags: Vec<TagDefinition>| {
        ClassifierSet::new(&ClassifierDefinition {
            detectors,
            tags,
            limits: Limits::default(),
        })
        .expect("valid")
    };
    let mut parts: Vec<(String, ClassifierSet)> = DetectorKind::ALL
        .iter()
        .map(|d| (format!("detector {}", d.as_str()), alone(vec![*d], vec![])))
        .collect();
    parts.push((
        "complexity".into(),
        alone(vec![], ClassifierDefinition::builtin().tags),
    ));
    for (name, set) in &parts {
        percentiles(&format!("alone/{name}/4k_token_prompt"), || {
            black_box(set.classify(black_box(Prompt::Chat(&long_chat))));
        });
    }
}
