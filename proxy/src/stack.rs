//! One target's request path, in one place: the order of its layers.
//!
//! ```text
//!  connection (HTTP/1.1 or h2c, `server`)
//!    └ RequestId        x-request-id kept or made, returned on the response
//!      └ OpenAi         method, content type, body limit, parse; /v1/models from policy
//!        ├ Route        classify + decide (kinference_decision), record      completions
//!        └ Passthrough  resolve the model, plain power of two                other /v1/* paths
//!          └ Observe    the answer streamed back: first token, ITL, usage, cost, router feedback
//!            └ Retry    attempts in the plan's order; 5xx/429/connect errors go to the next
//!              └ Forward  pooled HTTP/1.1 or h2 connections to the endpoint
//! ```
//!
//! Each layer takes typed parameters: the handles of the target it needs and nothing else.
//! [`build`] is called once per target (the default one, and each redirected destination with an
//! inference policy), so each target has its own stack over its own router.

use crate::{
    config::Config,
    decisions::Decisions,
    forward::Forward,
    front::{FrontParams, OpenAi},
    metrics::Metrics,
    observe::{ObserveLayer, ObserveParams},
    passthrough::{PassthroughLayer, PassthroughParams},
    retry::{RetryLayer, RetryParams},
    route::{RouteLayer, RouteParams},
    server::{RequestIdLayer, RequestIdService},
    target::Target,
};
use kinference_decision::Workload;
use tower::{Layer, ServiceBuilder};

type Upstream<F> = crate::observe::Observe<crate::retry::Retry<F>>;

/// A target's stack over the forward service `F`.
pub type StackOf<F> = RequestIdService<
    OpenAi<crate::route::Route<Upstream<F>>, crate::passthrough::Passthrough<Upstream<F>>>,
>;

/// The service that serves one target's OpenAI traffic.
pub type Stack = StackOf<Forward>;

/// What a stack is built from beside its target: the sidecar's settings, and the metrics and
/// decision records every target shares.
#[derive(Clone, Debug)]
pub struct Shared {
    pub metrics: Metrics,
    pub decisions: Decisions,
    /// Answered requests' traffic records, shared by every target.
    pub traffic: crate::traffic::Traffic,
    pub workload: Workload,
    pub settings: Settings,
}

/// The sidecar's settings the layers take.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Attempts per request, the first included.
    pub max_attempts: usize,
    pub body_limit_bytes: usize,
    pub allow_tenant_header: bool,
    /// The configured workload (`namespace/name`), every request's tenant.
    pub tenant: String,
    /// Log each request at INFO.
    pub access_log: bool,
    /// The retry budget: a share of requests, and a floor per second.
    pub retry_ratio: f32,
    pub retry_min_per_second: u32,
}

impl Settings {
    pub fn of(config: &Config) -> Self {
        Self {
            max_attempts: 1 + config.retry_budget as usize,
            body_limit_bytes: config.body_limit_bytes,
            allow_tenant_header: config.allow_tenant_header,
            tenant: config.workload.clone(),
            access_log: config.access_log,
            retry_ratio: config.retry_ratio,
            retry_min_per_second: config.retry_min_per_second,
        }
    }
}

/// Builds `target`'s stack over pooled connections.
pub fn build(config: &Config, target: &Target, shared: &Shared) -> Stack {
    let forward = Forward::new(
        config.upstream_protocol,
        config.connect_timeout(),
        config.response_timeout(),
    );
    layered(target, shared, forward)
}

/// Builds `target`'s stack over `forward` (a fake in unit tests).
pub fn layered<F: Clone>(target: &Target, shared: &Shared, forward: F) -> StackOf<F> {
    let settings = &shared.settings;
    let guard = crate::guard::Guard::new(
        target.guard_book.clone(),
        shared.metrics.guard.clone(),
        target.router.clone(),
        target.endpoints.clone(),
    )
    .reporting_to(target.guard_reports.clone());
    let upstream: Upstream<F> = ServiceBuilder::new()
        .layer(ObserveLayer::new(ObserveParams {
            router: target.router.clone(),
            metrics: shared.metrics.http.clone(),
            access_log: settings.access_log,
            guard: guard.clone(),
        }))
        .layer(RetryLayer::new(RetryParams {
            max_attempts: settings.max_attempts,
            router: target.router.clone(),
            endpoints: target.endpoints.clone(),
            decisions: shared.decisions.clone(),
            metrics: shared.metrics.retry.clone(),
            budget: std::sync::Arc::new(crate::retry::budget(
                settings.retry_ratio,
                settings.retry_min_per_second,
            )),
        }))
        .service(forward);
    let completions = RouteLayer::new(RouteParams {
        policy: target.policy.clone(),
        router: target.router.clone(),
        endpoints: target.endpoints.clone(),
        decisions: shared.decisions.clone(),
        metrics: shared.metrics.route.clone(),
        requests: shared.metrics.http.clone(),
        workload: shared.workload.clone(),
        target: target.name.clone(),
        max_attempts: settings.max_attempts,
        guard,
        admission: target.admission.clone(),
        admission_metrics: shared.metrics.admission.clone(),
        budgets: target.budgets.clone(),
        rollout_ledger: target.rollout_ledger.clone(),
        rollout_metrics: shared.metrics.rollout.clone(),
        traffic: shared.traffic.clone(),
    })
    .layer(upstream.clone());
    let others = PassthroughLayer::new(PassthroughParams {
        policy: target.policy.clone(),
        router: target.router.clone(),
        requests: shared.metrics.http.clone(),
    })
    .layer(upstream);
    let front = OpenAi::new(
        FrontParams {
            policy: target.policy.clone(),
            metrics: shared.metrics.http.clone(),
            body_limit_bytes: settings.body_limit_bytes,
            allow_tenant_header: settings.allow_tenant_header,
            tenant: settings.tenant.clone(),
        },
        completions,
        others,
    );
    ServiceBuilder::new().layer(RequestIdLayer).service(front)
}

#[cfg(test)]
mod tests;
