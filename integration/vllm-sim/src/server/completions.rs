//! `/v1/chat/completions` and `/v1/completions`: from a request body to the engine and back, whole
//! or streamed.
//!
//! Both endpoints share one path: parse into a `Job`, apply any injected fault, submit to the
//! engine, then either collect every token into one JSON answer or write one SSE chunk per token
//! as the engine produces it. The request's `RequestGuard` lives in the streaming task (or the
//! handler's future), so a client that goes away aborts its engine request at once.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use kinference_sim::{EngineEvent, SubmitError};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Body, Cut, LoadGuard, State, error_response, json_response, read_body};
use crate::{
    driver::RequestGuard,
    error::ApiError,
    fault::{self, FaultPlan},
    openai::{self, Endpoint, Job, Piece, ResponseId, Usage},
    text,
};

pub(super) async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
    endpoint: Endpoint,
) -> Result<Response<Body>, Cut> {
    let load = state.count_load();
    match prepare(&state, req, endpoint).await {
        Ok(Prepared {
            job,
            plan,
            guard,
            events,
        }) => {
            if job.stream {
                Ok(stream(job, plan, guard, load, events))
            } else {
                let response = collect(job, plan, guard, events).await;
                drop(load);
                response
            }
        }
        Err(e) => {
            tracing::info!(status = e.status.as_u16(), ?endpoint, "refused");
            Ok(error_response(&e))
        }
    }
}

/// An accepted request, in the engine.
struct Prepared {
    job: Job,
    plan: FaultPlan,
    guard: RequestGuard,
    events: mpsc::UnboundedReceiver<EngineEvent>,
}

async fn prepare(
    state: &State,
    req: Request<Incoming>,
    endpoint: Endpoint,
) -> Result<Prepared, ApiError> {
    let forced = match req.headers().get(fault::FAULT_HEADER) {
        Some(v) => {
            let v = v
                .to_str()
                .map_err(|_| ApiError::bad_request("x-sim-fault is not ASCII"))?;
            Some(fault::parse_header(v).map_err(ApiError::bad_request)?)
        }
        None => None,
    };
    let body = read_body(req).await?;
    let job = match endpoint {
        Endpoint::Chat => openai::parse_chat(&state.config, &body)?,
        Endpoint::Completions => openai::parse_completion(&state.config, &body)?,
    };
    let plan = forced.unwrap_or_else(|| {
        let faults = state.faults.lock();
        faults.draw(&mut *state.rng.lock())
    });
    if let Some(status) = plan.status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return Err(ApiError::new(
            status,
            format!("simulated fault: status {}", status.as_u16()),
        ));
    }
    let clock = *state.driver.clock();
    if plan.stall {
        let max_s = state.faults.lock().stall_max_s;
        tokio::time::sleep(clock.wall(max_s)).await;
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("simulated fault: stalled for {max_s} s"),
        ));
    }
    if plan.latency_spike_s > 0.0 {
        tokio::time::sleep(clock.wall(plan.latency_spike_s)).await;
    }
    let (guard, events) = state
        .driver
        .submit(job.prompt.clone(), job.max_tokens, job.lora.clone())
        .map_err(|e| submit_error(state, &e))?;
    tracing::info!(
        request = guard.id(),
        ?endpoint,
        prompt_tokens = job.prompt.len(),
        max_tokens = job.max_tokens,
        stream = job.stream,
        lora = job.lora.as_deref().unwrap_or(""),
        "accepted"
    );
    Ok(Prepared {
        job,
        plan,
        guard,
        events,
    })
}

/// The engine's refusals. A request longer than the context window gets 413 (vLLM itself answers
/// 400 here; we follow Kinference's issue and keep vLLM's message text).
fn submit_error(state: &State, e: &SubmitError) -> ApiError {
    match e {
        SubmitError::TooLong {
            max_model_len,
            prompt,
            max_tokens,
            ..
        } => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            openai::too_long_message(*max_model_len, *prompt, *max_tokens),
        )
        .with_param("max_tokens"),
        SubmitError::EmptyPrompt => {
            ApiError::bad_request("the prompt is empty").with_param("prompt")
        }
        SubmitError::Duplicate(_) => {
            tracing::error!(model = %state.config.model, "duplicate request id");
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    }
}

fn engine_gone() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the engine stopped before the request finished",
    )
}

/// One generated token's text.
fn piece(guard: &RequestGuard, index: u32) -> &'static str {
    text::output_piece(guard.id(), index)
}

/// The index of a token event, if the event is one.
fn token_index(event: &EngineEvent) -> Option<u32> {
    match event {
        EngineEvent::FirstToken { .. } => Some(0),
        EngineEvent::Token { index, .. } => Some(*index),
        _ => None,
    }
}

async fn collect(
    job: Job,
    plan: FaultPlan,
    mut guard: RequestGuard,
    mut events: mpsc::UnboundedReceiver<EngineEvent>,
) -> Result<Response<Body>, Cut> {
    let rid = ResponseId::new(job.endpoint, guard.id(), &job.model);
    let mut text = job.answer_prefix.clone();
    let mut tokens = 0u32;
    loop {
        let Some(event) = events.recv().await else {
            return Ok(error_response(&engine_gone()));
        };
        if let Some(index) = token_index(&event) {
            text.push_str(piece(&guard, index));
            tokens += 1;
            if plan.disconnect_after_tokens.is_some_and(|n| tokens >= n) {
                tracing::info!(
                    request = guard.id(),
                    tokens,
                    "cutting the connection (fault)"
                );
                return Err(Cut("disconnect after tokens"));
            }
        }
        if let EngineEvent::Finished {
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            ..
        } = event
        {
            guard.finish();
            let usage = Usage {
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                prompt_tokens_details: job.prompt_tokens_details,
            };
            tracing::info!(
                request = guard.id(),
                prompt_tokens,
                cached_tokens,
                completion_tokens,
                "done"
            );
            return Ok(json_response(
                StatusCode::OK,
                &openai::full_response(job.endpoint, &rid, &text, usage),
            ));
        }
    }
}

type Chunk = Result<Frame<Bytes>, Cut>;

fn stream(
    job: Job,
    plan: FaultPlan,
    guard: RequestGuard,
    load: Option<LoadGuard>,
    events: mpsc::UnboundedReceiver<EngineEvent>,
) -> Response<Body> {
    // A small buffer: each chunk is handed to hyper as soon as it exists, and a client that stops
    // reading applies back-pressure instead of growing a queue.
    let (tx, rx) = mpsc::channel::<Chunk>(4);
    tokio::spawn(async move {
        write_stream(job, plan, guard, events, tx).await;
        // The stream is written (or cut): the request leaves `GET /load`.
        drop(load);
    });
    let body = StreamBody::new(ReceiverStream::new(rx)).boxed();
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    resp
}

async fn write_stream(
    job: Job,
    plan: FaultPlan,
    mut guard: RequestGuard,
    mut events: mpsc::UnboundedReceiver<EngineEvent>,
    tx: mpsc::Sender<Chunk>,
) {
    let rid = ResponseId::new(job.endpoint, guard.id(), &job.model);
    let send = |bytes: Bytes| {
        let tx = tx.clone();
        async move { tx.send(Ok(Frame::data(bytes))).await.is_ok() }
    };
    if job.endpoint == Endpoint::Chat {
        let first = openai::chunk(
            job.endpoint,
            &rid,
            Piece {
                text: "",
                role: true,
                last: false,
            },
        );
        if !send(openai::sse(&first)).await {
            return;
        }
    }
    let mut tokens = 0u32;
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            // The client went away (hyper dropped the body): dropping the guard aborts.
            _ = tx.closed() => {
                tracing::info!(request = guard.id(), tokens, "client went away");
                return;
            }
        };
        let Some(event) = event else {
            let e = engine_gone();
            let _ = send(openai::sse(&e.body())).await;
            return;
        };
        if let Some(index) = token_index(&event) {
            tokens += 1;
            let prefixed;
            let text = if tokens == 1 && !job.answer_prefix.is_empty() {
                prefixed = format!("{}{}", job.answer_prefix, piece(&guard, index));
                prefixed.as_str()
            } else {
                piece(&guard, index)
            };
            let last = tokens >= job.max_tokens;
            let chunk = openai::chunk(
                job.endpoint,
                &rid,
                Piece {
                    text,
                    role: false,
                    last,
                },
            );
            if !send(openai::sse(&chunk)).await {
                return;
            }
            if plan.disconnect_after_tokens.is_some_and(|n| tokens >= n) {
                tracing::info!(request = guard.id(), tokens, "cutting the stream (fault)");
                cut(&tx).await;
                return;
            }
        }
        if let EngineEvent::Finished {
            prompt_tokens,
            cached_tokens,
            completion_tokens,
            ..
        } = event
        {
            guard.finish();
            tracing::info!(
                request = guard.id(),
                prompt_tokens,
                cached_tokens,
                completion_tokens,
                "done"
            );
            if job.include_usage {
                let usage = Usage {
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                    prompt_tokens_details: job.prompt_tokens_details,
                };
                let chunk = openai::usage_chunk(job.endpoint, &rid, usage);
                if !send(openai::sse(&chunk)).await {
                    return;
                }
            }
            let _ = send(Bytes::from_static(openai::SSE_DONE)).await;
            return;
        }
    }
}

/// Cuts the stream after the chunks already sent reach the client. hyper drops buffered data when
/// a body fails, so wait until it has taken every chunk from the channel and give it a moment to
/// flush them before failing the body.
async fn cut(tx: &mpsc::Sender<Chunk>) {
    while tx.capacity() < tx.max_capacity() {
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(CUT_POLL).await;
    }
    tokio::time::sleep(CUT_FLUSH).await;
    let _ = tx.send(Err(Cut("disconnect after tokens"))).await;
}

const CUT_POLL: std::time::Duration = std::time::Duration::from_millis(1);
const CUT_FLUSH: std::time::Duration = std::time::Duration::from_millis(50);
