//! An OpenAI-shaped upstream that answers at once, to measure what a proxy in front of it adds.
//!
//! The simulator's own latency (its engine step, its scheduler) would be noise larger than the
//! proxy's overhead, so the benchmark's upstream does no work: a chat or completion request gets
//! `max_tokens` tokens (at most [`MAX_TOKENS`]) back immediately, as one JSON body or as an SSE
//! stream of `chat.completion.chunk` events ending in `data: [DONE]`. It also serves the vLLM
//! metrics the proxy scrapes (its in-flight requests as `vllm:num_requests_running`, an empty
//! queue and cache), so the proxy's signals stay fresh and it routes as it would in production.

use bytes::Bytes;
use futures::stream;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};
use tokio::net::TcpListener;

/// The most tokens one response carries.
pub const MAX_TOKENS: u64 = 256;
/// The largest request body read.
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

type Body = BoxBody<Bytes, Infallible>;

/// Counters shared by every listener of one upstream.
#[derive(Debug, Default)]
pub struct Upstream {
    in_flight: AtomicU64,
    requests_total: AtomicU64,
    prompt_tokens_total: AtomicU64,
}

impl Upstream {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Completion requests answered so far.
    pub fn requests_total(&self) -> u64 {
        self.requests_total.load(Ordering::Relaxed)
    }

    /// Serves `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let this = Arc::clone(&self);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let this = Arc::clone(&this);
                    async move { Ok::<_, Infallible>(this.handle(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        match (req.method(), req.uri().path()) {
            (&Method::POST, "/v1/chat/completions") => self.completion(req, true).await,
            (&Method::POST, "/v1/completions") => self.completion(req, false).await,
            (&Method::GET, "/metrics") => text(StatusCode::OK, self.metrics()),
            (&Method::GET, "/health") => text(StatusCode::OK, String::new()),
            (&Method::GET, "/v1/models") => json_response(
                StatusCode::OK,
                &json!({"object": "list", "data": [{"id": "upstream", "object": "model"}]}),
            ),
            _ => error(StatusCode::NOT_FOUND, "no such route"),
        }
    }

    fn metrics(&self) -> String {
        let running = self.in_flight.load(Ordering::Relaxed);
        let prompt = self.prompt_tokens_total.load(Ordering::Relaxed);
        format!(
            "# TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{model_name=\"upstream\"}} {running}\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{model_name=\"upstream\"}} 0\n\
             # TYPE vllm:kv_cache_usage_perc gauge\n\
             vllm:kv_cache_usage_perc{{model_name=\"upstream\"}} 0\n\
             # TYPE vllm:prefix_cache_queries_total counter\n\
             vllm:prefix_cache_queries_total{{model_name=\"upstream\"}} {prompt}\n\
             # TYPE vllm:prefix_cache_hits_total counter\n\
             vllm:prefix_cache_hits_total{{model_name=\"upstream\"}} 0\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"16\",enable_prefix_caching=\"True\",num_gpu_blocks=\"10000\"}} 1\n"
        )
    }

    async fn completion(&self, req: Request<Incoming>, chat: bool) -> Response<Body> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let resp = self.answer(req, chat).await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        resp
    }

    async fn answer(&self, req: Request<Incoming>, chat: bool) -> Response<Body> {
        let bytes = match Limited::new(req.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(_) => return error(StatusCode::PAYLOAD_TOO_LARGE, "body too large or cut"),
        };
        let Ok(body) = serde_json::from_slice::<Value>(&bytes) else {
            return error(StatusCode::BAD_REQUEST, "the body is not JSON");
        };
        let Some(model) = body.get("model").and_then(Value::as_str) else {
            return error(StatusCode::BAD_REQUEST, "model is required");
        };
        let max_tokens = body
            .get("max_tokens")
            .or_else(|| body.get("max_completion_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(16)
            .clamp(1, MAX_TOKENS);
        let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
        let usage_in_stream = body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        // About four bytes a token: the upstream does no tokenisation.
        let prompt_tokens = (bytes.len() as u64 / 4).max(1);
        let n = self.requests_total.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens_total
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        let id = format!("cmpl-{n}");
        let usage = json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        });
        if !stream {
            let text = "tok ".repeat(max_tokens as usize);
            let choice = if chat {
                json!({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"})
            } else {
                json!({"index": 0, "text": text, "finish_reason": "length"})
            };
            let object = if chat {
                "chat.completion"
            } else {
                "text_completion"
            };
            return json_response(
                StatusCode::OK,
                &json!({"id": id, "object": object, "created": 0, "model": model,
                        "choices": [choice], "usage": usage}),
            );
        }
        let object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let chunk = |choice: Value| json!({"id": id, "object": object, "created": 0, "model": model, "choices": [choice]});
        let mut events: Vec<Value> = Vec::new();
        for i in 0..max_tokens {
            let finish = (i + 1 == max_tokens).then_some("length");
            events.push(chunk(if chat {
                json!({"index": 0, "delta": {"content": "tok "}, "finish_reason": finish})
            } else {
                json!({"index": 0, "text": "tok ", "finish_reason": finish})
            }));
        }
        if usage_in_stream {
            let mut last = chunk(json!(null));
            last["choices"] = json!([]);
            last["usage"] = usage;
            events.push(last);
        }
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = events
            .iter()
            .map(|e| Ok(Frame::data(Bytes::from(format!("data: {e}\n\n")))))
            .chain(std::iter::once(Ok(Frame::data(Bytes::from_static(
                b"data: [DONE]\n\n",
            )))))
            .collect();
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(StreamBody::new(stream::iter(frames)).boxed())
            .unwrap_or_else(|_| Response::new(empty()))
    }
}

fn empty() -> Body {
    Full::new(Bytes::new()).boxed()
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; version=0.0.4")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap_or_else(|_| Response::new(empty()))
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap_or_else(|_| Response::new(empty()))
}

/// An error in the OpenAI format.
fn error(status: StatusCode, message: &str) -> Response<Body> {
    json_response(
        status,
        &json!({"error": {"message": message, "type": "invalid_request_error",
                          "code": status.as_u16()}}),
    )
}

/// Binds every address in `addrs` and serves them all from one [`Upstream`]; returns the bound
/// addresses and the upstream once every listener accepts.
pub async fn bind(
    addrs: &[SocketAddr],
) -> std::io::Result<(Arc<Upstream>, Vec<SocketAddr>, Vec<TcpListener>)> {
    let upstream = Upstream::new();
    let mut listeners = Vec::new();
    let mut bound = Vec::new();
    for a in addrs {
        let l = TcpListener::bind(a).await?;
        bound.push(l.local_addr()?);
        listeners.push(l);
    }
    Ok((upstream, bound, listeners))
}
