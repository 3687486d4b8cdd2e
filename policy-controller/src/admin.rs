//! The admin server: `/live`, `/ready` and `/metrics`.
//!
//! Kept apart from the gRPC port so probes and scrapes never compete with proxies'
//! streams, as in Linkerd's controllers.

use crate::metrics::Metrics;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kinference_policy_k8s_index::SharedIndex;
use std::convert::Infallible;
use tokio::net::TcpListener;

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Metrics, index: SharedIndex) {
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
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let metrics = metrics.clone();
                let index = index.clone();
                async move { Ok::<_, Infallible>(handle(&req, &metrics, &index)) }
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
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, &metrics.registry) {
                Ok(()) => text(
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
        _ => text(StatusCode::NOT_FOUND, "not found\n", PLAIN),
    }
}
