//! Prefix affinity: where a prompt's prefix *should* live when prediction cannot tell endpoints
//! apart.
//!
//! The TTFT prediction sees one request. Placement has a second, fleet-wide consequence it cannot
//! see: the endpoint that prefills a prefix keeps it cached (until evicted) for the next request that
//! shares it, and KV blocks of running requests that share a prefix are held once. When several
//! sidecars, or one sidecar over time, place the requests of one prefix on whichever endpoint happens
//! to be cheapest by a few milliseconds, the prefix is copied around the fleet, each copy evicting
//! others, and the hit rate falls exactly when the fleet is short of KV (measured in
//! `docs/ttft-model.md`, "Pass 3").
//!
//! So every prompt has a *home* among the endpoints of a model: the endpoint ranked first by
//! rendezvous (highest-random-weight) hashing of a key taken from the prompt's leading chunk hashes
//! (the first `key_tokens` of the prompt). Prompts that share that much prefix share a home; every
//! sidecar computes the same home with no coordination; adding or removing an endpoint moves only
//! the prompts homed on it. Affinity is a preference, never an override: only candidates whose
//! selection cost is within a slack of the best are eligible (bounded load), and among those a
//! candidate already holding more of the prompt wins before rendezvous rank does.

use crate::{endpoint::EndpointId, prefix::PromptBlocks};
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Settings of prefix affinity.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct AffinityConfig {
    /// Candidates whose selection cost is at most `best × (1 + slack)` (and at least within the tie
    /// window) are eligible; 0 turns affinity off (selection is then the plain lowest cost with
    /// random tie-breaking).
    pub slack: f64,
    /// Leading prompt tokens that form the affinity key: prompts sharing this many tokens share a
    /// home. Prompts shorter than one chunk have no key (and no affinity).
    pub key_tokens: u32,
    /// Absolute floor of the slack, so near-idle endpoints (costs of a few milliseconds) still
    /// count as equal.
    pub min_slack: Duration,
    /// Mean KV-cache usage of the model's candidates below which affinity is off; the slack grows
    /// linearly from 0 there to `slack` at full usage. Affinity buys hits by spending TTFT now,
    /// which pays only when the cache is short enough that copies evict one another.
    pub kv_usage_floor: f64,
    /// Affinity keys remembered (LRU) from this proxy's dispatches. A prompt whose key was seen
    /// before, or whose key prefix an endpoint already holds, recurs; affinity for a prompt that
    /// shares nothing would only trade its TTFT for nothing.
    pub remembered_keys: usize,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        Self {
            slack: 1.0,
            key_tokens: 1_024,
            min_slack: Duration::from_millis(5),
            kv_usage_floor: 0.7,
            remembered_keys: 65_536,
        }
    }
}

/// The affinity key of a prompt: the chained hash of its chunk covering token `key_tokens` (or of
/// its last full chunk, when shorter). Chained hashes make this a hash of the whole leading text.
pub fn key(prompt: &PromptBlocks, config: &AffinityConfig) -> Option<u64> {
    let hashes = prompt.hashes();
    let per_block = prompt.block_size_tokens().max(1);
    let blocks = usize::try_from(config.key_tokens.div_ceil(per_block))
        .unwrap_or(usize::MAX)
        .max(1);
    hashes
        .get(blocks.min(hashes.len()).checked_sub(1)?)
        .copied()
}

/// Tokens of a prompt the key covers (what a holder must hold for the key prefix to be cached).
pub fn key_coverage_tokens(prompt: &PromptBlocks, config: &AffinityConfig) -> u32 {
    let per_block = prompt.block_size_tokens().max(1);
    let blocks = u32::try_from(prompt.hashes().len()).unwrap_or(u32::MAX);
    config.key_tokens.div_ceil(per_block).max(1).min(blocks) * per_block
}

/// The rendezvous weight of `endpoint` for `key`: the endpoint with the highest weight is the home.
pub fn weight(key: u64, endpoint: &EndpointId) -> u64 {
    xxh3_64_with_seed(endpoint.as_str().as_bytes(), key)
}

/// The relative slack at mean KV-cache usage `kv_usage` (0 below the floor, `slack` at 1).
pub fn slack_at(kv_usage: f64, config: &AffinityConfig) -> f64 {
    let floor = config.kv_usage_floor.clamp(0.0, 1.0);
    let span = (1.0 - floor).max(f64::EPSILON);
    config.slack.max(0.0) * ((kv_usage - floor) / span).clamp(0.0, 1.0)
}

/// The most a candidate may cost and still be eligible, given the best cost and the slack.
pub fn eligible_limit(
    best_cost_s: f64,
    slack: f64,
    tie_window: Duration,
    config: &AffinityConfig,
) -> f64 {
    let slack = (best_cost_s.max(0.0) * slack.max(0.0))
        .max(config.min_slack.as_secs_f64())
        .max(tie_window.as_secs_f64());
    best_cost_s + slack
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix::ApproxConfig;

    fn blocks(text: &str) -> PromptBlocks {
        PromptBlocks::from_text(text.as_bytes(), &ApproxConfig::default())
    }

    #[test]
    fn prompts_sharing_the_key_prefix_share_a_key() {
        let config = AffinityConfig {
            key_tokens: 64,
            ..AffinityConfig::default()
        };
        // 64 tokens are 256 characters at 4 characters a token.
        let shared = "s".repeat(256);
        let a = blocks(&format!("{shared} first question about apples"));
        let b = blocks(&format!(
            "{shared} another, longer question about pears and plums"
        ));
        let c = blocks(&format!("x{}", &shared[1..]));
        assert_eq!(key(&a, &config), key(&b, &config));
        assert!(key(&a, &config).is_some());
        assert_ne!(key(&a, &config), key(&c, &config));
    }

    #[test]
    fn short_prompts_use_their_last_full_chunk_and_tiny_ones_have_no_key() {
        let config = AffinityConfig::default();
        let short = blocks(&"q".repeat(100));
        assert_eq!(key(&short, &config), short.hashes().last().copied());
        assert_eq!(key(&blocks("hi"), &config), None);
    }

    #[test]
    fn rendezvous_moves_only_the_keys_of_a_removed_endpoint() {
        let ids: Vec<EndpointId> = (0..8).map(|i| EndpointId::from(format!("e{i}"))).collect();
        let home = |key: u64, set: &[EndpointId]| {
            set.iter().max_by_key(|e| weight(key, e)).unwrap().clone()
        };
        let mut homes = [0usize; 8];
        let mut moved = 0;
        for key in 0..4_000u64 {
            let before = home(key, &ids);
            homes[ids.iter().position(|e| *e == before).unwrap()] += 1;
            let after = home(key, &ids[..7]);
            if before != after {
                moved += 1;
                assert_eq!(
                    before, ids[7],
                    "only keys homed on the removed endpoint move"
                );
            }
        }
        assert_eq!(moved, homes[7]);
        // Spread: every endpoint is home to a fair share (500 expected each).
        assert!(homes.iter().all(|&n| (400..600).contains(&n)), "{homes:?}");
    }

    #[test]
    fn eligibility_is_relative_with_floors() {
        let config = AffinityConfig::default();
        let tie = Duration::from_millis(5);
        assert!((eligible_limit(2.0, 0.25, tie, &config) - 2.5).abs() < 1e-12);
        assert!((eligible_limit(0.001, 0.25, tie, &config) - 0.006).abs() < 1e-12);
        let wide_tie = Duration::from_millis(20);
        assert!((eligible_limit(2.0, 0.0, wide_tie, &config) - 2.02).abs() < 1e-12);
    }

    #[test]
    fn slack_grows_from_the_kv_usage_floor_to_full_usage() {
        let config = AffinityConfig {
            slack: 1.0,
            kv_usage_floor: 0.8,
            ..AffinityConfig::default()
        };
        assert_eq!(slack_at(0.5, &config), 0.0);
        assert_eq!(slack_at(0.8, &config), 0.0);
        assert!((slack_at(0.9, &config) - 0.5).abs() < 1e-9);
        assert!((slack_at(1.0, &config) - 1.0).abs() < 1e-9);
        assert!((slack_at(1.2, &config) - 1.0).abs() < 1e-9);
    }
}
