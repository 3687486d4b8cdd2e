//! SGLang's router, `cache_aware` policy.
//!
//! Source: sgl-project/sglang, the router's `cache_aware` policy and its CLI defaults
//! (`cache_threshold` 0.3, `balance_abs_threshold` 64, `balance_rel_threshold` 1.5,
//! `eviction_interval` 120 s, `max_tree_size` 2^26). The load of a worker is the router's own count
//! of its outstanding requests. If the load is imbalanced (`max − min > 64` and
//! `max > 1.5 × min`) the least-loaded worker is chosen; otherwise the worker whose approximate
//! radix tree (built from the prompts this router sent it) matches the longest prefix is chosen if
//! the match rate exceeds 0.3, else the worker with the smallest tree. The prompt is then inserted
//! into the chosen worker's tree.
//!
//! Approximation: SGLang's tree is character-level; here it is kept at 16-token granularity (the
//! match rate differs by less than one block), and the 2^26-character bound becomes 2^20 blocks of
//! 16 tokens at ~4 characters a token, evicted least-recently-used on insert rather than every
//! 120 s (no run here comes near the bound).
//!
//! One gateway by default. Its HA set-up (`--peer-instances N`) is SMG's mesh
//! (lightseekorg/smg `docs/concepts/architecture/high-availability.md`: `--enable-mesh`, state
//! exchanged by SWIM gossip at a 1 s interval, cache-aware routing trees among the replicated
//! state): each gateway's tree insertions reach the others a gossip interval later; the load
//! counts stay each gateway's own.

use kinference_sim::SimTime;
use rand_chacha::ChaCha8Rng;

use super::{
    LruSet, PeerEvent, Pick, Req, Router, argmax_random, argmin_random, chained_block_hashes,
};
use crate::sidecar::View;

pub const CACHE_THRESHOLD: f64 = 0.3;
pub const BALANCE_ABS_THRESHOLD: f64 = 64.0;
pub const BALANCE_REL_THRESHOLD: f64 = 1.5;
pub const BLOCK_TOKENS: u32 = 16;
pub const MAX_TREE_BLOCKS: usize = 1 << 20;

#[derive(Debug)]
pub struct SglangCacheAware {
    trees: Vec<LruSet>,
}

impl SglangCacheAware {
    pub fn new(replicas: usize) -> Self {
        Self {
            trees: vec![LruSet::new(MAX_TREE_BLOCKS); replicas],
        }
    }
}

impl Router for SglangCacheAware {
    fn pick(
        &mut self,
        req: &Req<'_>,
        candidates: &[usize],
        view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        let hashes = chained_block_hashes(req.prompt, BLOCK_TOKENS, usize::MAX);
        let loads: Vec<(usize, f64)> = candidates
            .iter()
            .map(|&r| (r, f64::from(view.own_inflight[r])))
            .collect();
        let max = loads.iter().map(|l| l.1).fold(f64::NEG_INFINITY, f64::max);
        let min = loads.iter().map(|l| l.1).fold(f64::INFINITY, f64::min);
        let imbalanced = max - min > BALANCE_ABS_THRESHOLD && max > BALANCE_REL_THRESHOLD * min;
        let r = if imbalanced {
            argmin_random(&loads, rng)
        } else {
            let matched: Vec<(usize, f64)> = candidates
                .iter()
                .map(|&r| {
                    (
                        r,
                        (self.trees[r].leading_matches(&hashes) * BLOCK_TOKENS as usize) as f64,
                    )
                })
                .collect();
            let best = matched.iter().map(|m| m.1).fold(0.0, f64::max);
            let rate = best / req.prompt.len().max(1) as f64;
            if rate > CACHE_THRESHOLD {
                argmax_random(&matched, rng)
            } else {
                let sizes: Vec<(usize, f64)> = candidates
                    .iter()
                    .map(|&r| (r, self.trees[r].len() as f64))
                    .collect();
                argmin_random(&sizes, rng)
            }
        };
        for h in hashes {
            self.trees[r].touch(h);
        }
        Pick::to(r)
    }

    fn on_dispatch(&mut self, _req: &Req<'_>, _replica: usize, _now: SimTime) {}

    fn on_peer(&mut self, event: &PeerEvent, _now: SimTime) {
        if let PeerEvent::Dispatch {
            replica, prompt, ..
        } = event
        {
            for h in chained_block_hashes(prompt, BLOCK_TOKENS, usize::MAX) {
                self.trees[*replica].touch(h);
            }
        }
    }
}
