//! Kinference: the proxy's own routing core (`kinference-routing`), driven in virtual time.
//!
//! Exactly the code the sidecar runs: per endpoint, TTFT = wait (prefill-bound or KV-capacity-bound,
//! the wait corrected by a peak-EWMA of observed/predicted wait) + prefill of the uncached part +
//! overhead; the lowest predicted TTFT plus the delay the request would add to the requests queued
//! behind it wins, within a tie window (see `docs/ttft-model.md`); the prefix overlap comes from vLLM KV events
//! (precise mode) where they have arrived, else from the approximate index of what this sidecar sent.
//! Its settings are `RouterConfig::default()` (a sweep may override them, see `crate::tune`); the
//! prefix affinity among near-equal candidates is the router's (`kinference_routing::affinity`); the per-model priors are what a platform team
//! publishes from the model's profile (prefill rate, decode step, token budget), not fitted to
//! this benchmark. When the policy allows it (low-complexity prompts in the two-model mix), the
//! candidate models include the small model.

use std::collections::HashMap;

use kinference_routing::{
    self as routing, DispatchHandle, EndpointId, EndpointMeta, ModelName, ModelPrior, PromptBlocks,
    RouterConfig, Scrape, Time,
    endpoint::{CacheConfig, PrefixCacheCounters},
};
use kinference_sim::{KvEvent, SimTime};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{Pick, Req, Router, chained_block_hashes};
use crate::{fleet::ReplicaInfo, sidecar::View};

/// vLLM-space block hashes of one prompt: the fleet knows the tokens, as a proxy with the model's
/// tokenizer would.
struct TokenHasher<'a> {
    prompt: &'a [u32],
}

impl routing::BlockHasher for TokenHasher<'_> {
    fn block_hashes(&self, _model: &ModelName, block_size_tokens: u32) -> Option<Vec<u64>> {
        Some(chained_block_hashes(
            self.prompt,
            block_size_tokens,
            usize::MAX,
        ))
    }
}

/// The prompt's approximate blocks: each token's 4 little-endian bytes stand for its ~4 characters
/// of text, so a 64-byte chunk is exactly a 16-token block.
fn prompt_blocks(prompt: &[u32], config: &routing::ApproxConfig) -> PromptBlocks {
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    PromptBlocks::from_text(&bytes, config)
}

/// The prior a platform team would publish for a model, from its profile.
pub fn prior_of(info: &ReplicaInfo) -> ModelPrior {
    let c = &info.profile.cost;
    ModelPrior {
        prefill_tokens_per_second: 1.0 / c.prefill_token_s,
        time_per_output_token_s: c.step_overhead_s,
        decode_step_per_seq_s: c.decode_seq_s,
        max_num_batched_tokens: info.max_num_batched_tokens,
        overhead_s: 0.0,
        prefill_attention_pair_s: c.prefill_attention_pair_s,
    }
}

fn time(t: SimTime) -> Time {
    Time::from_since_epoch(t)
}

#[derive(Debug)]
pub struct Kinference {
    router: routing::Router,
    ids: Vec<EndpointId>,
    models: Vec<ModelName>,
    pools: Vec<usize>,
    by_id: HashMap<EndpointId, usize>,
    handles: HashMap<u64, DispatchHandle>,
    /// The decision for the request being picked, kept for `on_dispatch`.
    last: Option<(u64, routing::Decision, PromptBlocks)>,
}

impl Kinference {
    pub fn new(replicas: &[ReplicaInfo], config: RouterConfig) -> Self {
        let mut router = routing::Router::new(config);
        let mut ids = Vec::new();
        let mut models = Vec::new();
        let mut by_id = HashMap::new();
        for (i, info) in replicas.iter().enumerate() {
            let model = ModelName::from(info.model.as_str());
            router.set_model_prior(model.clone(), prior_of(info));
            let id = EndpointId::from(format!("replica-{i}"));
            let mut meta = EndpointMeta::new(id.clone(), model.clone());
            meta.kv_events = true;
            router.upsert_endpoint(meta, Time::ZERO);
            // The id was just inserted: setting it ready cannot fail.
            let _ = router.set_ready(&id, true);
            by_id.insert(id.clone(), i);
            ids.push(id);
            models.push(model);
        }
        let pools = replicas.iter().map(|r| r.pool).collect();
        Self {
            router,
            ids,
            models,
            pools,
            by_id,
            handles: HashMap::new(),
            last: None,
        }
    }
}

impl Router for Kinference {
    fn pick(
        &mut self,
        req: &Req<'_>,
        candidates: &[usize],
        view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        let requested = self.pools.iter().position(|&p| p == req.pool).map_or_else(
            || self.models[candidates[0]].clone(),
            |r| self.models[r].clone(),
        );
        let mut candidate_models: Vec<ModelName> = Vec::new();
        for &r in candidates {
            if !candidate_models.contains(&self.models[r]) {
                candidate_models.push(self.models[r].clone());
            }
        }
        let blocks = prompt_blocks(req.prompt, &self.router.config().approx);
        let hasher = TokenHasher { prompt: req.prompt };
        let request = routing::Request {
            requested_model: &requested,
            candidate_models: &candidate_models,
            prompt_tokens: u32::try_from(req.prompt.len()).unwrap_or(u32::MAX),
            max_tokens: None,
            lora_adapter: None,
            prompt_blocks: &blocks,
            block_hasher: Some(&hasher),
        };
        let decision = self.router.decide(&request, time(view.now), rng);
        let chosen = decision
            .chosen_endpoint()
            .and_then(|id| self.by_id.get(id).copied());
        let pick = match chosen {
            Some(replica) => Pick {
                replica,
                predicted_ttft_s: decision.predicted_ttft_s(),
                prediction: decision.chosen().map(|c| Box::new(c.prediction.clone())),
            },
            // The core found nothing to choose (cannot happen with ready candidates): spread at
            // random rather than drop the request.
            None => Pick::to(candidates[rng.random_range(0..candidates.len())]),
        };
        self.last = Some((req.id, decision, blocks));
        pick
    }

    fn on_dispatch(&mut self, req: &Req<'_>, _replica: usize, now: SimTime) {
        if let Some((id, decision, blocks)) = self.last.take()
            && id == req.id
            && let Ok(h) = self.router.dispatch(&decision, &blocks, time(now))
        {
            self.handles.insert(req.id, h);
        }
    }

    fn on_first_token(&mut self, id: u64, _replica: usize, now: SimTime) {
        if let Some(&h) = self.handles.get(&id) {
            let _ = self.router.first_token(h, time(now));
            let _ = self.router.observe_token(h, time(now));
        }
    }

    fn on_token(&mut self, id: u64, _replica: usize, now: SimTime) {
        if let Some(&h) = self.handles.get(&id) {
            let _ = self.router.observe_token(h, time(now));
        }
    }

    fn on_complete(&mut self, id: u64, _replica: usize, _output_tokens: u32, now: SimTime) {
        if let Some(h) = self.handles.remove(&id) {
            let _ = self.router.complete_at(h, time(now));
        }
    }

    fn on_scrape(&mut self, view: &View<'_>) {
        for (i, s) in view.scraped.iter().enumerate() {
            let Some(s) = s else { continue };
            let info = &view.replicas[i];
            let scrape = Scrape {
                num_requests_waiting: Some(s.waiting),
                num_requests_running: Some(s.running),
                kv_cache_usage: Some(s.kv_cache_usage),
                cache_config: Some(CacheConfig {
                    block_size_tokens: info.block_size_tokens,
                    num_gpu_blocks: u64::from(info.num_gpu_blocks),
                }),
                prefix_cache: Some(PrefixCacheCounters {
                    queries_tokens: s.prefix_cache_queries_tokens,
                    hits_tokens: s.prefix_cache_hits_tokens,
                    prompt_tokens: Some(s.prompt_tokens),
                }),
                server_load: s.server_load,
                generation_tokens: Some(s.generation_tokens),
            };
            let _ = self
                .router
                .observe_scrape(&self.ids[i], &scrape, time(s.at));
        }
    }

    fn on_kv_events(&mut self, replica: usize, events: &[KvEvent], _now: SimTime) {
        let converted: Vec<routing::KvEvent> = events
            .iter()
            .map(|e| match e {
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    ..
                } => routing::KvEvent::BlockStored {
                    block_hashes: block_hashes.clone(),
                    parent_block_hash: *parent_block_hash,
                    token_ids: token_ids.clone(),
                    block_size: *block_size,
                },
                KvEvent::BlockRemoved { block_hashes } => routing::KvEvent::BlockRemoved {
                    block_hashes: block_hashes.clone(),
                },
                KvEvent::AllBlocksCleared => routing::KvEvent::AllBlocksCleared,
            })
            .collect();
        let _ = self.router.apply_kv_events(&self.ids[replica], &converted);
    }
}
