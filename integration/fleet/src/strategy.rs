//! The routing strategies under comparison, behind one small trait.
//!
//! Each strategy is written from its published description with its published default parameters
//! (each file cites its source), and sees only what a router of its kind sees: the static facts of
//! the candidates, its own sidecar's scrapes and in-flight requests, its own routing history and,
//! for the strategies that subscribe to them, KV events after their delivery delay.

pub mod aibrix;
pub mod dynamo;
pub mod gie;
pub mod kinference;
pub mod least_request;
pub mod llmd_precise;
pub mod oracle;
pub mod peak_ewma;
pub mod random;
pub mod round_robin;
pub mod sglang;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use kinference_sim::{KvEvent, SimTime};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::{fleet::ReplicaInfo, priors::PriorFactors, sidecar::View};

/// A request as a router sees it (the output length is unknown to every router).
#[derive(Copy, Clone, Debug)]
pub struct Req<'a> {
    pub id: u64,
    pub prompt: &'a [u32],
    /// The pool of the model the client asked for.
    pub pool: usize,
    pub low_complexity: bool,
    /// The service class its app declares (`None`: the policy's default).
    pub service_class: Option<&'a str>,
}

/// How a router holds a class's requests for capacity (see `kinference_decision::admission`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Admission {
    /// Held while the best candidate's predicted TTFT is over this (seconds).
    pub threshold_s: f64,
    /// Refused once held this long.
    pub max_wait: Duration,
    /// The class's guaranteed share of releases while it has requests held.
    pub reserved_share: f64,
}

/// A routing decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Pick {
    pub replica: usize,
    /// The TTFT the strategy predicted for this request there, if it predicts one (seconds).
    pub predicted_ttft_s: Option<f64>,
    /// Every input of that prediction (Kinference only), for `--dump-requests`.
    pub prediction: Option<Box<kinference_routing::predict::Prediction>>,
}

impl Pick {
    pub fn to(replica: usize) -> Self {
        Self {
            replica,
            predicted_ttft_s: None,
            prediction: None,
        }
    }
}

/// One sidecar's instance of a routing strategy.
pub trait Router: Send + std::fmt::Debug {
    /// Chooses one of `candidates` (never empty) for `req`.
    fn pick(
        &mut self,
        req: &Req<'_>,
        candidates: &[usize],
        view: &View<'_>,
        rng: &mut ChaCha8Rng,
    ) -> Pick;
    /// The request was sent to `replica`.
    fn on_dispatch(&mut self, _req: &Req<'_>, _replica: usize, _now: SimTime) {}
    /// The first token of request `id` came back from `replica`.
    fn on_first_token(&mut self, _id: u64, _replica: usize, _now: SimTime) {}
    /// A later token of request `id` arrived from `replica`.
    fn on_token(&mut self, _id: u64, _replica: usize, _now: SimTime) {}
    /// Whether to tell the other instances (a [`PeerEvent::Step`]) that `replica`'s engine step
    /// ended at `now`, as the token of request `id` just seen there shows (called after
    /// [`Router::on_first_token`] and [`Router::on_token`], with replica sync only).
    fn step_report(&mut self, _id: u64, _replica: usize, _now: SimTime) -> bool {
        false
    }
    /// Request `id` finished on `replica` (`output_tokens` streamed).
    fn on_complete(&mut self, _id: u64, _replica: usize, _output_tokens: u32, _now: SimTime) {}
    /// This sidecar just scraped every replica (the view holds the new values).
    fn on_scrape(&mut self, _view: &View<'_>) {}
    /// KV events of `replica` reached this sidecar.
    fn on_kv_events(&mut self, _replica: usize, _events: &[KvEvent], _now: SimTime) {}
    /// Another instance of the same strategy published what it did (HA replica sync; only
    /// strategies with [`StrategyKind::replica_sync`] receive these).
    fn on_peer(&mut self, _event: &PeerEvent, _now: SimTime) {}

    /// `GET /load` of `replica`, read at `at` apart from its metrics (the signal service's
    /// faster load loop, arms with `:signals`).
    fn on_load(&mut self, _replica: usize, _server_load: u32, _at: SimTime) {}
    /// Whether, and how, a request of `class` is held while it is predicted to miss its
    /// objective; `None`: sent at once (every peer forwards everything).
    fn admission(&self, _class: &str) -> Option<Admission> {
        None
    }
}

/// What one router instance tells its peers when the strategy syncs replicas.
#[derive(Clone, Debug)]
pub enum PeerEvent {
    /// Request `id` was sent to `replica`.
    Dispatch {
        id: u64,
        replica: usize,
        prompt: Arc<[u32]>,
        /// Kinference's notice of it, with the sender's prediction (the signal plane).
        notice: Option<kinference_routing::Notice>,
    },
    /// Request `id` produced its first token on `replica` at `at`.
    FirstToken {
        id: u64,
        replica: usize,
        at: SimTime,
    },
    /// An engine step of `replica` ended at `at`, as a token of the sender's stream of request
    /// `id` showed.
    Step {
        id: u64,
        replica: usize,
        at: SimTime,
    },
    /// Request `id` finished on `replica` at `at`.
    Complete {
        id: u64,
        replica: usize,
        at: SimTime,
    },
}

/// How a system is deployed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Deployment {
    /// A picker every request passes through (a gateway's endpoint picker, a router service):
    /// one instance by default, its HA set-up with `--peer-instances`.
    Central,
    /// A proxy beside every client (a service mesh's sidecars): `--kinference-sidecars` of them.
    Mesh,
}

/// What a strategy's instance is built with.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct BuildContext {
    /// The routing core's settings for Kinference (and the oracle).
    pub kinference: kinference_routing::RouterConfig,
    /// Kinference's priors against the engine's constants.
    pub priors: PriorFactors,
    /// The workload's TTFT SLO, in seconds (the `Standard` class's in the policy of
    /// `kinference-cheapest-within-slo`).
    pub slo_ttft_s: f64,
    /// The workload's service classes, declared in Kinference's policy (empty: none).
    pub classes: &'static [crate::workload::classes::Class],
    /// Whether Kinference's policy gives its classes `maxQueueTime` (admission control).
    pub admission: bool,
}

impl Default for BuildContext {
    fn default() -> Self {
        Self {
            kinference: kinference_routing::RouterConfig::default(),
            priors: PriorFactors::MEASURED,
            slo_ttft_s: 2.0,
            classes: &[],
            admission: false,
        }
    }
}

/// SMG's mesh exchanges state during its SWIM pings, once a second
/// (lightseekorg/smg, `docs/concepts/architecture/high-availability.md`).
pub const SGLANG_GOSSIP_INTERVAL: Duration = Duration::from_secs(1);

/// The strategies, by name.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StrategyKind {
    RoundRobin,
    Random,
    LeastRequest,
    PeakEwma,
    Gie,
    LlmdPrecise,
    Dynamo,
    Sglang,
    Aibrix,
    Kinference,
    /// The same decision code with the widening rule removed: the headline's baseline.
    KinferenceRequestedOnly,
    /// Kinference with the policy objective `CheapestWithinSLO` at the workload's SLO.
    KinferenceCheapest,
    Oracle,
}

impl StrategyKind {
    /// The systems compared (the oracle, a bound and not a system, is listed apart).
    pub const ALL: [StrategyKind; 10] = [
        StrategyKind::RoundRobin,
        StrategyKind::Random,
        StrategyKind::LeastRequest,
        StrategyKind::PeakEwma,
        StrategyKind::Gie,
        StrategyKind::LlmdPrecise,
        StrategyKind::Dynamo,
        StrategyKind::Sglang,
        StrategyKind::Aibrix,
        StrategyKind::Kinference,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::RoundRobin => "round-robin",
            StrategyKind::Random => "random",
            StrategyKind::LeastRequest => "least-request",
            StrategyKind::PeakEwma => "peak-ewma-p2c",
            StrategyKind::Gie => "gie-default",
            StrategyKind::LlmdPrecise => "llm-d-precise",
            StrategyKind::Dynamo => "dynamo-kv",
            StrategyKind::Sglang => "sglang-cache-aware",
            StrategyKind::Aibrix => "aibrix-prefix",
            StrategyKind::Kinference => "kinference",
            StrategyKind::KinferenceRequestedOnly => "kinference-requested-only",
            StrategyKind::KinferenceCheapest => "kinference-cheapest-within-slo",
            StrategyKind::Oracle => "oracle",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::KINFERENCE_VARIANTS)
            .chain([StrategyKind::Oracle])
            .find(|k| k.name() == s)
    }

    /// Whether this is one of Kinference's own strategies (for the report's comparisons: every
    /// other strategy is a peer). More Kinference variants join here.
    pub fn is_kinference(self) -> bool {
        matches!(
            self,
            StrategyKind::Kinference
                | StrategyKind::KinferenceRequestedOnly
                | StrategyKind::KinferenceCheapest
        )
    }

    /// Kinference under other policies, beside `kinference` (LowestTTFT with the widening rule):
    /// the headline's baseline without the rule, and the `CheapestWithinSLO` objective.
    pub const KINFERENCE_VARIANTS: [StrategyKind; 2] = [
        StrategyKind::KinferenceRequestedOnly,
        StrategyKind::KinferenceCheapest,
    ];

    /// How the system is deployed: central pickers central, a mesh as a mesh.
    pub fn deployment(self) -> Deployment {
        match self {
            StrategyKind::RoundRobin
            | StrategyKind::Random
            | StrategyKind::LeastRequest
            | StrategyKind::PeakEwma
            | StrategyKind::Kinference
            | StrategyKind::KinferenceRequestedOnly
            | StrategyKind::KinferenceCheapest => Deployment::Mesh,
            StrategyKind::Gie
            | StrategyKind::LlmdPrecise
            | StrategyKind::Dynamo
            | StrategyKind::Sglang
            | StrategyKind::Aibrix
            | StrategyKind::Oracle => Deployment::Central,
        }
    }

    /// Of `replicas` deployed picker replicas, how many serve traffic. The Inference Extension's
    /// chart adds `--ha-enable-leader-election` when `replicas > 1`, so only the leader passes
    /// readiness and serves (active-passive; llm-d/llm-d `guides/precise-prefix-cache-aware/
    /// active-active.md`, "Leader election"). llm-d's guide documents active-active instead, every
    /// replica serving. The oracle is one instance by definition.
    pub fn serving_instances(self, replicas: usize) -> usize {
        match self {
            StrategyKind::Gie | StrategyKind::Oracle => 1,
            _ => replicas.max(1),
        }
    }

    /// How long a peer instance takes to learn what another did, for systems with their own
    /// replica sync; `None` where a system has none (each instance knows only its own work).
    /// - Dynamo: `--router-replica-sync` publishes active-sequence lifecycle events over NATS core
    ///   (ai-dynamo/dynamo `docs/components/router/router-operations.md`, "Active Block Replica
    ///   Synchronization"): the event plane's delay, as for KV events.
    /// - SGLang's gateway (SMG) with `--enable-mesh` replicates its cache-aware radix trees by
    ///   gossip ([`SGLANG_GOSSIP_INTERVAL`]); loads stay local.
    /// - llm-d active-active: every replica subscribes to every pod's KV events (which the fleet
    ///   delivers to every instance anyway) and nothing else is shared.
    /// - AIBrix, the Inference Extension, the mesh strategies: none.
    pub fn replica_sync(self, event_plane_delay: Duration) -> Option<Duration> {
        match self {
            StrategyKind::Dynamo => Some(event_plane_delay),
            StrategyKind::Sglang => Some(SGLANG_GOSSIP_INTERVAL),
            _ => None,
        }
    }

    /// Whether the strategy's published design reads a server-side queue that vLLM's `GET /load`
    /// can supply fresher than `/metrics` (the Inference Extension's and llm-d's queue scorers,
    /// Kinference). The others count their own requests (SGLang, AIBrix, Dynamo, Linkerd, Envoy)
    /// or read nothing.
    pub fn reads_server_load(self) -> bool {
        matches!(
            self,
            StrategyKind::Gie
                | StrategyKind::LlmdPrecise
                | StrategyKind::Kinference
                | StrategyKind::KinferenceRequestedOnly
                | StrategyKind::KinferenceCheapest
                | StrategyKind::Oracle
        )
    }

    /// Whether the run loop hands this strategy the engines' true state at each decision (the
    /// oracle only).
    pub fn sees_truth(self) -> bool {
        matches!(self, StrategyKind::Oracle)
    }

    /// Whether the strategy subscribes to KV events.
    pub fn wants_kv_events(self) -> bool {
        matches!(
            self,
            StrategyKind::LlmdPrecise
                | StrategyKind::Dynamo
                | StrategyKind::Kinference
                | StrategyKind::KinferenceRequestedOnly
                | StrategyKind::KinferenceCheapest
                | StrategyKind::Oracle
        )
    }

    /// Whether the strategy applies Kinference's cross-model policy (the others route within the
    /// requested model's pool).
    pub fn cross_model(self) -> bool {
        matches!(
            self,
            StrategyKind::Kinference | StrategyKind::KinferenceCheapest | StrategyKind::Oracle
        )
    }

    /// A fresh instance for one sidecar (or picker replica) of a fleet with `replicas`; `ctx`
    /// configures Kinference (the others use their published defaults).
    pub fn build(self, replicas: &[ReplicaInfo], ctx: &BuildContext) -> Box<dyn Router> {
        match self {
            StrategyKind::RoundRobin => Box::new(round_robin::RoundRobin::default()),
            StrategyKind::Random => Box::new(random::Random),
            StrategyKind::LeastRequest => Box::new(least_request::LeastRequest),
            StrategyKind::PeakEwma => Box::new(peak_ewma::PeakEwmaP2c::new(replicas.len())),
            StrategyKind::Gie => Box::new(gie::GieDefault::new(replicas.len())),
            StrategyKind::LlmdPrecise => Box::new(llmd_precise::LlmdPrecise::new(replicas)),
            StrategyKind::Dynamo => Box::new(dynamo::DynamoKv::new(replicas)),
            StrategyKind::Sglang => Box::new(sglang::SglangCacheAware::new(replicas.len())),
            StrategyKind::Aibrix => Box::new(aibrix::AibrixPrefix::new(replicas.len())),
            StrategyKind::Kinference
            | StrategyKind::KinferenceRequestedOnly
            | StrategyKind::KinferenceCheapest => {
                let variant = match self {
                    StrategyKind::KinferenceRequestedOnly => {
                        kinference::PolicyVariant::RequestedOnly
                    }
                    StrategyKind::KinferenceCheapest => {
                        kinference::PolicyVariant::CheapestWithinSlo {
                            slo: std::time::Duration::from_secs_f64(ctx.slo_ttft_s),
                        }
                    }
                    _ => kinference::PolicyVariant::Widening,
                };
                Box::new(
                    kinference::Kinference::with_policy(
                        replicas,
                        ctx.kinference,
                        variant,
                        ctx.priors,
                    )
                    .with_classes(ctx.classes, ctx.admission),
                )
            }
            StrategyKind::Oracle => Box::new(oracle::build(replicas, ctx.kinference)),
        }
    }
}

/// The candidate with the highest score; exact ties broken uniformly at random (as the Inference
/// Extension's max-score picker does by shuffling first).
pub fn argmax_random(scored: &[(usize, f64)], rng: &mut ChaCha8Rng) -> usize {
    let best = scored
        .iter()
        .map(|&(_, s)| s)
        .fold(f64::NEG_INFINITY, f64::max);
    let ties: Vec<usize> = scored
        .iter()
        .filter(|&&(_, s)| s >= best - 1e-12)
        .map(|&(r, _)| r)
        .collect();
    ties[rng.random_range(0..ties.len())]
}

/// The candidate with the lowest cost; exact ties broken uniformly at random.
pub fn argmin_random(scored: &[(usize, f64)], rng: &mut ChaCha8Rng) -> usize {
    let negated: Vec<(usize, f64)> = scored.iter().map(|&(r, c)| (r, -c)).collect();
    argmax_random(&negated, rng)
}

/// Chained hashes of the full `block_tokens`-token blocks of `prompt` (a block's hash names its
/// whole prefix), at most `max_blocks` of them.
pub fn chained_block_hashes(prompt: &[u32], block_tokens: u32, max_blocks: usize) -> Vec<u64> {
    let bs = block_tokens.max(1) as usize;
    let n = (prompt.len() / bs).min(max_blocks);
    let mut out = Vec::with_capacity(n);
    kinference_sim::kv::extend_block_hashes(&mut out, &prompt[..n * bs], block_tokens.max(1), None);
    out
}

/// A set of block hashes with least-recently-used eviction at a fixed capacity: the approximate
/// per-server index that routers build from their own routing decisions.
#[derive(Clone, Debug, Default)]
pub struct LruSet {
    capacity: usize,
    tick: u64,
    last_used: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
}

impl LruSet {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            ..Self::default()
        }
    }

    pub fn len(&self) -> usize {
        self.last_used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last_used.is_empty()
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.last_used.contains_key(&hash)
    }

    /// Inserts or refreshes `hash`, evicting the least recently used entries beyond capacity.
    pub fn touch(&mut self, hash: u64) {
        self.tick += 1;
        self.last_used.insert(hash, self.tick);
        self.order.push_back((self.tick, hash));
        while self.last_used.len() > self.capacity {
            let Some((t, h)) = self.order.pop_front() else {
                break;
            };
            if self.last_used.get(&h) == Some(&t) {
                self.last_used.remove(&h);
            }
        }
        // Keep the lazy queue bounded.
        if self.order.len() > 4 * self.capacity + 1024 {
            let live = &self.last_used;
            self.order.retain(|(t, h)| live.get(h) == Some(t));
        }
    }

    /// How many leading `hashes` are present.
    pub fn leading_matches(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.last_used.contains_key(h))
            .count()
    }
}

/// Per-replica sets of cached block hashes, kept from vLLM KV events (the precise index).
#[derive(Clone, Debug)]
pub struct KvIndex {
    cached: Vec<HashSet<u64>>,
}

impl KvIndex {
    pub fn new(replicas: usize) -> Self {
        Self {
            cached: vec![HashSet::new(); replicas],
        }
    }

    pub fn apply(&mut self, replica: usize, events: &[KvEvent]) {
        let set = &mut self.cached[replica];
        for e in events {
            match e {
                KvEvent::BlockStored { block_hashes, .. } => {
                    set.extend(block_hashes.iter().copied())
                }
                KvEvent::BlockRemoved { block_hashes } => {
                    for h in block_hashes {
                        set.remove(h);
                    }
                }
                KvEvent::AllBlocksCleared => set.clear(),
            }
        }
    }

    /// Whether `replica` holds block `hash`.
    pub fn holds(&self, replica: usize, hash: u64) -> bool {
        self.cached[replica].contains(&hash)
    }

    /// Leading blocks of `hashes` that `replica` holds.
    pub fn leading_matches(&self, replica: usize, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.cached[replica].contains(h))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn lru_evicts_least_recent() {
        let mut l = LruSet::new(2);
        l.touch(1);
        l.touch(2);
        l.touch(1);
        l.touch(3);
        assert!(l.contains(1) && l.contains(3) && !l.contains(2));
        assert_eq!(l.leading_matches(&[1, 3, 2, 1]), 2);
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn kv_index_follows_events_and_matches_engine_hashes() {
        let prompt: Vec<u32> = (1..=40).collect();
        let h = chained_block_hashes(&prompt, 16, usize::MAX);
        assert_eq!(h.len(), 2);
        let mut idx = KvIndex::new(2);
        idx.apply(
            1,
            &[KvEvent::BlockStored {
                block_hashes: h.clone(),
                parent_block_hash: None,
                token_ids: prompt[..32].to_vec(),
                block_size: 16,
                lora_id: None,
            }],
        );
        assert_eq!(idx.leading_matches(1, &h), 2);
        assert_eq!(idx.leading_matches(0, &h), 0);
        idx.apply(
            1,
            &[KvEvent::BlockRemoved {
                block_hashes: vec![h[0]],
            }],
        );
        assert_eq!(idx.leading_matches(1, &h), 0);
        // The same hashes an engine computes for its prefix cache.
        let mut eng = kinference_sim::Engine::new(
            kinference_sim::Profile::named("qwen-3.6-27b")
                .unwrap()
                .engine,
            kinference_sim::Profile::named("qwen-3.6-27b").unwrap().cost,
        );
        eng.submit(
            kinference_sim::EngineRequest {
                id: 1,
                prompt: prompt.clone(),
                max_tokens: 1,
                lora: None,
            },
            SimTime::ZERO,
        )
        .unwrap();
        eng.step(SimTime::ZERO);
        let stored: Vec<u64> = eng
            .drain_kv_events()
            .into_iter()
            .flat_map(|e| match e {
                KvEvent::BlockStored { block_hashes, .. } => block_hashes,
                _ => vec![],
            })
            .collect();
        assert_eq!(stored, h);
    }

    #[test]
    fn ties_are_spread() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let scored = [(0, 1.0), (1, 1.0), (2, 0.5)];
        let mut seen = [0; 3];
        for _ in 0..300 {
            seen[argmax_random(&scored, &mut rng)] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(seen[0] > 100 && seen[1] > 100, "{seen:?}");
        assert_eq!(argmin_random(&scored, &mut rng), 2);
        for k in StrategyKind::ALL.into_iter().chain([StrategyKind::Oracle]) {
            assert_eq!(StrategyKind::parse(k.name()), Some(k));
        }
    }
}
