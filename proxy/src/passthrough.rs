//! The passthrough layer: another `/v1/*` request naming a model, sent to that model's pool.
//!
//! Embeddings, tokenization and the like are not completions: nothing is classified, predicted or
//! recorded. The model (or alias) resolves through the policy, and the request goes by plain
//! peak-EWMA power of two over the model's endpoints ([`kinference_decision::passthrough`]), then
//! on through the same observe, retry and forward layers as a decided request.

use crate::{
    body::{ProxyBody, refuse},
    front::OtherRequest,
    metrics::{RequestLabels, RequestMetrics, UNKNOWN_MODEL},
    route::{Attempts, Routed},
    router::RouterHandle,
    target::PolicyWatch,
};
use kinference_decision::DEFAULT_SERVICE_CLASS;
use kinference_openai::ApiError;
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

/// The passthrough layer's handles.
#[derive(Clone, Debug)]
pub struct PassthroughParams {
    pub policy: PolicyWatch,
    pub router: RouterHandle,
    /// Where refusals are counted.
    pub requests: RequestMetrics,
}

#[derive(Clone, Debug)]
pub struct PassthroughLayer {
    params: Arc<PassthroughParams>,
}

impl PassthroughLayer {
    pub fn new(params: PassthroughParams) -> Self {
        Self {
            params: Arc::new(params),
        }
    }
}

impl<S> tower::Layer<S> for PassthroughLayer {
    type Service = Passthrough<S>;
    fn layer(&self, inner: S) -> Passthrough<S> {
        Passthrough {
            params: self.params.clone(),
            inner,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Passthrough<S> {
    params: Arc<PassthroughParams>,
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S> tower::Service<OtherRequest> for Passthrough<S>
where
    S: tower::Service<Routed, Response = http::Response<ProxyBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<ProxyBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: OtherRequest) -> Self::Future {
        let params = self.params.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            match plan(&params, req) {
                Ok(routed) => tower::ServiceExt::oneshot(inner, routed).await,
                Err(refused) => Ok(*refused),
            }
        })
    }
}

fn plan(
    params: &PassthroughParams,
    req: OtherRequest,
) -> Result<Routed, Box<http::Response<ProxyBody>>> {
    let mut labels = RequestLabels {
        tenant: req.tenant,
        requested_model: UNKNOWN_MODEL.into(),
        service_class: DEFAULT_SERVICE_CLASS.into(),
        ..RequestLabels::default()
    };
    let refused = |labels: &RequestLabels, e: ApiError| {
        Box::new(refuse(&params.requests, labels, &e, &req.request_id))
    };
    let Some(active) = params.policy.borrow().clone() else {
        return Err(refused(
            &labels,
            ApiError::unavailable("no inference policy has been received from the controller yet"),
        ));
    };
    let plain = match params.router.passthrough(&active.policy, &req.model) {
        Ok(p) => p,
        Err(_) => return Err(refused(&labels, ApiError::unknown_model(&req.model))),
    };
    labels.requested_model = plain.model.name.clone();
    labels.served_model = plain.model.name.clone();
    labels.pool = plain.model.pool.clone();
    let order = plain.order;
    Ok(Routed {
        head: req.head,
        body: req.body,
        model: req.model,
        stream: false,
        max_tokens: None,
        request_id: req.request_id,
        received_at: req.received_at,
        labels,
        policy: active.policy.clone(),
        sample: None,
        budget: None,
        rollout: None,
        traffic: None,
        attempts: Attempts::Plain(order),
    })
}
