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
use tokenizers::{
    Tokenizer, models::wordpiece::WordPiece, normalizers::BertNormalizer,
    pre_tokenizers::bert::BertPreTokenizer,
};

const VOCAB: &str = include_str!("../model/minilm-vocab.txt");

fn reference() -> Tokenizer {
    let vocab: ahash::AHashMap<String, u32> = VOCAB
        .lines()
        .enumerate()
        .map(|(i, p)| (p.to_string(), i as u32))
        .collect();
    let model = WordPiece::builder()
        .vocab(vocab)
        .unk_token("[UNK]".into())
        .continuing_subword_prefix("##".into())
        .max_input_chars_per_word(100)
        .build()
        .expect("a WordPiece model");
    let mut t = Tokenizer::new(model);
    t.with_normalizer(Some(BertNormalizer::new(true, true, None, true)));
    t.with_pre_tokenizer(Some(BertPreTokenizer));
    t
}

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
    let theirs = reference();
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
