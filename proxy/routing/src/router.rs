//! The routing state of one proxy, and the decision made from it.
//!
//! The [`Router`] owns what one sidecar knows about every endpoint it may route to (signals, its own
//! in-flight requests, learned prefill rates, peak-EWMAs, prefix indexes) and turns it into a
//! [`Decision`] per request. It is driven entirely by its caller: scrapes, KV events, dispatches,
//! first tokens and completions come in as calls stamped with a [`Time`], so the proxy and the
//! fleet benchmark run the same code.

use crate::{
    accrual::{Accrual, AccrualConfig},
    affinity::{self, AffinityConfig},
    decision::{Candidate, Decision, Excluded, Exclusion, Reason},
    endpoint::{EndpointId, EndpointMeta, ModelName, Scrape, Signals},
    ewma::{DEFAULT_TAU, PeakEwma},
    fallback::{P2cInputs, power_of_two},
    inflight::{InFlight, InFlightRequest},
    notice::Notice,
    predict::{EndpointView, ModelPrior, PredictConfig, PrefillRate, ServiceTime, predict},
    prefix::{
        ApproxConfig, ApproxIndex, BlockHash, BlockHasher, KvEvent, LruSet, PreciseIndex,
        PrefixSource, PromptBlocks,
    },
    select::{DEFAULT_TIE_WINDOW, lowest_within_tie_window},
    time::Time,
};
use rand::Rng;
use std::{collections::HashMap, sync::Arc, time::Duration};

/// Settings of the router (the balancer settings the controller serves, with defaults).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RouterConfig {
    pub predict: PredictConfig,
    pub approx: ApproxConfig,
    /// Prefix affinity among near-equal candidates (see [`crate::affinity`]).
    pub affinity: AffinityConfig,
    /// Failure accrual: when failing endpoints are ejected (see [`crate::accrual`]).
    pub accrual: AccrualConfig,
    /// A candidate of a model other than the requested one (a substitute the policy allows) has
    /// its selection cost multiplied by `1 + substitute_margin`, so it wins only when clearly
    /// faster. A substitute is another model, usually a smaller one: moving a request to it on a
    /// few milliseconds of prediction trades quality for nothing, and loads a pool whose own
    /// requests cannot move back (measured in `docs/ttft-model.md`, "Pass 3").
    pub substitute_margin: f64,
    /// Predictions within this of the best are treated as equal.
    pub tie_window: Duration,
    /// Decay time constant of the fallback's TTFT peak-EWMA.
    pub latency_tau: Duration,
    /// Weight of one request in the running mean prompt size.
    pub mean_prompt_alpha: f64,
    /// The running mean prompt size before any request, in tokens.
    pub default_prompt_tokens: f64,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            predict: PredictConfig::default(),
            approx: ApproxConfig::default(),
            affinity: AffinityConfig::default(),
            accrual: AccrualConfig::default(),
            substitute_margin: 0.5,
            tie_window: DEFAULT_TIE_WINDOW,
            latency_tau: DEFAULT_TAU,
            mean_prompt_alpha: 0.05,
            default_prompt_tokens: 1_000.0,
        }
    }
}

/// Errors at the router's edge.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouterError {
    #[error("unknown endpoint {0}")]
    UnknownEndpoint(EndpointId),
    #[error("the decision chose no endpoint")]
    NothingChosen,
    #[error("the endpoint of this request was removed or replaced")]
    StaleHandle,
    #[error("unknown request (already completed?)")]
    UnknownRequest,
}

/// One request to route. Holds no prompt text, only what the prediction needs.
#[derive(Copy, Clone)]
pub struct Request<'a> {
    /// The model the client asked for (the fallback's pool).
    pub requested_model: &'a ModelName,
    /// The models the policy allows for this request (including the requested one if allowed).
    pub candidate_models: &'a [ModelName],
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    /// The LoRA adapter asked for, if any: only endpoints serving it are candidates.
    pub lora_adapter: Option<&'a str>,
    /// The prompt's approximate chunk hashes.
    pub prompt_blocks: &'a PromptBlocks,
    /// vLLM-space hashing of this prompt, for endpoints with KV events.
    pub block_hasher: Option<&'a dyn BlockHasher>,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("requested_model", self.requested_model)
            .field("candidate_models", &self.candidate_models)
            .field("prompt_tokens", &self.prompt_tokens)
            .field("max_tokens", &self.max_tokens)
            .field("lora_adapter", &self.lora_adapter)
            .field("prompt_blocks", &self.prompt_blocks.hashes().len())
            .field("block_hasher", &self.block_hasher.is_some())
            .finish()
    }
}

/// Identifies a dispatched request for its first-token and completion calls.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct DispatchHandle {
    slot: u32,
    generation: u32,
    request_id: u64,
}

impl DispatchHandle {
    /// The request's id in this router's ledger (what this proxy's notices name it by).
    pub fn request_id(&self) -> u64 {
        self.request_id
    }
}

/// How long another proxy's request stays on record without its completion notice.
pub const NOTICE_TTL: std::time::Duration = std::time::Duration::from_secs(300);

/// How long before a `GET /load` read a request must have been sent to be counted in it when the
/// notices are reconciled with it: the hop from a sidecar to the engine's API server (loopback or
/// one cluster network hop, well under this).
pub const RECONCILE_GRACE: std::time::Duration = std::time::Duration::from_millis(10);

#[derive(Debug)]
struct EndpointState {
    meta: EndpointMeta,
    ready: bool,
    signals: Signals,
    inflight: InFlight,
    /// Other proxies' requests here, from notices (see [`crate::notice`]).
    foreign: InFlight,
    rate: PrefillRate,
    /// How long requests decode here (first token to completion): own ones, and other
    /// proxies' from their notices.
    service: ServiceTime,
    /// Peak-EWMA of observed / predicted (uncorrected) TTFT, resting at 1.
    correction: PeakEwma,
    /// Peak-EWMA of observed TTFT in seconds, resting at 0 (the fallback's latency).
    latency: PeakEwma,
    precise: Option<PreciseIndex>,
    /// Its recent failures, and whether they ejected it.
    accrual: Accrual,
    /// The chunk hashes of own requests sent here that have not had their first token yet.
    pending_prompts: Vec<(u64, Arc<[BlockHash]>)>,
    /// The same for other proxies' requests, from notices ([`Router::observe_notice_prompt`]).
    foreign_prompts: Vec<(u64, Arc<[BlockHash]>)>,
    /// When this proxy last sent the others a step notice for this endpoint.
    step_reported_at: Option<Time>,
}

impl EndpointState {
    /// What a first token teaches: the prefill rate (when nothing was predicted ahead of it),
    /// the correction of the wait, and the latency EWMA.
    fn learn(&mut self, ft: &crate::inflight::FirstToken, at: Time, cfg: &PredictConfig) {
        let ttft_s = ft.ttft.as_secs_f64();
        let r = ft.request;
        let kv = r.kv_pressure_factor.max(1.0);
        if r.teaches_rate {
            self.rate.observe(
                r.uncached_tokens,
                (ttft_s - r.predicted_non_prefill_s) / kv,
                cfg,
            );
        }
        let wait_s = r.predicted_wait_s;
        if wait_s > 0.0 && wait_s >= cfg.correction_min_wait_fraction * r.predicted_raw_ttft_s {
            // The observed wait: the TTFT less what was predicted for everything but the wait.
            let observed_wait_s = ttft_s - (r.predicted_raw_ttft_s - wait_s);
            let ratio = (observed_wait_s / wait_s).clamp(cfg.correction_min, cfg.correction_max);
            self.correction.observe(ratio, at);
        }
        self.latency.observe(ttft_s, at);
    }

    /// Leading prompt tokens shared with a prompt this proxy (or, by notice, another) sent here
    /// that is still waiting for its first token (whose prefix the endpoint will have computed before it gets to `prompt`).
    fn pending_tokens(&self, prompt: &PromptBlocks) -> u64 {
        let hashes = prompt.hashes();
        let Some(first) = hashes.first() else {
            return 0;
        };
        let blocks = self
            .pending_prompts
            .iter()
            .chain(self.foreign_prompts.iter())
            .filter(|(_, p)| p.first() == Some(first))
            .map(|(_, p)| p.iter().zip(hashes).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0);
        blocks as u64 * u64::from(prompt.block_size_tokens())
    }

    /// Reconciles the notices' ledger with `GET /load` read at `at`: the endpoint's API server
    /// holds every request from its arrival until its response ends, so the requests known here
    /// (own and others', sent by `at`) are at most `server_load`. More means notices were lost
    /// (a first token and a completion both lost would hold a request's work in the queue until
    /// [`NOTICE_TTL`]): the excess, oldest first, is forgotten.
    ///
    /// Two readings say nothing of the notices and are skipped: a load below the requests the
    /// engine's own gauges show (an engine that does not track its load answers 0 whatever it
    /// holds, as vLLM does without `--enable-server-load-tracking`), and requests sent within
    /// [`RECONCILE_GRACE`] of the read, which may still be on their way to the engine.
    fn reconcile_foreign(&mut self, server_load: u32, at: Time) {
        let gauge = |o: Option<crate::endpoint::Observed<u32>>| o.map_or(0, |o| o.value);
        let shown = gauge(self.signals.num_requests_running)
            .saturating_add(gauge(self.signals.num_requests_waiting));
        if server_load < shown {
            return;
        }
        let at = Time::from_since_epoch(at.since_epoch().saturating_sub(RECONCILE_GRACE));
        let sent_by = |f: &InFlight| f.iter().filter(|r| r.dispatched_at <= at).count();
        let known = sent_by(&self.inflight) + sent_by(&self.foreign);
        let excess = known.saturating_sub(server_load as usize);
        if excess == 0 {
            return;
        }
        let mut oldest: Vec<(Time, u64)> = self
            .foreign
            .iter()
            .filter(|r| r.dispatched_at <= at)
            .map(|r| (r.dispatched_at, r.id))
            .collect();
        oldest.sort_unstable();
        for &(_, id) in oldest.iter().take(excess) {
            let _ = self.foreign.complete(id);
            self.foreign_prompts.retain(|(i, _)| *i != id);
        }
    }

    fn forget_pending(&mut self, request_id: u64) {
        self.pending_prompts.retain(|(id, _)| *id != request_id);
    }
}

#[derive(Debug, Default)]
struct Slot {
    generation: u32,
    state: Option<EndpointState>,
}

/// The routing state of one proxy.
#[derive(Debug)]
pub struct Router {
    config: RouterConfig,
    slots: Vec<Slot>,
    by_id: HashMap<EndpointId, u32>,
    by_model: HashMap<ModelName, Vec<u32>>,
    priors: HashMap<ModelName, ModelPrior>,
    default_prior: ModelPrior,
    approx: ApproxIndex,
    mean_prompt_tokens: f64,
    next_request_id: u64,
    /// Affinity keys of prompts this proxy dispatched (see [`crate::affinity`]).
    seen_keys: LruSet,
}

impl Router {
    /// An empty router.
    pub fn new(config: RouterConfig) -> Self {
        Self {
            config,
            slots: Vec::new(),
            by_id: HashMap::new(),
            by_model: HashMap::new(),
            priors: HashMap::new(),
            default_prior: ModelPrior::default(),
            approx: ApproxIndex::default(),
            mean_prompt_tokens: config.default_prompt_tokens,
            next_request_id: 0,
            seen_keys: LruSet::new(config.affinity.remembered_keys),
        }
    }

    /// The router's settings.
    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Sets the prior of `model`. Endpoints that have not learned a prefill rate yet start from it.
    pub fn set_model_prior(&mut self, model: ModelName, prior: ModelPrior) {
        for &slot in self.by_model.get(&model).into_iter().flatten() {
            if let Some(st) = self.slots[slot as usize].state.as_mut()
                && st.rate.samples() == 0
            {
                st.rate = PrefillRate::new(&prior);
            }
        }
        self.priors.insert(model, prior);
    }

    fn prior(&self, model: &ModelName) -> &ModelPrior {
        self.priors.get(model).unwrap_or(&self.default_prior)
    }

    /// Adds an endpoint, or updates its static facts. Changing its model starts it afresh. New
    /// endpoints start not ready until [`Router::set_ready`].
    pub fn upsert_endpoint(&mut self, meta: EndpointMeta, now: Time) {
        if let Some(&slot) = self.by_id.get(&meta.id) {
            if let Some(st) = self.slots[slot as usize].state.as_mut()
                && st.meta.model == meta.model
            {
                st.meta = meta;
                return;
            }
            self.remove_endpoint(&meta.id);
        }
        let slot = match self.slots.iter().position(|s| s.state.is_none()) {
            Some(i) => i,
            None => {
                self.slots.push(Slot::default());
                self.slots.len() - 1
            }
        };
        let slot_u32 = u32::try_from(slot).unwrap_or(u32::MAX);
        let prior = *self.prior(&meta.model);
        self.approx
            .add_endpoint(slot_u32, self.config.approx.default_capacity_blocks);
        self.by_id.insert(meta.id.clone(), slot_u32);
        self.by_model
            .entry(meta.model.clone())
            .or_default()
            .push(slot_u32);
        let s = &mut self.slots[slot];
        s.generation = s.generation.wrapping_add(1);
        s.state = Some(EndpointState {
            meta,
            ready: false,
            signals: Signals::default(),
            inflight: InFlight::default(),
            foreign: InFlight::default(),
            rate: PrefillRate::new(&prior),
            service: ServiceTime::default(),
            correction: PeakEwma::new(1.0, 1.0, self.config.predict.correction_tau, now),
            latency: PeakEwma::new(0.0, 0.0, self.config.latency_tau, now),
            precise: None,
            accrual: Accrual::default(),
            pending_prompts: Vec::new(),
            foreign_prompts: Vec::new(),
            step_reported_at: None,
        });
    }

    /// Forgets an endpoint. Returns whether it was known. Handles of its requests become stale.
    pub fn remove_endpoint(&mut self, id: &EndpointId) -> bool {
        let Some(slot) = self.by_id.remove(id) else {
            return false;
        };
        if let Some(st) = self.slots[slot as usize].state.take()
            && let Some(v) = self.by_model.get_mut(&st.meta.model)
        {
            v.retain(|s| *s != slot);
            if v.is_empty() {
                self.by_model.remove(&st.meta.model);
            }
        }
        self.approx.remove_endpoint(slot);
        true
    }

    /// Applies a notice of another proxy's request on endpoint `id` (see [`crate::notice`]). The
    /// caller keys the request ids so that two proxies' ids never collide. A request whose
    /// dispatch is not on record is ignored at first token and completion, and one on record
    /// longer than [`NOTICE_TTL`] is dropped, so a lost completion notice cannot leave work
    /// queued here forever.
    pub fn observe_notice(&mut self, id: &EndpointId, notice: Notice) -> Result<(), RouterError> {
        let cfg = self.config.predict;
        let st = self.state_mut(id)?;
        match notice {
            Notice::Dispatch(request) => {
                let at = request.dispatched_at;
                st.foreign.retain_since(Time::from_since_epoch(
                    at.since_epoch().saturating_sub(NOTICE_TTL),
                ));
                st.foreign.dispatch(request);
                let foreign = &st.foreign;
                st.foreign_prompts
                    .retain(|(i, _)| foreign.iter().any(|r| r.id == *i));
            }
            Notice::FirstToken { id, at } => {
                st.foreign_prompts.retain(|(i, _)| *i != id);
                // The sender's prediction teaches as one of this proxy's own would.
                if let Some(ft) = st.foreign.first_token(id, at) {
                    st.learn(&ft, at, &cfg);
                }
            }
            Notice::Step { id, at } => {
                st.foreign.token(id, at);
            }
            Notice::Complete { id, at } => {
                st.foreign_prompts.retain(|(i, _)| *i != id);
                // Its decode time teaches the capacity-bound wait's pace as an own one's would.
                if let Some(first) = st.foreign.complete(id).and_then(|r| r.first_token_at) {
                    st.service
                        .observe(at.saturating_since(first).as_secs_f64(), &cfg);
                }
            }
        }
        Ok(())
    }

    /// Records the prompt of another proxy's request `request_id` on endpoint `id`, whose
    /// dispatch notice is on record and still awaits its first token: like a prompt this proxy
    /// sent there, it is prefilled before a request queued behind it is admitted, which then
    /// finds its prefix (`docs/ttft-model.md`, step 1, *pending*). Forgotten at the request's
    /// first token or completion. Returns whether it was recorded.
    pub fn observe_notice_prompt(
        &mut self,
        id: &EndpointId,
        request_id: u64,
        prompt: &PromptBlocks,
    ) -> Result<bool, RouterError> {
        let st = self.state_mut(id)?;
        let awaiting = st
            .foreign
            .iter()
            .any(|r| r.id == request_id && r.first_token_at.is_none());
        if !awaiting || prompt.hashes().is_empty() {
            return Ok(false);
        }
        st.foreign_prompts.retain(|(i, _)| *i != request_id);
        st.foreign_prompts
            .push((request_id, Arc::from(prompt.hashes())));
        Ok(true)
    }

    /// Other proxies' requests on endpoint `id`, as notices have told them.
    pub fn foreign(&self, id: &EndpointId) -> Option<&InFlight> {
        self.state(id).map(|st| &st.foreign)
    }

    /// Marks an endpoint ready (routable) or not.
    pub fn set_ready(&mut self, id: &EndpointId, ready: bool) -> Result<(), RouterError> {
        self.state_mut(id)?.ready = ready;
        Ok(())
    }

    /// Applies a metrics scrape made at `at`. A newly learned cache size resizes the prefix indexes.
    pub fn observe_scrape(
        &mut self,
        id: &EndpointId,
        scrape: &Scrape,
        at: Time,
    ) -> Result<(), RouterError> {
        let slot = self.slot_of(id)?;
        let approx_block_tokens = u64::from(self.config.approx.block_size_tokens.max(1));
        let Some(st) = self.slots[slot as usize].state.as_mut() else {
            return Err(RouterError::UnknownEndpoint(id.clone()));
        };
        let before = st.signals.cache_config.map(|o| o.value);
        st.signals.apply(scrape, at);
        if let Some(load) = scrape.server_load {
            st.reconcile_foreign(load, at);
        }
        let after = st.signals.cache_config.map(|o| o.value);
        if let Some(cc) = after.filter(|a| Some(*a) != before) {
            let capacity =
                usize::try_from(cc.capacity_tokens() / approx_block_tokens).unwrap_or(usize::MAX);
            self.approx.set_capacity(slot, capacity);
            if let Some(p) = st.precise.as_mut() {
                p.set_capacity(usize::try_from(cc.num_gpu_blocks).unwrap_or(usize::MAX));
            }
        }
        Ok(())
    }

    /// Applies KV events from an endpoint (in order).
    pub fn apply_kv_events(
        &mut self,
        id: &EndpointId,
        events: &[KvEvent],
    ) -> Result<(), RouterError> {
        let default_blocks = self.config.approx.default_capacity_blocks;
        let st = self.state_mut(id)?;
        let precise = st.precise.get_or_insert_with(|| {
            let cc = st.signals.cache_config.map(|o| o.value);
            PreciseIndex::new(
                cc.map_or(16, |c| c.block_size_tokens),
                cc.map_or(default_blocks, |c| {
                    usize::try_from(c.num_gpu_blocks).unwrap_or(usize::MAX)
                }),
            )
        });
        for e in events {
            precise.apply(e);
        }
        Ok(())
    }

    /// Decides where `request` should go at `now`. Pure: nothing changes until [`Router::dispatch`].
    pub fn decide(&self, request: &Request<'_>, now: Time, rng: &mut impl Rng) -> Decision {
        self.decide_with(&self.config, request, now, rng)
    }

    /// [`Router::decide`] under other settings than the router's own: a rollout's cohort is
    /// decided with its candidate balancer's freshness budget and tie window on the same learned
    /// state as the control group, so both arms see the same endpoints.
    pub fn decide_with(
        &self,
        cfg: &RouterConfig,
        request: &Request<'_>,
        now: Time,
        rng: &mut impl Rng,
    ) -> Decision {
        let mut candidates = Vec::new();
        let mut excluded = Vec::new();
        let matches = self.approx.lookup(request.prompt_blocks);
        let mut precise_hashes: Vec<(ModelName, u32, Option<Vec<BlockHash>>)> = Vec::new();

        for (i, model) in request.candidate_models.iter().enumerate() {
            if request.candidate_models[..i].contains(model) {
                continue;
            }
            let prior = self.prior(model);
            for &slot in self.by_model.get(model).into_iter().flatten() {
                let s = &self.slots[slot as usize];
                let Some(st) = s.state.as_ref() else { continue };
                let why = if !st.ready {
                    Some(Exclusion::NotReady)
                } else if !st.accrual.available(now) {
                    Some(Exclusion::Ejected)
                } else if request
                    .lora_adapter
                    .is_some_and(|a| !st.meta.serves_adapter(a))
                {
                    Some(Exclusion::MissingLoraAdapter)
                } else {
                    None
                };
                if let Some(why) = why {
                    excluded.push(Excluded {
                        endpoint: st.meta.id.clone(),
                        model: model.clone(),
                        why,
                    });
                    continue;
                }
                let precise = match (st.meta.kv_events, st.precise.as_ref(), request.block_hasher) {
                    (true, Some(p), Some(hasher)) => {
                        let bs = p.block_size_tokens();
                        let at = match precise_hashes
                            .iter()
                            .position(|(m, b, _)| m == model && *b == bs)
                        {
                            Some(at) => at,
                            None => {
                                precise_hashes.push((
                                    model.clone(),
                                    bs,
                                    hasher.block_hashes(model, bs),
                                ));
                                precise_hashes.len() - 1
                            }
                        };
                        precise_hashes[at]
                            .2
                            .as_deref()
                            .map(|h| (p.leading_tokens(h), PrefixSource::Precise))
                    }
                    _ => None,
                };
                let indexed = precise.unwrap_or((matches.tokens(slot), PrefixSource::Approximate));
                // A prompt sent ahead shares its prefix only if it is prefilled before this one is
                // admitted: when the endpoint is queueing. Admitted in the same step, both miss.
                let queueing = st
                    .signals
                    .num_requests_waiting
                    .is_some_and(|o| o.value > 0 && o.is_fresh(now, cfg.predict.freshness_budget));
                let pending = if queueing {
                    st.pending_tokens(request.prompt_blocks)
                } else {
                    0
                };
                let cached = if pending > indexed.0 {
                    (pending, PrefixSource::Pending)
                } else {
                    indexed
                };
                let view = EndpointView {
                    signals: &st.signals,
                    inflight: &st.inflight,
                    foreign: &st.foreign,
                    prior,
                    prefill_tokens_per_second: st.rate.tokens_per_second(),
                    correction: st.correction.value_at(now),
                    mean_prompt_tokens: self.mean_prompt_tokens,
                    mean_service_s: st.service.mean_s(),
                };
                let mut prediction = predict(
                    &view,
                    request.prompt_tokens,
                    Some(cached),
                    now,
                    &cfg.predict,
                );
                // A failed attempt here costs, with its recent share, about another TTFT elsewhere.
                let retry_s = prediction.ranked_ttft_s();
                prediction.charge_failures(st.accrual.failure_share, retry_s);
                candidates.push(Candidate {
                    endpoint: st.meta.id.clone(),
                    model: model.clone(),
                    prediction,
                    p2c: None,
                    slot,
                    generation: s.generation,
                    precise_lookup: precise.is_some(),
                });
            }
        }

        // A candidate that would prefill again what another of the same model has cached pays for
        // the duplicate copy of the prefix (see `PredictConfig::miss_cost_weight`).
        if cfg.predict.miss_cost_weight > 0.0 {
            // The most any candidate of each model holds: one pass (a policy allows a handful of
            // models, so a short list).
            let mut best: Vec<(ModelName, u32)> = Vec::new();
            for c in &candidates {
                let cached = c.prediction.cached_tokens;
                match best.iter_mut().find(|(m, _)| *m == c.model) {
                    Some((_, b)) => *b = (*b).max(cached),
                    None => best.push((c.model.clone(), cached)),
                }
            }
            for c in &mut candidates {
                let most = best
                    .iter()
                    .find(|(m, _)| *m == c.model)
                    .map_or(0, |(_, b)| *b);
                c.prediction.charge_duplicate_prefix(most, &cfg.predict);
            }
        }
        // A substitute model must be clearly faster (see `RouterConfig::substitute_margin`).
        if cfg.substitute_margin > 0.0 {
            for c in &mut candidates {
                if c.model != *request.requested_model {
                    c.prediction.charge_substitute(cfg.substitute_margin);
                }
            }
        }

        let mut decision = Decision {
            at: now,
            requested_model: request.requested_model.clone(),
            prompt_tokens: request.prompt_tokens,
            reason: Reason::NoCandidates,
            chosen: None,
            candidates,
            excluded,
            tie_window_s: cfg.tie_window.as_secs_f64(),
        };
        if decision.candidates.is_empty() {
            return decision;
        }

        if decision
            .candidates
            .iter()
            .any(|c| c.prediction.signals_fresh)
        {
            let preds: Vec<f64> = decision
                .candidates
                .iter()
                .map(|c| c.prediction.selection_cost_s)
                .collect();
            // Unknown or stale usage counts as empty: such an endpoint is as good a place as any.
            let kv_usage: Vec<f64> = decision
                .candidates
                .iter()
                .map(|c| {
                    c.prediction
                        .kv_cache_usage
                        .filter(|u| u.used)
                        .map_or(0.0, |u| u.value)
                })
                .collect();
            if let Some(pick) = lowest_within_tie_window(&preds, &kv_usage, cfg.tie_window, rng) {
                decision.chosen = Some(pick.index);
                decision.reason = if pick.tied > 1 {
                    Reason::TieBroken { tied: pick.tied }
                } else {
                    Reason::LowestPredictedTtft
                };
                if let Some((index, eligible)) =
                    self.affine_choice(cfg, &decision, pick.index, request)
                {
                    decision.chosen = Some(index);
                    decision.reason = Reason::PrefixAffinity { eligible };
                }
            }
            return decision;
        }

        // Nothing fresh: peak-EWMA power of two over the requested model's endpoints (or, if it has
        // none, over all candidates).
        decision.reason = if decision
            .candidates
            .iter()
            .any(|c| c.prediction.reported_waiting.is_some())
        {
            Reason::FallbackStaleSignals
        } else {
            Reason::FallbackNoSignals
        };
        let mut pool: Vec<usize> = (0..decision.candidates.len())
            .filter(|&i| decision.candidates[i].model == *request.requested_model)
            .collect();
        if pool.is_empty() {
            pool = (0..decision.candidates.len()).collect();
        }
        let (pick, costs) = self.power_of_two_among(&decision, &pool, now, rng);
        for (&i, p2c) in pool.iter().zip(costs) {
            decision.candidates[i].p2c = Some(p2c);
        }
        decision.chosen = pick.map(|k| pool[k]);
        decision
    }

    /// Plain balancing over `pool` (indices into `decision.candidates`): Linkerd's peak-EWMA power
    /// of two, each endpoint costed by its observed-TTFT peak-EWMA (its undated predicted TTFT
    /// until it has one) times its pending requests plus one. Returns the index into `pool` of the
    /// pick and every endpoint's inputs. The fallback and shadow mode both balance this way.
    pub fn power_of_two_among(
        &self,
        decision: &Decision,
        pool: &[usize],
        now: Time,
        rng: &mut impl Rng,
    ) -> (Option<usize>, Vec<P2cInputs>) {
        let mut costs: Vec<P2cInputs> = pool
            .iter()
            .map(|&i| {
                let c = &decision.candidates[i];
                let st = self.slots[c.slot as usize]
                    .state
                    .as_ref()
                    .filter(|_| self.slots[c.slot as usize].generation == c.generation);
                st.map_or(P2cInputs::new(c.prediction.undated.raw_ttft_s, 0), |st| {
                    Self::p2c_of(st, c.prediction.undated.raw_ttft_s, now)
                })
            })
            .collect();
        let pick = power_of_two(&mut costs, rng);
        (pick, costs)
    }

    /// The peak-EWMA power-of-two inputs of one endpoint; `default_latency_s` stands in for an
    /// endpoint with no observed TTFT yet.
    pub fn p2c_inputs(&self, id: &EndpointId, default_latency_s: f64, now: Time) -> P2cInputs {
        self.state(id)
            .map_or(P2cInputs::new(default_latency_s, 0), |st| {
                Self::p2c_of(st, default_latency_s, now)
            })
    }

    fn p2c_of(st: &EndpointState, default_latency_s: f64, now: Time) -> P2cInputs {
        let latency_s = if st.latency.is_observed() {
            st.latency.value_at(now)
        } else {
            default_latency_s
        };
        P2cInputs::new(latency_s, st.inflight.pending())
    }

    /// The endpoint's peak-EWMA of observed TTFT at `now`, once it has observed one.
    pub fn observed_latency_s(&self, id: &EndpointId, now: Time) -> Option<f64> {
        self.state(id)
            .filter(|st| st.latency.is_observed())
            .map(|st| st.latency.value_at(now))
    }

    /// Every endpoint of `model`, ready or not, in id order.
    pub fn endpoints_of(&self, model: &ModelName) -> Vec<EndpointId> {
        let mut ids: Vec<EndpointId> = self
            .by_model
            .get(model)
            .into_iter()
            .flatten()
            .filter_map(|&slot| self.slots[slot as usize].state.as_ref())
            .map(|st| st.meta.id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// Among the candidates of the lowest-cost candidate's model whose cost is within the affinity
    /// slack of it, the one holding most of the prompt, then the prompt's home by rendezvous rank.
    /// `None` when affinity is off, the prompt has no key, or fewer than two are eligible (the plain
    /// lowest-cost pick stands).
    fn affine_choice(
        &self,
        cfg: &RouterConfig,
        decision: &Decision,
        best: usize,
        request: &Request<'_>,
    ) -> Option<(usize, u32)> {
        if cfg.affinity.slack <= 0.0 {
            return None;
        }
        let key = affinity::key(request.prompt_blocks, &cfg.affinity)?;
        let best = decision.candidates.get(best)?;
        let best_model = &best.model;
        let usages: Vec<f64> = decision
            .candidates
            .iter()
            .filter(|c| c.model == *best_model)
            .filter_map(|c| c.prediction.kv_cache_usage.filter(|u| u.used))
            .map(|u| u.value)
            .collect();
        if usages.is_empty() {
            return None;
        }
        let mean_usage = usages.iter().sum::<f64>() / usages.len() as f64;
        let slack = affinity::slack_at(mean_usage, &cfg.affinity);
        if slack <= 0.0 {
            return None;
        }
        let limit = affinity::eligible_limit(
            best.prediction.selection_cost_s,
            slack,
            cfg.tie_window,
            &cfg.affinity,
        );
        let eligible: Vec<usize> = (0..decision.candidates.len())
            .filter(|&i| {
                let c = &decision.candidates[i];
                c.model == *best_model && c.prediction.selection_cost_s <= limit
            })
            .collect();
        if eligible.len() < 2 {
            return None;
        }
        let coverage = affinity::key_coverage_tokens(request.prompt_blocks, &cfg.affinity);
        let recurs = self.seen_keys.contains(key)
            || eligible
                .iter()
                .any(|&i| decision.candidates[i].prediction.cached_tokens >= coverage);
        if !recurs {
            return None;
        }
        let index = eligible.iter().copied().max_by_key(|&i| {
            let c = &decision.candidates[i];
            (
                c.prediction.cached_tokens,
                affinity::weight(key, &c.endpoint),
            )
        })?;
        Some((index, u32::try_from(eligible.len()).unwrap_or(u32::MAX)))
    }

    /// Records that the decision's choice was sent `prompt` at `now`: the request joins the
    /// endpoint's in-flight work and the endpoint is recorded as holding the prompt's prefix.
    pub fn dispatch(
        &mut self,
        decision: &Decision,
        prompt: &PromptBlocks,
        now: Time,
    ) -> Result<DispatchHandle, RouterError> {
        let c = decision.chosen().ok_or(RouterError::NothingChosen)?;
        let s = &mut self.slots[c.slot as usize];
        let Some(st) = s.state.as_mut().filter(|_| s.generation == c.generation) else {
            return Err(RouterError::StaleHandle);
        };
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        let p = &c.prediction;
        st.inflight.dispatch(InFlightRequest::of_prediction(
            request_id,
            now,
            p,
            &self.config.predict,
        ));
        if p.uncached_tokens > 0 && !prompt.hashes().is_empty() {
            st.pending_prompts
                .push((request_id, Arc::from(prompt.hashes())));
        }
        // An endpoint whose precise mirror answered for this prompt is never asked the
        // approximate index for it: recording there would only spend memory (a sidecar's
        // approximate indexes fill to their caches' size).
        if !c.precise_lookup {
            self.approx.record(c.slot, prompt);
        }
        if let Some(key) = affinity::key(prompt, &self.config.affinity) {
            self.seen_keys.touch(key);
            self.seen_keys.evict_over_capacity(|_| ());
        }
        let alpha = self.config.mean_prompt_alpha;
        self.mean_prompt_tokens += alpha * (f64::from(p.prompt_tokens) - self.mean_prompt_tokens);
        Ok(DispatchHandle {
            slot: c.slot,
            generation: c.generation,
            request_id,
        })
    }

    /// Records the first token of a dispatched request at `at`: its prefill leaves the queue, and
    /// the endpoint's prefill rate, correction and latency learn from its TTFT. Returns the TTFT.
    pub fn first_token(
        &mut self,
        handle: DispatchHandle,
        at: Time,
    ) -> Result<Duration, RouterError> {
        let cfg = self.config.predict;
        let st = self.handle_state(handle)?;
        let ft = st
            .inflight
            .first_token(handle.request_id, at)
            .ok_or(RouterError::UnknownRequest)?;
        st.forget_pending(handle.request_id);
        st.learn(&ft, at, &cfg);
        Ok(ft.ttft)
    }

    /// Records that a streamed token of a dispatched request (its first included) arrived at `at`:
    /// an engine step of its endpoint ended then, which times the step in progress for the next
    /// prediction there (`docs/ttft-model.md`, step 5).
    pub fn observe_token(&mut self, handle: DispatchHandle, at: Time) -> Result<(), RouterError> {
        let st = self.handle_state(handle)?;
        if st.inflight.token(handle.request_id, at) {
            Ok(())
        } else {
            Err(RouterError::UnknownRequest)
        }
    }

    /// The step notice to send the other proxies for a streamed token of a dispatched request
    /// that arrived at `at` (after [`Router::observe_token`]), when this proxy reports the
    /// endpoint's steps: its oldest stream there is older than every request the others' notices
    /// show decoding there (so, of the proxies with streams there, about one reports), and
    /// `step_report_interval` has passed since its last report. The step in progress is what
    /// dates the queue (`docs/signals.md`, "Step notices").
    pub fn step_notice(&mut self, handle: DispatchHandle, at: Time) -> Option<Notice> {
        let (on, interval) = (
            self.config.predict.step_notices,
            self.config.predict.step_report_interval,
        );
        let st = self.handle_state(handle).ok().filter(|_| on)?;
        // The interval first: it is one comparison, the election a walk of both ledgers, and
        // this runs at every streamed token.
        if st
            .step_reported_at
            .is_some_and(|t| at <= t || at.saturating_since(t) < interval)
        {
            return None;
        }
        let own_oldest = st.inflight.oldest_decoding_dispatch(true)?;
        if st
            .foreign
            .oldest_decoding_dispatch(false)
            .is_some_and(|t| t < own_oldest)
        {
            return None;
        }
        st.step_reported_at = Some(at);
        Some(Notice::Step {
            id: handle.request_id,
            at,
        })
    }

    /// Records that a dispatched request finished (or failed, or was cancelled). Learns nothing
    /// from it; prefer [`Router::complete_at`], which also learns the endpoint's service time.
    pub fn complete(&mut self, handle: DispatchHandle) -> Result<(), RouterError> {
        let st = self.handle_state(handle)?;
        st.forget_pending(handle.request_id);
        st.inflight
            .complete(handle.request_id)
            .map(|_| ())
            .ok_or(RouterError::UnknownRequest)
    }

    /// Records that a dispatched request finished at `at`. A request that had its first token
    /// teaches the endpoint's service time (first token to completion), which paces the
    /// capacity-bound wait; one that failed before its first token teaches nothing.
    pub fn complete_at(&mut self, handle: DispatchHandle, at: Time) -> Result<(), RouterError> {
        let cfg = self.config.predict;
        let st = self.handle_state(handle)?;
        st.forget_pending(handle.request_id);
        let r = st
            .inflight
            .complete(handle.request_id)
            .ok_or(RouterError::UnknownRequest)?;
        if let Some(first) = r.first_token_at {
            st.service
                .observe(at.saturating_since(first).as_secs_f64(), &cfg);
        }
        Ok(())
    }

    /// An attempt on `id` succeeded: its failure record is reset (a probation ends).
    pub fn observe_success(&mut self, id: &EndpointId) -> Result<(), RouterError> {
        let cfg = self.config.accrual;
        self.state_mut(id)?.accrual.success(&cfg);
        Ok(())
    }

    /// An attempt on `id` failed at `at` (`draw` in `[0, 1)` places the backoff within its
    /// jitter). Returns whether it ejected the endpoint (see [`crate::accrual`]).
    pub fn observe_failure(
        &mut self,
        id: &EndpointId,
        at: Time,
        draw: f64,
    ) -> Result<bool, RouterError> {
        let cfg = self.config.accrual;
        Ok(self.state_mut(id)?.accrual.failure(at, &cfg, draw))
    }

    /// The endpoint's failure record.
    pub fn accrual(&self, id: &EndpointId) -> Option<&Accrual> {
        self.state(id).map(|st| &st.accrual)
    }

    /// The endpoint's learned service time (first token to completion), in seconds, once any of
    /// this proxy's requests has completed there.
    pub fn service_s(&self, id: &EndpointId) -> Option<f64> {
        self.state(id).and_then(|st| st.service.mean_s())
    }

    /// The endpoint's learned prefill rate, in tokens per second.
    pub fn prefill_tokens_per_second(&self, id: &EndpointId) -> Option<f64> {
        self.state(id).map(|st| st.rate.tokens_per_second())
    }

    /// The endpoint's correction factor at `now` (before clamping).
    pub fn correction(&self, id: &EndpointId, now: Time) -> Option<f64> {
        self.state(id).map(|st| st.correction.value_at(now))
    }

    /// The endpoint's own in-flight requests.
    pub fn inflight(&self, id: &EndpointId) -> Option<&InFlight> {
        self.state(id).map(|st| &st.inflight)
    }

    /// The endpoint's current signals.
    pub fn signals(&self, id: &EndpointId) -> Option<&Signals> {
        self.state(id).map(|st| &st.signals)
    }

    /// The running mean prompt size, in tokens.
    pub fn mean_prompt_tokens(&self) -> f64 {
        self.mean_prompt_tokens
    }

    /// Chunks the approximate index records for the endpoint, and its capacity.
    pub fn approx_blocks(&self, id: &EndpointId) -> Option<(usize, usize)> {
        let slot = *self.by_id.get(id)?;
        Some((self.approx.held_blocks(slot), self.approx.capacity(slot)?))
    }

    fn slot_of(&self, id: &EndpointId) -> Result<u32, RouterError> {
        self.by_id
            .get(id)
            .copied()
            .ok_or_else(|| RouterError::UnknownEndpoint(id.clone()))
    }

    fn state(&self, id: &EndpointId) -> Option<&EndpointState> {
        let slot = *self.by_id.get(id)?;
        self.slots[slot as usize].state.as_ref()
    }

    fn state_mut(&mut self, id: &EndpointId) -> Result<&mut EndpointState, RouterError> {
        let slot = self.slot_of(id)?;
        self.slots[slot as usize]
            .state
            .as_mut()
            .ok_or_else(|| RouterError::UnknownEndpoint(id.clone()))
    }

    /// The endpoint a dispatched request went to, while it is still in the router.
    pub fn endpoint_of(&self, h: DispatchHandle) -> Option<&EndpointId> {
        let s = self.slots.get(h.slot as usize)?;
        (s.generation == h.generation)
            .then_some(s.state.as_ref())
            .flatten()
            .map(|st| &st.meta.id)
    }

    fn handle_state(&mut self, h: DispatchHandle) -> Result<&mut EndpointState, RouterError> {
        let s = self
            .slots
            .get_mut(h.slot as usize)
            .ok_or(RouterError::StaleHandle)?;
        if s.generation != h.generation {
            return Err(RouterError::StaleHandle);
        }
        s.state.as_mut().ok_or(RouterError::StaleHandle)
    }
}
