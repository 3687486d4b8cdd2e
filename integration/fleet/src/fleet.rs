//! The replicas: one simulated vLLM engine each, plus the static facts discovery would give a
//! router (which model and pool it serves, its cache configuration).
//!
//! A router may know what any proxy can learn from discovery and `vllm:cache_config_info`, never
//! the engine's internal state; this module keeps the two apart.

use kinference_sim::{Engine, Profile};

/// How many replicas of which model profile make up the fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetSpec {
    pub pools: Vec<PoolSpec>,
}

/// One `InferencePool`: replicas of one model profile.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSpec {
    /// A `kinference_sim::Profile` name (`glm-5.3`, `qwen-3.6-27b`).
    pub profile: String,
    pub replicas: usize,
    /// What the model's tokens cost, for the cost columns.
    pub price: Option<Price>,
    /// The KV-cache size the live endpoints report (`vllm:cache_config_info`), in place of the
    /// profile's: a replay sizes its fleet from what the proxy sees.
    pub cache: Option<CacheSize>,
}

/// A replica's KV cache: blocks of `block_size` tokens, `num_gpu_blocks` of them.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CacheSize {
    pub block_size: u32,
    pub num_gpu_blocks: u32,
}

impl PoolSpec {
    /// `replicas` of `profile`, at the policy's price for it.
    pub fn of(profile: &str, replicas: usize) -> Self {
        Self {
            profile: profile.to_owned(),
            replicas,
            price: Price::of(profile),
            cache: None,
        }
    }
}

/// A model's price per million tokens, in US dollars, as an `InferencePolicy` carries it
/// (`spec.models[].price`).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Price {
    pub prompt_per_million: f64,
    pub cached_per_million: f64,
    pub completion_per_million: f64,
}

impl Price {
    /// The prices of the project's example policy (`examples/policy.yaml`), the platform's
    /// published prices for the two models the fleet runs.
    pub fn of(profile: &str) -> Option<Price> {
        match profile {
            "glm-5.3" => Some(Price {
                prompt_per_million: 0.60,
                cached_per_million: 0.11,
                completion_per_million: 2.20,
            }),
            "qwen-3.6-27b" => Some(Price {
                prompt_per_million: 0.20,
                cached_per_million: 0.05,
                completion_per_million: 0.60,
            }),
            _ => None,
        }
    }

    /// What a request of `prompt` tokens (`cached` of them from the prefix cache) and `output`
    /// generated tokens costs.
    pub fn cost_usd(&self, prompt: u32, cached: u32, output: u32) -> f64 {
        let cached = cached.min(prompt);
        (f64::from(prompt - cached) * self.prompt_per_million
            + f64::from(cached) * self.cached_per_million
            + f64::from(output) * self.completion_per_million)
            / 1e6
    }
}

impl FleetSpec {
    /// A fleet of one pool.
    pub fn single(profile: &str, replicas: usize) -> Self {
        Self {
            pools: vec![PoolSpec::of(profile, replicas)],
        }
    }

    pub fn num_replicas(&self) -> usize {
        self.pools.iter().map(|p| p.replicas).sum()
    }
}

/// What discovery and `vllm:cache_config_info` say about a replica: static, never stale.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaInfo {
    /// Index of the pool (and so of the model) in the fleet spec.
    pub pool: usize,
    pub model: String,
    pub block_size_tokens: u32,
    pub num_gpu_blocks: u32,
    pub max_num_batched_tokens: u32,
    pub max_model_len: u32,
    /// The profile, for priors (what a platform team would publish per model).
    pub profile: Profile,
    /// What the model's tokens cost, as the policy declares it.
    pub price: Option<Price>,
}

/// One replica: its engine and its static facts.
#[derive(Debug)]
pub struct Replica {
    pub info: ReplicaInfo,
    pub engine: Engine,
    /// When the step in progress ends (`None` when idle).
    pub busy_until: Option<kinference_sim::SimTime>,
    /// The events of the step in progress, delivered when it ends.
    pub pending: Vec<kinference_sim::EngineEvent>,
}

/// Why a fleet could not be built.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("unknown model profile {0:?}")]
    UnknownProfile(String),
}

/// Builds the replicas of `spec`, pool by pool, in order.
pub fn build(spec: &FleetSpec) -> Result<Vec<Replica>, FleetError> {
    let mut out = Vec::with_capacity(spec.num_replicas());
    for (pool, p) in spec.pools.iter().enumerate() {
        let mut profile = Profile::named(&p.profile)
            .ok_or_else(|| FleetError::UnknownProfile(p.profile.clone()))?;
        if let Some(c) = p.cache {
            profile.engine.block_size = c.block_size;
            profile.engine.num_gpu_blocks = c.num_gpu_blocks;
        }
        for _ in 0..p.replicas {
            let e = &profile.engine;
            out.push(Replica {
                info: ReplicaInfo {
                    pool,
                    model: profile.model.clone(),
                    block_size_tokens: e.block_size,
                    num_gpu_blocks: e.num_gpu_blocks,
                    max_num_batched_tokens: e.max_num_batched_tokens,
                    max_model_len: e.max_model_len,
                    profile: profile.clone(),
                    price: p.price,
                },
                engine: Engine::new(profile.engine.clone(), profile.cost.clone()),
                busy_until: None,
                pending: Vec::new(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_in_order_with_profile_facts() {
        let spec = FleetSpec {
            pools: vec![PoolSpec::of("glm-5.3", 2), PoolSpec::of("qwen-3.6-27b", 3)],
        };
        let r = build(&spec).unwrap();
        assert_eq!(r.len(), 5);
        assert_eq!(
            r.iter().map(|r| r.info.pool).collect::<Vec<_>>(),
            [0, 0, 1, 1, 1]
        );
        let q = Profile::named("qwen-3.6-27b").unwrap();
        assert_eq!(r[4].info.num_gpu_blocks, q.engine.num_gpu_blocks);
        assert_eq!(r[4].info.max_model_len, 32_768);
        assert!(build(&FleetSpec::single("nope", 1)).is_err());
        // 1,000 uncached and 1,000 cached prompt tokens and 100 generated, at glm's prices.
        let p = Price::of("glm-5.3").unwrap();
        assert!((p.cost_usd(2_000, 1_000, 100) - (600.0 + 110.0 + 220.0) / 1e6).abs() < 1e-12);
        assert!(Price::of("nope").is_none());
    }
}
