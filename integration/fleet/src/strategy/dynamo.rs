//! NVIDIA Dynamo's KV router.
//!
//! Source: ai-dynamo/dynamo, `docs/router/kv_cache_routing.md` and the KV router's scheduler. Each
//! worker's cost is `overlap_score_weight × prefill_blocks + decode_blocks`, where `prefill_blocks`
//! is the prefill work the worker would have (the blocks of this prompt it has not cached, plus the
//! uncached blocks of requests this router sent it that have not produced a first token) and
//! `decode_blocks` the KV blocks of the router's active sequences there, this one included. Cache
//! overlap comes from vLLM's KV events (`--kv-events`, the default). Defaults:
//! `overlap_score_weight` 1.0, `router_temperature` 0 (the lowest cost wins, ties at random),
//! one router by default. Its HA set-up (`--peer-instances N`) runs N routers with
//! `--router-replica-sync` (`docs/components/router/router-operations.md`): each publishes its
//! active-sequence lifecycle (assigned, prefill done, freed) over NATS core and every other
//! replica adds it to its own active-load view, after the event plane's delay. The current cost
//! (`docs/components/router/router-concepts.md`, "Cost Calculation": `prefill_load_scale ×
//! max(active prefill + incoming prompt blocks − overlap credit, 0) + decode blocks`, scale 1,
//! credit 1) is this one.

use std::collections::HashMap;

use kinference_sim::{KvEvent, SimTime};
use rand_chacha::ChaCha8Rng;

use super::{KvIndex, PeerEvent, Pick, Req, Router, argmin_random, chained_block_hashes};
use crate::{fleet::ReplicaInfo, sidecar::View};

pub const OVERLAP_SCORE_WEIGHT: f64 = 1.0;

#[derive(Copy, Clone, Debug)]
struct Active {
    replica: usize,
    prefill_blocks: f64,
    blocks: f64,
    prefilling: bool,
}

#[derive(Debug)]
pub struct DynamoKv {
    index: KvIndex,
    block_tokens: Vec<u32>,
    active: HashMap<u64, Active>,
    /// Per replica: uncached blocks still being prefilled, and blocks of active sequences.
    prefill_blocks: Vec<f64>,
    decode_blocks: Vec<f64>,
    last: Option<(u64, Active)>,
}

impl DynamoKv {
    pub fn new(replicas: &[ReplicaInfo]) -> Self {
        Self {
            index: KvIndex::new(replicas.len()),
            block_tokens: replicas.iter().map(|r| r.block_size_tokens).collect(),
            active: HashMap::new(),
            prefill_blocks: vec![0.0; replicas.len()],
            decode_blocks: vec![0.0; replicas.len()],
            last: None,
        }
    }
}

impl Router for DynamoKv {
    fn pick(
        &mut self,
        req: &Req<'_>,
        candidates: &[usize],
        _view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick {
        let bs = self.block_tokens[candidates[0]];
        let hashes = chained_block_hashes(req.prompt, bs, usize::MAX);
        let request_blocks = (req.prompt.len() as f64 / f64::from(bs)).ceil();
        let mut per: HashMap<usize, Active> = HashMap::new();
        let scored: Vec<(usize, f64)> = candidates
            .iter()
            .map(|&r| {
                let overlap = self.index.leading_matches(r, &hashes) as f64;
                let new_prefill = (request_blocks - overlap).max(0.0);
                per.insert(
                    r,
                    Active {
                        replica: r,
                        prefill_blocks: new_prefill,
                        blocks: request_blocks,
                        prefilling: true,
                    },
                );
                let prefill = self.prefill_blocks[r] + new_prefill;
                let decode = self.decode_blocks[r] + request_blocks;
                (r, OVERLAP_SCORE_WEIGHT * prefill + decode)
            })
            .collect();
        let r = argmin_random(&scored, rng);
        self.last = per.remove(&r).map(|a| (req.id, a));
        Pick::to(r)
    }

    fn on_dispatch(&mut self, req: &Req<'_>, replica: usize, _now: SimTime) {
        let a = match self.last.take() {
            Some((id, a)) if id == req.id && a.replica == replica => a,
            _ => {
                let blocks =
                    (req.prompt.len() as f64 / f64::from(self.block_tokens[replica])).ceil();
                Active {
                    replica,
                    prefill_blocks: blocks,
                    blocks,
                    prefilling: true,
                }
            }
        };
        self.prefill_blocks[replica] += a.prefill_blocks;
        self.decode_blocks[replica] += a.blocks;
        self.active.insert(req.id, a);
    }

    fn on_first_token(&mut self, id: u64, _replica: usize, _now: SimTime) {
        if let Some(a) = self.active.get_mut(&id)
            && a.prefilling
        {
            a.prefilling = false;
            self.prefill_blocks[a.replica] =
                (self.prefill_blocks[a.replica] - a.prefill_blocks).max(0.0);
        }
    }

    fn on_complete(&mut self, id: u64, _replica: usize, _output_tokens: u32, _now: SimTime) {
        if let Some(a) = self.active.remove(&id) {
            if a.prefilling {
                self.prefill_blocks[a.replica] =
                    (self.prefill_blocks[a.replica] - a.prefill_blocks).max(0.0);
            }
            self.decode_blocks[a.replica] = (self.decode_blocks[a.replica] - a.blocks).max(0.0);
        }
    }

    fn on_kv_events(&mut self, replica: usize, events: &[KvEvent], _now: SimTime) {
        self.index.apply(replica, events);
    }

    fn on_peer(&mut self, event: &PeerEvent, now: SimTime) {
        match event {
            PeerEvent::Dispatch {
                id,
                replica,
                prompt,
                ..
            } => {
                // The peer's sequence, with the overlap this replica's own index gives it.
                let bs = self.block_tokens[*replica];
                let blocks = (prompt.len() as f64 / f64::from(bs)).ceil();
                let hashes = chained_block_hashes(prompt, bs, usize::MAX);
                let overlap = self.index.leading_matches(*replica, &hashes) as f64;
                let a = Active {
                    replica: *replica,
                    prefill_blocks: (blocks - overlap).max(0.0),
                    blocks,
                    prefilling: true,
                };
                self.prefill_blocks[a.replica] += a.prefill_blocks;
                self.decode_blocks[a.replica] += a.blocks;
                self.active.insert(*id, a);
            }
            PeerEvent::FirstToken { id, replica, .. } => self.on_first_token(*id, *replica, now),
            PeerEvent::Complete { id, replica, .. } => self.on_complete(*id, *replica, 0, now),
            PeerEvent::Step { .. } => {}
        }
    }
}
