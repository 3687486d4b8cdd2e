//! The observe layer: the answer on its way back, and what it teaches.
//!
//! It wraps the retry layer. The answer that was kept streams to the client through an
//! [`ObservedBody`] whose hooks feed the router (first token, each streamed token, the decode's
//! pace, completion; for a non-stream answer, an estimated first token) and count the request
//! per tenant and model: TTFT, inter-token latency, duration, tokens, cost, and the observed TTFT
//! against its prediction. A usage without a cached-token figure counts the decision's predicted
//! cached tokens instead, also counted apart as an estimate. When every attempt failed, the error is answered and counted here.

use crate::{
    body::{ENDPOINT_HEADER, ProxyBody, REQUEST_ID, refuse},
    forward::UpstreamBody,
    metrics::{RequestLabels, RequestMetrics},
    retry::{Answered, Served},
    route::Routed,
    router::RouterHandle,
    stream::{Deadlines, Hooks, ObservedBody, Summary},
};
use http_body_util::BodyExt;
use kinference_decision::Price;
use kinference_openai::{ApiError, Usage};
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Instant;
use tower::ServiceExt;

/// The observe layer's handles.
#[derive(Clone, Debug)]
pub struct ObserveParams {
    pub router: RouterHandle,
    pub metrics: RequestMetrics,
    /// Log each request at INFO (else DEBUG).
    pub access_log: bool,
    /// Where a sampled request's answer goes to be judged.
    pub guard: crate::guard::Guard,
}

#[derive(Clone, Debug)]
pub struct ObserveLayer {
    params: Arc<ObserveParams>,
}

impl ObserveLayer {
    pub fn new(params: ObserveParams) -> Self {
        Self {
            params: Arc::new(params),
        }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            params: self.params.clone(),
            inner,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Observe<S> {
    params: Arc<ObserveParams>,
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B> tower::Service<Routed> for Observe<S>
where
    S: tower::Service<Routed, Response = Answered<B>, Error = ApiError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: UpstreamBody,
{
    type Response = http::Response<ProxyBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Routed) -> Self::Future {
        let params = self.params.clone();
        let inner = self.inner.clone();
        let mut labels = req.labels.clone();
        let request_id = req.request_id.clone();
        let (stream, received_at) = (req.stream, req.received_at);
        let policy = req.policy.clone();
        let sample = req.sample.clone();
        let rollout = req.rollout.clone();
        let traffic = req.traffic.take();
        // Released if every attempt fails (dropped), settled when an answer ends.
        let budget = req.budget.take();
        Box::pin(async move {
            match inner.oneshot(req).await {
                Ok(Answered { response, served }) => {
                    labels.served_model = served.endpoint.model.clone();
                    labels.pool = served.endpoint.pool.clone();
                    let price = policy
                        .model(&served.endpoint.model)
                        .map(|m| m.price.clone())
                        .unwrap_or_default();
                    let t = policy.timeouts;
                    let deadlines = Deadlines {
                        first_token: (stream && served.predicted_ttft_s > 0.0)
                            .then(|| served.sent_at + t.first_byte(served.predicted_ttft_s)),
                        idle: t.stream_idle,
                        end: received_at + t.request,
                    };
                    let hooks = RequestHooks {
                        params,
                        labels,
                        received_at,
                        price,
                        request_id: request_id.clone(),
                        status: response.status(),
                        served,
                        first_token_seen: false,
                        decode: (0.0, 0),
                        sample,
                        budget,
                        rollout,
                        ttft_s: None,
                        traffic,
                    };
                    Ok(respond(response, stream, hooks, deadlines, &request_id))
                }
                Err(e) => {
                    if let Some(t) = &rollout {
                        t.record(crate::rollout::Ended {
                            status: e.status.as_u16(),
                            ..Default::default()
                        });
                    }
                    Ok(refuse(&params.metrics, &labels, &e, &request_id))
                }
            }
        })
    }
}

fn respond<B: UpstreamBody>(
    rsp: http::Response<B>,
    stream: bool,
    hooks: RequestHooks,
    deadlines: Deadlines,
    request_id: &str,
) -> http::Response<ProxyBody> {
    let (mut parts, body) = rsp.into_parts();
    retain_end_to_end(&mut parts.headers);
    let is_sse = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if let Ok(v) = http::HeaderValue::from_str(request_id) {
        parts.headers.insert(REQUEST_ID, v);
    }
    if let Ok(v) = http::HeaderValue::from_str(hooks.served.endpoint.id.as_str()) {
        parts.headers.insert(ENDPOINT_HEADER, v);
    }
    let capture = hooks.sample.is_some();
    let mut body =
        ObservedBody::new(body, stream && is_sse, Box::new(hooks)).with_deadlines(deadlines);
    if capture {
        body = body.capture();
    }
    let body = body.boxed_unsync();
    http::Response::from_parts(parts, body)
}

/// Drops hop-by-hop headers (keeps `content-length`, which describes the body passed through).
fn retain_end_to_end(headers: &mut http::HeaderMap) {
    for h in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
    ] {
        headers.remove(h);
    }
}

/// What one request's body tells the router and the metrics.
struct RequestHooks {
    params: Arc<ObserveParams>,
    labels: RequestLabels,
    received_at: Instant,
    price: Price,
    request_id: String,
    status: http::StatusCode,
    served: Served,
    first_token_seen: bool,
    /// Streamed inter-token gaps: (sum in seconds, count).
    decode: (f64, u64),
    /// Set when the request was sampled for its rule's quality guard.
    sample: Option<Arc<crate::guard::Sample>>,
    /// The tokens reserved of the tenant's budget.
    budget: Option<crate::budget::Reservation>,
    /// The request's arm of the policy's rollout.
    rollout: Option<Arc<crate::rollout::ArmTag>>,
    /// Its time to first token, once seen (streams).
    ttft_s: Option<f64>,
    /// Its traffic record, kept when the answer ends.
    traffic: Option<crate::traffic::Pending>,
}

/// The prompt tokens to count as cached and to charge at the cached price, and whether that is an
/// estimate: the usage's `cached_tokens` when the server reported it; otherwise (vLLM without
/// `--enable-prompt-tokens-details` sends `prompt_tokens_details: null`) what the decision
/// predicted the serving endpoint held, at most the prompt; nothing for plain balancing.
fn cached_prompt_tokens(usage: &Usage, served: &Served) -> (u64, bool) {
    match (usage.cached_tokens, served.predicted_cached_tokens) {
        (Some(reported), _) => (reported, false),
        (None, Some(predicted)) => (predicted.min(usage.prompt_tokens), true),
        (None, None) => (0, false),
    }
}

impl Hooks for RequestHooks {
    fn first_token(&mut self, at: Instant) {
        self.first_token_seen = true;
        let m = &self.params.metrics;
        let ttft_s = at.saturating_duration_since(self.received_at).as_secs_f64();
        self.ttft_s = Some(ttft_s);
        m.ttft_seconds.get_or_create(&self.labels).observe(ttft_s);
        if let Some(h) = self.served.handle
            && let Some(ttft) = self.params.router.first_token(h, at, true)
        {
            m.observe_prediction(
                &self.labels,
                self.served.endpoint.id.as_str(),
                ttft.as_secs_f64(),
                self.served.predicted_ttft_s,
            );
        }
    }

    fn token(&mut self, at: Instant, gap: Duration) {
        // A token ends an engine step: the endpoint's step in progress is timed from it.
        if let Some(h) = self.served.handle {
            self.params.router.observe_token(h, at);
        }
        self.decode.0 += gap.as_secs_f64();
        self.decode.1 += 1;
        self.params
            .metrics
            .inter_token_latency_seconds
            .get_or_create(&self.labels)
            .observe(gap.as_secs_f64());
    }

    fn end(&mut self, summary: Summary) {
        let router = &self.params.router;
        let endpoint = &self.served.endpoint;
        if let Some(h) = self.served.handle.take() {
            if self.first_token_seen {
                router.observe_decode(&endpoint.id, self.decode.0, self.decode.1);
            } else if self.status.is_success()
                && summary.upstream_error.is_none()
                && !summary.cancelled
                && let Some(u) = summary.usage.filter(|u| u.completion_tokens > 0)
            {
                // A non-stream answer: feed its estimated first token (see `router`).
                let end = Instant::now();
                router.estimated_first_token(
                    &endpoint.id,
                    &endpoint.model,
                    h,
                    end.saturating_duration_since(self.served.sent_at),
                    end,
                    u.completion_tokens,
                );
            }
            router.complete(h);
        }
        let m = &self.params.metrics;
        let l = &self.labels;
        let e2e = self.received_at.elapsed();
        m.requests.get_or_create(l).inc();
        m.request_duration_seconds
            .get_or_create(l)
            .observe(e2e.as_secs_f64());
        let mut cost_usd = 0.0;
        if let Some(u) = summary.usage {
            let (cached, estimated) = cached_prompt_tokens(&u, &self.served);
            m.prompt_tokens.get_or_create(l).inc_by(u.prompt_tokens);
            m.cached_prompt_tokens.get_or_create(l).inc_by(cached);
            if estimated {
                m.cached_prompt_tokens_estimated
                    .get_or_create(l)
                    .inc_by(cached);
            }
            m.completion_tokens
                .get_or_create(l)
                .inc_by(u.completion_tokens);
            cost_usd = self
                .price
                .cost(u.prompt_tokens, cached, u.completion_tokens);
            m.cost_usd.get_or_create(l).inc_by(cost_usd);
        }
        if let Some(t) = &self.rollout {
            t.record(crate::rollout::Ended {
                status: self.status.as_u16(),
                stream_failed: summary.upstream_error.is_some() && !summary.cancelled,
                timed_out: summary.timed_out,
                ttft_s: self.ttft_s,
                cost_usd,
                tokens: summary
                    .usage
                    .map_or(0, |u| u.prompt_tokens + u.completion_tokens),
            });
        }
        if let Some(pending) = self.traffic.take() {
            pending.finish(
                &endpoint.model,
                endpoint.id.as_str(),
                self.status.as_u16(),
                self.ttft_s,
                summary
                    .usage
                    .map(|u| (u.prompt_tokens, u.completion_tokens)),
                self.decode.1 + u64::from(self.first_token_seen),
            );
        }
        if !self.status.is_success() {
            m.error(l, self.status.as_str());
        } else if summary.upstream_error.is_some() {
            m.error(l, "stream");
        }
        if let Some(reservation) = self.budget.take() {
            match summary.usage {
                Some(u) => reservation.settle(u.prompt_tokens + u.completion_tokens),
                // Answered without a usage (a stream without include_usage): the estimate stands.
                None if self.status.is_success() => {
                    let estimate = reservation.reserved();
                    reservation.settle(estimate);
                }
                None => drop(reservation),
            }
        }
        if let Some(sample) = self.sample.take() {
            let whole =
                self.status.is_success() && summary.upstream_error.is_none() && !summary.cancelled;
            // The answer the app got, with the model that wrote it (a retry may have moved it).
            let answer = summary.answer.clone().filter(|_| whole);
            if sample.served_model == endpoint.model {
                self.params.guard.judge_later(sample, answer);
            } else {
                self.params.guard.judge_later(sample, None);
            }
        }
        macro_rules! done {
            ($level:expr) => {
                tracing::event!(
                    $level,
                    request_id = %self.request_id,
                    tenant = %l.tenant,
                    requested_model = %l.requested_model,
                    served_model = %l.served_model,
                    endpoint = %endpoint.id,
                    status = self.status.as_u16(),
                    duration_ms = e2e.as_millis() as u64,
                    prompt_tokens = summary.usage.map(|u| u.prompt_tokens),
                    completion_tokens = summary.usage.map(|u| u.completion_tokens),
                    cancelled = summary.cancelled,
                    upstream_error = summary.upstream_error.as_deref(),
                    rollout = self.rollout.as_ref().map(|t| &*t.rollout),
                    arm = self.rollout.as_ref().map(|t| t.arm.as_str()),
                    "request done"
                )
            };
        }
        if self.params.access_log {
            done!(tracing::Level::INFO);
        } else {
            done!(tracing::Level::DEBUG);
        }
    }
}
