//! llm-d's shared-prefix shape: many groups of prompts, each group sharing a long prefix.
//!
//! llm-d published its precise-prefix-cache result on this shape (150 groups, a 6,000-token shared
//! prefix, a 1,200-token question, load ramping to saturation on 8 endpoints); reproducing its
//! ordering (precise ≪ approximate ≪ random in p90 TTFT) is how the benchmark shows that it models
//! what matters. The endpoints are `qwen-3.6-27b` (one H100 each): with ~75k tokens of KV cache per
//! endpoint, 150 × 6,000 prefix tokens cannot all stay cached everywhere, so where a group's
//! requests land decides its cache hits.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{RequestSpec, Size, Workload, WorkloadKind, exp_gap_s, random_tokens, shrunk};
use crate::fleet::FleetSpec;

pub const GROUPS: usize = 150;
pub const PREFIX_TOKENS: usize = 6_000;
pub const QUESTION_TOKENS: usize = 1_200;
pub const ENDPOINTS: usize = 8;
/// Output tokens are uniform in this range ("a few hundred").
pub const OUTPUT_TOKENS: std::ops::RangeInclusive<u32> = 128..=384;
pub const PROFILE: &str = "qwen-3.6-27b";

pub fn build(load_rps: f64, size: Size, seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let groups = (GROUPS / size.shrink.max(1)).max(1);
    let prefixes: Vec<Vec<u32>> = (0..groups)
        .map(|_| random_tokens(&mut rng, PREFIX_TOKENS))
        .collect();
    let mut at_s = 0.0;
    let requests = (0..size.requests)
        .map(|i| {
            at_s += exp_gap_s(&mut rng, load_rps);
            let g = rng.random_range(0..groups);
            let mut prompt = prefixes[g].clone();
            prompt.extend(random_tokens(&mut rng, QUESTION_TOKENS));
            RequestSpec {
                at_s,
                prompt: Arc::from(prompt),
                output_tokens: rng.random_range(OUTPUT_TOKENS),
                pool: 0,
                low_complexity: false,
                service_class: None,
                tenant: 0,
                client: i as u32,
            }
        })
        .collect();
    Workload {
        kind: WorkloadKind::SharedPrefix,
        load_rps,
        fleet: FleetSpec::single(PROFILE, shrunk(ENDPOINTS, size)),
        requests,
        sessions: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_share_exactly_their_prefix() {
        let w = build(
            4.0,
            Size {
                requests: 400,
                shrink: 1,
            },
            7,
        );
        assert_eq!(w.requests.len(), 400);
        assert_eq!(w.fleet.num_replicas(), 8);
        let mut by_prefix = std::collections::HashMap::new();
        for r in &w.requests {
            assert_eq!(r.prompt.len(), PREFIX_TOKENS + QUESTION_TOKENS);
            assert!(OUTPUT_TOKENS.contains(&r.output_tokens));
            *by_prefix
                .entry(r.prompt[..PREFIX_TOKENS].to_vec())
                .or_insert(0) += 1;
        }
        // 400 draws over 150 groups: well over 100 distinct groups, and repeats.
        assert!(
            by_prefix.len() > 100 && by_prefix.len() <= GROUPS,
            "{}",
            by_prefix.len()
        );
        // Poisson at 4 req/s: the last of 400 arrivals lands near 100 s.
        let last = w.requests.last().unwrap().at_s;
        assert!((80.0..120.0).contains(&last), "{last}");
        // Same seed, same prompts.
        let again = build(
            4.0,
            Size {
                requests: 400,
                shrink: 1,
            },
            7,
        );
        assert_eq!(again.requests[17].prompt, w.requests[17].prompt);
    }
}
