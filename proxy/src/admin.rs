//! The admin listener, on loopback: health, metrics and the debug views an operator uses to see why
//! a request went where it went.
//!
//! `/live` answers while the process runs; `/ready` once a policy has been received (the last good
//! one is kept if the controller goes away) and discovery has reported every model's pool, so a
//! ready proxy can route; `/metrics` is the OpenMetrics exposition;
//! `/debug/endpoints`, `POST /debug/classify`, `POST /debug/explain` (a dry run of the whole
//! decision, see `kinference_decision::explain`), `/debug/discovery` (whether the controller's streams are up) and
//! `/debug/decisions` explain signals, tags and decisions without showing prompt text.
//! `/debug/targets` lists the default target and every redirected inference target the sidecar
//! holds a stack for (policy, endpoints, connections, idle time), since with traffic capture one
//! sidecar routes for several Services; `POST /debug/classify` and `POST /debug/explain` take
//! `?target=ADDR` (a redirected Service's `clusterIP:port`, as `/debug/targets` names it) to
//! explain that Service's policy, and the default target otherwise. The other views are about the
//! default target (decision records name their target).

mod endpoints;

pub use self::endpoints::view as endpoints_view;

use crate::{
    body::{ProxyBody, full},
    decisions::Decisions,
    hasher::PromptHasher,
    metrics::Metrics,
    target::Target,
};
use http::{Method, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use kinference_decision::{Input, Workload, explain::PolicySummary};
use kinference_openai::{ApiError, Endpoint, InferenceRequest};
use kinference_routing::{ApproxConfig, PromptBlocks};
use std::{convert::Infallible, sync::Arc, sync::atomic::Ordering};

/// What the admin listener serves from: the default target, the sidecar's metrics and decision
/// records, the workload, and the redirected targets.
#[derive(Clone)]
pub struct Admin {
    pub target: Target,
    pub metrics: Metrics,
    pub decisions: Decisions,
    /// Answered requests' traffic records (`/debug/traffic`).
    pub traffic: crate::traffic::Traffic,
    pub workload: Workload,
    pub targets: TargetsView,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("target", &self.target.name)
            .finish_non_exhaustive()
    }
}
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
    fn stack(&self, dst: &str) -> Option<Target>;
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
fn chosen_target(admin: &Admin, req: &http::Request<Incoming>) -> Result<Target, ApiError> {
    match query_param(req, "target") {
        None => Ok(admin.target.clone()),
        Some(t) if *t == *admin.target.name => Ok(admin.target.clone()),
        Some(t) => admin
            .targets
            .stack(&t)
            .ok_or_else(|| ApiError::unknown_target(&t)),
    }
}

/// One target's state as `/debug/targets` shows it.
pub fn target_state(target: &Target) -> serde_json::Value {
    let policy = target.policy();
    let endpoints: Vec<String> = target
        .endpoints
        .list()
        .iter()
        .map(|e| e.addr.to_string())
        .collect();
    let refusals = target
        .refusals
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    // Who keeps a last good policy, if anyone: the proxy over a message it refused, or the
    // controller, which sent its last valid version.
    let last_good = match (&refusals.kept, &policy) {
        (Some(r), _) => serde_json::json!({
            "kept_by": "proxy",
            "reason": r.reason,
            "message": r.message,
        }),
        (None, Some(p))
            if p.proto.status.as_ref().is_some_and(|s| {
                s.kind == kinference_proxy_api::inference::status::Kind::LastGood as i32
            }) =>
        {
            serde_json::json!({
                "kept_by": "controller",
                "message": p.proto.status.as_ref().map(|s| s.message.as_str()),
            })
        }
        _ => serde_json::Value::Null,
    };
    serde_json::json!({
        "target": &*target.name,
        "ready": target.readiness().is_ok(),
        "connected": target.connected.load(Ordering::Relaxed),
        "policy": policy.as_ref().map(|s| PolicySummary::of(&s.policy)),
        "last_good": last_good,
        "policy_rejections": refusals.count(),
        "endpoints": endpoints,
        "awaiting_endpoints": target.endpoints.awaiting(),
        "admission_held": target.admission.held(),
    })
}

/// Answers one admin request.
pub async fn handle(admin: Arc<Admin>, req: http::Request<Incoming>) -> http::Response<ProxyBody> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let get = method == Method::GET;
    match path.as_str() {
        "/live" if get => text(StatusCode::OK, "live\n".into(), "text/plain"),
        "/ready" if get => match admin.target.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n".into(), "text/plain"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
                "text/plain",
            ),
        },
        "/metrics" if get => text(
            StatusCode::OK,
            admin.metrics.encode(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        "/debug/endpoints" if get => json(StatusCode::OK, &endpoints::view(&admin.target)),
        "/debug/decisions" if get => {
            let id = query_param(&req, "request_id");
            let records = admin.decisions.snapshot(id.as_deref());
            json(
                StatusCode::OK,
                &serde_json::to_value(&records).unwrap_or(serde_json::Value::Null),
            )
        }
        "/debug/traffic" if get => {
            let since = match query_param(&req, "since_ms").map(|v| v.parse::<u64>()) {
                None => 0,
                Some(Ok(ms)) => ms,
                Some(Err(_)) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        "since_ms must be Unix milliseconds\n".into(),
                        "text/plain",
                    );
                }
            };
            text(
                StatusCode::OK,
                crate::traffic::Traffic::jsonl(&admin.traffic.since(since)),
                "application/jsonl",
            )
        }
        "/debug/classify" | "/debug/explain" if method == Method::POST => {
            let target = match chosen_target(&admin, &req) {
                Ok(t) => t,
                Err(e) => return json(e.status, &e.to_json()),
            };
            if path == "/debug/classify" {
                classify(&target, &admin.workload, req).await
            } else {
                explain(&target, &admin.workload, req).await
            }
        }
        "/debug/discovery" if get => discovery(&admin.target),
        "/debug/guards" if get => {
            let guards = admin
                .target
                .policy()
                .map(|p| crate::guard::statuses(&admin.target.guard_book, &p.policy))
                .unwrap_or_default();
            json(
                StatusCode::OK,
                &serde_json::json!({ "target": &*admin.target.name, "guards": guards }),
            )
        }
        "/debug/targets" if get => json(
            StatusCode::OK,
            &serde_json::json!({
                "default": target_state(&admin.target),
                "redirected": admin.targets.debug(),
            }),
        ),
        "/live" | "/ready" | "/metrics" | "/debug/endpoints" | "/debug/decisions"
        | "/debug/traffic" | "/debug/classify" | "/debug/explain" | "/debug/discovery"
        | "/debug/targets" | "/debug/guards" => {
            let e = ApiError::method_not_allowed(&method, &path);
            json(e.status, &e.to_json())
        }
        _ => {
            let e = ApiError::not_found(&path);
            json(e.status, &e.to_json())
        }
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
async fn classify(
    target: &Target,
    workload: &Workload,
    req: http::Request<Incoming>,
) -> http::Response<ProxyBody> {
    let request = match read_request(req).await {
        Ok(r) => r,
        Err(e) => return json(e.status, &e.to_json()),
    };
    let Some(active) = target.policy() else {
        let e = ApiError::unavailable("no inference policy yet");
        return json(e.status, &e.to_json());
    };
    let explanation = request.explain(&active.classifiers.set).await;
    let tags = explanation.to_tags();
    let candidates = active.policy.candidates(&request.model, &tags, workload);
    json(
        StatusCode::OK,
        &serde_json::json!({
            "target": &*target.name,
            "model": request.model,
            "explanation": explanation,
            "candidates": candidates,
            "unavailable": active.classifiers.unavailable,
        }),
    )
}

/// `POST /debug/explain[?models=a,b]` with a chat or completion body: tags, rules, candidates and
/// the routing decision over them (or over `models`), made now and neither dispatched nor recorded.
async fn explain(
    target: &Target,
    workload: &Workload,
    req: http::Request<Incoming>,
) -> http::Response<ProxyBody> {
    let models: Option<Vec<String>> = query_param(&req, "models").map(|v| {
        v.split(',')
            .filter(|m| !m.is_empty())
            .map(str::to_string)
            .collect()
    });
    let headers = req.headers().clone();
    let request = match read_request(req).await {
        Ok(r) => r,
        Err(e) => return json(e.status, &e.to_json()),
    };
    let Some(active) = target.policy() else {
        let e = ApiError::unavailable("no inference policy yet");
        return json(e.status, &e.to_json());
    };
    // Under a rollout, the arm the request would be in (its tenant: the tenant header, else the
    // workload), and that arm's policy.
    let rollout = active.policy.rollout.as_ref().map(|r| {
        let tenant = headers
            .get(crate::front::TENANT_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map_or_else(
                || format!("{}/{}", workload.namespace, workload.name),
                str::to_string,
            );
        let arm = crate::rollout::arm_of(&r.split, &tenant, workload, &headers, rand::random);
        crate::rollout::RolloutRecord {
            name: r.name().to_string(),
            arm: arm.as_str(),
        }
    });
    let policy = match (&rollout, &active.cohort) {
        (Some(r), Some(cohort)) if r.arm == "cohort" => cohort,
        _ => &active.policy,
    };
    let explanation = request.explain(&active.classifiers.set).await;
    let tags = explanation.to_tags();
    let blocks = PromptBlocks::from_text(&request.prefix_text(), &ApproxConfig::default());
    // A dry run may be over any of the policy's models: the prompt is hashed for each pool.
    let all: Vec<String> = policy.models.iter().map(|m| m.name.clone()).collect();
    let hasher = PromptHasher::new(&target.endpoints.tokenizers(), &all, &request.prompt);
    let input = Input {
        requested: &request.model,
        tags: &tags,
        workload,
        prompt_tokens: request.estimated_prompt_tokens(),
        max_tokens: request.max_tokens,
        prompt_blocks: &blocks,
        block_hasher: hasher.as_ref().map(|h| h as _),
        // A dry run shows every endpoint in the order it would be tried.
        max_attempts: usize::MAX,
    };
    let out = target.router.explain(policy, explanation, &input, models);
    if out.candidates.is_none() && out.routing.is_none() {
        let e = ApiError::unknown_model(&request.model);
        return json(e.status, &e.to_json());
    }
    let mut v = serde_json::to_value(&out).unwrap_or(serde_json::Value::Null);
    v["target"] = target.name.to_string().into();
    if let Some(r) = &rollout {
        v["rollout"] = serde_json::to_value(r).unwrap_or_default();
    }
    v["guards"] = guards_for(target, policy, &tags, &v);
    // Tags the policy declares that this proxy cannot compute (rules on them never match).
    v["unavailable_tags"] =
        serde_json::to_value(&active.classifiers.unavailable).unwrap_or_default();
    json(StatusCode::OK, &v)
}

/// The guard state of each matched guarded rule, for the prompt's family: what a request like this
/// one would meet (measuring, trusted or suspended), per tenant measured so far.
fn guards_for(
    target: &Target,
    policy: &kinference_decision::Policy,
    tags: &kinference_classify::Tags,
    explained: &serde_json::Value,
) -> serde_json::Value {
    let matched: Vec<&str> = explained["candidates"]["rule_trace"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter(|r| r["matched"] == true)
                .filter_map(|r| r["rule"].as_str())
                .collect()
        })
        .unwrap_or_default();
    let statuses = crate::guard::statuses(&target.guard_book, policy);
    let mut out = vec![];
    for rule in policy
        .rules
        .iter()
        .filter(|r| matched.contains(&r.name.as_str()))
    {
        let Some(g) = &rule.guard else { continue };
        let family = kinference_decision::guard::family(tags, g);
        let measured: Vec<_> = statuses
            .iter()
            .filter(|s| s.key.rule == rule.name && s.key.family == family)
            .collect();
        if measured.is_empty() {
            out.push(serde_json::json!({
                "rule": rule.name, "family": family, "tenant": null, "state": "measuring",
                "samples": 0, "min_samples": g.min_samples, "gap": null, "tolerance": g.tolerance,
                "capped_share": g.capped_share,
            }));
        }
        for s in measured {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            v["capped_share"] = g.capped_share.into();
            out.push(v);
        }
    }
    serde_json::Value::Array(out)
}

/// `GET /debug/discovery`: whether every stream to the controller is up, and the policy held.
fn discovery(target: &Target) -> http::Response<ProxyBody> {
    let policy = target.policy();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "connected": target.connected.load(Ordering::Relaxed),
            "policy": policy.as_ref().map(|s| PolicySummary::of(&s.policy)),
            "awaiting_endpoints": target.endpoints.awaiting(),
        }),
    )
}

/// The paths the read-only metrics listener serves (GET only): nothing that shows a decision, an
/// endpoint or a policy, and nothing that computes on a request body.
pub const READ_ONLY_PATHS: [&str; 3] = ["/metrics", "/ready", "/live"];

/// Serves the admin listener until the task is dropped.
pub async fn serve(listener: TcpListener, admin: Admin) {
    serve_with(listener, Arc::new(admin), false).await;
}

/// Serves the read-only metrics listener ([`READ_ONLY_PATHS`]) until the task is dropped: what
/// may be exposed on the pod's IP while the admin listener stays on loopback.
pub async fn serve_read_only(listener: TcpListener, admin: Admin) {
    serve_with(listener, Arc::new(admin), true).await;
}

async fn serve_with(listener: TcpListener, admin: Arc<Admin>, read_only: bool) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let admin = admin.clone();
                async move {
                    let allowed =
                        req.method() == Method::GET && READ_ONLY_PATHS.contains(&req.uri().path());
                    if read_only && !allowed {
                        return Ok::<_, Infallible>(text(
                            StatusCode::NOT_FOUND,
                            "not found: this listener serves only GET /metrics, /ready and /live\n"
                                .into(),
                            "text/plain",
                        ));
                    }
                    Ok(handle(admin, req).await)
                }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
