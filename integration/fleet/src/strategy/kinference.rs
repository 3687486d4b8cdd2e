//! Kinference: the proxy's own routing core (`kinference-routing`), driven in virtual time.
//!
//! Exactly the code the sidecar runs: the whole decision (`kinference_decision::decide`: the
//! policy's rules over the request's tags, the router's prediction and pick, and the plan's mode,
//! failure mode and attempt order), over a policy built from the fleet's pools as a platform team
//! would write it. Per endpoint, TTFT = wait (prefill-bound or KV-capacity-bound,
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

use kinference_classify::{ClassifierId, Tag, Tags};
use kinference_decision::{
    DEFAULT_SERVICE_CLASS, Input, Model, Objective, Policy, Price, ServiceClass, Workload,
    policy::{Action, Rule, TagMatch, WorkloadMatch},
};
use kinference_routing::{
    self as routing, DispatchHandle, EndpointId, EndpointMeta, ModelName, ModelPrior, Notice,
    PromptBlocks, RouterConfig, Scrape, Time,
    endpoint::{CacheConfig, PrefixCacheCounters},
};
use kinference_sim::{KvEvent, SimTime};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

use super::{Admission, PeerEvent, Pick, Req, Router, chained_block_hashes};
use crate::{fleet::ReplicaInfo, priors::PriorFactors, sidecar::View};

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

/// The prior a platform team would publish for a model: its profile's constants, off by
/// `factors` (see `crate::priors`; the engine's own constants only with `PriorFactors::TRUE`).
pub fn prior_of(info: &ReplicaInfo, factors: &PriorFactors) -> ModelPrior {
    let c = &info.profile.cost;
    ModelPrior {
        prefill_tokens_per_second: factors.prefill_rate / c.prefill_token_s,
        time_per_output_token_s: factors.decode_step * c.step_overhead_s,
        decode_step_per_seq_s: factors.decode_per_seq * c.decode_seq_s,
        max_num_batched_tokens: info.max_num_batched_tokens,
        overhead_s: 0.0,
        prefill_attention_pair_s: factors.attention_pair * c.prefill_attention_pair_s,
    }
}

fn time(t: SimTime) -> Time {
    Time::from_since_epoch(t)
}

/// Which policy a Kinference strategy routes under.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum PolicyVariant {
    /// The seed's rule (a `complexity=low` prompt may be served by any pool's model), LowestTTFT.
    Widening,
    /// No widening rule: every request stays on the requested model's pool.
    RequestedOnly,
    /// The seed's rule, and the objective `CheapestWithinSLO` with this `Standard` SLO.
    CheapestWithinSlo { slo: Duration },
}

/// The policy of the fleet's pools: every model with its prior (off by `priors`) and price, and
/// the seed's rule: a prompt tagged `complexity=low` may be served by any pool's model.
pub fn policy_of(replicas: &[ReplicaInfo], priors: &PriorFactors) -> Policy {
    policy_variant(replicas, PolicyVariant::Widening, priors)
}

/// [`policy_of`] under `variant`.
pub fn policy_variant(
    replicas: &[ReplicaInfo],
    variant: PolicyVariant,
    priors: &PriorFactors,
) -> Policy {
    let mut models: Vec<Model> = Vec::new();
    for info in replicas {
        if models.iter().any(|m| m.name == info.model) {
            continue;
        }
        models.push(Model {
            name: info.model.clone(),
            served_name: info.model.clone(),
            destination_path: format!("pool-{}", info.pool),
            pool: format!("pool-{}", info.pool),
            prior: prior_of(info, priors),
            price: info.price.map_or_else(Price::default, |p| Price {
                prompt_per_million_tokens: p.prompt_per_million,
                cached_prompt_per_million_tokens: p.cached_per_million,
                completion_per_million_tokens: p.completion_per_million,
            }),
            kv_events: None,
            engine: String::new(),
        });
    }
    let all: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    let mut policy = Policy {
        revision: "fleet".into(),
        models,
        rules: vec![Rule {
            name: "low-complexity-may-use-any-pool".into(),
            models: vec![],
            tags: vec![TagMatch {
                name: "complexity".into(),
                values: vec!["low".into()],
                min_confidence: 0.5,
            }],
            workloads: vec![],
            action: Action {
                add_models: all,
                ..Action::default()
            },
            guard: None,
        }],
        ..Policy::default()
    };
    match variant {
        PolicyVariant::Widening => {}
        PolicyVariant::RequestedOnly => policy.rules.clear(),
        PolicyVariant::CheapestWithinSlo { slo } => {
            policy.balancer.objective = Objective::CheapestWithinSlo;
            policy.service_classes = vec![ServiceClass {
                name: DEFAULT_SERVICE_CLASS.into(),
                ttft_slo: Some(slo),
                max_queue_time: None,
                reserved_share: 0.0,
            }];
        }
    }
    policy
}

/// The tags the workload gives a request: its complexity, as a classifier that knows would.
fn tags_of(req: &Req<'_>) -> Tags {
    let mut tags = Tags::new();
    tags.insert(Tag {
        name: "complexity".into(),
        value: if req.low_complexity { "low" } else { "high" }.into(),
        confidence: 1.0,
        source: ClassifierId::Rules,
    });
    tags
}

/// Why each request's decision chose what it chose, by request id: filled by a Kinference
/// router given one (a replay lists the decisions two policies made differently, with reasons).
pub type Decided = std::sync::Arc<std::sync::Mutex<HashMap<u64, String>>>;

/// A decision's reason as the proxy's records name it (`lowest_predicted_ttft`, ...), with the
/// rules that matched.
pub fn reason_of(plan: &kinference_decision::Plan) -> String {
    let kind = serde_json::to_value(plan.decision.reason)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str().map(str::to_owned)))
        .unwrap_or_else(|| format!("{:?}", plan.decision.reason));
    let rules: Vec<&str> = plan
        .candidates
        .rule_trace
        .iter()
        .filter(|r| r.matched)
        .map(|r| r.rule.as_str())
        .collect();
    if rules.is_empty() {
        kind
    } else {
        format!("{kind} (rules: {})", rules.join(", "))
    }
}

#[derive(Debug)]
pub struct Kinference {
    policy: Policy,
    workload: Workload,
    router: routing::Router,
    ids: Vec<EndpointId>,
    models: Vec<ModelName>,
    pools: Vec<usize>,
    by_id: HashMap<EndpointId, usize>,
    handles: HashMap<u64, DispatchHandle>,
    /// The plan for the request being picked, kept for `on_dispatch`.
    last: Option<(u64, kinference_decision::Plan, PromptBlocks)>,
    /// Where each decision's reason is written, when asked.
    decided: Option<Decided>,
}

impl Kinference {
    /// Kinference under the fleet's policy (the widening rule, LowestTTFT).
    pub fn new(replicas: &[ReplicaInfo], config: RouterConfig, priors: PriorFactors) -> Self {
        Self::with_policy(replicas, config, PolicyVariant::Widening, priors)
    }

    /// Kinference under `variant` of the fleet's policy.
    pub fn with_policy(
        replicas: &[ReplicaInfo],
        config: RouterConfig,
        variant: PolicyVariant,
        priors: PriorFactors,
    ) -> Self {
        let mut router = routing::Router::new(config);
        let mut ids = Vec::new();
        let mut models = Vec::new();
        let mut by_id = HashMap::new();
        for (i, info) in replicas.iter().enumerate() {
            let model = ModelName::from(info.model.as_str());
            router.set_model_prior(model.clone(), prior_of(info, &priors));
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
            policy: policy_variant(replicas, variant, &priors),
            workload: Workload::default(),
            router,
            ids,
            models,
            pools,
            by_id,
            handles: HashMap::new(),
            last: None,
            decided: None,
        }
    }

    /// Kinference under a given policy (an `InferencePolicy` converted as the proxy converts it),
    /// its models' priors the policy's own, as the proxy starts from them. The replicas' models
    /// are the policy's model names.
    pub fn with_given_policy(
        replicas: &[ReplicaInfo],
        config: RouterConfig,
        policy: Policy,
        decided: Option<Decided>,
    ) -> Self {
        let mut k = Self::with_policy(
            replicas,
            config,
            PolicyVariant::RequestedOnly,
            PriorFactors::TRUE,
        );
        for m in &policy.models {
            k.router
                .set_model_prior(ModelName::from(m.name.as_str()), m.prior);
        }
        k.policy = policy;
        k.decided = decided;
        k
    }
}

/// The workload label a rule reads a request's service class from (as a platform team would
/// class an app's workloads).
pub const CLASS_LABEL: &str = "kinference.io/service-class";

impl Kinference {
    /// Declares the workload's service classes in the policy, with a rule per class that gives it
    /// to the apps labelled with it; with `admission`, each class's `maxQueueTime` and
    /// `reservedShare` too.
    pub fn with_classes(
        mut self,
        classes: &[crate::workload::classes::Class],
        admission: bool,
    ) -> Self {
        if classes.is_empty() {
            return self;
        }
        self.policy.service_classes = classes
            .iter()
            .map(|c| ServiceClass {
                name: c.name.into(),
                ttft_slo: Some(Duration::from_secs_f64(c.ttft_slo_s)),
                max_queue_time: c
                    .max_queue_time_s
                    .filter(|_| admission)
                    .map(Duration::from_secs_f64),
                reserved_share: if admission { c.reserved_share } else { 0.0 },
            })
            .collect();
        for c in classes {
            self.policy.rules.push(Rule {
                name: format!("class-{}", c.name.to_lowercase()),
                models: vec![],
                tags: vec![],
                workloads: vec![WorkloadMatch {
                    namespace: String::new(),
                    name: String::new(),
                    match_labels: [(CLASS_LABEL.to_string(), c.name.to_string())].into(),
                    match_expressions: vec![],
                }],
                action: Action {
                    service_class: Some(c.name.into()),
                    ..Action::default()
                },
                guard: None,
            });
        }
        self
    }
}

impl Router for Kinference {
    fn admission(&self, class: &str) -> Option<Admission> {
        let (threshold, max_wait) = self.policy.admission(class)?;
        Some(Admission {
            threshold_s: threshold.as_secs_f64(),
            max_wait,
            reserved_share: self.policy.reserved_share(class),
        })
    }

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
        let blocks = prompt_blocks(req.prompt, &self.router.config().approx);
        let hasher = TokenHasher { prompt: req.prompt };
        let tags = tags_of(req);
        let classed = req.service_class.map(|c| Workload {
            labels: vec![(CLASS_LABEL.to_string(), c.to_string())],
            ..self.workload.clone()
        });
        let input = Input {
            requested: requested.as_str(),
            tags: &tags,
            workload: classed.as_ref().unwrap_or(&self.workload),
            prompt_tokens: u32::try_from(req.prompt.len()).unwrap_or(u32::MAX),
            max_tokens: None,
            prompt_blocks: &blocks,
            block_hasher: Some(&hasher),
            // The sidecar's default: one attempt and two retries.
            max_attempts: 3,
        };
        let plan =
            kinference_decision::decide(&self.policy, &self.router, &input, time(view.now), rng);
        let first = plan.as_ref().ok().and_then(|p| {
            let c = p.attempt(0)?;
            Some((self.by_id.get(&c.endpoint).copied()?, c))
        });
        let pick = match first {
            Some((replica, c)) => Pick {
                replica,
                predicted_ttft_s: Some(c.prediction.dated.predicted_ttft_s),
                prediction: Some(Box::new(c.prediction.clone())),
            },
            // The decision found nothing to send to (cannot happen with ready candidates and
            // the fleet's fail-open policy): spread at random rather than drop the request.
            None => Pick::to(candidates[rng.random_range(0..candidates.len())]),
        };
        if let Ok(plan) = plan {
            if let Some(d) = &self.decided
                && let Ok(mut d) = d.lock()
            {
                d.insert(req.id, reason_of(&plan));
            }
            self.last = Some((req.id, plan, blocks));
        }
        pick
    }

    fn on_dispatch(&mut self, req: &Req<'_>, replica: usize, now: SimTime) {
        let Some((id, plan, blocks)) = self.last.take() else {
            return;
        };
        // The attempt that went to `replica` (the plan's first, unless the engine refused it).
        let Some(&index) = plan
            .order
            .iter()
            .find(|&&i| self.by_id.get(&plan.decision.candidates[i].endpoint) == Some(&replica))
        else {
            return;
        };
        let mut decision = plan.decision;
        decision.chosen = Some(index);
        if id == req.id
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

    fn step_report(&mut self, id: u64, _replica: usize, now: SimTime) -> bool {
        self.handles
            .get(&id)
            .is_some_and(|&h| self.router.step_notice(h, time(now)).is_some())
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

    /// Another sidecar's notice through the signal plane (arms with `:signals`).
    fn on_peer(&mut self, event: &PeerEvent, now: SimTime) {
        let (replica, notice) = match event {
            PeerEvent::Dispatch {
                id,
                replica,
                prompt,
                notice,
            } => (
                *replica,
                notice.unwrap_or_else(|| {
                    let tokens = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
                    Notice::dispatch(*id, time(now), tokens, tokens)
                }),
            ),
            // Dated by the event, not the delivery: a notice carries its age.
            PeerEvent::FirstToken { id, replica, at } => (
                *replica,
                Notice::FirstToken {
                    id: *id,
                    at: time(*at),
                },
            ),
            PeerEvent::Step { id, replica, at } => (
                *replica,
                Notice::Step {
                    id: *id,
                    at: time(*at),
                },
            ),
            PeerEvent::Complete { id, replica, at } => (
                *replica,
                Notice::Complete {
                    id: *id,
                    at: time(*at),
                },
            ),
        };
        let _ = self.router.observe_notice(&self.ids[replica], notice);
        if let PeerEvent::Dispatch { id, prompt, .. } = event {
            let blocks = prompt_blocks(prompt, &self.router.config().approx);
            let _ = self
                .router
                .observe_notice_prompt(&self.ids[replica], *id, &blocks);
        }
    }

    fn on_load(&mut self, replica: usize, server_load: u32, at: SimTime) {
        // Dated on its own, as the proxy applies the service's loads: only the server load moves.
        let scrape = Scrape {
            server_load: Some(server_load),
            ..Scrape::default()
        };
        let _ = self
            .router
            .observe_scrape(&self.ids[replica], &scrape, time(at));
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
