//! Prefix hashing throughput, approximate-index lookup across 64 endpoints (partly filled, and
//! full so that recording evicts), and the precise mirrors: a full mirror's lookup and a stored
//! batch that must evict.

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use kinference_routing::{
    ApproxConfig, KvEvent, PromptBlocks,
    prefix::{ApproxIndex, PreciseIndex},
};
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

/// 64 full approximate indexes of 8,192 chunks (the `sidecar_memory --approx` fill: prompts of
/// 256 chunks, the first 128 one of 32 shared system prompts): a lookup of a prompt whose system
/// prompt most endpoints hold, and recording a new prompt (128 chunks new, each evicting one).
fn approx_full(c: &mut Criterion) {
    let mut g = c.benchmark_group("approx_full");
    let mix = |x: u64| {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut next = 1u64 << 62;
    let mut prompt = |system: u64| {
        let hashes: Vec<u64> = (0..256u64)
            .map(|i| {
                if i < 128 {
                    mix((system << 32) | i)
                } else {
                    next += 1;
                    mix(next)
                }
            })
            .collect();
        PromptBlocks::from_hashes(hashes, 16)
    };
    let mut index = ApproxIndex::default();
    for slot in 0..64 {
        index.add_endpoint(slot, 8_192);
    }
    for k in 0..64 * 64u64 {
        index.record((k % 64) as u32, &prompt(mix(k) % 32));
    }
    let probe = prompt(5);
    let m = index.lookup(&probe);
    assert!((0..64).filter(|&s| m.blocks(s) == 128).count() > 40);
    g.throughput(Throughput::Elements(1));
    g.bench_function("lookup_64_endpoints_256_chunks", |b| {
        b.iter(|| index.lookup(black_box(&probe)))
    });
    let mut k = 0u64;
    g.bench_function("record_256_chunks_128_new", |b| {
        b.iter_batched(
            || {
                k += 1;
                ((k % 64) as u32, prompt(mix(k) % 32))
            },
            |(slot, p)| index.record(slot, black_box(&p)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// 64 full mirrors of 32,768 blocks (2 M hashes): a 500-block prompt held by one endpoint, looked
/// up at all 64 (what one decision asks), and one endpoint storing 64 blocks past capacity.
fn precise(c: &mut Criterion) {
    let mut g = c.benchmark_group("precise");
    let blocks = 32_768u64;
    let stored = |from: u64, n: u64| KvEvent::BlockStored {
        block_hashes: (from..from + n)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect(),
        parent_block_hash: None,
        token_ids: Vec::new(),
        block_size: 16,
    };
    let mut mirrors: Vec<PreciseIndex> = (0..64u64)
        .map(|e| {
            let mut ix = PreciseIndex::new(16, blocks as usize);
            ix.apply(&stored(e << 32, blocks));
            ix
        })
        .collect();
    let prompt: Vec<u64> = (0..500u64)
        .map(|i| ((5u64 << 32) + i).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    assert_eq!(mirrors[5].leading_blocks(&prompt), 500);
    g.throughput(Throughput::Elements(1));
    g.bench_function("lookup_64_full_mirrors_500_blocks", |b| {
        b.iter(|| {
            mirrors
                .iter()
                .map(|m| m.leading_tokens(black_box(&prompt)))
                .sum::<u64>()
        })
    });
    let mut next = 1u64 << 40;
    g.bench_function("store_64_blocks_into_a_full_mirror", |b| {
        b.iter(|| {
            mirrors[0].apply(&stored(next, 64));
            next += 64;
        })
    });
    g.finish();
}

criterion_group!(benches, prefix, approx_full, precise);
criterion_main!(benches);
