//! The HTTP server: the JSON API under `/api/`, the single-page dashboard at `/`, and viz's own
//! `/metrics`, `/live` and `/ready`.
//!
//! The dashboard is one HTML file embedded in the binary (no build step); it polls the API every
//! two seconds, so a page left open follows the traffic.
//!
//! [`Options`] holds what only the server needs beside [`State`] (the replay reports' directory),
//! so that [`serve`] keeps its signature for those who embed viz (`kinference-local`).

use crate::api::State;
use bytes::Bytes;
use http::{Method, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    convert::Infallible,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};
use tokio::net::TcpListener;

/// The dashboard page.
pub const DASHBOARD_HTML: &str = include_str!("server/dashboard.html");

/// The API paths, in the order `/metrics` lists them.
const PATHS: [&str; 9] = [
    "/api/stat",
    "/api/flows",
    "/api/endpoints",
    "/api/decisions",
    "/api/top",
    "/api/policies",
    "/api/rollouts",
    "/api/rollouts/series",
    "/",
];

/// What the server reads besides [`State`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The directory of `kinfctl replay` reports (`*.json`) the experiment page lists.
    pub replay_dir: Option<PathBuf>,
}

/// viz's own counters.
#[derive(Debug, Default)]
pub struct Counters {
    requests: [AtomicU64; PATHS.len()],
    errors: [AtomicU64; PATHS.len()],
}

impl Counters {
    fn encode(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP kinference_viz_requests_total API and dashboard requests answered\n");
        out.push_str("# TYPE kinference_viz_requests_total counter\n");
        for (i, p) in PATHS.iter().enumerate() {
            out.push_str(&format!(
                "kinference_viz_requests_total{{path=\"{p}\"}} {}\n",
                self.requests[i].load(Ordering::Relaxed)
            ));
        }
        out.push_str(
            "# HELP kinference_viz_source_errors_total Answers with a source (Prometheus, a proxy, the policies) unreadable\n",
        );
        out.push_str("# TYPE kinference_viz_source_errors_total counter\n");
        for (i, p) in PATHS.iter().enumerate() {
            out.push_str(&format!(
                "kinference_viz_source_errors_total{{path=\"{p}\"}} {}\n",
                self.errors[i].load(Ordering::Relaxed)
            ));
        }
        out
    }
}

type Body = Full<Bytes>;

fn respond(status: StatusCode, content_type: &'static str, body: String) -> http::Response<Body> {
    let mut rsp = http::Response::new(Full::new(Bytes::from(body)));
    *rsp.status_mut() = status;
    rsp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    rsp.headers_mut().insert(
        header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    rsp
}

fn json_rsp(status: StatusCode, v: &Value) -> http::Response<Body> {
    respond(status, "application/json", v.to_string())
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes one `application/x-www-form-urlencoded` component.
pub fn decode_component(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses a query string; the last value of a repeated key wins.
pub fn parse_query(q: Option<&str>) -> BTreeMap<String, String> {
    q.unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode_component(k), decode_component(v))
        })
        .collect()
}

/// Answers one request.
pub async fn handle(
    state: Arc<State>,
    options: Arc<Options>,
    counters: Arc<Counters>,
    req: http::Request<Incoming>,
) -> http::Response<Body> {
    let path = req.uri().path().to_string();
    let q = parse_query(req.uri().query());
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return json_rsp(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"error": format!("{} is not allowed on {path}", req.method())}),
        );
    }
    let result = match path.as_str() {
        "/" | "/index.html" => {
            return respond(
                StatusCode::OK,
                "text/html; charset=utf-8",
                DASHBOARD_HTML.into(),
            );
        }
        "/live" => return respond(StatusCode::OK, "text/plain", "live\n".into()),
        "/ready" => {
            return if state.prometheus.ready().await {
                respond(StatusCode::OK, "text/plain", "ready\n".into())
            } else {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!(
                        "not ready: Prometheus at {} is not ready\n",
                        state.prometheus.base_url()
                    ),
                )
            };
        }
        "/metrics" => {
            return respond(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                counters.encode(),
            );
        }
        "/api/stat" => state.stat(&q).await,
        "/api/flows" => state.flows(&q).await,
        "/api/endpoints" => state.endpoints(&q).await,
        "/api/decisions" => state.decisions(&q).await,
        "/api/top" => state.top(&q).await,
        "/api/policies" => Ok(state.policies().await),
        "/api/rollouts" => {
            crate::api::rollouts::rollouts(&state, options.replay_dir.as_deref(), &q).await
        }
        "/api/rollouts/series" => {
            crate::api::rollouts::series(&state, &q, crate::clock::unix_now()).await
        }
        _ => {
            return json_rsp(
                StatusCode::NOT_FOUND,
                &json!({"error": format!("no such page: {path}")}),
            );
        }
    };
    let i = PATHS.iter().position(|p| *p == path);
    if let Some(i) = i {
        counters.requests[i].fetch_add(1, Ordering::Relaxed);
    }
    match result {
        Ok(v) => {
            if v["errors"].as_array().is_some_and(|e| !e.is_empty())
                && let Some(i) = i
            {
                counters.errors[i].fetch_add(1, Ordering::Relaxed);
            }
            json_rsp(StatusCode::OK, &v)
        }
        Err(e) => json_rsp(StatusCode::BAD_REQUEST, &json!({"error": e.to_string()})),
    }
}

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, state: State) {
    serve_with(listener, state, Options::default()).await
}

/// Serves with `options` until the task is dropped.
pub async fn serve_with(listener: TcpListener, state: State, options: Options) {
    let state = Arc::new(state);
    let options = Arc::new(options);
    let counters = Arc::new(Counters::default());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        let options = options.clone();
        let counters = counters.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                let options = options.clone();
                let counters = counters.clone();
                async move { Ok::<_, Infallible>(handle(state, options, counters, req).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_decoded() {
        let q = parse_query(Some(
            "tenant=team-a%2Fchat&model=glm-5.3&by=tenant,model&x=a+b&bad=%zz&e",
        ));
        assert_eq!(q["tenant"], "team-a/chat");
        assert_eq!(q["model"], "glm-5.3");
        assert_eq!(q["by"], "tenant,model");
        assert_eq!(q["x"], "a b");
        assert_eq!(q["bad"], "%zz");
        assert_eq!(q["e"], "");
        assert_eq!(decode_component("%4"), "%4");
    }
}
