//! The HTTP server of one replica: the listener, the routes, and the replica's lifecycle.
//!
//! A [`Replica`] is what tests and the `vllm-sim` binary hold: it owns the listener task (HTTP/1.1
//! and HTTP/2 cleartext on one port, via hyper-util's `auto` builder), the engine driver task and
//! the KV-event publisher, and shuts them down gracefully. The routes are vLLM's
//! (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/tokenize`, `/health`, `/metrics`,
//! `/load`, and the dev endpoints `/reset_prefix_cache`, `/pause`, `/resume`, `/is_paused`) plus
//! the simulator's own `/sim/faults` and `/sim/state`.

mod completions;

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
};
use kinference_sim::{Engine, EngineStats};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

use crate::{
    config::{ConfigError, ReplicaConfig},
    driver::{Clock, Driver},
    error::ApiError,
    fault::{self, FaultConfig, MetricsFault},
    kv_events::{self, KvEventsError},
    metrics, openai,
};

/// The largest request body accepted.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// How long shutdown waits for open connections to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A response body: whole, or streamed token by token. An error cuts the connection.
pub type Body = BoxBody<Bytes, Cut>;

/// The connection was cut on purpose (the mid-stream disconnect fault).
#[derive(Debug, thiserror::Error)]
#[error("connection cut by the simulator: {0}")]
pub struct Cut(pub &'static str);

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    KvEvents(#[from] KvEventsError),
}

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) config: ReplicaConfig,
    pub(crate) driver: Arc<Driver>,
    pub(crate) faults: Mutex<FaultConfig>,
    pub(crate) rng: Mutex<StdRng>,
    pub(crate) created_unix_s: f64,
    /// What `GET /load` reports (see [`LoadGuard`]).
    pub(crate) server_load: Arc<AtomicU32>,
    /// The signal reads this replica has served, `GET /metrics` then `GET /load`: how a benchmark
    /// sees the load a mesh's sidecars (or the signal service) put on an engine. Exported as
    /// `signal_reads` in `GET /sim/state`, so that `/metrics` stays exactly vLLM's exposition.
    pub(crate) signal_reads: [AtomicU64; 2],
}

impl State {
    /// Counts one request in `GET /load` until the guard is dropped, as vLLM's
    /// `--enable-server-load-tracking` does from a handler's entry until its response is sent.
    pub(crate) fn count_load(&self) -> Option<LoadGuard> {
        self.config.server_load_tracking.then(|| {
            self.server_load.fetch_add(1, Ordering::SeqCst);
            LoadGuard(self.server_load.clone())
        })
    }
}

/// One request counted in `GET /load`.
#[derive(Debug)]
pub(crate) struct LoadGuard(Arc<AtomicU32>);

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running replica.
#[derive(Debug)]
pub struct Replica {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<()>,
    driver: JoinHandle<()>,
    kv_events: Option<JoinHandle<()>>,
}

/// Starts a replica listening on `addr` (port 0 picks a free port; see [`Replica::local_addr`]).
pub async fn serve(config: ReplicaConfig, addr: SocketAddr) -> Result<Replica, ServeError> {
    config.validate()?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Listen { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| ServeError::Listen { addr, source })?;

    let (kv_tx, kv_task) = match &config.kv_events {
        Some(kv) => {
            let (tx, task) = kv_events::start(kv, config.kv_events_bind_host).await?;
            (Some(tx), Some(task))
        }
        None => (None, None),
    };
    let engine = Engine::new(config.engine.clone(), config.cost.clone());
    let driver = Driver::new(engine, Clock::new(config.time_scale), kv_tx);
    let driver_task = tokio::spawn(driver.clone().run());
    let state = Arc::new(State {
        faults: Mutex::new(config.faults.clone()),
        rng: Mutex::new(fault::rng(config.seed)),
        created_unix_s: crate::driver::unix_now_s(),
        server_load: Arc::new(AtomicU32::new(0)),
        signal_reads: Default::default(),
        driver,
        config,
    });
    let (shutdown, shutdown_rx) = watch::channel(false);
    let server = tokio::spawn(accept_loop(listener, state.clone(), shutdown_rx));
    tracing::info!(%addr, model = %state.config.model, "replica listening");
    Ok(Replica {
        addr,
        state,
        shutdown,
        server,
        driver: driver_task,
        kv_events: kv_task,
    })
}

impl Replica {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn config(&self) -> &ReplicaConfig {
        &self.state.config
    }

    /// The engine's counters now.
    pub fn stats(&self) -> EngineStats {
        self.state.driver.stats()
    }

    /// Leading tokens of `prompt` in the prefix cache now.
    pub fn cached_prefix_tokens(&self, prompt: &[u32], lora: Option<&str>) -> u32 {
        self.state.driver.cached_prefix_tokens(prompt, lora)
    }

    /// Stops accepting, lets open connections finish (for a few seconds), then stops the engine.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.server.await;
        self.driver.abort();
        if let Some(task) = self.kv_events {
            task.abort();
        }
        tracing::info!(addr = %self.addr, "replica stopped");
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>, mut stop: watch::Receiver<bool>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let service = hyper::service::service_fn(move |req| handle(state.clone(), req));
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(error) = conn.await {
                tracing::debug!(%peer, %error, "connection ended");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the grace period");
    }
}

pub(crate) fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|never: Infallible| match never {})
        .boxed()
}

pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut resp = Response::new(full(value.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.status, &e.body())
}

pub(crate) async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {MAX_BODY_BYTES} bytes"),
        )),
        Err(e) => Err(ApiError::bad_request(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// The routes and the methods each allows.
const ROUTES: &[(&str, &[Method])] = &[
    ("/v1/chat/completions", &[Method::POST]),
    ("/v1/completions", &[Method::POST]),
    ("/v1/models", &[Method::GET]),
    ("/tokenize", &[Method::POST]),
    ("/health", &[Method::GET]),
    ("/metrics", &[Method::GET]),
    ("/load", &[Method::GET]),
    ("/reset_prefix_cache", &[Method::POST]),
    ("/pause", &[Method::POST]),
    ("/resume", &[Method::POST]),
    ("/is_paused", &[Method::GET]),
    ("/sim/faults", &[Method::GET, Method::POST]),
    ("/sim/state", &[Method::GET]),
];

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Cut> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let Some((_, allowed)) = ROUTES.iter().find(|(p, _)| *p == path) else {
        return Ok(error_response(&ApiError::new(
            StatusCode::NOT_FOUND,
            "Not Found",
        )));
    };
    if !allowed.contains(&method) {
        let mut resp = error_response(&ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method Not Allowed",
        ));
        let allow = allowed
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        if let Ok(v) = header::HeaderValue::from_str(&allow) {
            resp.headers_mut().insert(header::ALLOW, v);
        }
        return Ok(resp);
    }
    let result = match (method, path.as_str()) {
        (_, "/v1/chat/completions") => {
            return completions::handle(state, req, openai::Endpoint::Chat).await;
        }
        (_, "/v1/completions") => {
            return completions::handle(state, req, openai::Endpoint::Completions).await;
        }
        (_, "/v1/models") => Ok(json_response(
            StatusCode::OK,
            &openai::models(&state.config, state.created_unix_s as u64),
        )),
        (_, "/tokenize") => tokenize(&state, req).await,
        (_, "/health") => Ok(Response::new(full(Bytes::new()))),
        (_, "/metrics") => metrics_response(&state).await,
        (_, "/load") => {
            state.signal_reads[1].fetch_add(1, Ordering::Relaxed);
            Ok(json_response(
                StatusCode::OK,
                &json!({ "server_load": state.server_load.load(Ordering::SeqCst) }),
            ))
        }
        (_, "/reset_prefix_cache") => {
            let reset = state.driver.reset_prefix_cache();
            if reset {
                Ok(Response::new(full(Bytes::new())))
            } else {
                Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the prefix cache could not be reset (blocks are in use)",
                ))
            }
        }
        (_, "/pause") => pause(&state, req.uri().query().unwrap_or("")).await,
        (_, "/resume") => {
            state.driver.resume();
            Ok(json_response(StatusCode::OK, &json!({"status": "resumed"})))
        }
        (_, "/is_paused") => Ok(json_response(
            StatusCode::OK,
            &json!({"is_paused": state.driver.is_paused()}),
        )),
        (Method::GET, "/sim/faults") => Ok(json_response(
            StatusCode::OK,
            &serde_json::to_value(&*state.faults.lock()).unwrap_or(Value::Null),
        )),
        (_, "/sim/faults") => set_faults(&state, req).await,
        (_, "/sim/state") => Ok(json_response(StatusCode::OK, &sim_state(&state))),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, "Not Found")),
    };
    Ok(result.unwrap_or_else(|e| error_response(&e)))
}

/// vLLM's `POST /pause` (a dev endpoint, as `/reset_prefix_cache` is), in the one mode the
/// simulator has: `mode=keep&clear_cache=false`, which freezes the engine after the step in
/// progress with every request kept where it is (new ones queue) until `POST /resume`. vLLM's
/// default, `mode=abort`, aborts every request; `mode=wait` drains them; `clear_cache=true`
/// (the default) also resets the prefix cache.
async fn pause(state: &State, query: &str) -> Result<Response<Body>, ApiError> {
    let mut mode = "abort";
    let mut clear_cache = "true";
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("mode", v) => mode = v,
            ("clear_cache", v) => clear_cache = v,
            _ => {}
        }
    }
    if mode != "keep" || !clear_cache.eq_ignore_ascii_case("false") {
        return Err(ApiError::bad_request(format!(
            "the simulator pauses only with mode=keep&clear_cache=false (got mode={mode}, \
             clear_cache={clear_cache})"
        )));
    }
    state.driver.pause().await;
    Ok(json_response(StatusCode::OK, &json!({"status": "paused"})))
}

async fn tokenize(state: &State, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let body = read_body(req).await?;
    let tokens = openai::parse_tokenize(&state.config, &body)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "count": tokens.len(),
            "max_model_len": state.config.engine.max_model_len,
            "tokens": tokens,
            "token_strs": null,
        }),
    ))
}

async fn metrics_response(state: &State) -> Result<Response<Body>, ApiError> {
    state.signal_reads[0].fetch_add(1, Ordering::Relaxed);
    let fault = state.faults.lock().metrics;
    match fault {
        MetricsFault::Ok => {}
        MetricsFault::Hang => {
            let max_s = state.faults.lock().stall_max_s;
            tokio::time::sleep(state.driver.clock().wall(max_s)).await;
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "simulated fault: /metrics hung",
            ));
        }
        MetricsFault::Unavailable => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "simulated fault: /metrics unavailable",
            ));
        }
    }
    let stats = state.driver.stats();
    let lora = state.driver.lora_usage();
    let text = metrics::encode(&metrics::Snapshot {
        model: &state.config.model,
        engine: &state.config.engine,
        stats: &stats,
        lora: &lora,
        max_loras: state.config.max_loras,
        created_unix_s: state.created_unix_s,
        now_unix_s: crate::driver::unix_now_s(),
    });
    let mut resp = Response::new(full(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    Ok(resp)
}

async fn set_faults(state: &State, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let body = read_body(req).await?;
    let faults: FaultConfig = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid fault configuration: {e}")))?;
    faults
        .validate()
        .map_err(|e| ApiError::bad_request(format!("invalid fault configuration: {e}")))?;
    tracing::info!(?faults, "faults changed");
    let value = serde_json::to_value(&faults).unwrap_or(Value::Null);
    *state.faults.lock() = faults;
    Ok(json_response(StatusCode::OK, &value))
}

fn sim_state(state: &State) -> Value {
    let s = state.driver.stats();
    let hist = |h: &kinference_sim::metrics::Histogram| json!({ "count": h.count, "sum_s": h.sum });
    json!({
        "model": state.config.model,
        "time_scale": state.driver.clock().scale(),
        "virtual_time_s": state.driver.clock().now().as_secs_f64(),
        "inflight_requests": state.driver.inflight(),
        "num_requests_running": s.num_requests_running,
        "num_requests_waiting": s.num_requests_waiting,
        "kv_cache_usage": s.kv_cache_usage,
        "prefix_cache_queries_tokens": s.prefix_cache_queries,
        "prefix_cache_hits_tokens": s.prefix_cache_hits,
        "num_preemptions": s.num_preemptions,
        "prompt_tokens": s.prompt_tokens,
        "generation_tokens": s.generation_tokens,
        "requests_finished": s.requests_finished,
        "time_to_first_token": hist(&s.time_to_first_token),
        "inter_token_latency": hist(&s.inter_token_latency),
        "e2e_request_latency": hist(&s.e2e_request_latency),
        "engine": state.config.engine,
        "signal_reads": {
            "metrics": state.signal_reads[0].load(Ordering::Relaxed),
            "load": state.signal_reads[1].load(Ordering::Relaxed),
        },
    })
}
