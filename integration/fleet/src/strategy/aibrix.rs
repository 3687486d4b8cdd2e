//! AIBrix's `prefix-cache` routing algorithm.
//!
//! Source: vllm-project/aibrix, `pkg/plugins/gateway/algorithms/README.md` (prefix cache aware) and
//! its defaults: character tokenizer with 128-character blocks, at most 200,000 blocks,
//! `AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT` 16,
//! `AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR` 2. If `max − min` running requests over the
//! pods exceeds 16, the pod with the fewest running requests wins. Otherwise the pods whose blocks
//! match a prefix of the prompt are sorted by match percentage (then fewer running requests) and
//! the first whose running count is at most `mean + 2 × stddev` wins; with no such pod, the least
//! loaded. The chosen pod's index then records the prompt's blocks. Running requests are the
//! gateway's own counts of its outstanding requests.
//!
//! Approximation: 128 characters are 32 tokens at this tokenizer's ~4 characters a token, so blocks
//! are 32 tokens; the 200,000-block bound applies per pod.
//!
//! One gateway plugin by default; its HA set-up (`--peer-instances N`) runs N gateway replicas,
//! each with its own in-process prefix index and request counts (we found no replica sync of
//! either documented).

use kinference_sim::SimTime;
use rand_chacha::ChaCha8Rng;

use super::{LruSet, Pick, Req, Router, argmin_random, chained_block_hashes};
use crate::sidecar::View;

pub const IMBALANCE_ABS_COUNT: f64 = 16.0;
pub const STDDEV_FACTOR: f64 = 2.0;
pub const BLOCK_TOKENS: u32 = 32;
pub const MAX_BLOCKS: usize = 200_000;

#[derive(Debug)]
pub struct AibrixPrefix {
    pods: Vec<LruSet>,
}

impl AibrixPrefix {
    pub fn new(replicas: usize) -> Self {
        Self {
            pods: vec![LruSet::new(MAX_BLOCKS); replicas],
        }
    }
}

impl Router for AibrixPrefix {
    fn pick(
        &mut self,
        req: &Req<'_>,
        candidates: &[usize],
        view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        let hashes = chained_block_hashes(req.prompt, BLOCK_TOKENS, usize::MAX);
        let running: Vec<(usize, f64)> = candidates
            .iter()
            .map(|&r| (r, f64::from(view.own_inflight[r])))
            .collect();
        let max = running
            .iter()
            .map(|l| l.1)
            .fold(f64::NEG_INFINITY, f64::max);
        let min = running.iter().map(|l| l.1).fold(f64::INFINITY, f64::min);
        let r = if max - min > IMBALANCE_ABS_COUNT || hashes.is_empty() {
            argmin_random(&running, rng)
        } else {
            let n = running.len() as f64;
            let mean = running.iter().map(|l| l.1).sum::<f64>() / n;
            let std = (running.iter().map(|l| (l.1 - mean).powi(2)).sum::<f64>() / n).sqrt();
            let mut matched: Vec<(usize, f64, f64)> = running
                .iter()
                .map(|&(r, load)| {
                    (
                        r,
                        self.pods[r].leading_matches(&hashes) as f64 / hashes.len() as f64,
                        load,
                    )
                })
                .filter(|m| m.1 > 0.0)
                .collect();
            matched.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.total_cmp(&b.2)));
            matched
                .iter()
                .find(|m| m.2 <= mean + STDDEV_FACTOR * std)
                .map(|m| m.0)
                .unwrap_or_else(|| argmin_random(&running, rng))
        };
        for h in hashes {
            self.pods[r].touch(h);
        }
        Pick::to(r)
    }

    fn on_dispatch(&mut self, _req: &Req<'_>, _replica: usize, _now: SimTime) {}
}
