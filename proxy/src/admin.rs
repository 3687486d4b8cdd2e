//! The admin listener, on loopback: health, metrics and the debug views an operator uses to see why
//! a request went where it went.
//!
//! `/live` answers while the process runs; `/ready` once a policy has been received (the last good
//! one is kept if the controller goes away) and discovery has reported every model's pool, so a
//! ready proxy can route; `/metrics` is the OpenMetrics exposition;
//! `/debug/endpoints`, `POST /debug/classify`, `POST /debug/explain` (a dry run of the whole
//! decision, see [`explain`]), `/debug/discovery` (whether the controller's streams are up) and
//! `/debug/decisions` explain signals, tags and decisions without showing prompt text.
//! `/debug/targets` lists the default target and every redirected inference target the sidecar
//! holds a stack for (policy, endpoints, connections, idle time), since with traffic capture one
//! sidecar routes for several Services; `POST /debug/classify` and `POST /debug/explain` take
//! `?target=ADDR` (a redirected Service's `clusterIP:port`, as `/debug/targets` names it) to
//! explain that Service's policy, and the default target otherwise. The other views are about the
//! default target (decision records name their target).

pub mod explain;

use crate::{
    inference::{ProxyBody, Shared, full},
    openai::{ApiError, Endpoint, InferenceRequest},
};
use http::{Method, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use std::{convert::Infallible, sync::Arc, sync::atomic::Ordering};
use tokio::net::TcpListener;

/// The largest body `/debug/classify` reads.
const CLASSIFY_LIMIT_BYTES: usize = 4 * 1024 * 1024;

fn json(status: StatusCode, v: &serde_json::Value) -> http::Response<ProxyBody> {
    let mut rsp = http::Response::new(full(v.to_string()));
    *rsp.status_mut() = status;
    rsp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    rsp
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> http::Response<ProxyBody> {
    let mut rsp = http::Response::new(full(body));
    *rsp.status_mut() = status;
    rsp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    rsp
}

/// The redirected targets, as the admin server sees them (the app holds them).
pub trait RedirectedTargets: Send + Sync {
    /// What `/debug/targets` shows of them.
    fn debug(&self) -> serde_json::Value;
    /// The stack of the redirected target named `dst` (`clusterIP:port`), once it has started.
    fn stack(&self, dst: &str) -> Option<Arc<Shared>>;
}

pub type TargetsView = Arc<dyn RedirectedTargets>;

/// The value of query parameter `key` (percent-decoded), if the request has one.
fn query_param(req: &http::Request<Incoming>, key: &str) -> Option<String> {
    form_urlencoded::parse(req.uri().query()?.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// The target a debug request is about: `?target=` names a redirected one (or the default one by
/// its name); without it, the default target.
fn chosen_target(
    shared: Arc<Shared>,
    targets: &TargetsView,
    req: &http::Request<Incoming>,
) -> Result<Arc<Shared>, ApiError> {
    match query_param(req, "target") {
        None => Ok(shared),
        Some(t) if t == shared.target => Ok(shared),
        Some(t) => targets
            .stack(&t)
            .ok_or_else(|| ApiError::unknown_target(&t)),
    }
}

/// One target's state as `/debug/targets` shows it.
pub fn target_state(target: &str, shared: &Shared) -> serde_json::Value {
    let policy = shared.policy();
    let endpoints: Vec<String> = shared
        .balance
        .subscribe()
        .borrow()
        .iter()
        .map(|e| e.addr.to_string())
        .collect();
    serde_json::json!({
        "target": target,
        "ready": readiness(shared).is_ok(),
        "connected": shared.controller_connected.load(Ordering::Relaxed),
        "policy": policy.as_ref().map(|s| explain::PolicySummary::of(&s.policy)),
        "endpoints": endpoints,
        "awaiting_endpoints": shared.balance.awaiting_endpoints(),
    })
}

/// Answers one admin request.
pub async fn handle(
    shared: Arc<Shared>,
    targets: TargetsView,
    req: http::Request<Incoming>,
) -> http::Response<ProxyBody> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let get = method == Method::GET;
    match path.as_str() {
        "/live" if get => text(StatusCode::OK, "live\n".into(), "text/plain"),
        "/ready" if get => match readiness(&shared) {
            Ok(()) => text(StatusCode::OK, "ready\n".into(), "text/plain"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
                "text/plain",
            ),
        },
        "/metrics" if get => text(
            StatusCode::OK,
            shared.metrics.encode(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        "/debug/endpoints" if get => json(StatusCode::OK, &shared.balance.debug()),
        "/debug/decisions" if get => {
            let id = query_param(&req, "request_id");
            let records = shared.decisions.snapshot(id.as_deref());
            json(
                StatusCode::OK,
                &serde_json::to_value(&records).unwrap_or(serde_json::Value::Null),
            )
        }
        "/debug/classify" | "/debug/explain" if method == Method::POST => {
            let shared = match chosen_target(shared, &targets, &req) {
                Ok(s) => s,
                Err(e) => return json(e.status, &e.to_json()),
            };
            if path == "/debug/classify" {
                classify(shared, req).await
            } else {
                explain(shared, req).await
            }
        }
        "/debug/discovery" if get => discovery(&shared),
        "/debug/targets" if get => json(
            StatusCode::OK,
            &serde_json::json!({
                "default": target_state(&shared.target, &shared),
                "redirected": targets.debug(),
            }),
        ),
        "/live" | "/ready" | "/metrics" | "/debug/endpoints" | "/debug/decisions"
        | "/debug/classify" | "/debug/explain" | "/debug/discovery" | "/debug/targets" => {
            let e = ApiError::method_not_allowed(&method, &path);
            json(e.status, &e.to_json())
        }
        _ => {
            let e = ApiError::not_found(&path);
            json(e.status, &e.to_json())
        }
    }
}

/// Ready to route: a policy, and discovery has reported the pool of each of its models.
fn readiness(shared: &Shared) -> Result<(), String> {
    if shared.policy().is_none() {
        return Err("no inference policy yet".into());
    }
    let awaiting = shared.balance.awaiting_endpoints();
    if awaiting.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "no endpoints reported yet for {}",
            awaiting.join(", ")
        ))
    }
}

/// Reads a chat (with `messages`) or completion body.
async fn read_request(req: http::Request<Incoming>) -> Result<InferenceRequest, ApiError> {
    let bytes = match Limited::new(req.into_body(), CLASSIFY_LIMIT_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return Err(ApiError::too_large(CLASSIFY_LIMIT_BYTES)),
    };
    let is_chat = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .is_some_and(|v| v.get("messages").is_some());
    let endpoint = if is_chat {
        Endpoint::Chat
    } else {
        Endpoint::Completion
    };
    InferenceRequest::parse(endpoint, bytes)
}

/// `POST /debug/classify` with a chat or completion body: the tags with their explanation, and the
/// candidate models the policy would allow.
async fn classify(shared: Arc<Shared>, req: http::Request<Incoming>) -> http::Response<ProxyBody> {
    let request = match read_request(req).await {
        Ok(r) => r,
        Err(e) => return json(e.status, &e.to_json()),
    };
    let Some(state) = shared.policy() else {
        let e = ApiError::unavailable("no inference policy yet");
        return json(e.status, &e.to_json());
    };
    let set = shared
        .classifiers
        .get(&state.policy.revision, &state.proto.classifiers);
    let explanation = set.explain(&request).await;
    let tags = explanation.to_tags();
    let candidates = state
        .policy
        .candidates(&request.model, &tags, &shared.workload);
    json(
        StatusCode::OK,
        &serde_json::json!({
            "target": shared.target,
            "model": request.model,
            "explanation": explanation,
            "candidates": candidates,
            "unavailable": set.unavailable,
        }),
    )
}

/// `POST /debug/explain[?models=a,b]` with a chat or completion body: tags, rules, candidates and
/// the routing decision over them (or over `models`), made now and neither dispatched nor recorded.
async fn explain(shared: Arc<Shared>, req: http::Request<Incoming>) -> http::Response<ProxyBody> {
    let models: Option<Vec<String>> = query_param(&req, "models").map(|v| {
        v.split(',')
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect()
    });
    let request = match read_request(req).await {
        Ok(r) => r,
        Err(e) => return json(e.status, &e.to_json()),
    };
    let Some(state) = shared.policy() else {
        let e = ApiError::unavailable("no inference policy yet");
        return json(e.status, &e.to_json());
    };
    let set = shared
        .classifiers
        .get(&state.policy.revision, &state.proto.classifiers);
    let explanation = set.explain(&request).await;
    let out = explain::explain(
        &state.policy,
        explanation,
        &request,
        &shared.workload,
        models,
        Some(&shared.balance),
    );
    if out.candidates.is_none() && out.routing.is_none() {
        let e = ApiError::unknown_model(&request.model);
        return json(e.status, &e.to_json());
    }
    let mut v = serde_json::to_value(&out).unwrap_or(serde_json::Value::Null);
    v["target"] = shared.target.clone().into();
    // Tags the policy declares that this proxy cannot compute (rules on them never match).
    v["unavailable_tags"] = serde_json::to_value(&set.unavailable).unwrap_or_default();
    json(StatusCode::OK, &v)
}

/// `GET /debug/discovery`: whether every stream to the controller is up, and the policy held.
fn discovery(shared: &Shared) -> http::Response<ProxyBody> {
    let policy = shared.policy();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "connected": shared.controller_connected.load(Ordering::Relaxed),
            "policy": policy.as_ref().map(|s| explain::PolicySummary::of(&s.policy)),
            "awaiting_endpoints": shared.balance.awaiting_endpoints(),
        }),
    )
}

/// Serves the admin listener until the task is dropped.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, targets: TargetsView) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (shared, targets) = (shared.clone(), targets.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let (shared, targets) = (shared.clone(), targets.clone());
                async move { Ok::<_, Infallible>(handle(shared, targets, req).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
