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
//! ```text
//! cargo run --release -p kinference-routing --example sidecar_memory -- --endpoints 64 --blocks 8192
//! ```

use kinference_routing::{
    EndpointId, EndpointMeta, KvEvent, Router, RouterConfig, Scrape, Time, endpoint::CacheConfig,
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

fn main() {
    let endpoints = arg("--endpoints", 64);
    let blocks = arg("--blocks", 8192);
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
