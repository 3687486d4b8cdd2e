//! The hand-written WordPiece against the `tokenizers` crate on the text the static embedding
//! reads (at most 2 KiB of the final question), to show why the request path does not call
//! `tokenizers`:
//!
//!     cargo bench -p kinference-classify --features wordpiece-reference --bench wordpiece
//!
//! Both tokenizers are built from the same compiled-in vocabulary; `tests/wordpiece.rs` checks
//! that they give the same ids.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use kinference_classify::wordpiece;

fn texts() -> [(&'static str, String); 3] {
    let para = "The quarterly report shows revenue of 4,120 units across 12 regions. Explain the \
                variance step by step, then write a function `fn variance(xs: &[f64]) -> f64 { ... }` \
                that computes it, and ensure it handles empty input. Contact ops@example.com. ";
    let mut long = String::new();
    while long.len() < 2048 {
        long.push_str(para);
    }
    long.truncate(2048);
    [
        ("short", "What is the capital of France?".to_string()),
        ("2KiB_english", long),
        (
            "mixed_script",
            "Traduis en français : « Где находится ближайшая станция метро? » 東京駅はどこですか。"
                .repeat(8),
        ),
    ]
}

fn bench(c: &mut Criterion) {
    let ours = wordpiece::minilm();
    let theirs = wordpiece::reference();
    let mut g = c.benchmark_group("wordpiece");
    for (name, text) in texts() {
        assert_eq!(
            ours.encode(&text),
            theirs
                .encode(text.as_str(), false)
                .expect("encodes")
                .get_ids(),
            "{name}"
        );
        g.bench_function(format!("hand_written/{name}"), |b| {
            b.iter(|| ours.encode(black_box(&text)))
        });
        g.bench_function(format!("tokenizers/{name}"), |b| {
            b.iter(|| theirs.encode(black_box(text.as_str()), false))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
