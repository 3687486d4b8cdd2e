//! The outbound listener: where the application's OpenAI requests arrive.
//!
//! One port speaks HTTP/1.1 and HTTP/2 cleartext (hyper-util's `auto` builder). Each request goes
//! through a small tower stack: the request id layer (taken from `x-request-id` or made, and put on
//! the response), then [`OpenAi`], which checks method and content type, reads the body once up to
//! the limit, parses it, and hands the typed request to the inference layer. Every request is
//! answered, with an OpenAI error object when it cannot be served.
//!
//! Which stack serves a connection depends on where the app was calling ([`serve_outbound`]): a
//! connection iptables redirected here keeps its original destination, and is served by that
//! destination's stack when the controller has an inference policy for it, or forwarded as plain
//! TCP when it has none; a connection to the listener itself (direct use) is served by the stack
//! of the configured default target. Each accepted connection is counted by how it was served
//! (`kinference_proxy_connections_total`), and each failed forward by why.

pub mod orig_dst;
pub mod targets;

use crate::{
    dispatch::{Attempt, DispatchService, UpstreamBody},
    inference::{self, ProxyBody, ProxyRequest, REQUEST_ID, Shared, error_response, full},
    openai::{ApiError, Endpoint, InferenceRequest},
};
use bytes::Bytes;
use http::{Method, header};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};
use tokio::net::{TcpListener, TcpStream};

use self::{
    orig_dst::{Destination, OrigDst},
    targets::{Resolve, Route, Targets},
};

/// The header that may name the tenant when the operator allows it.
pub const TENANT_HEADER: &str = "x-kinference-tenant";

/// The request id of a request, set by [`RequestIdLayer`].
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// Takes `x-request-id` from the request (if it is sane) or makes one; puts it on the response.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestIdLayer;

impl<S> tower::Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RequestIdService<S> {
    inner: S,
}

fn valid_request_id(v: &str) -> bool {
    !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic())
}

/// A fresh request id: 128 random bits in hex.
pub fn new_request_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl<S, B> tower::Service<http::Request<B>> for RequestIdService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ProxyBody>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let id = req
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| valid_request_id(v))
            .map_or_else(new_request_id, str::to_string);
        req.extensions_mut().insert(RequestId(id.clone()));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut rsp = fut.await?;
            if let Ok(v) = http::HeaderValue::from_str(&id) {
                rsp.headers_mut().insert(REQUEST_ID, v);
            }
            Ok(rsp)
        })
    }
}

/// The OpenAI front: method, content type, body limit, parse, then the inference layer.
#[derive(Clone, Debug)]
pub struct OpenAi<S> {
    shared: Arc<Shared>,
    inference: inference::Inference<S>,
    dispatch: S,
    body_limit_bytes: usize,
    allow_tenant_header: bool,
    tenant: String,
}

impl<S> OpenAi<S> {
    pub fn new(
        shared: Arc<Shared>,
        dispatch: S,
        body_limit_bytes: usize,
        allow_tenant_header: bool,
        tenant: String,
    ) -> Self
    where
        S: Clone,
    {
        let inference = tower::Layer::layer(
            &inference::InferenceLayer::new(shared.clone()),
            dispatch.clone(),
        );
        Self {
            shared,
            inference,
            dispatch,
            body_limit_bytes,
            allow_tenant_header,
            tenant,
        }
    }
}

impl<S, RB, B> tower::Service<http::Request<RB>> for OpenAi<S>
where
    // The projection names `B` for the impl; the rest of the bounds are `DispatchService`'s.
    S: DispatchService<B> + tower::Service<Attempt, Response = http::Response<B>> + Sync,
    B: UpstreamBody,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: std::error::Error + Send + Sync + 'static,
{
    type Response = http::Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<RB>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(req).await) })
    }
}

fn models_list(shared: &Shared) -> Result<http::Response<ProxyBody>, ApiError> {
    let Some(state) = shared.policy() else {
        return Err(ApiError::unavailable(
            "no inference policy has been received from the controller yet",
        ));
    };
    let p = &state.policy;
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
    let body = serde_json::json!({"object": "list", "data": data}).to_string();
    let mut rsp = http::Response::new(full(body));
    rsp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(rsp)
}

impl<S> OpenAi<S> {
    async fn handle<RB, B>(self, req: http::Request<RB>) -> http::Response<ProxyBody>
    where
        S: DispatchService<B>,
        B: UpstreamBody,
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: std::error::Error + Send + Sync + 'static,
    {
        let received_at = Instant::now();
        let request_id = req
            .extensions()
            .get::<RequestId>()
            .map_or_else(new_request_id, |r| r.0.clone());
        let tenant = if self.allow_tenant_header {
            req.headers()
                .get(TENANT_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .unwrap_or(&self.tenant)
                .to_string()
        } else {
            self.tenant.clone()
        };
        let labels = crate::metrics::RequestLabels {
            tenant: tenant.clone(),
            ..Default::default()
        };
        let refuse = |e: ApiError| {
            self.shared.metrics.requests.get_or_create(&labels).inc();
            self.shared.metrics.error(&labels, e.status.as_str());
            error_response(&e, &request_id)
        };
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        let endpoint = match path.as_str() {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completion),
            "/v1/models" => {
                if method != Method::GET {
                    return refuse(ApiError::method_not_allowed(&method, &path));
                }
                return models_list(&self.shared).unwrap_or_else(refuse);
            }
            p if p.starts_with("/v1/") => None,
            _ => return refuse(ApiError::not_found(&path)),
        };
        if endpoint.is_some() && method != Method::POST {
            return refuse(ApiError::method_not_allowed(&method, &path));
        }
        if let Some(id) = path.strip_prefix("/v1/models/") {
            return match self.shared.policy() {
                Some(state) if state.policy.resolve(id).is_some() => {
                    let body = serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "kinference"});
                    let mut rsp = http::Response::new(full(body.to_string()));
                    rsp.headers_mut().insert(
                        header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/json"),
                    );
                    rsp
                }
                Some(_) => refuse(ApiError::unknown_model(id)),
                None => refuse(ApiError::unavailable(
                    "no inference policy has been received from the controller yet",
                )),
            };
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
                return refuse(ApiError::unsupported_media_type(content_type));
            }
            let declared = req
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > self.body_limit_bytes as u64) {
                return refuse(ApiError::too_large(self.body_limit_bytes));
            }
        }
        let (head, body) = req.into_parts();
        let bytes = match Limited::new(body, self.body_limit_bytes).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return refuse(ApiError::too_large(self.body_limit_bytes));
            }
            Err(e) => return refuse(ApiError::bad_request(format!("cannot read the body: {e}"))),
        };
        match endpoint {
            Some(endpoint) => {
                let request = match InferenceRequest::parse(endpoint, bytes) {
                    Ok(r) => r,
                    Err(e) => return refuse(e),
                };
                let req = ProxyRequest {
                    head,
                    request,
                    request_id,
                    tenant,
                    received_at,
                };
                match tower::ServiceExt::oneshot(self.inference.clone(), req).await {
                    Ok(rsp) => rsp,
                    Err(never) => match never {},
                }
            }
            None => {
                let model = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_string));
                let Some(model) = model else {
                    return refuse(ApiError::bad_field(
                        "model",
                        format!(
                            "{path} is forwarded to a model's pool: the JSON body must name `model`"
                        ),
                    ));
                };
                inference::forward_other(
                    self.shared.clone(),
                    self.dispatch.clone(),
                    head,
                    bytes,
                    model,
                    request_id,
                    tenant,
                    received_at,
                )
                .await
            }
        }
    }
}

/// Serves the outbound listener, all connections by one stack, until the task is dropped.
pub async fn serve<S>(listener: TcpListener, service: S)
where
    S: tower::Service<
            http::Request<Incoming>,
            Response = http::Response<ProxyBody>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    loop {
        let (stream, peer) = accept(&listener).await;
        tokio::spawn(serve_http(stream, peer, service.clone()));
    }
}

/// The outbound listener's routing: the default target's stack for direct use, and per original
/// destination for redirected connections.
pub struct Outbound<S, R, O> {
    /// The stack of the configured default target.
    pub direct: S,
    pub targets: Targets<S, R>,
    pub orig_dst: O,
    /// How long to connect to a forwarded connection's destination.
    pub connect_timeout: std::time::Duration,
    /// Where connections are counted (the sidecar's metrics).
    pub metrics: crate::metrics::Metrics,
}

impl<S, R, O> std::fmt::Debug for Outbound<S, R, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

/// Serves the outbound listener with traffic capture until the task is dropped.
pub async fn serve_outbound<S, R, O>(listener: TcpListener, outbound: Arc<Outbound<S, R, O>>)
where
    S: tower::Service<
            http::Request<Incoming>,
            Response = http::Response<ProxyBody>,
            Error = Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    R: Resolve,
    O: OrigDst,
{
    loop {
        let (stream, peer) = accept(&listener).await;
        let local = match stream.local_addr() {
            Ok(a) => a,
            Err(error) => {
                tracing::debug!(%peer, %error, "connection gone before it was served");
                continue;
            }
        };
        let orig = outbound.orig_dst.orig_dst(&stream).unwrap_or_else(|error| {
            tracing::warn!(%peer, %error, "cannot read the original destination; serving as direct use");
            None
        });
        let outbound = outbound.clone();
        tokio::spawn(async move {
            let metrics = &outbound.metrics;
            match Destination::of(local, orig) {
                Destination::Direct => {
                    metrics.connection("direct");
                    serve_http(stream, peer, outbound.direct.clone()).await;
                }
                Destination::Redirected(dst) => match outbound.targets.route(dst).await {
                    Route::Inference(svc, lease) => {
                        metrics.connection("inference_target");
                        serve_http(stream, peer, svc).await;
                        // The target's stack may be evicted once no connection holds it.
                        drop(lease);
                    }
                    Route::Forward => {
                        metrics.connection("forwarded");
                        if let Err(reason) = forward(stream, dst, outbound.connect_timeout).await {
                            metrics.forward_error(reason);
                        }
                    }
                },
            }
        });
    }
}

async fn accept(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

/// Serves one connection's HTTP/1.1 or h2c requests with `service`.
async fn serve_http<S>(stream: TcpStream, peer: std::net::SocketAddr, service: S)
where
    S: tower::Service<
            http::Request<Incoming>,
            Response = http::Response<ProxyBody>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let svc = TowerToHyperService::new(service);
    if let Err(error) = auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), svc)
        .await
    {
        tracing::debug!(%peer, %error, "connection ended with an error");
    }
}

/// Copies bytes both ways between the app's connection and its original destination; on
/// failure, the reason as `forward_errors_total` labels it (`connect`, `connect_timeout`, `io`).
async fn forward(
    mut inbound: TcpStream,
    dst: std::net::SocketAddr,
    timeout: std::time::Duration,
) -> Result<(), &'static str> {
    let mut outbound = match tokio::time::timeout(timeout, TcpStream::connect(dst)).await {
        Ok(Ok(s)) => s,
        Ok(Err(error)) => {
            tracing::debug!(%dst, %error, "cannot connect to the original destination");
            return Err("connect");
        }
        Err(_) => {
            tracing::debug!(%dst, "connecting to the original destination timed out");
            return Err("connect_timeout");
        }
    };
    let _ = outbound.set_nodelay(true);
    if let Err(error) = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await {
        tracing::debug!(%dst, %error, "forwarded connection ended with an error");
        return Err("io");
    }
    Ok(())
}
