//! The retry layer: a routed request's attempts, in the plan's order, within the attempt limit
//! and the retry budget.
//!
//! Each attempt goes to the next endpoint of the request's [`Attempts`]: its body names the model
//! that endpoint serves (rewritten only when that differs from what the client sent), and for a
//! decided request the router is told of the dispatch, so its queue and prefix index know. Each
//! attempt waits for its first byte as long as the policy's timeouts derive from its prediction
//! (a multiple of the predicted TTFT, plus the decode of `max_tokens` for a non-stream answer,
//! within a floor and a cap). A connect error, a failure before any response, an expired wait,
//! or a 5xx or 429 answered before the first byte is retried on the next endpoint, as long as the
//! target's retry budget allows (a share of its requests plus a floor per second, as Linkerd's:
//! a fleet-wide brownout must not multiply the load on the endpoints); the failed attempt's
//! dispatch is completed at once. Every outcome feeds failure accrual (an endpoint that keeps
//! failing is ejected for a backoff), and a connect error also marks the endpoint unroutable until
//! a scrape succeeds. The answer that is kept goes up with the [`Served`] facts the observe layer
//! needs; when every attempt failed, the error says why.

use crate::{
    decisions::Decisions,
    endpoints::{EndpointInfo, EndpointTable},
    forward::{Attempt, ForwardError, ForwardService, UpstreamBody, is_hop_by_hop},
    metrics::{EndpointLabels, RetryLabels, RetryMetrics},
    route::{Attempts, Routed},
    router::RouterHandle,
};
use bytes::Bytes;
use http_body_util::Full;
use kinference_openai::ApiError;
use kinference_routing::{DispatchHandle, EndpointId};
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::time::Instant;
use tower::ServiceExt;
use tower::retry::budget::{Budget, TpsBudget};

/// The retry layer's handles.
#[derive(Clone, Debug)]
pub struct RetryParams {
    /// Attempts per request, the first included.
    pub max_attempts: usize,
    pub router: RouterHandle,
    pub endpoints: EndpointTable,
    /// Where each attempt is added to the request's decision record.
    pub decisions: Decisions,
    pub metrics: RetryMetrics,
    /// The target's retry budget: every request deposits, every retry withdraws.
    pub budget: Arc<TpsBudget>,
}

/// A retry budget over the last 10 s: retries may add `ratio` of the requests (Linkerd's default
/// 0.2), and `min_per_second` are always allowed (10).
pub fn budget(ratio: f32, min_per_second: u32) -> TpsBudget {
    TpsBudget::new(
        std::time::Duration::from_secs(10),
        min_per_second,
        ratio.clamp(0.0, 1000.0),
    )
}

/// The endpoint that answered, and what the observe layer feeds back about it.
#[derive(Clone, Debug)]
pub struct Served {
    pub endpoint: EndpointInfo,
    /// The router's handle on the dispatch (decided requests only); whoever holds it completes it.
    pub handle: Option<DispatchHandle>,
    /// When the attempt that answered was sent.
    pub sent_at: Instant,
    /// Its predicted TTFT (zero for plain balancing).
    pub predicted_ttft_s: f64,
    /// The prompt tokens the decision predicted this endpoint held in its prefix cache (decided
    /// requests only): the observe layer's estimate when the usage reports none.
    pub predicted_cached_tokens: Option<u64>,
}

/// An upstream answer kept by the retry layer.
#[derive(Debug)]
pub struct Answered<B> {
    pub response: http::Response<B>,
    pub served: Served,
}

#[derive(Clone, Debug)]
pub struct RetryLayer {
    params: Arc<RetryParams>,
}

impl RetryLayer {
    pub fn new(params: RetryParams) -> Self {
        Self {
            params: Arc::new(params),
        }
    }
}

impl<S> tower::Layer<S> for RetryLayer {
    type Service = Retry<S>;
    fn layer(&self, inner: S) -> Retry<S> {
        Retry {
            params: self.params.clone(),
            inner,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Retry<S> {
    params: Arc<RetryParams>,
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B> tower::Service<Routed> for Retry<S>
where
    S: ForwardService<B> + tower::Service<Attempt, Response = http::Response<B>>,
    B: UpstreamBody,
{
    type Response = Answered<B>;
    type Error = ApiError;
    type Future = BoxFuture<Result<Answered<B>, ApiError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Routed) -> Self::Future {
        let params = self.params.clone();
        let inner = self.inner.clone();
        Box::pin(async move { attempt_all(&params, inner, req).await })
    }
}

/// One endpoint of the request's order.
struct Next {
    endpoint: EndpointId,
    /// Its index in the plan's candidates (decided requests).
    candidate: Option<usize>,
    predicted_ttft_s: f64,
    /// Seconds per decode step there, for a non-stream answer's expected length.
    decode_step_s: f64,
    /// Prompt tokens predicted cached there.
    cached_tokens: Option<u64>,
}

fn order(attempts: &Attempts, max: usize) -> Vec<Next> {
    match attempts {
        Attempts::Planned { plan, .. } => plan
            .order
            .iter()
            .take(max)
            .filter_map(|&i| {
                let c = plan.decision.candidates.get(i)?;
                Some(Next {
                    endpoint: c.endpoint.clone(),
                    candidate: Some(i),
                    predicted_ttft_s: c.prediction.dated.predicted_ttft_s,
                    decode_step_s: c.prediction.decode_step_s,
                    cached_tokens: Some(c.prediction.cached_tokens.into()),
                })
            })
            .collect(),
        Attempts::Plain(endpoints) => endpoints
            .iter()
            .take(max)
            .map(|e| Next {
                endpoint: e.clone(),
                candidate: None,
                predicted_ttft_s: f64::NAN,
                decode_step_s: 0.0,
                cached_tokens: None,
            })
            .collect(),
    }
}

async fn attempt_all<S, B>(
    params: &RetryParams,
    forward: S,
    req: Routed,
) -> Result<Answered<B>, ApiError>
where
    S: ForwardService<B>,
    B: UpstreamBody,
{
    let tries = order(&req.attempts, params.max_attempts.max(1));
    let planned = match &req.attempts {
        Attempts::Planned { plan, blocks } => Some((plan, blocks)),
        Attempts::Plain(_) => None,
    };
    let retry = |reason: &str| {
        params
            .metrics
            .retries
            .get_or_create(&RetryLabels {
                tenant: req.labels.tenant.clone(),
                requested_model: req.labels.requested_model.clone(),
                reason: reason.into(),
            })
            .inc();
    };
    let timeouts = req.policy.timeouts;
    params.budget.deposit();
    let mut last_error = None;
    for (n, next) in tries.iter().enumerate() {
        let last_try = n + 1 == tries.len();
        let Some(info) = params.endpoints.info(&next.endpoint) else {
            continue;
        };
        let body = if info.served_name == req.model {
            req.body.clone()
        } else {
            kinference_openai::rewrite_model(&req.body, &info.served_name)?
        };
        let handle = match (planned, next.candidate) {
            (Some((plan, blocks)), Some(i)) => {
                params
                    .decisions
                    .update(&req.request_id, |r| r.attempts.push(info.id.to_string()));
                params.router.dispatch(&plan.decision, i, blocks)
            }
            _ => None,
        };
        let attempt = Attempt {
            addr: info.addr,
            request: upstream_request(&req.head, body, &req.request_id),
        };
        // A stream's first byte is its response headers; a non-stream answer's is the whole
        // answer, so its wait covers the decode of max_tokens too. Plain balancing predicts
        // nothing: the cap.
        let predicted_s = if next.predicted_ttft_s.is_nan() {
            f64::INFINITY
        } else if req.stream {
            next.predicted_ttft_s
        } else {
            let tokens = f64::from(req.max_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS));
            next.predicted_ttft_s + tokens * next.decode_step_s
        };
        let wait = timeouts.first_byte(predicted_s);
        let sent_at = Instant::now();
        let outcome = match tokio::time::timeout(wait, forward.clone().oneshot(attempt)).await {
            Ok(r) => r,
            Err(_) => Err(ForwardError::Timeout(info.addr, wait)),
        };
        match outcome {
            Ok(rsp) => {
                if let Some(t) = &req.rollout {
                    t.set_attempt_timed_out(false);
                }
                let status = rsp.status();
                let failed =
                    status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS;
                if failed {
                    accrue_failure(params, &info);
                } else {
                    params.router.success(&info.id);
                }
                // A failed answer is retried only with the budget's leave; without it, the
                // endpoint's own answer goes back.
                if failed && !last_try && retry_allowed(params, &req, &retry) {
                    if let Some(h) = handle {
                        params.router.complete(h);
                    }
                    tracing::info!(request_id = %req.request_id, endpoint = %info.id, status = status.as_u16(), "retrying on the next endpoint");
                    if planned.is_some() {
                        retry(if status == http::StatusCode::TOO_MANY_REQUESTS {
                            "status_429"
                        } else {
                            "status_5xx"
                        });
                    }
                    last_error = Some(format!("{} answered {status}", info.id));
                    continue;
                }
                return Ok(Answered {
                    response: rsp,
                    served: Served {
                        endpoint: info,
                        handle,
                        sent_at,
                        predicted_ttft_s: if next.predicted_ttft_s.is_nan() {
                            0.0
                        } else {
                            next.predicted_ttft_s
                        },
                        predicted_cached_tokens: next.cached_tokens,
                    },
                });
            }
            Err(e) => {
                if let Some(h) = handle {
                    params.router.complete(h);
                }
                if let Some(t) = &req.rollout {
                    t.set_attempt_timed_out(matches!(e, ForwardError::Timeout(..)));
                }
                if e.is_connect() {
                    params.router.set_ready(&info.id, false);
                }
                accrue_failure(params, &info);
                tracing::warn!(request_id = %req.request_id, endpoint = %info.id, error = %e, "attempt failed");
                if planned.is_some() {
                    retry(match &e {
                        ForwardError::Connect(..) => "connect",
                        ForwardError::Timeout(..) => "timeout",
                        _ => "failed",
                    });
                }
                last_error = Some(e.to_string());
                if !last_try && !retry_allowed(params, &req, &retry) {
                    break;
                }
            }
        }
    }
    Err(match last_error {
        Some(msg) => ApiError::bad_gateway(format!("every attempt failed; last: {msg}")),
        None if planned.is_some() => ApiError::unavailable("no endpoint could be tried"),
        None => ApiError::unavailable(format!(
            "no endpoint of {} is known",
            req.labels.served_model
        )),
    })
}

/// The completion assumed for a non-stream answer's wait when the request sets no `max_tokens`.
const DEFAULT_OUTPUT_TOKENS: u32 = 256;

/// Whether the target's retry budget lets the request try its next endpoint (counted when not).
fn retry_allowed(params: &RetryParams, req: &Routed, retry: &impl Fn(&str)) -> bool {
    if params.budget.withdraw() {
        return true;
    }
    if matches!(req.attempts, Attempts::Planned { .. }) {
        retry("budget_exhausted");
    }
    tracing::debug!(request_id = %req.request_id, "retry budget exhausted");
    false
}

/// Counts a failed attempt against its endpoint; an ejection is counted and logged.
fn accrue_failure(params: &RetryParams, info: &EndpointInfo) {
    if params.router.failure(&info.id) {
        tracing::warn!(endpoint = %info.id, pool = %info.pool, "endpoint ejected after consecutive failures");
        params
            .metrics
            .ejections
            .get_or_create(&EndpointLabels {
                pool: info.pool.clone(),
                model: info.model.clone(),
                endpoint: info.id.to_string(),
            })
            .inc();
    }
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
        req.headers_mut().insert(crate::body::REQUEST_ID, v);
    }
    req
}
