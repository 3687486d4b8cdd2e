//! Prefix hashing throughput and approximate-index lookup across 64 endpoints.

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use kinference_routing::{ApproxConfig, PromptBlocks, prefix::ApproxIndex};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn text(seed: u64, bytes: usize, shared: &str) -> Vec<u8> {
    let mut v = shared.as_bytes().to_vec();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    while v.len() < bytes {
        v.push(b'a' + rng.random_range(0..26u8));
    }
    v
}

fn prefix(c: &mut Criterion) {
    let cfg = ApproxConfig::default();
    let mut g = c.benchmark_group("prefix");
    for bytes in [4_000usize, 32_000, 256_000] {
        let t = text(1, bytes, "");
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(format!("hash_{bytes}_bytes"), |b| {
            b.iter(|| PromptBlocks::from_text(black_box(&t), &cfg))
        });
    }

    // 64 endpoints, 16 system prompts of 16,000 bytes spread over them, 1,024 prompts recorded.
    let mut index = ApproxIndex::default();
    for slot in 0..64 {
        index.add_endpoint(slot, 20_000);
    }
    let systems: Vec<String> = (0..16)
        .map(|s| format!("system {s:03} ").repeat(1_600))
        .collect();
    for k in 0..1_024u64 {
        let t = text(k, 32_000, &systems[(k % 16) as usize]);
        index.record((k % 64) as u32, &PromptBlocks::from_text(&t, &cfg));
    }
    let probe = PromptBlocks::from_text(&text(7_777, 32_000, &systems[5]), &cfg);
    assert!((0..64).any(|s| index.lookup(&probe).blocks(s) > 0));
    g.throughput(Throughput::Elements(1));
    g.bench_function("lookup_64_endpoints_8000_tokens", |b| {
        b.iter(|| index.lookup(black_box(&probe)))
    });
    g.bench_function("record_8000_tokens", |b| {
        b.iter(|| index.record(3, black_box(&probe)))
    });
    g.finish();
}

criterion_group!(benches, prefix);
criterion_main!(benches);
