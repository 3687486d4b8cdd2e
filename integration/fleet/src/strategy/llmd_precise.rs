//! llm-d's precise prefix-cache routing, as its current guide configures it.
//!
//! Source: llm-d/llm-d `guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml`
//! (the guide's `EndpointPickerConfig`) and llm-d/llm-d-inference-scheduler
//! `pkg/plugins/scorer/precise_prefix_cache.go` and `utils.go` (the scorer). The guide's default
//! scheduling profile:
//! - `precise-prefix-cache-scorer`, weight 2.0: per pod, the longest prefix of the prompt's
//!   vLLM block hashes that the pod's KV events (`BlockStored`/`BlockRemoved`/
//!   `AllBlocksCleared`) say it holds, in blocks; normalised by `indexedScoresToNormalizedScoredPods`:
//!   min-max over the pods that match at least one block (1.0 when they all match equally), 0 for a
//!   pod that matches none. The guide sets `blockSize` to vLLM's `--block-size` (64 there; the
//!   fleet's engines use 16, and the scorer follows the engine as the guide requires).
//! - Speculative indexing (`speculativeIndexing: true` in the current guide): right after a
//!   routing decision the chosen pod is recorded as holding the prompt's blocks until confirmed
//!   KV events arrive, for `speculativeTTL` (default 2 s). The guide nests the flag under
//!   `indexerConfig`, where the plugin's config struct does not read it (it is a top-level plugin
//!   parameter); the benchmark runs it on, as the guide intends.
//! - `kv-cache-utilization-scorer`, weight 1.0: `1 − kv_cache_usage`.
//! - `queue-scorer`, weight 1.0: the Inference Extension's min-max of the waiting queues
//!   ([`super::gie::queue_scores`]).
//! - `max-score-picker`: the highest weighted sum, ties at random. (`decode-filter` passes every
//!   pod of an aggregated deployment.)
//!
//! KV events reach the picker after the fleet's delivery delay. Deployed as the guide deploys it:
//! one scheduler; its active-active HA sub-guide (`active-active.md`) runs N schedulers, each
//! subscribed to every pod's KV events, each with its own index, scrapes and speculative entries.

use std::collections::{HashMap, VecDeque};

use kinference_sim::{KvEvent, SimTime};
use rand_chacha::ChaCha8Rng;

use super::{KvIndex, Pick, Req, Router, argmax_random, chained_block_hashes, gie};
use crate::{fleet::ReplicaInfo, sidecar::View};

pub const PREFIX_WEIGHT: f64 = 2.0;
pub const KV_UTILIZATION_WEIGHT: f64 = 1.0;
pub const QUEUE_WEIGHT: f64 = 1.0;
/// `defaultSpeculativeTTL` of the precise scorer.
pub const SPECULATIVE_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// Predicted entries: block hash → when it expires, per pod, with the order they expire in.
#[derive(Debug, Default)]
struct Speculative {
    expires: Vec<HashMap<u64, SimTime>>,
    queue: VecDeque<(SimTime, usize, Vec<u64>)>,
}

impl Speculative {
    fn new(replicas: usize) -> Self {
        Self {
            expires: vec![HashMap::new(); replicas],
            queue: VecDeque::new(),
        }
    }

    fn expire(&mut self, now: SimTime) {
        while let Some((at, _, _)) = self.queue.front() {
            if *at > now {
                break;
            }
            let Some((at, replica, hashes)) = self.queue.pop_front() else {
                break;
            };
            let map = &mut self.expires[replica];
            for h in hashes {
                if map.get(&h) == Some(&at) {
                    map.remove(&h);
                }
            }
        }
    }

    fn add(&mut self, replica: usize, hashes: Vec<u64>, now: SimTime) {
        let at = now + SPECULATIVE_TTL;
        for &h in &hashes {
            self.expires[replica].insert(h, at);
        }
        self.queue.push_back((at, replica, hashes));
    }

    fn holds(&self, replica: usize, hash: u64, now: SimTime) -> bool {
        self.expires[replica].get(&hash).is_some_and(|&at| at > now)
    }
}

#[derive(Debug)]
pub struct LlmdPrecise {
    index: KvIndex,
    speculative: Speculative,
    block_tokens: Vec<u32>,
    /// The hashes of the request being picked, kept for `on_dispatch`.
    last: Option<(u64, Vec<u64>)>,
}

impl LlmdPrecise {
    pub fn new(replicas: &[ReplicaInfo]) -> Self {
        Self {
            index: KvIndex::new(replicas.len()),
            speculative: Speculative::new(replicas.len()),
            block_tokens: replicas.iter().map(|r| r.block_size_tokens).collect(),
            last: None,
        }
    }

    /// Leading blocks of `hashes` that `replica` holds, confirmed or speculatively.
    fn matched(&self, replica: usize, hashes: &[u64], now: SimTime) -> usize {
        hashes
            .iter()
            .take_while(|&&h| {
                self.index.holds(replica, h) || self.speculative.holds(replica, h, now)
            })
            .count()
    }
}

/// llm-d's normalisation of per-pod matched blocks (`indexedScoresToNormalizedScoredPods`): the
/// min and max are over the pods with a match; a pod without one scores 0.
pub fn normalized_prefix_scores(matched: &[usize]) -> Vec<f64> {
    let hits = matched.iter().copied().filter(|&m| m > 0);
    let min = hits.clone().min();
    let max = hits.max();
    matched
        .iter()
        .map(|&m| match (min, max) {
            _ if m == 0 => 0.0,
            (Some(lo), Some(hi)) if hi > lo => (m - lo) as f64 / (hi - lo) as f64,
            _ => 1.0,
        })
        .collect()
}

impl Router for LlmdPrecise {
    fn pick(
        &mut self,
        req: &Req<'_>,
        candidates: &[usize],
        view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        self.speculative.expire(view.now);
        let bs = self.block_tokens[candidates[0]];
        let hashes = chained_block_hashes(req.prompt, bs, usize::MAX);
        let matched: Vec<usize> = candidates
            .iter()
            .map(|&r| self.matched(r, &hashes, view.now))
            .collect();
        let prefix = normalized_prefix_scores(&matched);
        let queue = gie::queue_scores(candidates, view);
        let scored: Vec<(usize, f64)> = candidates
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let kv = 1.0 - view.kv_cache_usage(r);
                (
                    r,
                    PREFIX_WEIGHT * prefix[i]
                        + KV_UTILIZATION_WEIGHT * kv
                        + QUEUE_WEIGHT * queue[i],
                )
            })
            .collect();
        self.last = Some((req.id, hashes));
        Pick::to(argmax_random(&scored, rng))
    }

    fn on_dispatch(&mut self, req: &Req<'_>, replica: usize, now: SimTime) {
        if let Some((id, hashes)) = self.last.take()
            && id == req.id
        {
            self.speculative.add(replica, hashes, now);
        }
    }

    fn on_kv_events(&mut self, replica: usize, events: &[KvEvent], _now: SimTime) {
        self.index.apply(replica, events);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_scores_are_normalised_over_matching_pods_only() {
        assert_eq!(normalized_prefix_scores(&[0, 0, 0]), [0.0, 0.0, 0.0]);
        assert_eq!(normalized_prefix_scores(&[0, 7, 0]), [0.0, 1.0, 0.0]);
        assert_eq!(normalized_prefix_scores(&[4, 4, 0]), [1.0, 1.0, 0.0]);
        assert_eq!(
            normalized_prefix_scores(&[5, 10, 0, 15]),
            [0.0, 0.5, 0.0, 1.0]
        );
    }

    #[test]
    fn speculative_entries_expire_after_the_ttl() {
        let mut s = Speculative::new(2);
        let t0 = std::time::Duration::from_secs(10);
        s.add(1, vec![7, 8], t0);
        assert!(s.holds(1, 7, t0) && !s.holds(0, 7, t0));
        let later = t0 + SPECULATIVE_TTL;
        s.expire(later);
        assert!(!s.holds(1, 7, later));
        assert!(s.expires[1].is_empty() && s.queue.is_empty());
    }
}
