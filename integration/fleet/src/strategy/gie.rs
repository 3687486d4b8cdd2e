//! The Gateway API Inference Extension's endpoint picker, default scheduling profile.
//!
//! Source: kubernetes-sigs/gateway-api-inference-extension, the EPP's default `EndpointPickerConfig`
//! (`queue-scorer` weight 2, `kv-cache-utilization-scorer` weight 2, `prefix-cache-scorer` weight
//! 3, `max-score-picker`), and the prefix plugin's defaults (`pkg/epp/.../plugins/multi/prefix`):
//! `blockSizeTokens` 16 (vLLM's block size; the older character default of 64 characters is also 16
//! tokens at this tokenizer's ~4 characters a token), `maxPrefixBlocksToMatch` 256,
//! `lruCapacityPerServer` 31,250 blocks. The scorers:
//! - queue: `(max − q) / (max − min)` of the scraped waiting queues over the candidates (1 when all
//!   are equal);
//! - kv-cache utilization: `1 − kv_cache_usage`;
//! - prefix (approximate): matched leading blocks / blocks of the prompt (up to 256), from an LRU of
//!   the block hashes this picker itself sent to each server.
//!
//! The max-score picker takes the highest weighted sum, ties at random.
//!
//! Deployed as the Inference Extension is: one endpoint picker that sees every request. Its
//! chart's HA set-up (`replicas > 1`) is active-passive by leader election, so the HA row serves
//! from one picker too (see `StrategyKind::serving_instances`).

use kinference_sim::SimTime;
use rand_chacha::ChaCha8Rng;

use super::{LruSet, Pick, Req, Router, argmax_random, chained_block_hashes};
use crate::sidecar::View;

pub const QUEUE_WEIGHT: f64 = 2.0;
pub const KV_WEIGHT: f64 = 2.0;
pub const PREFIX_WEIGHT: f64 = 3.0;
pub const BLOCK_TOKENS: u32 = 16;
pub const MAX_PREFIX_BLOCKS: usize = 256;
pub const LRU_CAPACITY_PER_SERVER: usize = 31_250;

#[derive(Debug)]
pub struct GieDefault {
    servers: Vec<LruSet>,
    /// The hashes of the request being picked, kept for `on_dispatch`.
    last: Option<(u64, Vec<u64>)>,
}

impl GieDefault {
    pub fn new(replicas: usize) -> Self {
        Self {
            servers: vec![LruSet::new(LRU_CAPACITY_PER_SERVER); replicas],
            last: None,
        }
    }
}

/// The queue scorer over `candidates`, on the freshest queue the picker reads ([`View::queue`]:
/// the scraped waiting queue, or `GET /load` less the running batch where the picker reads it).
pub fn queue_scores(candidates: &[usize], view: &View<'_>) -> Vec<f64> {
    let q: Vec<f64> = candidates
        .iter()
        .map(|&r| f64::from(view.queue(r)))
        .collect();
    let max = q.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = q.iter().copied().fold(f64::INFINITY, f64::min);
    q.iter()
        .map(|&v| {
            if max > min {
                (max - v) / (max - min)
            } else {
                1.0
            }
        })
        .collect()
}

impl Router for GieDefault {
    fn pick(
        &mut self,
        req: &Req<'_>,
        candidates: &[usize],
        view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        let hashes = chained_block_hashes(req.prompt, BLOCK_TOKENS, MAX_PREFIX_BLOCKS);
        let queue = queue_scores(candidates, view);
        let scored: Vec<(usize, f64)> = candidates
            .iter()
            .zip(queue)
            .map(|(&r, q)| {
                let prefix = if hashes.is_empty() {
                    0.0
                } else {
                    self.servers[r].leading_matches(&hashes) as f64 / hashes.len() as f64
                };
                let kv = 1.0 - view.kv_cache_usage(r);
                (
                    r,
                    QUEUE_WEIGHT * q + KV_WEIGHT * kv + PREFIX_WEIGHT * prefix,
                )
            })
            .collect();
        let r = argmax_random(&scored, rng);
        self.last = Some((req.id, hashes));
        Pick::to(r)
    }

    fn on_dispatch(&mut self, req: &Req<'_>, replica: usize, _now: SimTime) {
        let hashes = match self.last.take() {
            Some((id, h)) if id == req.id => h,
            _ => chained_block_hashes(req.prompt, BLOCK_TOKENS, MAX_PREFIX_BLOCKS),
        };
        for h in hashes {
            self.servers[replica].touch(h);
        }
    }
}
