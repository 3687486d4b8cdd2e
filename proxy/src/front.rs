//! The OpenAI front: method, content type, body limit and parse, before anything is decided.
//!
//! It reads each request's body once, up to the limit, and answers what needs no endpoint: the
//! model list from policy (`GET /v1/models`, `GET /v1/models/{id}`), and refusals as OpenAI error
//! objects (405, 413, 415, 400, 404). A completion (`POST /v1/chat/completions`,
//! `POST /v1/completions`) goes on parsed, as a [`ProxyRequest`], to the route layer; any other
//! `/v1/*` request with a JSON body naming `model` goes to the passthrough layer. The tenant is
//! the configured workload, or the tenant header when the operator allows it.

use crate::{
    body::{ProxyBody, full, refuse},
    metrics::{RequestLabels, RequestMetrics},
    server::RequestId,
    target::PolicyWatch,
};
use bytes::Bytes;
use http::{Method, header};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use kinference_openai::{ApiError, Endpoint, InferenceRequest};
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::time::Instant;
use tower::ServiceExt;

/// The header that may name the tenant when the operator allows it.
pub const TENANT_HEADER: &str = "x-kinference-tenant";

/// The OpenAI paths forwarded to a model's pool without a decision (`POST`, a JSON body naming
/// `model`), beside the two completion paths: an allow-list, so that an engine's administration
/// (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`) or any path the policy does not serve is
/// never reachable through the sidecar.
pub const PASSTHROUGH_PATHS: &[&str] = &["/v1/embeddings", "/v1/rerank", "/v1/score"];

/// A parsed completion request on its way to the route layer.
#[derive(Debug)]
pub struct ProxyRequest {
    pub head: http::request::Parts,
    pub request: InferenceRequest,
    pub request_id: String,
    pub tenant: String,
    pub received_at: Instant,
}

/// Another `/v1/*` request naming a model, on its way to the passthrough layer.
#[derive(Debug)]
pub struct OtherRequest {
    pub head: http::request::Parts,
    pub body: Bytes,
    /// The model the body names.
    pub model: String,
    pub request_id: String,
    pub tenant: String,
    pub received_at: Instant,
}

/// The front's settings and handles.
#[derive(Clone, Debug)]
pub struct FrontParams {
    pub policy: PolicyWatch,
    /// Where refusals are counted.
    pub metrics: RequestMetrics,
    pub body_limit_bytes: usize,
    pub allow_tenant_header: bool,
    /// The configured workload, every request's tenant unless the header is allowed.
    pub tenant: String,
}

/// The OpenAI front over the completions stack `C` and the passthrough stack `P`.
#[derive(Clone, Debug)]
pub struct OpenAi<C, P> {
    params: Arc<FrontParams>,
    completions: C,
    others: P,
}

impl<C, P> OpenAi<C, P> {
    pub fn new(params: FrontParams, completions: C, others: P) -> Self {
        Self {
            params: Arc::new(params),
            completions,
            others,
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<C, P, RB> tower::Service<http::Request<RB>> for OpenAi<C, P>
where
    C: tower::Service<ProxyRequest, Response = http::Response<ProxyBody>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    C::Future: Send + 'static,
    P: tower::Service<OtherRequest, Response = http::Response<ProxyBody>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    P::Future: Send + 'static,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: std::error::Error + Send + Sync + 'static,
{
    type Response = http::Response<ProxyBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<RB>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}

fn json(body: serde_json::Value) -> http::Response<ProxyBody> {
    let mut rsp = http::Response::new(full(body.to_string()));
    rsp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    rsp
}

fn no_policy() -> ApiError {
    ApiError::unavailable("no inference policy has been received from the controller yet")
}

/// `GET /v1/models`: the policy's models, then its aliases with their `root`.
fn models_list(policy: &PolicyWatch) -> Result<http::Response<ProxyBody>, ApiError> {
    let Some(active) = policy.borrow().clone() else {
        return Err(no_policy());
    };
    let p = &active.policy;
    let mut data: Vec<serde_json::Value> = p
        .models
        .iter()
        .map(|m| {
            serde_json::json!({"id": m.name, "object": "model", "created": 0, "owned_by": "kinference"})
        })
        .collect();
    let mut aliases: Vec<(&String, &String)> = p.aliases.iter().collect();
    aliases.sort();
    for (name, _) in aliases {
        if let Some(m) = p.resolve(name) {
            data.push(serde_json::json!({"id": name, "object": "model", "created": 0, "owned_by": "kinference", "root": m.name}));
        }
    }
    Ok(json(serde_json::json!({"object": "list", "data": data})))
}

/// `GET /v1/models/{id}`.
fn model(policy: &PolicyWatch, id: &str) -> Result<http::Response<ProxyBody>, ApiError> {
    let Some(active) = policy.borrow().clone() else {
        return Err(no_policy());
    };
    if active.policy.resolve(id).is_none() {
        return Err(ApiError::unknown_model(id));
    }
    Ok(json(
        serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "kinference"}),
    ))
}

impl<C, P> OpenAi<C, P> {
    async fn handle<RB>(self, req: http::Request<RB>) -> http::Response<ProxyBody>
    where
        C: tower::Service<ProxyRequest, Response = http::Response<ProxyBody>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        C::Future: Send + 'static,
        P: tower::Service<OtherRequest, Response = http::Response<ProxyBody>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        P::Future: Send + 'static,
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: std::error::Error + Send + Sync + 'static,
    {
        let received_at = Instant::now();
        let params = &self.params;
        let request_id = req
            .extensions()
            .get::<RequestId>()
            .map_or_else(crate::server::new_request_id, |r| r.0.clone());
        let tenant = if params.allow_tenant_header {
            req.headers()
                .get(TENANT_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .unwrap_or(&params.tenant)
                .to_string()
        } else {
            params.tenant.clone()
        };
        // Before the body is read the request names no model.
        let labels = RequestLabels {
            tenant: tenant.clone(),
            ..Default::default()
        };
        let refused = |e: ApiError| refuse(&params.metrics, &labels, &e, &request_id);
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        let endpoint = match path.as_str() {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completion),
            "/v1/models" => {
                if method != Method::GET {
                    return refused(ApiError::method_not_allowed(&method, &path));
                }
                return models_list(&params.policy).unwrap_or_else(refused);
            }
            // Other OpenAI inference paths go to the named model's pool; everything else (engine
            // administration such as loading LoRA adapters, anything unknown) is refused.
            p if PASSTHROUGH_PATHS.contains(&p) => None,
            _ => return refused(ApiError::not_found(&path)),
        };
        if endpoint.is_some() && method != Method::POST {
            return refused(ApiError::method_not_allowed(&method, &path));
        }
        if let Some(id) = path.strip_prefix("/v1/models/") {
            return model(&params.policy, id).unwrap_or_else(refused);
        }
        let has_body = method == Method::POST || method == Method::PUT || method == Method::PATCH;
        if has_body {
            let content_type = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok());
            let json = content_type.is_some_and(|ct| {
                ct.split(';')
                    .next()
                    .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
            });
            if !json && endpoint.is_some() {
                return refused(ApiError::unsupported_media_type(content_type));
            }
            let declared = req
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > params.body_limit_bytes as u64) {
                return refused(ApiError::too_large(params.body_limit_bytes));
            }
        }
        let (head, body) = req.into_parts();
        let bytes = match Limited::new(body, params.body_limit_bytes).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return refused(ApiError::too_large(params.body_limit_bytes));
            }
            Err(e) => return refused(ApiError::bad_request(format!("cannot read the body: {e}"))),
        };
        match endpoint {
            Some(endpoint) => {
                // A large body is parsed on the blocking pool (see the route layer).
                let parsed = if bytes.len() > crate::route::LARGE_PROMPT_BYTES {
                    crate::route::off_workers(move || InferenceRequest::parse(endpoint, bytes))
                        .await
                } else {
                    InferenceRequest::parse(endpoint, bytes)
                };
                let request = match parsed {
                    Ok(r) => r,
                    Err(e) => return refused(e),
                };
                let req = ProxyRequest {
                    head,
                    request,
                    request_id,
                    tenant,
                    received_at,
                };
                match self.completions.oneshot(req).await {
                    Ok(rsp) => rsp,
                    Err(never) => match never {},
                }
            }
            None => {
                let model = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_string));
                let Some(model) = model else {
                    return refused(ApiError::bad_field(
                        "model",
                        format!(
                            "{path} is forwarded to a model's pool: the JSON body must name `model`"
                        ),
                    ));
                };
                let req = OtherRequest {
                    head,
                    body: bytes,
                    model,
                    request_id,
                    tenant,
                    received_at,
                };
                match self.others.oneshot(req).await {
                    Ok(rsp) => rsp,
                    Err(never) => match never {},
                }
            }
        }
    }
}
