//! The inference layer: classify, apply policy, decide, dispatch with retries, observe.
//!
//! A `tower::Layer` over the dispatch service, so it knows nothing about sockets: it takes a parsed
//! request ([`ProxyRequest`]) and answers a response whose body streams straight from the chosen
//! endpoint. Connect errors and 5xx/429 answers before the first byte are retried on the next-best
//! endpoint of the plan, within the retry budget; the routing core hears about every dispatch,
//! first token and completion, so its predictions learn from what this proxy observes.

use crate::{
    balance::{Balance, EndpointInfo, Plan},
    classify,
    decisions::{DecisionRecord, Decisions, TagRecord},
    dispatch::{Attempt, DispatchService, UpstreamBody, is_hop_by_hop},
    metrics::{
        DecisionLabels, FallbackLabels, Metrics, PoolLabels, RequestLabels, RetryLabels,
        TenantLabels,
    },
    openai::{ApiError, InferenceRequest},
    policy::{Mode, Policy, Price, Workload},
    stream::{BoxError, Hooks, ObservedBody, Summary},
};
use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use kinference_proxy_api::inference as api;
use kinference_routing::{ApproxConfig, DispatchHandle, EndpointId, PromptBlocks, Reason};
use parking_lot::RwLock;
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant, SystemTime},
};
use tower::ServiceExt;

/// The body of every response the proxy answers.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

/// An error response with the request id.
pub fn error_response(e: &ApiError, request_id: &str) -> http::Response<ProxyBody> {
    let mut rsp: http::Response<Bytes> = e.to_response();
    if let Ok(v) = http::HeaderValue::from_str(request_id) {
        rsp.headers_mut().insert(REQUEST_ID, v);
    }
    rsp.map(full)
}

pub const REQUEST_ID: &str = "x-request-id";
/// The endpoint that served a response (for operators and tests; never request content).
pub const ENDPOINT_HEADER: &str = "x-kinference-endpoint";

/// The policy the proxy currently enforces, with the message it came from.
#[derive(Debug)]
pub struct PolicyState {
    pub policy: Policy,
    pub proto: Arc<api::InferencePolicy>,
}

/// What the inference layer, the server and the admin listener share.
#[derive(Debug)]
pub struct Shared {
    pub policy: RwLock<Option<Arc<PolicyState>>>,
    pub balance: Arc<Balance>,
    pub metrics: Metrics,
    pub decisions: Decisions,
    pub classifiers: classify::Cache,
    pub workload: Workload,
    pub retry_budget: u32,
    /// The target this state is for (decision records name it): the default target's authority,
    /// or a redirected connection's original destination; empty until set.
    pub target: String,
    /// Whether every discovery stream to the controller is up (the last good policy is kept
    /// while it is not); `/debug/discovery` reports it.
    pub controller_connected: std::sync::atomic::AtomicBool,
}

impl Shared {
    pub fn new(workload: Workload, retry_budget: u32, decision_records: usize) -> Self {
        Self {
            policy: RwLock::new(None),
            balance: Arc::new(Balance::new()),
            metrics: Metrics::new(),
            decisions: Decisions::new(decision_records),
            classifiers: classify::Cache::default(),
            workload,
            retry_budget,
            target: String::new(),
            controller_connected: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn policy(&self) -> Option<Arc<PolicyState>> {
        self.policy.read().clone()
    }

    pub fn set_policy(&self, proto: Arc<api::InferencePolicy>) -> Arc<PolicyState> {
        let state = Arc::new(PolicyState {
            policy: Policy::from_proto(&proto),
            proto,
        });
        *self.policy.write() = Some(state.clone());
        state
    }

    /// The tags of a request's prompt, from the current policy's classifiers (external ones
    /// within their budgets).
    pub async fn classify(
        &self,
        state: &PolicyState,
        req: &InferenceRequest,
    ) -> kinference_classify::Tags {
        let set = self
            .classifiers
            .get(&state.policy.revision, &state.proto.classifiers);
        set.tags(req).await
    }

    fn answer_error(
        &self,
        labels: &RequestLabels,
        e: &ApiError,
        request_id: &str,
    ) -> http::Response<ProxyBody> {
        self.metrics.requests.get_or_create(labels).inc();
        self.metrics.error(labels, e.status.as_str());
        tracing::info!(request_id, tenant = %labels.tenant, requested_model = %labels.requested_model, status = e.status.as_u16(), error = %e.message, "request refused");
        error_response(e, request_id)
    }
}

/// A parsed request on its way through the inference layer.
#[derive(Debug)]
pub struct ProxyRequest {
    pub head: http::request::Parts,
    pub request: InferenceRequest,
    pub request_id: String,
    pub tenant: String,
    pub received_at: Instant,
}

/// The inference layer.
#[derive(Clone, Debug)]
pub struct InferenceLayer {
    shared: Arc<Shared>,
}

impl InferenceLayer {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

impl<S> tower::Layer<S> for InferenceLayer {
    type Service = Inference<S>;
    fn layer(&self, inner: S) -> Inference<S> {
        Inference {
            shared: self.shared.clone(),
            inner,
        }
    }
}

/// The inference service over a dispatch service `S`.
#[derive(Clone, Debug)]
pub struct Inference<S> {
    shared: Arc<Shared>,
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B> tower::Service<ProxyRequest> for Inference<S>
where
    // The projection names `B` for the impl; the rest of the bounds are `DispatchService`'s.
    S: DispatchService<B> + tower::Service<Attempt, Response = http::Response<B>>,
    B: UpstreamBody,
{
    type Response = http::Response<ProxyBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ProxyRequest) -> Self::Future {
        let shared = self.shared.clone();
        let inner = self.inner.clone();
        Box::pin(async move { Ok(route(shared, inner, req).await) })
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Enforce => "enforce",
        Mode::Shadow => "shadow",
    }
}

fn reason_name(r: &Reason) -> &'static str {
    match r {
        Reason::LowestPredictedTtft => "lowest_predicted_ttft",
        Reason::TieBroken { .. } => "tie_broken",
        Reason::PrefixAffinity { .. } => "prefix_affinity",
        Reason::FallbackStaleSignals => "stale_signals",
        Reason::FallbackNoSignals => "no_signals",
        Reason::NoCandidates => "no_candidates",
    }
}

async fn route<S, B>(
    shared: Arc<Shared>,
    dispatch: S,
    req: ProxyRequest,
) -> http::Response<ProxyBody>
where
    S: DispatchService<B>,
    B: UpstreamBody,
{
    let ProxyRequest {
        head,
        request,
        request_id,
        tenant,
        received_at,
    } = req;
    let mut labels = RequestLabels {
        tenant: tenant.clone(),
        requested_model: request.model.clone(),
        ..RequestLabels::default()
    };
    let Some(state) = shared.policy() else {
        return shared.answer_error(
            &labels,
            &ApiError::unavailable("no inference policy has been received from the controller yet"),
            &request_id,
        );
    };
    let t0 = Instant::now();
    let tags = shared.classify(&state, &request).await;
    let Some(candidates) = state
        .policy
        .candidates(&request.model, &tags, &shared.workload)
    else {
        return shared.answer_error(
            &labels,
            &ApiError::unknown_model(&request.model),
            &request_id,
        );
    };
    labels.requested_model = candidates.requested_model.clone();
    labels.service_class = candidates.service_class.clone();
    let blocks = PromptBlocks::from_text(&request.prefix_text(), &ApproxConfig::default());
    let plan = shared.balance.plan(
        &candidates.requested_model,
        &candidates.models,
        request.estimated_prompt_tokens(),
        request.max_tokens,
        &blocks,
        Some(&request.prompt),
    );
    let decision_s = t0.elapsed().as_secs_f64();
    let m = &shared.metrics;
    m.decision_duration_seconds
        .get_or_create(&TenantLabels {
            tenant: tenant.clone(),
            requested_model: labels.requested_model.clone(),
        })
        .observe(decision_s);
    let d = &plan.decision;
    m.decisions
        .get_or_create(&DecisionLabels {
            tenant: tenant.clone(),
            requested_model: labels.requested_model.clone(),
            served_model: d.chosen_model().map(|m| m.to_string()).unwrap_or_default(),
            reason: reason_name(&d.reason).into(),
            mode: mode_name(plan.mode).into(),
        })
        .inc();
    m.rule_decisions(
        &tenant,
        &labels.requested_model,
        &d.chosen_model().map(|m| m.to_string()).unwrap_or_default(),
        candidates
            .rule_trace
            .iter()
            .filter(|t| t.matched)
            .map(|t| t.rule.as_str()),
    );
    for c in &d.candidates {
        if c.prediction.reported_waiting.is_some() && !c.prediction.signals_fresh {
            let pool = shared
                .balance
                .info(&c.endpoint)
                .map(|i| i.pool)
                .unwrap_or_default();
            m.stale_signals
                .get_or_create(&PoolLabels {
                    pool,
                    model: c.model.to_string(),
                })
                .inc();
        }
    }
    if d.reason.is_fallback() {
        let failure_mode = if plan.refused.is_some() {
            "fail_close"
        } else {
            "fail_open"
        };
        m.fallbacks
            .get_or_create(&FallbackLabels {
                tenant: tenant.clone(),
                requested_model: labels.requested_model.clone(),
                reason: reason_name(&d.reason).into(),
                failure_mode: failure_mode.into(),
            })
            .inc();
    }
    shared.decisions.push(DecisionRecord {
        request_id: request_id.clone(),
        target: shared.target.clone(),
        unix_time_ms: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        tenant: tenant.clone(),
        requested: request.model.clone(),
        service_class: candidates.service_class.clone(),
        tags: tags
            .iter()
            .map(|t| TagRecord {
                name: t.name.clone(),
                value: t.value.clone(),
                confidence: t.confidence,
            })
            .collect(),
        rule_trace: candidates.rule_trace.clone(),
        candidate_models: candidates.models.clone(),
        mode: mode_name(plan.mode),
        decision: d.clone(),
        attempts: vec![],
        decision_duration_s: decision_s,
    });
    if let Some(why) = &plan.refused {
        return shared.answer_error(&labels, &ApiError::unavailable(why.clone()), &request_id);
    }
    attempt_all(
        shared.clone(),
        dispatch,
        &state.policy,
        head,
        request,
        plan,
        blocks,
        labels,
        request_id,
        received_at,
    )
    .await
}

/// Builds the upstream request of one attempt.
fn upstream_request(
    head: &http::request::Parts,
    body: Bytes,
    request_id: &str,
) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::new(Full::new(body));
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = head.uri.clone();
    for (k, v) in &head.headers {
        if !is_hop_by_hop(k) {
            req.headers_mut().append(k.clone(), v.clone());
        }
    }
    if let Ok(v) = http::HeaderValue::from_str(request_id) {
        req.headers_mut().insert(REQUEST_ID, v);
    }
    req
}

#[allow(clippy::too_many_arguments)]
async fn attempt_all<S, B>(
    shared: Arc<Shared>,
    dispatch: S,
    policy: &Policy,
    head: http::request::Parts,
    request: InferenceRequest,
    plan: Plan,
    blocks: PromptBlocks,
    mut labels: RequestLabels,
    request_id: String,
    received_at: Instant,
) -> http::Response<ProxyBody>
where
    S: DispatchService<B>,
    B: UpstreamBody,
{
    let max_attempts = 1 + shared.retry_budget as usize;
    let tries: Vec<usize> = plan.order.iter().copied().take(max_attempts).collect();
    let mut last_error = None;
    for (n, &index) in tries.iter().enumerate() {
        let last_try = n + 1 == tries.len();
        let cand = &plan.decision.candidates[index];
        let Some(info) = shared.balance.info(&cand.endpoint) else {
            continue;
        };
        let body = if info.served_name == request.model {
            request.raw.clone()
        } else {
            match crate::openai::rewrite_model(&request.raw, &info.served_name) {
                Ok(b) => b,
                Err(e) => return shared.answer_error(&labels, &e, &request_id),
            }
        };
        labels.served_model = info.model.clone();
        labels.pool = info.pool.clone();
        shared
            .decisions
            .update(&request_id, |r| r.attempts.push(info.id.to_string()));
        let handle = shared.balance.dispatch(&plan.decision, index, &blocks);
        let attempt = Attempt {
            addr: info.addr,
            request: upstream_request(&head, body, &request_id),
        };
        let sent_at = Instant::now();
        let retry = |reason: &str| {
            shared
                .metrics
                .retries
                .get_or_create(&RetryLabels {
                    tenant: labels.tenant.clone(),
                    requested_model: labels.requested_model.clone(),
                    reason: reason.into(),
                })
                .inc();
        };
        match dispatch.clone().oneshot(attempt).await {
            Ok(rsp) => {
                let status = rsp.status();
                let retryable =
                    status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS;
                if retryable && !last_try {
                    if let Some(h) = handle {
                        shared.balance.complete(h);
                    }
                    tracing::info!(request_id, endpoint = %info.id, status = status.as_u16(), "retrying on the next-best endpoint");
                    retry(if status == http::StatusCode::TOO_MANY_REQUESTS {
                        "status_429"
                    } else {
                        "status_5xx"
                    });
                    last_error = Some(format!("{} answered {status}", info.id));
                    continue;
                }
                let hooks = RequestHooks {
                    shared: shared.clone(),
                    labels: labels.clone(),
                    handle,
                    endpoint: info.id.clone(),
                    predicted_ttft_s: cand.prediction.dated.predicted_ttft_s,
                    received_at,
                    price: policy
                        .model(&info.model)
                        .map(|m| m.price.clone())
                        .unwrap_or_default(),
                    request_id: request_id.clone(),
                    status,
                    sent_at,
                    first_token_seen: false,
                    decode: (0.0, 0),
                };
                return respond(rsp, request.stream, Box::new(hooks), &request_id, &info);
            }
            Err(e) => {
                if let Some(h) = handle {
                    shared.balance.complete(h);
                }
                if e.is_connect() {
                    shared.balance.set_ready(&info.id, false);
                }
                tracing::warn!(request_id, endpoint = %info.id, error = %e, "attempt failed");
                retry(if e.is_connect() { "connect" } else { "failed" });
                last_error = Some(e.to_string());
            }
        }
    }
    let e = match last_error {
        Some(msg) => ApiError::bad_gateway(format!("every attempt failed; last: {msg}")),
        None => ApiError::unavailable("no endpoint could be tried"),
    };
    shared.answer_error(&labels, &e, &request_id)
}

fn respond<B>(
    rsp: http::Response<B>,
    stream: bool,
    hooks: Box<dyn Hooks>,
    request_id: &str,
    info: &EndpointInfo,
) -> http::Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    let (mut parts, body) = rsp.into_parts();
    parts.headers.retain_hop_by_hop();
    let is_sse = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if let Ok(v) = http::HeaderValue::from_str(request_id) {
        parts.headers.insert(REQUEST_ID, v);
    }
    if let Ok(v) = http::HeaderValue::from_str(info.id.as_str()) {
        parts.headers.insert(ENDPOINT_HEADER, v);
    }
    let body = ObservedBody::new(body, stream && is_sse, hooks).boxed_unsync();
    http::Response::from_parts(parts, body)
}

trait RetainHopByHop {
    fn retain_hop_by_hop(&mut self);
}

impl RetainHopByHop for http::HeaderMap {
    /// Drops hop-by-hop headers (keeps `content-length`, which describes the body passed through).
    fn retain_hop_by_hop(&mut self) {
        for h in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "te",
            "trailer",
            "upgrade",
        ] {
            self.remove(h);
        }
    }
}

/// What one request's body tells the balancer and the metrics.
struct RequestHooks {
    shared: Arc<Shared>,
    labels: RequestLabels,
    handle: Option<DispatchHandle>,
    endpoint: EndpointId,
    predicted_ttft_s: f64,
    received_at: Instant,
    price: Price,
    request_id: String,
    status: http::StatusCode,
    /// When the attempt that answered was sent.
    sent_at: Instant,
    first_token_seen: bool,
    /// Streamed inter-token gaps: (sum in seconds, count).
    decode: (f64, u64),
}

impl Hooks for RequestHooks {
    fn first_token(&mut self, at: Instant) {
        self.first_token_seen = true;
        let m = &self.shared.metrics;
        m.ttft_seconds
            .get_or_create(&self.labels)
            .observe(at.saturating_duration_since(self.received_at).as_secs_f64());
        if let Some(h) = self.handle
            && let Some(ttft) = self.shared.balance.first_token(&self.endpoint, h, at, true)
        {
            m.observe_prediction(
                &self.labels,
                self.endpoint.as_str(),
                ttft.as_secs_f64(),
                self.predicted_ttft_s,
            );
        }
    }

    fn token(&mut self, at: Instant, gap: Duration) {
        // A token ends an engine step: the endpoint's step in progress is timed from it.
        if let Some(h) = self.handle {
            self.shared.balance.observe_token(h, at);
        }
        self.decode.0 += gap.as_secs_f64();
        self.decode.1 += 1;
        self.shared
            .metrics
            .inter_token_latency_seconds
            .get_or_create(&self.labels)
            .observe(gap.as_secs_f64());
    }

    fn end(&mut self, summary: Summary) {
        if let Some(h) = self.handle.take() {
            let balance = &self.shared.balance;
            if self.first_token_seen {
                balance.observe_decode(&self.endpoint, self.decode.0, self.decode.1);
            } else if self.status.is_success()
                && summary.upstream_error.is_none()
                && !summary.cancelled
                && let Some(u) = summary.usage.filter(|u| u.completion_tokens > 0)
            {
                // A non-stream answer: feed its estimated first token (see `balance`).
                let end = Instant::now();
                balance.estimated_first_token(
                    &self.endpoint,
                    h,
                    end.saturating_duration_since(self.sent_at),
                    end,
                    u.completion_tokens,
                );
            }
            balance.complete(h);
        }
        let m = &self.shared.metrics;
        let l = &self.labels;
        let e2e = self.received_at.elapsed();
        m.requests.get_or_create(l).inc();
        m.request_duration_seconds
            .get_or_create(l)
            .observe(e2e.as_secs_f64());
        if let Some(u) = summary.usage {
            m.prompt_tokens.get_or_create(l).inc_by(u.prompt_tokens);
            m.cached_prompt_tokens
                .get_or_create(l)
                .inc_by(u.cached_tokens);
            m.completion_tokens
                .get_or_create(l)
                .inc_by(u.completion_tokens);
            m.cost_usd.get_or_create(l).inc_by(self.price.cost(
                u.prompt_tokens,
                u.cached_tokens,
                u.completion_tokens,
            ));
        }
        if !self.status.is_success() {
            m.error(l, self.status.as_str());
        } else if summary.upstream_error.is_some() {
            m.error(l, "stream");
        }
        tracing::info!(
            request_id = %self.request_id,
            tenant = %l.tenant,
            requested_model = %l.requested_model,
            served_model = %l.served_model,
            endpoint = %self.endpoint,
            status = self.status.as_u16(),
            duration_ms = e2e.as_millis() as u64,
            prompt_tokens = summary.usage.map(|u| u.prompt_tokens),
            completion_tokens = summary.usage.map(|u| u.completion_tokens),
            cancelled = summary.cancelled,
            upstream_error = summary.upstream_error.as_deref(),
            "request done"
        );
    }
}

/// Forwards another `/v1/*` request to the requested model's pool (plain balancing, with retries).
#[allow(clippy::too_many_arguments)]
pub async fn forward_other<S, B>(
    shared: Arc<Shared>,
    dispatch: S,
    head: http::request::Parts,
    body: Bytes,
    model: String,
    request_id: String,
    tenant: String,
    received_at: Instant,
) -> http::Response<ProxyBody>
where
    S: DispatchService<B>,
    B: UpstreamBody,
{
    let mut labels = RequestLabels {
        tenant,
        requested_model: model.clone(),
        service_class: crate::policy::DEFAULT_SERVICE_CLASS.into(),
        ..RequestLabels::default()
    };
    let Some(state) = shared.policy() else {
        return shared.answer_error(
            &labels,
            &ApiError::unavailable("no inference policy has been received from the controller yet"),
            &request_id,
        );
    };
    let Some(target) = state.policy.resolve(&model).cloned() else {
        return shared.answer_error(&labels, &ApiError::unknown_model(&model), &request_id);
    };
    labels.requested_model = target.name.clone();
    labels.served_model = target.name.clone();
    labels.pool = target.pool.clone();
    let body = if target.served_name == model || body.is_empty() {
        body
    } else {
        crate::openai::rewrite_model(&body, &target.served_name).unwrap_or(body)
    };
    let eps = shared.balance.plain(&target.name);
    let max_attempts = 1 + shared.retry_budget as usize;
    let mut last_error = None;
    let n = eps.len().min(max_attempts);
    for (i, info) in eps.iter().take(n).enumerate() {
        let attempt = Attempt {
            addr: info.addr,
            request: upstream_request(&head, body.clone(), &request_id),
        };
        match dispatch.clone().oneshot(attempt).await {
            Ok(rsp) => {
                let status = rsp.status();
                if (status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS)
                    && i + 1 < n
                {
                    last_error = Some(format!("{} answered {status}", info.id));
                    continue;
                }
                let hooks = RequestHooks {
                    shared: shared.clone(),
                    labels: labels.clone(),
                    handle: None,
                    endpoint: info.id.clone(),
                    predicted_ttft_s: 0.0,
                    received_at,
                    price: Price::default(),
                    request_id: request_id.clone(),
                    status,
                    sent_at: Instant::now(),
                    first_token_seen: false,
                    decode: (0.0, 0),
                };
                return respond(rsp, false, Box::new(hooks), &request_id, info);
            }
            Err(e) => {
                if e.is_connect() {
                    shared.balance.set_ready(&info.id, false);
                }
                last_error = Some(e.to_string());
            }
        }
    }
    let e = match last_error {
        Some(msg) => ApiError::bad_gateway(format!("every attempt failed; last: {msg}")),
        None => ApiError::unavailable(format!("no endpoint of {} is known", target.name)),
    };
    shared.answer_error(&labels, &e, &request_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dispatch::DispatchError, openai::Endpoint, policy::tests::example_proto};
    use kinference_proxy_discovery::{Endpoint as Ep, Endpoints};
    use parking_lot::Mutex;
    use std::{collections::BTreeMap, net::SocketAddr};
    use tower::Service;

    type Seen = Arc<Mutex<Vec<(SocketAddr, Bytes)>>>;

    /// A dispatch service that records what it was sent and answers `status`.
    fn fake(
        seen: Seen,
        status: impl Fn(SocketAddr) -> u16 + Clone + Send + 'static,
    ) -> impl tower::Service<
        Attempt,
        Response = http::Response<Full<Bytes>>,
        Error = DispatchError,
        Future = impl Send,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(move |a: Attempt| {
            let seen = seen.clone();
            let status = status.clone();
            async move {
                let body = a.request.into_body().collect().await.unwrap().to_bytes();
                seen.lock().push((a.addr, body));
                let mut rsp = http::Response::new(Full::new(Bytes::from_static(b"{}")));
                *rsp.status_mut() = http::StatusCode::from_u16(status(a.addr)).unwrap();
                Ok::<_, DispatchError>(rsp)
            }
        })
    }

    fn shared(mode: api::balancer::Mode) -> Arc<Shared> {
        let s = Arc::new(Shared::new(Workload::parse("default/app", vec![]), 1, 16));
        let mut proto = example_proto();
        proto.balancer.as_mut().unwrap().mode = mode as i32;
        // Keyword tags only: these tests do not depend on the complexity model's weights.
        proto.classifiers = crate::classify::tests::example();
        proto.classifiers[0]
            .tags
            .retain(|t| t.name == "translation");
        let rule = &mut proto.rules[0];
        rule.r#match.as_mut().unwrap().tags = vec![api::rule::TagMatch {
            name: "translation".into(),
            values: vec!["true".into()],
            min_confidence: 0.5,
        }];
        let state = s.set_policy(Arc::new(proto));
        let ep = |port: u16| Ep {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            labels: BTreeMap::new(),
        };
        let endpoints = Endpoints {
            by_backend: BTreeMap::from([
                (
                    "glm-5.3.default.inferencepool.kinference.io".into(),
                    vec![ep(1)],
                ),
                (
                    "qwen-3.6-27b.default.inferencepool.kinference.io".into(),
                    vec![ep(3)],
                ),
            ]),
        };
        s.balance.sync(&state.policy, &endpoints);
        // glm is loaded, qwen idle.
        for (port, waiting) in [(1, 60), (3, 0)] {
            s.balance.observe_scrape(
                &EndpointId::from(format!("127.0.0.1:{port}")),
                &kinference_routing::Scrape {
                    num_requests_waiting: Some(waiting),
                    num_requests_running: Some(0),
                    kv_cache_usage: Some(0.0),
                    ..Default::default()
                },
                s.balance.now(),
            );
        }
        s
    }

    fn request(raw: &'static str) -> ProxyRequest {
        let (head, ()) = http::Request::post("/v1/chat/completions")
            .body(())
            .unwrap()
            .into_parts();
        ProxyRequest {
            head,
            request: InferenceRequest::parse(Endpoint::Chat, Bytes::from_static(raw.as_bytes()))
                .unwrap(),
            request_id: "r1".into(),
            tenant: "default/app".into(),
            received_at: Instant::now(),
        }
    }

    #[tokio::test]
    async fn model_is_rewritten_only_when_a_substitute_wins() {
        let s = shared(api::balancer::Mode::Enforce);
        let seen: Seen = Arc::default();
        let mut svc =
            tower::Layer::layer(&InferenceLayer::new(s.clone()), fake(seen.clone(), |_| 200));
        // Tagged translation=true: qwen (idle) may serve it and beats loaded glm; the body names qwen.
        let low = r#"{"model":"glm-5.3","messages":[{"role":"user","content":"Please translate hello in French"}]}"#;
        let rsp = svc.call(request(low)).await.unwrap();
        let rec = s.decisions.snapshot(Some("r1"));
        assert_eq!(
            rsp.headers()[ENDPOINT_HEADER],
            "127.0.0.1:3",
            "{}",
            serde_json::to_string(&rec).unwrap()
        );
        let (addr, body) = seen.lock()[0].clone();
        assert_eq!(addr.port(), 3);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["model"], "qwen-3.6-27b");
        // Not tagged: only glm is allowed; the body is forwarded byte for byte.
        let high = r#"{"model":"glm-5.3", "messages":[{"role":"user","content":"Design a distributed consensus protocol tolerant to Byzantine faults for a geo-replicated database; derive its message complexity, prove safety and liveness under partial synchrony, and compare it with PBFT and HotStuff in latency and throughput."}]}"#;
        let rsp = svc.call(request(high)).await.unwrap();
        assert_eq!(rsp.headers()[ENDPOINT_HEADER], "127.0.0.1:1");
        let (addr, body) = seen.lock()[1].clone();
        assert_eq!(addr.port(), 1);
        assert_eq!(&body[..], high.as_bytes());
        drop(rsp);
    }

    #[tokio::test]
    async fn a_503_before_the_first_byte_is_retried_on_the_next_best() {
        let s = shared(api::balancer::Mode::Enforce);
        let seen: Seen = Arc::default();
        let mut svc = tower::Layer::layer(
            &InferenceLayer::new(s.clone()),
            fake(
                seen.clone(),
                |a: SocketAddr| if a.port() == 3 { 503 } else { 200 },
            ),
        );
        let low = r#"{"model":"glm-5.3","messages":[{"role":"user","content":"Please translate hello in French"}]}"#;
        let rsp = svc.call(request(low)).await.unwrap();
        assert_eq!(rsp.status(), 200);
        let ports: Vec<u16> = seen.lock().iter().map(|(a, _)| a.port()).collect();
        assert_eq!(ports, vec![3, 1]);
        // The retry went back to the requested model: its body names glm-5.3 again.
        let v: serde_json::Value = serde_json::from_slice(&seen.lock()[1].1).unwrap();
        assert_eq!(v["model"], "glm-5.3");
        assert_eq!(
            s.decisions.snapshot(Some("r1"))[0].attempts,
            vec!["127.0.0.1:3", "127.0.0.1:1"]
        );
    }

    #[tokio::test]
    async fn shadow_mode_records_the_decision_but_sends_to_the_requested_pool() {
        let s = shared(api::balancer::Mode::Shadow);
        let seen: Seen = Arc::default();
        let mut svc =
            tower::Layer::layer(&InferenceLayer::new(s.clone()), fake(seen.clone(), |_| 200));
        let low = r#"{"model":"glm-5.3","messages":[{"role":"user","content":"Please translate hello in French"}]}"#;
        let rsp = svc.call(request(low)).await.unwrap();
        assert_eq!(rsp.headers()[ENDPOINT_HEADER], "127.0.0.1:1");
        let rec = &s.decisions.snapshot(Some("r1"))[0];
        assert_eq!(rec.mode, "shadow");
        assert_eq!(
            rec.decision.chosen_endpoint().map(|e| e.as_str()),
            Some("127.0.0.1:3")
        );
        assert_eq!(rec.attempts, vec!["127.0.0.1:1"]);
        assert_eq!(&seen.lock()[0].1[..], low.as_bytes(), "not rewritten");
        let text = s.metrics.encode();
        assert!(text.contains(r#"mode="shadow"} 1"#), "{text}");
    }
}
