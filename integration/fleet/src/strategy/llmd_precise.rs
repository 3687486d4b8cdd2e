//! llm-d's precise prefix-cache routing: a KV-event index plus a load-aware scorer.
//!
//! Source: llm-d/llm-d-inference-scheduler. `precise-prefix-cache-scorer` keeps, per pod, the block
//! hashes that vLLM's KV events (`BlockStored`/`BlockRemoved`/`AllBlocksCleared`) report, hashes the
//! prompt the way vLLM does (block size 16, chained) and scores each pod by its longest cached
//! prefix in blocks, min-max normalised over the candidates. `load-aware-scorer` (threshold 128):
//! 0.5 for an empty waiting queue, `0.5 × (1 − q / 128)` below the threshold, 0 above. Weights from
//! the scheduler's documented profile: prefix 2.0, load-aware 1.0; `max-score-picker`.
//! KV events reach each sidecar after the fleet's delivery delay, so requests sent in between see
//! the cache as it was.

use kinference_sim::{KvEvent, SimTime};
use rand_chacha::ChaCha8Rng;

use super::{KvIndex, Pick, Req, Router, argmax_random, chained_block_hashes};
use crate::{fleet::ReplicaInfo, sidecar::View};

pub const PREFIX_WEIGHT: f64 = 2.0;
pub const LOAD_WEIGHT: f64 = 1.0;
pub const QUEUE_THRESHOLD: f64 = 128.0;

#[derive(Debug)]
pub struct LlmdPrecise {
    index: KvIndex,
    block_tokens: Vec<u32>,
}

impl LlmdPrecise {
    pub fn new(replicas: &[ReplicaInfo]) -> Self {
        Self {
            index: KvIndex::new(replicas.len()),
            block_tokens: replicas.iter().map(|r| r.block_size_tokens).collect(),
        }
    }
}

/// llm-d's load-aware score of a waiting queue of `q` requests.
pub fn load_aware_score(q: u32) -> f64 {
    let q = f64::from(q);
    if q == 0.0 {
        0.5
    } else if q > QUEUE_THRESHOLD {
        0.0
    } else {
        0.5 * (1.0 - q / QUEUE_THRESHOLD)
    }
}

impl Router for LlmdPrecise {
    fn pick(
        &mut self,
        req: &Req<'_>,
        candidates: &[usize],
        view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        let bs = self.block_tokens[candidates[0]];
        let hashes = chained_block_hashes(req.prompt, bs, usize::MAX);
        let matched: Vec<f64> = candidates
            .iter()
            .map(|&r| self.index.leading_matches(r, &hashes) as f64)
            .collect();
        let max = matched.iter().copied().fold(0.0, f64::max);
        let min = matched.iter().copied().fold(f64::INFINITY, f64::min);
        let scored: Vec<(usize, f64)> = candidates
            .iter()
            .zip(&matched)
            .map(|(&r, &m)| {
                let prefix = if max > min {
                    (m - min) / (max - min)
                } else {
                    0.0
                };
                (
                    r,
                    PREFIX_WEIGHT * prefix + LOAD_WEIGHT * load_aware_score(view.waiting(r)),
                )
            })
            .collect();
        Pick::to(argmax_random(&scored, rng))
    }

    fn on_kv_events(&mut self, replica: usize, events: &[KvEvent], _now: SimTime) {
        self.index.apply(replica, events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_aware_curve() {
        assert_eq!(load_aware_score(0), 0.5);
        assert_eq!(load_aware_score(64), 0.25);
        assert_eq!(load_aware_score(128), 0.0);
        assert_eq!(load_aware_score(500), 0.0);
    }
}
