//! Cost of the default classifier set (complexity, family and every detector) per request, on a
//! short chat turn and on a ~4,000-token prompt, plus the exemplar and rules classifiers, and of
//! each classifier alone.
//!
//!     cargo bench -p kinference-classify --bench classify
//!
//! After criterion's estimates it prints p50/p99/p99.9 from a separate loop of individually timed
//! calls, in wall time and in thread CPU time (which leaves out time spent descheduled, the bulk of
//! the wall-time tail on a machine shared with builds). With `KINFERENCE_BENCH_JSON=FILE` it also
//! writes those percentiles (and the machine's load average) as JSON, which `just classify-eval`
//! renders into `docs/benchmarks/classification.md`; with `KINFERENCE_BENCH_PERCENTILES_ONLY=1` it
//! skips criterion and runs only the percentile loops.

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

/// One case's percentiles, in µs.
#[derive(Debug)]
struct Percentiles {
    name: String,
    wall: [f64; 3],
    cpu: [f64; 3],
}

// A latency benchmark reads the OS clock itself (the clock rule is for code that tests pause).
#[allow(clippy::disallowed_methods)]
fn percentiles(name: &str, mut f: impl FnMut()) -> Percentiles {
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
    let p = Percentiles {
        name: name.to_string(),
        wall: [at(&wall, 0.5), at(&wall, 0.99), at(&wall, 0.999)],
        cpu: [at(&cpu, 0.5), at(&cpu, 0.99), at(&cpu, 0.999)],
    };
    println!(
        "{name}: wall p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs; thread CPU p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs (20,000 calls)",
        p.wall[0], p.wall[1], p.wall[2], p.cpu[0], p.cpu[1], p.cpu[2]
    );
    p
}

/// The 1-, 5- and 15-minute load averages, when the OS says.
fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

fn write_json(path: &str, results: &[Percentiles]) {
    let cases: Vec<String> = results
        .iter()
        .map(|p| {
            format!(
                "{{\"case\": {:?}, \"wall_us\": [{:.2}, {:.2}, {:.2}], \"cpu_us\": [{:.2}, {:.2}, {:.2}]}}",
                p.name, p.wall[0], p.wall[1], p.wall[2], p.cpu[0], p.cpu[1], p.cpu[2]
            )
        })
        .collect();
    let json = format!(
        "{{\"calls_per_case\": 20000, \"percentiles\": [50, 99, 99.9], \"load_average\": {:?}, \"cpus\": {}, \"cases\": [\n  {}\n]}}\n",
        load_average().unwrap_or_default(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cases.join(",\n  ")
    );
    std::fs::write(path, json).expect("write the benchmark JSON");
}

fn main() {
    if std::env::var_os("KINFERENCE_BENCH_PERCENTILES_ONLY").is_none() {
        benches();
        Criterion::default().configure_from_args().final_summary();
    }
    let mut results = Vec::new();
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
    results.push(percentiles("default_set/short_chat_turn", || {
        black_box(builtin.classify(black_box(Prompt::Chat(&short_chat))));
    }));
    results.push(percentiles("default_set/4k_token_prompt", || {
        black_box(builtin.classify(black_box(Prompt::Chat(&long_chat))));
    }));
    results.push(percentiles(
        "default_plus_rules_exemplars/4k_token_prompt",
        || {
            black_box(custom.classify(black_box(Prompt::Chat(&long_chat))));
        },
    ));
    // Each classifier alone on the long prompt (the code, math and PII detectors share one scan
    // of the text, and complexity and family one analysis, when they run together, so these do
    // not add up to the set).
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
    let builtin_tags = ClassifierDefinition::builtin().tags;
    for tag in &builtin_tags {
        parts.push((
            format!("tag {}", tag.name),
            alone(vec![], vec![tag.clone()]),
        ));
    }
    parts.push((
        "complexity and family".into(),
        alone(vec![], builtin_tags.clone()),
    ));
    for (name, set) in &parts {
        results.push(percentiles(
            &format!("alone/{name}/4k_token_prompt"),
            || {
                black_box(set.classify(black_box(Prompt::Chat(&long_chat))));
            },
        ));
    }
    // The complexity analysis step by step, on the same prompt as the set reads it.
    let turn = format!("{}\n{}", &long[..4096], &long[long.len() - 4096..]);
    let question = kinference_classify::question::final_question(&turn);
    let embedded = &question[..2048];
    let model = kinference_classify::complexity::default_model();
    results.push(percentiles("step/final_question/8KiB", || {
        black_box(kinference_classify::question::final_question(black_box(
            &turn,
        )));
    }));
    results.push(percentiles("step/wordpiece/2KiB", || {
        black_box(model.wordpiece.encode(black_box(embedded)));
    }));
    let ids = model.wordpiece.encode(embedded);
    results.push(percentiles("step/static_embedding/2KiB", || {
        black_box(model.table.embed(black_box(&ids)));
    }));
    results.push(percentiles("step/dense_features/8KiB", || {
        black_box(kinference_classify::complexity::features::dense(black_box(
            &question,
        )));
    }));
    results.push(percentiles("step/hashed_words", || {
        black_box(kinference_classify::complexity::features::hashed_words(
            black_box(&question),
        ));
    }));
    results.push(percentiles("step/whole_analysis/8KiB", || {
        black_box(model.analyse(black_box(&turn)));
    }));
    if let Some(path) = std::env::var_os("KINFERENCE_BENCH_JSON") {
        write_json(&path.to_string_lossy(), &results);
    }
}
