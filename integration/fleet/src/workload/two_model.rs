//! The seed's situation: apps ask for the big model, and most of their prompts are simple.
//!
//! Two pools: a big, expensive one (`glm-5.3`, 8×H200 per replica) sized for the complex work,
//! and a small, cheap one (`qwen-3.6-27b`, one H100 per replica) with headroom. Apps ask for the
//! big model ([`BIG_SHARE`] of requests; the rest ask for the small model directly). Of the big
//! model's prompts, [`LOW_SHARE`] are tagged `complexity=low`, and the policy
//! (`super::LOW_COMPLEXITY_RULE`, as in `examples/policy.yaml`) lets every other pool's model
//! serve those; a strategy without a cross-model policy keeps every request in the pool it asked
//! for.
//!
//! The low-complexity share is RouteLLM's measurement on chat prompts (Ong et al., "RouteLLM:
//! Learning to Route LLMs with Preference Data", ICLR 2025, arXiv:2406.18665, and the LMSYS blog
//! post of 2024-07-01): trained on Chatbot Arena's production preference data, its matrix
//! factorization router keeps 95% of GPT-4's quality on MT Bench while sending only 26% of the
//! prompts to GPT-4, so 74% can go to the weak model. (On exam-style traffic its numbers are
//! lower: 45% on MMLU and 35% on GSM8K move; `docs/classification.md` measures this project's own
//! classifier on those.) Prompts carry one of a few shared system prompts; the sweep runs from
//! light load to well past the big pool's saturation for its own requests.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{RequestSpec, Size, Workload, WorkloadKind, exp_gap_s, random_tokens, shrunk};
use crate::fleet::{FleetSpec, PoolSpec};

pub const BIG: &str = "glm-5.3";
pub const SMALL: &str = "qwen-3.6-27b";
pub const BIG_ENDPOINTS: usize = 2;
pub const SMALL_ENDPOINTS: usize = 8;
/// Requests that ask for the big model.
pub const BIG_SHARE: f64 = 0.85;
/// Of those, tagged low complexity (RouteLLM, MT Bench at 95% of GPT-4's quality: 1 − 0.26).
pub const LOW_SHARE: f64 = 0.74;
pub const SYSTEM_PROMPTS: usize = 32;
pub const SYSTEM_TOKENS: usize = 1_500;
pub const USER_TOKENS: std::ops::RangeInclusive<usize> = 100..=1_500;
pub const OUTPUT_TOKENS: std::ops::RangeInclusive<u32> = 50..=400;

pub fn build(load_rps: f64, size: Size, seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let systems: Vec<Vec<u32>> = (0..SYSTEM_PROMPTS)
        .map(|_| random_tokens(&mut rng, SYSTEM_TOKENS))
        .collect();
    let mut at_s = 0.0;
    let requests = (0..size.requests)
        .map(|i| {
            at_s += exp_gap_s(&mut rng, load_rps);
            let big = rng.random_bool(BIG_SHARE);
            let low = big && rng.random_bool(LOW_SHARE);
            let mut prompt = systems[rng.random_range(0..SYSTEM_PROMPTS)].clone();
            let n = rng.random_range(USER_TOKENS);
            prompt.extend(random_tokens(&mut rng, n));
            RequestSpec {
                at_s,
                prompt: Arc::from(prompt),
                output_tokens: rng.random_range(OUTPUT_TOKENS),
                pool: if big { 0 } else { 1 },
                low_complexity: low,
                service_class: None,
                tenant: 0,
                client: i as u32,
            }
        })
        .collect();
    Workload {
        kind: WorkloadKind::TwoModel,
        load_rps,
        fleet: FleetSpec {
            pools: vec![
                PoolSpec::of(BIG, shrunk(BIG_ENDPOINTS, size)),
                PoolSpec::of(SMALL, shrunk(SMALL_ENDPOINTS, size)),
            ],
        },
        requests,
        sessions: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_of_pools_and_tags() {
        let w = build(
            2.0,
            Size {
                requests: 4_000,
                shrink: 1,
            },
            5,
        );
        let big = w.requests.iter().filter(|r| r.pool == 0).count() as f64 / 4_000.0;
        let low = w.requests.iter().filter(|r| r.low_complexity).count() as f64 / 4_000.0;
        assert!((big - BIG_SHARE).abs() < 0.03, "{big}");
        assert!((low - BIG_SHARE * LOW_SHARE).abs() < 0.03, "{low}");
        assert!(w.requests.iter().all(|r| r.pool == 0 || !r.low_complexity));
        assert_eq!(w.fleet.pools.len(), 2);
        // The big model costs more per token.
        let (b, s) = (
            w.fleet.pools[0].price.unwrap(),
            w.fleet.pools[1].price.unwrap(),
        );
        assert!(b.prompt_per_million > s.prompt_per_million);
    }
}
