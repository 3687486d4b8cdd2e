//! A two-model fleet: a big pool (`glm-5.3`) and a small one (`qwen-3.6-27b`).
//!
//! Kinference's policy lets the small model serve prompts the classifier tags low complexity when
//! an app asks for the big one; no other strategy has a cross-model policy, so they route within
//! the requested model's pool. 70% of requests ask for the big model (40% of those tagged low
//! complexity), 30% ask for the small model directly, so the small pool is never idle. Prompts
//! carry one of a few shared system prompts.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{RequestSpec, Size, Workload, WorkloadKind, exp_gap_s, random_tokens, shrunk};
use crate::fleet::{FleetSpec, PoolSpec};

pub const BIG: &str = "glm-5.3";
pub const SMALL: &str = "qwen-3.6-27b";
pub const BIG_ENDPOINTS: usize = 2;
pub const SMALL_ENDPOINTS: usize = 4;
pub const BIG_SHARE: f64 = 0.7;
pub const LOW_SHARE: f64 = 0.4;
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
                client: i as u32,
            }
        })
        .collect();
    Workload {
        kind: WorkloadKind::TwoModel,
        load_rps,
        fleet: FleetSpec {
            pools: vec![
                PoolSpec {
                    profile: BIG.into(),
                    replicas: shrunk(BIG_ENDPOINTS, size),
                },
                PoolSpec {
                    profile: SMALL.into(),
                    replicas: shrunk(SMALL_ENDPOINTS, size),
                },
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
        assert!((big - 0.7).abs() < 0.03, "{big}");
        assert!((low - 0.28).abs() < 0.03, "{low}");
        assert!(w.requests.iter().all(|r| r.pool == 0 || !r.low_complexity));
        assert_eq!(w.fleet.pools.len(), 2);
    }
}
