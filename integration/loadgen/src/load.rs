//! The open-loop load generator: requests at a constant arrival rate, latency from the intended
//! send time.
//!
//! A closed-loop client (send, wait, send) slows down when the server does and so hides the very
//! stalls a benchmark should see (coordinated omission). Here a pacer thread releases request `i`
//! at `start + i / rate` whatever happened to earlier ones, and each request's latency runs from
//! that intended time, so a stall shows as the queue of late requests it really causes. The
//! pacer sleeps on the OS timer (a tokio timer has millisecond granularity, the size of the
//! interval at 1,000 requests/s); how late it woke is recorded as the schedule lag, which is part
//! of every latency and the same for every target, so it cancels in a difference between targets.

use crate::{
    pool::{Pool, PoolError, ReqBody},
    report::{Percentiles, Summary},
};
use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use http_body_util::{BodyExt as _, Full};
use std::{
    collections::BTreeMap,
    net::{SocketAddr, ToSocketAddrs as _},
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::mpsc;

/// What a response is read for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The whole response; latency to its last byte.
    NonStream,
    /// A Server-Sent Events stream; latency to the first `data:` chunk and to the last byte,
    /// which must carry `data: [DONE]`.
    Stream,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NonStream => "non-stream",
            Self::Stream => "stream",
        }
    }
}

/// Why a load run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("unsupported URL {0:?}: only http://HOST:PORT/PATH is supported")]
    Url(String),
    #[error("cannot resolve {0}")]
    Resolve(String),
    #[error("the rate must be positive and finite, not {0}")]
    Rate(f64),
    #[error("the pacer thread failed: {0}")]
    Pacer(String),
}

/// One load run.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// A label for the report (`direct`, `nginx`, `kinference-proxy`).
    pub target: String,
    /// `http://HOST:PORT/PATH`.
    pub url: String,
    pub mode: Mode,
    /// The POST body of every request.
    pub body: Bytes,
    pub rate_per_s: f64,
    /// Requests in this first span are sent but not counted.
    pub warmup: Duration,
    /// The measured span after the warm-up.
    pub duration: Duration,
    pub max_connections: usize,
    /// A request not finished this long after its intended send time counts as `timeout`.
    pub timeout: Duration,
}

/// An OpenAI chat completion body asking for `max_tokens` tokens.
pub fn chat_body(model: &str, content: &str, max_tokens: u32, stream: bool) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": stream,
        })
        .to_string(),
    )
}

/// The address and request template of an `http://` URL.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    authority: HeaderValue,
    path: http::Uri,
}

pub(crate) fn parse_url(url: &str) -> Result<Target, LoadError> {
    let uri: http::Uri = url.parse().map_err(|_| LoadError::Url(url.into()))?;
    if uri.scheme_str() != Some("http") {
        return Err(LoadError::Url(url.into()));
    }
    let authority = uri.authority().ok_or_else(|| LoadError::Url(url.into()))?;
    let port = authority.port_u16().unwrap_or(80);
    let addr = (authority.host(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| LoadError::Resolve(authority.to_string()))?;
    let path = uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .map_err(|_| LoadError::Url(url.into()))?;
    Ok(Target {
        addr,
        authority: HeaderValue::from_str(authority.as_str())
            .map_err(|_| LoadError::Url(url.into()))?,
        path,
    })
}

/// What happened to one request.
#[derive(Debug)]
struct Outcome {
    /// Counted (sent after the warm-up).
    measured: bool,
    lag_us: u64,
    first_chunk_us: Option<u64>,
    total_us: u64,
    result: Result<(), String>,
}

/// Runs `spec` on the current tokio runtime and summarises it.
pub async fn run(spec: &LoadSpec) -> Result<Summary, LoadError> {
    if !(spec.rate_per_s.is_finite() && spec.rate_per_s > 0.0) {
        return Err(LoadError::Rate(spec.rate_per_s));
    }
    let target = Arc::new(parse_url(&spec.url)?);
    let pool = Arc::new(Pool::new(target.addr, spec.max_connections));
    let interval = Duration::from_secs_f64(1.0 / spec.rate_per_s);
    let warmup_n = (spec.warmup.as_secs_f64() * spec.rate_per_s).round() as u64;
    let measured_n = (spec.duration.as_secs_f64() * spec.rate_per_s).round() as u64;
    let total_n = warmup_n + measured_n;

    let (tx, mut rx) = mpsc::unbounded_channel::<Outcome>();
    let handle = tokio::runtime::Handle::current();
    let start = crate::clock::now() + Duration::from_millis(20);
    let (mode, body, timeout) = (spec.mode, spec.body.clone(), spec.timeout);
    let pacer_pool = Arc::clone(&pool);
    let pacer = std::thread::Builder::new()
        .name("loadgen-pacer".into())
        .spawn(move || {
            for i in 0..total_n {
                let intended = start + interval.mul_f64(i as f64);
                let now = crate::clock::now();
                if intended > now {
                    std::thread::sleep(intended - now);
                }
                let (tx, pool, target, body) = (
                    tx.clone(),
                    Arc::clone(&pacer_pool),
                    Arc::clone(&target),
                    body.clone(),
                );
                handle.spawn(async move {
                    let mut outcome = one(&pool, &target, body, mode, intended, timeout).await;
                    outcome.measured = i >= warmup_n;
                    let _ = tx.send(outcome);
                });
            }
        })
        .map_err(|e| LoadError::Pacer(e.to_string()))?;

    let mut latency_us = Vec::with_capacity(measured_n as usize);
    let mut first_us = Vec::new();
    let mut lag_us = Vec::with_capacity(measured_n as usize);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let (mut sent, mut ok) = (0u64, 0u64);
    // Every task holds a sender; the channel ends when the pacer and all requests are done.
    while let Some(o) = rx.recv().await {
        if !o.measured {
            continue;
        }
        sent += 1;
        lag_us.push(o.lag_us);
        match o.result {
            Ok(()) => {
                ok += 1;
                latency_us.push(o.total_us);
                if let Some(f) = o.first_chunk_us {
                    first_us.push(f);
                }
            }
            Err(kind) => *errors.entry(kind).or_default() += 1,
        }
    }
    pacer
        .join()
        .map_err(|_| LoadError::Pacer("panicked".into()))?;

    Ok(Summary {
        target: spec.target.clone(),
        mode: spec.mode.as_str().into(),
        url: spec.url.clone(),
        rate_per_s: spec.rate_per_s,
        warmup_s: spec.warmup.as_secs_f64(),
        duration_s: spec.duration.as_secs_f64(),
        sent,
        ok,
        errors,
        achieved_rate_per_s: ok as f64 / spec.duration.as_secs_f64().max(1e-9),
        latency: Percentiles::from_us(&latency_us),
        first_chunk: (spec.mode == Mode::Stream).then(|| Percentiles::from_us(&first_us)),
        schedule_lag: Percentiles::from_us(&lag_us),
        connections_opened: pool.connections_opened(),
    })
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Sends one request and reads its response to the end.
async fn one(
    pool: &Pool,
    target: &Target,
    body: Bytes,
    mode: Mode,
    intended: Instant,
    timeout: Duration,
) -> Outcome {
    let lag_us = micros(crate::clock::now().saturating_duration_since(intended));
    let mut first_chunk: Option<Instant> = None;
    let exchange = exchange(pool, target, body, mode, &mut first_chunk, None);
    let result = match tokio::time::timeout_at((intended + timeout).into(), exchange).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err("timeout".to_string()),
    };
    let done = crate::clock::now();
    Outcome {
        measured: false,
        lag_us,
        first_chunk_us: first_chunk.map(|t| micros(t.saturating_duration_since(intended))),
        total_us: micros(done.saturating_duration_since(intended)),
        result,
    }
}

/// Sends one request on a pooled connection and reads its response to the end, noting when the
/// first SSE `data:` chunk arrived and, when `first_token` is given, the first event that carries
/// generated text ([`carries_text`]); the answer's `x-kinference-endpoint` (which replica the
/// proxy chose), or the kind of failure.
pub(crate) async fn exchange(
    pool: &Pool,
    target: &Target,
    body: Bytes,
    mode: Mode,
    first_chunk: &mut Option<Instant>,
    mut first_token: Option<&mut Option<Instant>>,
) -> Result<Option<String>, String> {
    let mut conn = pool.get().await.map_err(|e| match e {
        PoolError::Connect { .. } => "connect".to_string(),
        PoolError::Handshake { .. } => "handshake".to_string(),
        PoolError::Closed => "pool_closed".to_string(),
    })?;
    let req: Request<ReqBody> = Request::builder()
        .method(Method::POST)
        .uri(target.path.clone())
        .header(header::HOST, target.authority.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(
            header::ACCEPT,
            match mode {
                Mode::Stream => "text/event-stream",
                Mode::NonStream => "application/json",
            },
        )
        .body(Full::new(body))
        .map_err(|_| "request".to_string())?;
    let resp = conn
        .sender
        .send_request(req)
        .await
        .map_err(|_| "send".to_string())?;
    let status = resp.status();
    let endpoint = resp
        .headers()
        .get("x-kinference-endpoint")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = resp.into_body();
    // The last bytes seen, so a `data: [DONE]` split across two frames is still found.
    let mut tail: Vec<u8> = Vec::new();
    // The events not yet complete, while the first token is looked for.
    let mut pending: Vec<u8> = Vec::new();
    let (mut bytes, mut done_seen) = (0usize, false);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| "body".to_string())?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        bytes += data.len();
        if mode == Mode::Stream {
            tail.extend_from_slice(data);
            if first_chunk.is_none() && contains(&tail, b"data:") {
                *first_chunk = Some(crate::clock::now());
            }
            if let Some(token) = first_token.as_deref_mut()
                && token.is_none()
            {
                pending.extend_from_slice(data);
                while let Some(end) = find(&pending, b"\n\n") {
                    let event: Vec<u8> = pending.drain(..end + 2).collect();
                    if carries_text(&event) {
                        *token = Some(crate::clock::now());
                        pending.clear();
                        break;
                    }
                }
            }
            if contains(&tail, b"data: [DONE]") {
                done_seen = true;
            }
            let keep = tail.len().saturating_sub(16);
            tail.drain(..keep);
        }
    }
    pool.put(conn);
    if !status.is_success() {
        return Err(format!("status_{}", status.as_u16()));
    }
    match mode {
        Mode::NonStream if bytes == 0 => Err("empty_body".into()),
        Mode::Stream if !done_seen => Err("incomplete_stream".into()),
        _ => Ok(endpoint),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Whether one SSE event is a chunk with generated text: a chat delta's non-empty `content` or a
/// completion's non-empty `text`. A server may open a stream with a role-only chunk before its
/// first token (the simulator does, at once; vLLM sends it with the first token), so the first
/// `data:` is not the first token.
pub fn carries_text(event: &[u8]) -> bool {
    let Some(json) = std::str::from_utf8(event)
        .ok()
        .and_then(|e| e.trim().strip_prefix("data:"))
    else {
        return false;
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json.trim()) else {
        return false;
    };
    let non_empty = |v: &serde_json::Value| v.as_str().is_some_and(|s| !s.is_empty());
    v["choices"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| non_empty(&c["delta"]["content"]) || non_empty(&c["text"]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = parse_url("http://127.0.0.1:8080/v1/chat/completions").unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.path, "/v1/chat/completions");
        assert_eq!(t.authority, "127.0.0.1:8080");
        assert!(matches!(
            parse_url("https://127.0.0.1/"),
            Err(LoadError::Url(_))
        ));
        assert!(matches!(parse_url("not a url"), Err(LoadError::Url(_))));
    }

    #[test]
    fn a_role_chunk_is_not_a_token() {
        assert!(!carries_text(
            br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(carries_text(
            b"data: {\"choices\":[{\"delta\":{\"content\":\" hi\"}}]}\n\n"
        ));
        assert!(carries_text(br#"data: {"choices":[{"text":"a"}]}"#));
        assert!(!carries_text(b"data: [DONE]"));
        assert!(!carries_text(b": keep-alive"));
    }

    #[test]
    fn chat_bodies() {
        let b: serde_json::Value = serde_json::from_slice(&chat_body("m", "hi", 1, true)).unwrap();
        assert_eq!(b["model"], "m");
        assert_eq!(b["max_tokens"], 1);
        assert_eq!(b["stream"], true);
        assert_eq!(b["messages"][0]["content"], "hi");
    }
}
