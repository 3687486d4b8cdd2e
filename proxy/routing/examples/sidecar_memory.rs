//! What a sidecar's routing state costs in memory with full prefix knowledge (issue 21's goal:
//! at most 64 MiB with 64 endpoints; `docs/benchmarks/signals-sizing.md`).
//!
//! Builds the proxy's router with `--endpoints` endpoints, tells each its cache (`--blocks` GPU
//! blocks of 16 tokens) as a scrape would, and fills every endpoint's precise index to capacity
//! with KV-event batches of distinct block hashes: the most a mirror can hold, whichever way the
//! events arrive (the engines' own publishers or the signal service's deltas). Prints the
//! process's resident memory before and after (Linux `/proc/self/status`), so the figure includes
//! the allocator's overhead. The approximate index is left empty: with precise knowledge it is not
//! consulted for these endpoints.
//!
//! With `--approx`, the approximate index is filled instead, as for endpoints without KV events:
//! `--endpoints` endpoints of `--blocks` chunks each (16-token chunks, so a cache of `--blocks`
//! 16-token blocks), each recording prompts of `--prompt-chunks` chunks, round robin, until it has
//! recorded `--rounds` times its capacity (so it has evicted and is in its steady state). Each
//! prompt starts with one of `--systems` system prompts of `--system-chunks` chunks, drawn at
//! random and so shared across endpoints; the rest of it is distinct. The state measured is the
//! `ApproxIndex` alone (the router holds one for all endpoints).
//!
//! ```text
//! cargo run --release -p kinference-routing --example sidecar_memory -- --endpoints 64 --blocks 8192
//! cargo run --release -p kinference-routing --example sidecar_memory -- --approx --endpoints 64 --blocks 8192
//! ```

use kinference_routing::{
    EndpointId, EndpointMeta, KvEvent, PromptBlocks, Router, RouterConfig, Scrape, Time,
    endpoint::CacheConfig, prefix::ApproxIndex,
};

fn arg(name: &str, default: usize) -> usize {
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == name {
            return it
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"));
        }
    }
    default
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn flag(name: &str) -> bool {
    std::env::args().skip(1).any(|a| a == name)
}

/// splitmix64: distinct, uniform synthetic chunk hashes.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn approx(endpoints: usize, blocks: usize) {
    let systems = arg("--systems", 32) as u64;
    let system_chunks = arg("--system-chunks", 128) as u64;
    let prompt_chunks = arg("--prompt-chunks", 256) as u64;
    let rounds = arg("--rounds", 2);
    let before = rss_kib();
    let mut index = ApproxIndex::default();
    for slot in 0..endpoints as u32 {
        // As the router does: the default capacity first, the real one once a scrape tells it.
        index.add_endpoint(slot, 31_250);
        index.set_capacity(slot, blocks);
    }
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next_distinct = 1u64 << 62;
    let mut recorded = vec![0usize; endpoints];
    let mut prompts = 0u64;
    while recorded.iter().any(|&r| r < rounds * blocks) {
        for (slot, recorded) in recorded.iter_mut().enumerate() {
            rng = mix(rng);
            let system = rng % systems.max(1);
            let hashes: Vec<u64> = (0..prompt_chunks)
                .map(|i| {
                    if i < system_chunks {
                        mix((system << 32) | i)
                    } else {
                        next_distinct += 1;
                        mix(next_distinct)
                    }
                })
                .collect();
            index.record(slot as u32, &PromptBlocks::from_hashes(hashes, 16));
            *recorded += prompt_chunks as usize;
            prompts += 1;
        }
    }
    let after = rss_kib();
    let held: usize = (0..endpoints as u32).map(|s| index.held_blocks(s)).sum();
    let distinct = index.distinct_blocks();
    let mib = |kib: u64| kib as f64 / 1024.0;
    let bytes = after.saturating_sub(before) * 1024;
    println!(
        "approximate: endpoints {endpoints}, {blocks} chunks each, {prompts} prompts of {prompt_chunks} chunks ({system_chunks} from one of {systems} system prompts)"
    );
    println!(
        "held: {held} endpoint-chunks ({:.1} % of capacity), {distinct} distinct chunks ({:.1} % of held)",
        100.0 * held as f64 / (endpoints * blocks).max(1) as f64,
        100.0 * distinct as f64 / held.max(1) as f64
    );
    println!(
        "resident: {:.1} MiB before, {:.1} MiB after: {:.1} MiB for the routing state ({:.0} bytes per endpoint-chunk, {:.0} per distinct chunk)",
        mib(before),
        mib(after),
        mib(after.saturating_sub(before)),
        bytes as f64 / held.max(1) as f64,
        bytes as f64 / distinct.max(1) as f64
    );
    // What the record still answers: each system prompt's leading chunks at each endpoint.
    let (mut whole, mut chunks) = (0usize, 0u64);
    for system in 0..systems {
        let hashes = (0..system_chunks)
            .map(|i| mix((system << 32) | i))
            .collect();
        let m = index.lookup(&PromptBlocks::from_hashes(hashes, 16));
        for slot in 0..endpoints as u32 {
            whole += usize::from(u64::from(m.blocks(slot)) == system_chunks);
            chunks += u64::from(m.blocks(slot));
        }
    }
    let pairs = (endpoints as u64 * systems).max(1);
    println!(
        "system prompts held whole: {whole} of {pairs} (endpoint, system) pairs; {:.1} of {system_chunks} leading chunks on average",
        chunks as f64 / pairs as f64
    );
    std::hint::black_box(&index);
}

fn main() {
    let endpoints = arg("--endpoints", 64);
    let blocks = arg("--blocks", 8192);
    if flag("--approx") {
        return approx(endpoints, blocks);
    }
    let before = rss_kib();
    let mut router = Router::new(RouterConfig::default());
    let mut next_hash = 1u64;
    for e in 0..endpoints {
        let id = EndpointId::from(format!("10.0.{}.{}:8000", e / 250, e % 250 + 1));
        router.upsert_endpoint(EndpointMeta::new(id.clone(), "glm-5.3"), Time::ZERO);
        let scrape = Scrape {
            cache_config: Some(CacheConfig {
                block_size_tokens: 16,
                num_gpu_blocks: blocks as u64,
            }),
            ..Scrape::default()
        };
        router
            .observe_scrape(&id, &scrape, Time::ZERO)
            .expect("a known endpoint");
        // vLLM publishes a batch per engine step: 64 blocks at a time here.
        for chunk in 0..blocks.div_ceil(64) {
            let n = 64.min(blocks - chunk * 64);
            let hashes: Vec<u64> = (0..n as u64).map(|i| next_hash + i).collect();
            next_hash += n as u64;
            let stored = KvEvent::BlockStored {
                block_hashes: hashes,
                parent_block_hash: None,
                token_ids: Vec::new(),
                block_size: 16,
            };
            router
                .apply_kv_events(&id, &[stored])
                .expect("a known endpoint");
        }
    }
    let after = rss_kib();
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "endpoints {endpoints}, {blocks} blocks each: {} block hashes mirrored",
        endpoints * blocks
    );
    println!(
        "resident: {:.1} MiB before, {:.1} MiB after: {:.1} MiB for the routing state ({:.0} bytes per mirrored block)",
        mib(before),
        mib(after),
        mib(after.saturating_sub(before)),
        (after.saturating_sub(before) * 1024) as f64 / (endpoints * blocks).max(1) as f64
    );
    std::hint::black_box(&router);
}
