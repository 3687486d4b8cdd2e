//! The balancer: the routing core's state for this sidecar, fed by discovery and signals, and the
//! plan for each request (which endpoint first, which next on failure).
//!
//! [`kinference_routing::Router`] is a pure, clock-free library; this module owns one behind a
//! mutex and drives it with wall time: endpoints from discovery are added and removed, scrapes are
//! observed, and each request gets a [`Plan`]. The plan applies the policy's balancer settings:
//! FailClose refuses when prediction falls back, Shadow records the decision but sends the request
//! where plain peak-EWMA power-of-two balancing over the requested model's pool would.

use crate::policy::{FailureMode, Mode, Policy};
use kinference_proxy_discovery::Endpoints;
use kinference_routing::{
    Decision, DispatchHandle, EndpointId, EndpointMeta, ModelName, PromptBlocks, Request, Router,
    RouterConfig, Scrape, Time,
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
}

/// The shared balancer.
#[derive(Debug)]
pub struct Balance {
    epoch: Instant,
    inner: Mutex<Inner>,
    /// Publishes the endpoint set when it changes (the scrapers follow it).
    endpoints_tx: tokio::sync::watch::Sender<Arc<Vec<EndpointInfo>>>,
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
            }),
            endpoints_tx: tokio::sync::watch::channel(Arc::new(Vec::new())).0,
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
        }
        for m in &policy.models {
            inner
                .router
                .set_model_prior(ModelName::from(m.name.as_str()), m.prior);
        }
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
                };
                desired.insert(id, (info, meta));
            }
        }
        inner.endpoints.retain(|id, _| {
            let keep = desired.contains_key(id);
            if !keep {
                inner.router.remove_endpoint(id);
                inner.latency.remove(id);
            }
            keep
        });
        for (id, (info, meta)) in desired {
            if inner.endpoints.get(&id) != Some(&info) {
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

    /// Marks an endpoint unroutable (it refused a connection) until a scrape succeeds.
    pub fn set_ready(&self, id: &EndpointId, ready: bool) {
        let _ = self.inner.lock().router.set_ready(id, ready);
    }

    /// Plans one request.
    pub fn plan(
        &self,
        requested_model: &str,
        candidate_models: &[String],
        prompt_tokens: u32,
        max_tokens: Option<u32>,
        blocks: &PromptBlocks,
    ) -> Plan {
        let now = self.now();
        let requested = ModelName::from(requested_model);
        let models: Vec<ModelName> = candidate_models
            .iter()
            .map(|m| ModelName::from(m.as_str()))
            .collect();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let request = Request {
            requested_model: &requested,
            candidate_models: &models,
            prompt_tokens,
            max_tokens,
            lora_adapter: None,
            prompt_blocks: blocks,
            block_hasher: None,
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
            let p = |i: usize| decision.candidates[i].prediction.predicted_ttft_s;
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

    /// Records the first token of a dispatched request; returns its TTFT.
    pub fn first_token(
        &self,
        id: &EndpointId,
        handle: DispatchHandle,
        at: Instant,
    ) -> Option<Duration> {
        let at = self.time_of(at);
        let mut g = self.inner.lock();
        let ttft = g.router.first_token(handle, at).ok()?;
        let tau = DEFAULT_TAU;
        g.latency
            .entry(id.clone())
            .or_insert_with(|| PeakEwma::new(0.0, 0.0, tau, at))
            .observe(ttft.as_secs_f64(), at);
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
                predictions.insert(c.endpoint, c.prediction.predicted_ttft_s);
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
                    },
                    "own_pending_requests": inflight.map(|i| i.pending()),
                    "prefill_tokens_per_second": inner.router.prefill_tokens_per_second(&e.id),
                    "correction": inner.router.correction(&e.id, now),
                    "typical_prompt_tokens": typical_tokens,
                    "predicted_ttft_s": predictions.get(&e.id),
                })
            })
            .collect();
        serde_json::json!({ "endpoints": eps })
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
            p2c_inputs(inner, &c.endpoint, c.prediction.raw_ttft_s, now)
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
        let plan = b.plan("glm-5.3", &["glm-5.3".into()], 100, None, &blocks());
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
            let plan = b.plan("glm-5.3", &["glm-5.3".into()], 100, None, &blocks());
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
        let plan = b.plan("glm-5.3", &["glm-5.3".into()], 10, None, &blocks());
        assert!(plan.refused.is_some());
        fresh_scrape(&b, 1, 0);
        let plan = b.plan("glm-5.3", &["glm-5.3".into()], 10, None, &blocks());
        assert!(plan.refused.is_none());
        let h = b
            .dispatch(&plan.decision, plan.order[0], &blocks())
            .unwrap();
        let id = EndpointId::from("127.0.0.1:1");
        assert!(b.first_token(&id, h, Instant::now()).is_some());
        b.complete(h);
        assert_eq!(b.debug()["endpoints"][0]["own_pending_requests"], 0);
    }
}
