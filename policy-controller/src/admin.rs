//! The admin server: `/live`, `/ready`, `/metrics`, `/debug/guards` (the proxies' latest
//! quality-guard reports and each policy's merged condition, in every mode) and `/rollouts`
//! (each declared rollout's phase, verdict, arms and thresholds, as `status.rollout` says them:
//! the only place they show in manifest mode, where there is no status to write), and
//! `/rollouts/windows` (this replica's own window sums, which its peers add to theirs:
//! [`crate::peers`]).
//!
//! Kept apart from the gRPC port so probes and scrapes never compete with proxies'
//! streams, as in Linkerd's controllers.

use crate::metrics::Metrics;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kinference_policy_core::{
    guard::{GuardEntry, GuardReports},
    rollout::judge::Rollouts,
};
use kinference_policy_k8s_index::SharedIndex;
use std::{convert::Infallible, sync::Arc};
use tokio::net::TcpListener;

/// Serves until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    index: SharedIndex,
    guards: Arc<GuardReports>,
    rollouts: Arc<Rollouts>,
    replica: Arc<str>,
) {
    loop {
        let (io, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "admin accept failed");
                continue;
            }
        };
        let metrics = metrics.clone();
        let index = index.clone();
        let guards = guards.clone();
        let rollouts = rollouts.clone();
        let replica = replica.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let metrics = metrics.clone();
                let index = index.clone();
                let guards = guards.clone();
                let rollouts = rollouts.clone();
                let replica = replica.clone();
                async move {
                    Ok::<_, Infallible>(handle(
                        &req, &metrics, &index, &guards, &rollouts, &replica,
                    ))
                }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(error) = builder.serve_connection(TokioIo::new(io), svc).await {
                tracing::debug!(%error, "admin connection closed");
            }
        });
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &str) -> Response<Full<Bytes>> {
    let mut rsp = Response::new(Full::new(body.into()));
    *rsp.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        rsp.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    rsp
}

fn handle(
    req: &Request<Incoming>,
    metrics: &Metrics,
    index: &SharedIndex,
    guards: &GuardReports,
    rollouts: &Rollouts,
    replica: &str,
) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n",
            PLAIN,
        );
    }
    match req.uri().path() {
        "/live" => text(StatusCode::OK, "live\n", PLAIN),
        "/ready" if metrics.is_ready() => text(StatusCode::OK, "ready\n", PLAIN),
        "/ready" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n", PLAIN),
        "/metrics" => {
            // Sizes change when proxies start watching too, not only on reloads.
            let sizes = index.read().sizes();
            metrics.set_sizes(&sizes);
            metrics.rollout.set_outcomes(&rollouts.outcomes());
            match metrics.encode() {
                Ok(body) => text(
                    StatusCode::OK,
                    body,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "encoding failed\n",
                    PLAIN,
                ),
            }
        }
        "/debug/guards" => text(
            StatusCode::OK,
            guards_view(guards).to_string(),
            "application/json",
        ),
        "/rollouts" => text(
            StatusCode::OK,
            rollouts_view(rollouts).to_string(),
            "application/json",
        ),
        "/rollouts/windows" => text(
            StatusCode::OK,
            crate::peers::windows_view(replica, rollouts).to_string(),
            "application/json",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n", PLAIN),
    }
}

/// Per policy with a declared rollout: the policy and what its `status.rollout` would say.
pub fn rollouts_view(rollouts: &Rollouts) -> serde_json::Value {
    let policies: Vec<serde_json::Value> = rollouts
        .outcomes()
        .iter()
        .map(|((namespace, name), o)| {
            serde_json::json!({
                "namespace": namespace,
                "name": name,
                "rollout": kinference_policy_k8s_index::rollout::status_of(o),
            })
        })
        .collect();
    serde_json::json!({ "policies": policies })
}

/// Per policy: its merged `QualityGuard` condition and each proxy's latest report.
fn guards_view(guards: &GuardReports) -> serde_json::Value {
    let entry = |e: &GuardEntry| {
        serde_json::json!({
            "tenant": e.tenant, "rule": e.rule, "family": e.family, "state": e.state.as_str(),
            "samples": e.samples, "min_samples": e.min_samples, "gap": e.gap,
            "tolerance": e.tolerance,
        })
    };
    let policies: Vec<serde_json::Value> = guards
        .snapshot()
        .into_iter()
        .map(|((namespace, name), reports)| {
            let key = (namespace.clone(), name.clone());
            let condition = guards.condition(&key).map(|c| {
                serde_json::json!({"status": c.status, "reason": c.reason, "message": c.message})
            });
            serde_json::json!({
                "namespace": namespace,
                "name": name,
                "condition": condition,
                "merged": guards.merged(&key).iter().map(entry).collect::<Vec<_>>(),
                "reports": reports.iter().map(|(reporter, revision, entries)| serde_json::json!({
                    "reporter": reporter, "revision": revision,
                    "guards": entries.iter().map(entry).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({ "policies": policies })
}
