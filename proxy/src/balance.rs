//! The balancer: the routing core's state for this sidecar, fed by discovery and signals, and the
//! plan for each request (which endpoint first, which next on failure).
//!
//! [`kinference_routing::Router`] is a pure, clock-free library; this module owns one behind a
//! mutex and drives it with wall time: endpoints from discovery are added and removed, scrapes are
//! observed, and each request gets a [`Plan`]. The plan applies the policy's balancer settings:
//! FailClose refuses when prediction falls back, Shadow records the decision but sends the request
//! where plain peak-EWMA power-of-two balancing over the requested model's pool would.
//!
//! Pools whose endpoints publish vLLM KV events (the policy says so per pool) get the precise
//! prefix index: the signals task applies each endpoint's events here, and each plan hashes the
//! prompt with the pool's tokenizer contract ([`kinference_proxy_signals::Tokenizer`]) so the
//! routing core can count the leading blocks the endpoint really holds. Tokenizing happens before
//! the lock is taken, and only when a candidate model has such a pool.
//!
//! # First-token feedback from non-stream responses
//!
//! A non-stream response arrives whole, so the proxy never sees its first token. Two ways to get
//! one were weighed. Asking the server for a stream and assembling the JSON for the client would
//! give the exact time, but the proxy would then rewrite every non-stream response (fields,
//! tool calls, logprobs, `n` choices, errors), and a faithful re-assembly of every server's
//! format is a large, fragile surface in the request path; it also changes what the server
//! measures and bills. Instead the proxy estimates it: TTFT ≈ end-to-end time − decode time,
//! where decode time = (completion tokens − 1) × the endpoint's time per output token, learned
//! from the inter-token gaps of its streams (before any stream, the model's prior). The estimate's
//! error grows with the decode share, and the corrections it feeds are peak-EWMAs that jump at
//! once on a high value, so it is used only when it can be trusted: the time per token is the
//! larger of the learned value and the prior (an over-stated decode under-states the TTFT, the
//! safe side for a peak-EWMA), and the estimated decode must be at most half of the end-to-end
//! time. Short answers (classification, extraction, tool choices, `max_tokens` of a few tokens)
//! then teach the predictor like streams do; long generations teach only the service time, as
//! before. Metrics of observed TTFT stay stream-only: an estimate is not an observation.

use crate::{
    openai::PromptText,
    policy::{FailureMode, Mode, Policy},
};
use kinference_classify::Role;
use kinference_proxy_discovery::Endpoints;
use kinference_proxy_signals::{KvEventError, PromptRef, Tokenizer};
use kinference_routing::{
    BlockHasher, Decision, DispatchHandle, EndpointId, EndpointMeta, KvEvent, ModelName,
    PromptBlocks, Request, Router, RouterConfig, Scrape, Time,
    ewma::{DEFAULT_TAU, PeakEwma},
    fallback::{P2cInputs, power_of_two},
};
use parking_lot::Mutex;
use rand::{SeedableRng, rngs::SmallRng};
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

/// An endpoint as the proxy knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointInfo {
    pub id: EndpointId,
    pub addr: SocketAddr,
    /// The policy model it serves.
    pub model: String,
    pub served_name: String,
    pub pool: String,
    /// Where the endpoint publishes KV events, when its pool does.
    pub kv_events: Option<KvSubscription>,
}

/// One endpoint's KV-event publisher.
#[derive(Clone, Debug, PartialEq)]
pub struct KvSubscription {
    /// `tcp://IP:PORT`.
    pub publisher: String,
    pub topic: String,
    /// The pool's tokenizer contract, when the proxy knows it (else events are mirrored but
    /// prompts are not matched against them).
    pub tokenizer: Option<Tokenizer>,
}

/// What this proxy has heard from one endpoint's KV events (for `/debug/endpoints`).
#[derive(Clone, Debug, Default)]
struct KvState {
    batches: u64,
    blocks_stored: u64,
    blocks_removed: u64,
    /// Stored minus removed since the last clear: what the precise index holds when no event was
    /// lost (it is also capped at the endpoint's block count).
    blocks_held: u64,
    clears: u64,
    last_batch_at: Option<Time>,
    errors: u64,
    last_error: Option<String>,
}

/// What to do with one request.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The routing core's decision (what is recorded, in shadow mode too).
    pub decision: Decision,
    /// Indices into `decision.candidates` to try, in order.
    pub order: Vec<usize>,
    pub mode: Mode,
    /// Set when the request must be refused (FailClose on fallback, or no candidate).
    pub refused: Option<String>,
}

#[derive(Debug)]
struct Inner {
    router: Router,
    config: RouterConfig,
    endpoints: HashMap<EndpointId, EndpointInfo>,
    /// Peak-EWMA of observed TTFT per endpoint, for shadow mode's plain balancing.
    latency: HashMap<EndpointId, PeakEwma>,
    failure_mode: FailureMode,
    mode: Mode,
    rng: SmallRng,
    /// The policy's models whose pool discovery has not answered for yet (an answered pool may
    /// be empty): until it has, the proxy is not ready.
    awaiting_endpoints: Vec<String>,
    kv: HashMap<EndpointId, KvState>,
    /// Learned seconds per output token, per endpoint (from streams).
    tpot: HashMap<EndpointId, f64>,
    /// The policy's prior seconds per output token, per model.
    prior_tpot: HashMap<String, f64>,
    /// Non-stream responses whose estimated first token fed the predictor, per endpoint.
    estimated_first_tokens: HashMap<EndpointId, u64>,
}

/// Weight of one stream in the learned time per output token.
const TPOT_ALPHA: f64 = 0.2;
/// The most of a non-stream response's end-to-end time the estimated decode may take for the
/// estimated TTFT to be trusted.
const MAX_DECODE_SHARE: f64 = 0.5;

/// The TTFT of a non-stream response of `completion_tokens` tokens that took `e2e_s` end to end,
/// given `tpot_s` seconds per output token after the first; `None` when the decode would take
/// more than [`MAX_DECODE_SHARE`] of it (the estimate would be mostly the decode's error).
pub fn estimate_ttft_s(e2e_s: f64, completion_tokens: u64, tpot_s: f64) -> Option<f64> {
    if !(e2e_s.is_finite() && e2e_s > 0.0 && tpot_s.is_finite() && tpot_s >= 0.0) {
        return None;
    }
    let decode_s = completion_tokens.saturating_sub(1) as f64 * tpot_s;
    (decode_s <= MAX_DECODE_SHARE * e2e_s).then_some(e2e_s - decode_s)
}

/// The shared balancer.
#[derive(Debug)]
pub struct Balance {
    epoch: Instant,
    inner: Mutex<Inner>,
    /// Publishes the endpoint set when it changes (the scrapers follow it).
    endpoints_tx: tokio::sync::watch::Sender<Arc<Vec<EndpointInfo>>>,
    /// The tokenizer contract of each model whose pool publishes KV events (read before the
    /// router's lock is taken, so prompts are tokenized outside it).
    tokenizers: parking_lot::RwLock<Arc<HashMap<ModelName, Tokenizer>>>,
}

impl Default for Balance {
    fn default() -> Self {
        Self::new()
    }
}

impl Balance {
    pub fn new() -> Self {
        let config = RouterConfig::default();
        Self {
            epoch: Instant::now(),
            inner: Mutex::new(Inner {
                router: Router::new(config),
                config,
                endpoints: HashMap::new(),
                latency: HashMap::new(),
                failure_mode: FailureMode::FailOpen,
                mode: Mode::Enforce,
                rng: SmallRng::from_os_rng(),
                awaiting_endpoints: Vec::new(),
                kv: HashMap::new(),
                tpot: HashMap::new(),
                prior_tpot: HashMap::new(),
                estimated_first_tokens: HashMap::new(),
            }),
            endpoints_tx: tokio::sync::watch::channel(Arc::new(Vec::new())).0,
            tokenizers: parking_lot::RwLock::new(Arc::new(HashMap::new())),
        }
    }

    /// The current time on the router's clock.
    pub fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    pub fn time_of(&self, at: Instant) -> Time {
        Time::from_since_epoch(at.saturating_duration_since(self.epoch))
    }

    /// Follows the endpoint set.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Arc<Vec<EndpointInfo>>> {
        self.endpoints_tx.subscribe()
    }

    /// Applies a policy and the endpoints of its backends: settings, priors, endpoint set.
    pub fn sync(&self, policy: &Policy, endpoints: &Endpoints) {
        let now = self.now();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let b = &policy.balancer;
        let mut config = RouterConfig::default();
        config.predict.freshness_budget = b.freshness_budget;
        config.tie_window = b.tie_window;
        inner.failure_mode = b.failure_mode;
        inner.mode = b.mode;
        if config != inner.config {
            // New settings: start a fresh router (learned state is per-settings).
            inner.config = config;
            inner.router = Router::new(config);
            inner.endpoints.clear();
            inner.kv.clear();
        }
        for m in &policy.models {
            inner
                .router
                .set_model_prior(ModelName::from(m.name.as_str()), m.prior);
        }
        inner.prior_tpot = policy
            .models
            .iter()
            .map(|m| (m.name.clone(), m.prior.time_per_output_token_s))
            .collect();
        inner.awaiting_endpoints = policy
            .models
            .iter()
            .filter(|m| !endpoints.by_backend.contains_key(&m.destination_path))
            .map(|m| m.name.clone())
            .collect();
        let mut desired: HashMap<EndpointId, (EndpointInfo, EndpointMeta)> = HashMap::new();
        for m in &policy.models {
            for ep in endpoints
                .by_backend
                .get(&m.destination_path)
                .into_iter()
                .flatten()
            {
                let id = EndpointId::from(ep.addr.to_string());
                if desired.contains_key(&id) {
                    continue;
                }
                let mut meta = EndpointMeta::new(id.clone(), m.name.as_str());
                meta.pool = Arc::from(m.pool.as_str());
                let kv_events = m.kv_events.as_ref().and_then(|k| {
                    Some(KvSubscription {
                        publisher: k.publisher(ep.addr)?,
                        topic: k.topic.clone(),
                        tokenizer: Tokenizer::from_name(&k.tokenizer),
                    })
                });
                // The precise index answers only where prompts can be hashed as the pool does.
                meta.kv_events = kv_events.as_ref().is_some_and(|k| k.tokenizer.is_some());
                meta.lora_adapters = ep
                    .labels
                    .get("lora_adapters")
                    .map(|l| {
                        l.split(',')
                            .filter(|s| !s.is_empty())
                            .map(Arc::from)
                            .collect()
                    })
                    .unwrap_or_default();
                let info = EndpointInfo {
                    id: id.clone(),
                    addr: ep.addr,
                    model: m.name.clone(),
                    served_name: m.served_name.clone(),
                    pool: m.pool.clone(),
                    kv_events,
                };
                desired.insert(id, (info, meta));
            }
        }
        inner.endpoints.retain(|id, _| {
            let keep = desired.contains_key(id);
            if !keep {
                inner.router.remove_endpoint(id);
                inner.latency.remove(id);
                inner.kv.remove(id);
                inner.tpot.remove(id);
                inner.estimated_first_tokens.remove(id);
            }
            keep
        });
        for (id, (info, meta)) in desired {
            if inner.endpoints.get(&id) != Some(&info) {
                if inner.endpoints.get(&id).map(|e| &e.kv_events) != Some(&info.kv_events) {
                    inner.kv.remove(&id);
                }
                let fresh = !inner.endpoints.contains_key(&id);
                inner.router.upsert_endpoint(meta, now);
                if fresh || inner.router.signals(&id).is_none() {
                    let _ = inner.router.set_ready(&id, true);
                }
                inner.endpoints.insert(id, info);
            }
        }
        let mut list: Vec<EndpointInfo> = inner.endpoints.values().cloned().collect();
        list.sort_by(|a, b| a.id.cmp(&b.id));
        drop(g);
        let tokenizers: HashMap<ModelName, Tokenizer> = policy
            .models
            .iter()
            .filter_map(|m| {
                let t = Tokenizer::from_name(&m.kv_events.as_ref()?.tokenizer)?;
                Some((ModelName::from(m.name.as_str()), t))
            })
            .collect();
        if **self.tokenizers.read() != tokenizers {
            *self.tokenizers.write() = Arc::new(tokenizers);
        }
        self.endpoints_tx.send_if_modified(|cur| {
            if **cur == list {
                return false;
            }
            *cur = Arc::new(list);
            true
        });
    }

    /// The policy's models whose endpoints discovery has not reported yet (empty pools that it
    /// has reported are not awaited: one empty pool must not keep the proxy unready).
    pub fn awaiting_endpoints(&self) -> Vec<String> {
        self.inner.lock().awaiting_endpoints.clone()
    }

    pub fn info(&self, id: &EndpointId) -> Option<EndpointInfo> {
        self.inner.lock().endpoints.get(id).cloned()
    }

    /// A scrape of `id` made at `at`; a successful scrape also makes the endpoint routable again.
    pub fn observe_scrape(&self, id: &EndpointId, scrape: &Scrape, at: Time) {
        let mut g = self.inner.lock();
        if g.router.observe_scrape(id, scrape, at).is_ok() {
            let _ = g.router.set_ready(id, true);
        }
    }

    /// Applies a batch of `id`'s KV events to its precise prefix index.
    pub fn apply_kv_events(&self, id: &EndpointId, events: &[KvEvent]) {
        let now = self.now();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        if inner.router.apply_kv_events(id, events).is_err() {
            return;
        }
        let st = inner.kv.entry(id.clone()).or_default();
        st.batches += 1;
        st.last_batch_at = Some(now);
        for e in events {
            match e {
                KvEvent::BlockStored { block_hashes, .. } => {
                    st.blocks_stored += block_hashes.len() as u64;
                    st.blocks_held += block_hashes.len() as u64;
                }
                KvEvent::BlockRemoved { block_hashes } => {
                    st.blocks_removed += block_hashes.len() as u64;
                    st.blocks_held = st.blocks_held.saturating_sub(block_hashes.len() as u64);
                }
                KvEvent::AllBlocksCleared => {
                    st.clears += 1;
                    st.blocks_held = 0;
                }
            }
        }
    }

    /// A failure on `id`'s KV-event stream. Lost events make the mirror inexact: it is cleared
    /// (under-stating the overlap until new events arrive is safe; over-stating it is not).
    pub fn kv_events_failed(&self, id: &EndpointId, error: &KvEventError) {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        if inner.router.signals(id).is_none() {
            return;
        }
        if error.events_lost() {
            let _ = inner
                .router
                .apply_kv_events(id, &[KvEvent::AllBlocksCleared]);
        }
        let st = inner.kv.entry(id.clone()).or_default();
        st.errors += 1;
        if error.events_lost() {
            st.clears += 1;
            st.blocks_held = 0;
        }
        st.last_error = Some(error.to_string());
    }

    /// Marks an endpoint unroutable (it refused a connection) until a scrape succeeds.
    pub fn set_ready(&self, id: &EndpointId, ready: bool) {
        let _ = self.inner.lock().router.set_ready(id, ready);
    }

    /// Plans one request. `prompt` is hashed for the candidates whose pool publishes KV events.
    pub fn plan(
        &self,
        requested_model: &str,
        candidate_models: &[String],
        prompt_tokens: u32,
        max_tokens: Option<u32>,
        blocks: &PromptBlocks,
        prompt: Option<&PromptText>,
    ) -> Plan {
        let requested = ModelName::from(requested_model);
        let models: Vec<ModelName> = candidate_models
            .iter()
            .map(|m| ModelName::from(m.as_str()))
            .collect();
        let hasher = prompt.and_then(|p| PromptHasher::new(&self.tokenizers.read(), &models, p));
        // The pool's tokenizer counts the prompt exactly where the proxy's estimate guesses.
        let prompt_tokens = hasher
            .as_ref()
            .and_then(|h| h.token_count(&requested))
            .unwrap_or(prompt_tokens);
        let now = self.now();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let request = Request {
            requested_model: &requested,
            candidate_models: &models,
            prompt_tokens,
            max_tokens,
            lora_adapter: None,
            prompt_blocks: blocks,
            block_hasher: hasher.as_ref().map(|h| h as &dyn BlockHasher),
        };
        let decision = inner.router.decide(&request, now, &mut inner.rng);
        let mode = inner.mode;
        if decision.chosen.is_none() {
            return Plan {
                decision,
                order: vec![],
                mode,
                refused: Some("no ready endpoint serves the allowed models".into()),
            };
        }
        if mode == Mode::Shadow {
            let order = plain_order(inner, &decision, &requested, now);
            return Plan {
                decision,
                order,
                mode,
                refused: None,
            };
        }
        if decision.reason.is_fallback() && inner.failure_mode == FailureMode::FailClose {
            return Plan {
                decision,
                order: vec![],
                mode,
                refused: Some("endpoint signals are stale and the policy fails closed".to_string()),
            };
        }
        let chosen = decision.chosen.unwrap_or(0);
        let mut rest: Vec<usize> = (0..decision.candidates.len())
            .filter(|&i| i != chosen)
            // A fallback decision retries within the fallback pool only.
            .filter(|&i| !decision.reason.is_fallback() || decision.candidates[i].p2c.is_some())
            .collect();
        rest.sort_by(|&a, &b| {
            let p = |i: usize| decision.candidates[i].prediction.ranked_ttft_s();
            p(a).total_cmp(&p(b))
        });
        let mut order = vec![chosen];
        order.extend(rest);
        Plan {
            decision,
            order,
            mode,
            refused: None,
        }
    }

    /// The endpoints of `model` in plain-balancing order (other `/v1/*` paths).
    pub fn plain(&self, model: &str) -> Vec<EndpointInfo> {
        let now = self.now();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let mut eps: Vec<EndpointInfo> = inner
            .endpoints
            .values()
            .filter(|e| e.model == model)
            .cloned()
            .collect();
        eps.sort_by(|a, b| a.id.cmp(&b.id));
        let mut inputs: Vec<P2cInputs> = eps
            .iter()
            .map(|e| p2c_inputs(inner, &e.id, 0.0, now))
            .collect();
        if let Some(first) = power_of_two(&mut inputs, &mut inner.rng) {
            eps.swap(0, first);
        }
        eps
    }

    /// Records that the plan's `index`-th candidate was sent the request.
    pub fn dispatch(
        &self,
        decision: &Decision,
        index: usize,
        blocks: &PromptBlocks,
    ) -> Option<DispatchHandle> {
        let mut d = decision.clone();
        d.chosen = Some(index);
        let now = self.now();
        self.inner.lock().router.dispatch(&d, blocks, now).ok()
    }

    /// Records the first token of a dispatched request; returns its TTFT. `streamed`: the token
    /// itself arrived at `at` (a stream), so an engine step ended then (see
    /// [`Balance::observe_token`]); an estimated first token is not one.
    pub fn first_token(
        &self,
        id: &EndpointId,
        handle: DispatchHandle,
        at: Instant,
        streamed: bool,
    ) -> Option<Duration> {
        let at = self.time_of(at);
        let mut g = self.inner.lock();
        if streamed {
            let _ = g.router.observe_token(handle, at);
        }
        let ttft = g.router.first_token(handle, at).ok()?;
        let tau = DEFAULT_TAU;
        g.latency
            .entry(id.clone())
            .or_insert_with(|| PeakEwma::new(0.0, 0.0, tau, at))
            .observe(ttft.as_secs_f64(), at);
        Some(ttft)
    }

    /// A streamed token of a dispatched request arrived at `at` (see
    /// `kinference_routing::Router::observe_token`).
    pub fn observe_token(&self, handle: DispatchHandle, at: Instant) {
        let at = self.time_of(at);
        let _ = self.inner.lock().router.observe_token(handle, at);
    }

    /// A stream on `id` had `gaps` inter-token gaps summing to `decode_s`: the endpoint's time per
    /// output token learns from it (what non-stream responses' decode is estimated with).
    pub fn observe_decode(&self, id: &EndpointId, decode_s: f64, gaps: u64) {
        if gaps == 0 || !decode_s.is_finite() || decode_s < 0.0 {
            return;
        }
        let per_token = decode_s / gaps as f64;
        let mut g = self.inner.lock();
        if !g.endpoints.contains_key(id) {
            return;
        }
        g.tpot
            .entry(id.clone())
            .and_modify(|t| *t += TPOT_ALPHA * (per_token - *t))
            .or_insert(per_token);
    }

    /// A non-stream response from `id` ended at `end`, `e2e` after its attempt was sent, with
    /// `completion_tokens` tokens: when the estimate is trusted (see the module doc), the
    /// request's first token is recorded at `end − decode`, so the endpoint's peak-EWMAs, prefill
    /// rate and correction learn as from a stream. Returns the estimated TTFT. The caller still
    /// calls [`Balance::complete`].
    pub fn estimated_first_token(
        &self,
        id: &EndpointId,
        handle: DispatchHandle,
        e2e: Duration,
        end: Instant,
        completion_tokens: u64,
    ) -> Option<Duration> {
        let tpot_s = {
            let g = self.inner.lock();
            let info = g.endpoints.get(id)?;
            let prior = g.prior_tpot.get(&info.model).copied().unwrap_or(0.0);
            g.tpot.get(id).copied().unwrap_or(0.0).max(prior)
        };
        let ttft_s = estimate_ttft_s(e2e.as_secs_f64(), completion_tokens, tpot_s)?;
        let decode = e2e.saturating_sub(Duration::from_secs_f64(ttft_s));
        let at = end.checked_sub(decode)?;
        let ttft = self.first_token(id, handle, at, false)?;
        *self
            .inner
            .lock()
            .estimated_first_tokens
            .entry(id.clone())
            .or_default() += 1;
        Some(ttft)
    }

    /// The request is over: its work leaves the endpoint's queue, and (when its first token was
    /// seen) the endpoint's service time learns from it.
    pub fn complete(&self, handle: DispatchHandle) {
        let now = self.now();
        let _ = self.inner.lock().router.complete_at(handle, now);
    }

    /// Every endpoint's signals with their ages, and its predicted TTFT for a typical prompt.
    pub fn debug(&self) -> serde_json::Value {
        let now = self.now();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let typical_tokens = inner.router.mean_prompt_tokens().round() as u32;
        let empty = PromptBlocks::from_text(b"", &inner.config.approx);
        let mut models: Vec<ModelName> = inner
            .endpoints
            .values()
            .map(|e| ModelName::from(e.model.as_str()))
            .collect();
        models.sort();
        models.dedup();
        let mut predictions: HashMap<EndpointId, f64> = HashMap::new();
        if let Some(first) = models.first() {
            let request = Request {
                requested_model: first,
                candidate_models: &models,
                prompt_tokens: typical_tokens.max(1),
                max_tokens: None,
                lora_adapter: None,
                prompt_blocks: &empty,
                block_hasher: None,
            };
            let d = inner.router.decide(&request, now, &mut inner.rng);
            for c in d.candidates {
                predictions.insert(c.endpoint, c.prediction.dated.predicted_ttft_s);
            }
        }
        let mut list: Vec<&EndpointInfo> = inner.endpoints.values().collect();
        list.sort_by(|a, b| a.id.cmp(&b.id));
        let age = |at: Time| now.saturating_since(at).as_secs_f64();
        let eps: Vec<serde_json::Value> = list
            .into_iter()
            .map(|e| {
                let s = inner.router.signals(&e.id).cloned().unwrap_or_default();
                let inflight = inner.router.inflight(&e.id);
                serde_json::json!({
                    "endpoint": e.id.as_str(),
                    "model": e.model,
                    "pool": e.pool,
                    "ready": predictions.contains_key(&e.id),
                    "signals": {
                        "num_requests_waiting": s.num_requests_waiting.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                        "num_requests_running": s.num_requests_running.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                        "kv_cache_usage": s.kv_cache_usage.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                        "prefix_hit_fraction": s.prefix_hit_fraction.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                        "cache_config": s.cache_config.map(|o| serde_json::json!({"block_size_tokens": o.value.block_size_tokens, "num_gpu_blocks": o.value.num_gpu_blocks, "age_s": age(o.at)})),
                        "server_load": s.server_load.map(|o| serde_json::json!({"value": o.value, "age_s": age(o.at)})),
                    },
                    "own_pending_requests": inflight.map(|i| i.pending()),
                    "prefill_tokens_per_second": inner.router.prefill_tokens_per_second(&e.id),
                    "correction": inner.router.correction(&e.id, now),
                    "ttft_peak_ewma_s": inner.latency.get(&e.id).filter(|l| l.is_observed()).map(|l| l.value_at(now)),
                    "time_per_output_token_s": inner.tpot.get(&e.id),
                    "estimated_first_tokens": inner.estimated_first_tokens.get(&e.id).copied().unwrap_or(0),
                    "typical_prompt_tokens": typical_tokens,
                    "predicted_ttft_s": predictions.get(&e.id),
                    "approx_blocks": inner.router.approx_blocks(&e.id).map(|(held, capacity)| serde_json::json!({"held": held, "capacity": capacity})),
                    "kv_events": e.kv_events.as_ref().map(|k| {
                        let st = inner.kv.get(&e.id).cloned().unwrap_or_default();
                        serde_json::json!({
                            "publisher": k.publisher,
                            "topic": k.topic,
                            "tokenizer": k.tokenizer.map(Tokenizer::name),
                            "precise": k.tokenizer.is_some(),
                            "batches": st.batches,
                            "blocks_held": st.blocks_held,
                            "blocks_stored": st.blocks_stored,
                            "blocks_removed": st.blocks_removed,
                            "clears": st.clears,
                            "last_batch_age_s": st.last_batch_at.map(age),
                            "errors": st.errors,
                            "last_error": st.last_error,
                        })
                    }),
                })
            })
            .collect();
        serde_json::json!({ "endpoints": eps })
    }
}

/// One prompt's block hashes in each candidate pool's hash space, tokenized once per contract.
struct PromptHasher {
    by_model: Vec<(ModelName, Tokenizer)>,
    tokens: Vec<(Tokenizer, Vec<u32>)>,
}

impl PromptHasher {
    /// `None` when no candidate model's pool has a known tokenizer contract.
    fn new(
        tokenizers: &HashMap<ModelName, Tokenizer>,
        models: &[ModelName],
        prompt: &PromptText,
    ) -> Option<Self> {
        let by_model: Vec<(ModelName, Tokenizer)> = models
            .iter()
            .filter_map(|m| Some((m.clone(), *tokenizers.get(m)?)))
            .collect();
        if by_model.is_empty() {
            return None;
        }
        let mut tokens: Vec<(Tokenizer, Vec<u32>)> = Vec::new();
        for (_, t) in &by_model {
            if tokens.iter().all(|(have, _)| have != t) {
                tokens.push((*t, tokenize(*t, prompt)));
            }
        }
        Some(Self { by_model, tokens })
    }

    /// The prompt's token count under `model`'s tokenizer contract.
    fn token_count(&self, model: &ModelName) -> Option<u32> {
        let t = self.by_model.iter().find(|(m, _)| m == model)?.1;
        let tokens = &self.tokens.iter().find(|(have, _)| *have == t)?.1;
        u32::try_from(tokens.len().max(1)).ok()
    }
}

fn tokenize(t: Tokenizer, prompt: &PromptText) -> Vec<u32> {
    match prompt {
        PromptText::Completion(text) => t.tokens(PromptRef::Completion(text)),
        PromptText::Chat(turns) => {
            let turns: Vec<(&str, &str)> = turns
                .iter()
                .map(|c| (role_name(c.role), c.text.as_str()))
                .collect();
            t.tokens(PromptRef::Chat(&turns))
        }
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

impl BlockHasher for PromptHasher {
    fn block_hashes(&self, model: &ModelName, block_size_tokens: u32) -> Option<Vec<u64>> {
        let t = self.by_model.iter().find(|(m, _)| m == model)?.1;
        let tokens = &self.tokens.iter().find(|(have, _)| *have == t)?.1;
        Some(t.block_hashes(tokens, block_size_tokens))
    }
}

fn p2c_inputs(inner: &Inner, id: &EndpointId, default_latency_s: f64, now: Time) -> P2cInputs {
    let latency_s = inner
        .latency
        .get(id)
        .filter(|l| l.is_observed())
        .map_or(default_latency_s, |l| l.value_at(now));
    let pending = inner.router.inflight(id).map_or(0, |i| i.pending());
    P2cInputs::new(latency_s, pending)
}

/// Shadow mode: power-of-two over the requested model's ready candidates, then the rest of them.
fn plain_order(
    inner: &mut Inner,
    decision: &Decision,
    requested: &ModelName,
    now: Time,
) -> Vec<usize> {
    let pool: Vec<usize> = (0..decision.candidates.len())
        .filter(|&i| decision.candidates[i].model == *requested)
        .collect();
    let mut inputs: Vec<P2cInputs> = pool
        .iter()
        .map(|&i| {
            let c = &decision.candidates[i];
            p2c_inputs(inner, &c.endpoint, c.prediction.undated.raw_ttft_s, now)
        })
        .collect();
    let mut order = pool.clone();
    if let Some(k) = power_of_two(&mut inputs, &mut inner.rng) {
        order.swap(0, k);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::example_proto;
    use kinference_proxy_discovery::{Endpoint, Endpoints};
    use std::collections::BTreeMap;

    fn endpoints(ports: &[(&str, u16)]) -> Endpoints {
        let mut by_backend: BTreeMap<String, Vec<Endpoint>> = BTreeMap::new();
        for (model, port) in ports {
            by_backend
                .entry(format!("{model}.default.inferencepool.kinference.io"))
                .or_default()
                .push(Endpoint {
                    addr: SocketAddr::from(([127, 0, 0, 1], *port)),
                    labels: BTreeMap::new(),
                });
        }
        Endpoints { by_backend }
    }

    fn policy(mode: Mode, failure: FailureMode) -> Policy {
        let mut p = Policy::from_proto(&example_proto());
        p.balancer.mode = mode;
        p.balancer.failure_mode = failure;
        p
    }

    fn fresh_scrape(b: &Balance, port: u16, waiting: u32) {
        b.observe_scrape(
            &EndpointId::from(format!("127.0.0.1:{port}")),
            &Scrape {
                num_requests_waiting: Some(waiting),
                num_requests_running: Some(0),
                kv_cache_usage: Some(0.0),
                ..Scrape::default()
            },
            b.now(),
        );
    }

    fn blocks() -> PromptBlocks {
        PromptBlocks::from_text(b"hello", &Default::default())
    }

    #[test]
    fn sync_adds_and_removes_endpoints_per_backend() {
        let b = Balance::new();
        let p = policy(Mode::Enforce, FailureMode::FailOpen);
        b.sync(
            &p,
            &endpoints(&[("glm-5.3", 1), ("glm-5.3", 2), ("qwen-3.6-27b", 3)]),
        );
        let rx = b.subscribe();
        assert_eq!(rx.borrow().len(), 3);
        assert_eq!(
            b.info(&EndpointId::from("127.0.0.1:3")).map(|e| e.model),
            Some("qwen-3.6-27b".to_string())
        );
        b.sync(&p, &endpoints(&[("glm-5.3", 1)]));
        assert_eq!(rx.borrow().len(), 1);
        assert!(b.info(&EndpointId::from("127.0.0.1:3")).is_none());
    }

    #[test]
    fn models_whose_pool_discovery_has_not_answered_are_awaited() {
        let b = Balance::new();
        let p = policy(Mode::Enforce, FailureMode::FailOpen);
        assert!(
            b.awaiting_endpoints().is_empty(),
            "nothing awaited before a policy"
        );
        b.sync(&p, &endpoints(&[("glm-5.3", 1)]));
        assert_eq!(b.awaiting_endpoints(), vec!["qwen-3.6-27b".to_string()]);
        // An answered but empty pool is not awaited.
        let mut answered = endpoints(&[("glm-5.3", 1)]);
        let qwen = p.models.iter().find(|m| m.name == "qwen-3.6-27b").unwrap();
        answered
            .by_backend
            .insert(qwen.destination_path.clone(), Vec::new());
        b.sync(&p, &answered);
        assert!(b.awaiting_endpoints().is_empty());
    }

    #[test]
    fn enforce_picks_the_lowest_prediction_and_orders_retries() {
        let b = Balance::new();
        b.sync(
            &policy(Mode::Enforce, FailureMode::FailOpen),
            &endpoints(&[("glm-5.3", 1), ("glm-5.3", 2)]),
        );
        fresh_scrape(&b, 1, 40);
        fresh_scrape(&b, 2, 0);
        let plan = b.plan("glm-5.3", &["glm-5.3".into()], 100, None, &blocks(), None);
        assert!(plan.refused.is_none());
        let ids: Vec<&str> = plan
            .order
            .iter()
            .map(|&i| plan.decision.candidates[i].endpoint.as_str())
            .collect();
        assert_eq!(ids, vec!["127.0.0.1:2", "127.0.0.1:1"]);
    }

    #[test]
    fn fail_close_refuses_on_stale_signals_and_fail_open_routes() {
        for (mode, refused) in [
            (FailureMode::FailClose, true),
            (FailureMode::FailOpen, false),
        ] {
            let b = Balance::new();
            b.sync(
                &policy(Mode::Enforce, mode),
                &endpoints(&[("glm-5.3", 1), ("glm-5.3", 2)]),
            );
            // No scrape ever arrived: the core falls back.
            let plan = b.plan("glm-5.3", &["glm-5.3".into()], 100, None, &blocks(), None);
            assert!(plan.decision.reason.is_fallback());
            assert_eq!(plan.refused.is_some(), refused, "{mode:?}");
            assert_eq!(plan.order.is_empty(), refused);
        }
    }

    #[test]
    fn shadow_routes_within_the_requested_pool() {
        let b = Balance::new();
        b.sync(
            &policy(Mode::Shadow, FailureMode::FailOpen),
            &endpoints(&[("glm-5.3", 1), ("qwen-3.6-27b", 3)]),
        );
        // qwen is idle, glm is loaded: the decision picks qwen but shadow sends to glm.
        fresh_scrape(&b, 1, 50);
        fresh_scrape(&b, 3, 0);
        let plan = b.plan(
            "glm-5.3",
            &["glm-5.3".into(), "qwen-3.6-27b".into()],
            100,
            None,
            &blocks(),
            None,
        );
        assert_eq!(
            plan.decision.chosen_model().map(|m| m.as_str()),
            Some("qwen-3.6-27b")
        );
        assert_eq!(plan.mode, Mode::Shadow);
        let sent: Vec<&str> = plan
            .order
            .iter()
            .map(|&i| plan.decision.candidates[i].model.as_str())
            .collect();
        assert_eq!(sent, vec!["glm-5.3"]);
    }

    #[test]
    fn unready_endpoints_are_skipped_until_a_scrape() {
        let b = Balance::new();
        b.sync(
            &policy(Mode::Enforce, FailureMode::FailOpen),
            &endpoints(&[("glm-5.3", 1)]),
        );
        b.set_ready(&EndpointId::from("127.0.0.1:1"), false);
        let plan = b.plan("glm-5.3", &["glm-5.3".into()], 10, None, &blocks(), None);
        assert!(plan.refused.is_some());
        fresh_scrape(&b, 1, 0);
        let plan = b.plan("glm-5.3", &["glm-5.3".into()], 10, None, &blocks(), None);
        assert!(plan.refused.is_none());
        let h = b
            .dispatch(&plan.decision, plan.order[0], &blocks())
            .unwrap();
        let id = EndpointId::from("127.0.0.1:1");
        assert!(b.first_token(&id, h, Instant::now(), true).is_some());
        b.complete(h);
        assert_eq!(b.debug()["endpoints"][0]["own_pending_requests"], 0);
    }

    fn kv_policy() -> Policy {
        use crate::policy::{KvEvents, KvEventsPort};
        let mut p = policy(Mode::Enforce, FailureMode::FailOpen);
        for m in &mut p.models {
            m.kv_events = Some(KvEvents {
                port: KvEventsPort::Offset(1000),
                topic: String::new(),
                tokenizer: "kinference-sim".into(),
            });
        }
        p
    }

    #[test]
    fn kv_events_make_the_precise_index_answer_for_a_hashed_prompt() {
        let b = Balance::new();
        b.sync(&kv_policy(), &endpoints(&[("glm-5.3", 1), ("glm-5.3", 2)]));
        let info = b.info(&EndpointId::from("127.0.0.1:2")).unwrap();
        let sub = info.kv_events.clone().unwrap();
        assert_eq!(sub.publisher, "tcp://127.0.0.1:1002");
        assert_eq!(sub.tokenizer, Some(Tokenizer::KinferenceSim));
        fresh_scrape(&b, 1, 0);
        fresh_scrape(&b, 2, 0);
        // Endpoint 2 reports the blocks of a long prompt, hashed as the simulator does.
        let text = "You are a careful assistant. ".repeat(60);
        let prompt = PromptText::Completion(text.clone());
        let t = Tokenizer::KinferenceSim;
        let tokens = t.tokens(PromptRef::Completion(&text));
        let hashes = t.block_hashes(&tokens, 16);
        assert!(hashes.len() > 10);
        b.apply_kv_events(
            &EndpointId::from("127.0.0.1:2"),
            &[KvEvent::BlockStored {
                block_hashes: hashes.clone(),
                parent_block_hash: None,
                token_ids: vec![],
                block_size: 16,
            }],
        );
        let blocks = PromptBlocks::from_text(text.as_bytes(), &Default::default());
        let plan = b.plan(
            "glm-5.3",
            &["glm-5.3".into()],
            7, // a poor estimate: the pool's tokenizer counts the prompt instead
            None,
            &blocks,
            Some(&prompt),
        );
        assert_eq!(plan.decision.prompt_tokens as usize, tokens.len());
        let chosen = plan.decision.chosen().unwrap();
        assert_eq!(chosen.endpoint.as_str(), "127.0.0.1:2");
        assert_eq!(
            chosen.prediction.prefix_source,
            Some(kinference_routing::prefix::PrefixSource::Precise)
        );
        // Every full block is held (the last prompt token is always computed again).
        assert_eq!(
            chosen.prediction.cached_tokens as usize,
            (hashes.len() * 16).min(tokens.len() - 1)
        );
        let other = plan
            .decision
            .candidates
            .iter()
            .find(|c| c.endpoint.as_str() == "127.0.0.1:1")
            .unwrap();
        assert_eq!(other.prediction.cached_tokens, 0);
        // Without the prompt there is nothing to hash: the approximate index answers.
        let plan = b.plan("glm-5.3", &["glm-5.3".into()], 100, None, &blocks, None);
        assert!(
            plan.decision
                .candidates
                .iter()
                .all(|c| c.prediction.prefix_source
                    != Some(kinference_routing::prefix::PrefixSource::Precise))
        );
        let debug = b.debug();
        let kv = &debug["endpoints"][1]["kv_events"];
        assert_eq!(kv["blocks_held"], hashes.len() as u64, "{debug}");
        assert_eq!(kv["tokenizer"], "kinference-sim");
        // Lost events clear the mirror.
        b.kv_events_failed(
            &EndpointId::from("127.0.0.1:2"),
            &KvEventError::SequenceGap {
                expected: 3,
                received: 5,
            },
        );
        let plan = b.plan(
            "glm-5.3",
            &["glm-5.3".into()],
            tokens.len() as u32,
            None,
            &blocks,
            Some(&prompt),
        );
        assert!(
            plan.decision
                .candidates
                .iter()
                .all(|c| c.prediction.cached_tokens == 0)
        );
        assert_eq!(b.debug()["endpoints"][1]["kv_events"]["blocks_held"], 0);
    }

    #[test]
    fn an_unknown_tokenizer_subscribes_but_leaves_the_approximate_index() {
        let mut p = kv_policy();
        for m in &mut p.models {
            m.kv_events.as_mut().unwrap().tokenizer = "Qwen/Qwen3-8B".into();
        }
        let b = Balance::new();
        b.sync(&p, &endpoints(&[("glm-5.3", 1)]));
        let info = b.info(&EndpointId::from("127.0.0.1:1")).unwrap();
        assert_eq!(info.kv_events.unwrap().tokenizer, None);
        assert!(b.tokenizers.read().is_empty());
    }

    #[test]
    fn the_ttft_estimate_is_trusted_only_when_decode_is_a_small_share() {
        // 5 tokens at 30 ms: 120 ms of decode in 1 s.
        let t = estimate_ttft_s(1.0, 5, 0.03).unwrap();
        assert!((t - 0.88).abs() < 1e-9);
        assert_eq!(estimate_ttft_s(1.0, 1, 0.03), Some(1.0));
        // 100 tokens at 30 ms is 3 s of decode: more than the whole request.
        assert_eq!(estimate_ttft_s(1.0, 100, 0.03), None);
        assert_eq!(estimate_ttft_s(1.0, 18, 0.03), None); // 0.51 s > half
        assert_eq!(estimate_ttft_s(0.0, 1, 0.03), None);
    }

    #[test]
    fn non_stream_answers_feed_the_peak_ewma_and_prefill_rate() {
        let b = Balance::new();
        b.sync(
            &policy(Mode::Enforce, FailureMode::FailOpen),
            &endpoints(&[("glm-5.3", 1)]),
        );
        fresh_scrape(&b, 1, 0);
        let id = EndpointId::from("127.0.0.1:1");
        let before = b.debug()["endpoints"][0].clone();
        assert_eq!(before["ttft_peak_ewma_s"], serde_json::Value::Null);
        // A long generation: its decode dominates, nothing is learned but the completion.
        let plan = b.plan("glm-5.3", &["glm-5.3".into()], 2000, None, &blocks(), None);
        let h = b
            .dispatch(&plan.decision, plan.order[0], &blocks())
            .unwrap();
        let sent = Instant::now();
        let end = sent + Duration::from_secs(2);
        assert_eq!(
            b.estimated_first_token(&id, h, Duration::from_secs(2), end, 1000),
            None
        );
        b.complete(h);
        assert_eq!(b.debug()["endpoints"][0]["estimated_first_tokens"], 0);
        // A short answer: its end-to-end time is mostly its TTFT.
        let plan = b.plan("glm-5.3", &["glm-5.3".into()], 2000, None, &blocks(), None);
        let h = b
            .dispatch(&plan.decision, plan.order[0], &blocks())
            .unwrap();
        let sent = Instant::now();
        let end = sent + Duration::from_secs(2);
        let ttft = b
            .estimated_first_token(&id, h, Duration::from_secs(2), end, 3)
            .unwrap();
        b.complete(h);
        // Two tokens after the first at the prior's 30 ms: about 1.94 s (from dispatch).
        assert!(
            ttft > Duration::from_millis(1_900) && ttft <= Duration::from_secs(2),
            "{ttft:?}"
        );
        let after = b.debug()["endpoints"][0].clone();
        assert_eq!(after["estimated_first_tokens"], 1);
        let ewma = after["ttft_peak_ewma_s"].as_f64().unwrap();
        assert!(ewma > 1.5, "{after}");
        assert_ne!(
            after["prefill_tokens_per_second"], before["prefill_tokens_per_second"],
            "the prefill rate learns from the estimate"
        );
        // Streams teach the time per output token, which then paces the estimate.
        b.observe_decode(&id, 1.0, 10);
        assert_eq!(b.debug()["endpoints"][0]["time_per_output_token_s"], 0.1);
    }
}
