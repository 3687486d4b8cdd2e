//! The load generator against in-test servers on loopback: counts, error kinds and percentile
//! order, never timing.

use bytes::Bytes;
use futures::stream;
use http::{Response, StatusCode};
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use kinference_loadgen::{
    closed::Clients,
    load::{self, LoadSpec, Mode, chat_body},
    upstream,
};
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, Infallible>;

/// A server that answers every `fail_every`-th request with 503 and streams SSE when `sse`;
/// with `done` false its streams lack `data: [DONE]`. Returns its address and request counter.
async fn server(fail_every: u64, sse: bool, done: bool) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let c = Arc::clone(&count);
    tokio::spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let c = Arc::clone(&c);
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let c = Arc::clone(&c);
                        async move {
                            let _ = req.into_body().collect().await;
                            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                            let resp: Response<Body> = if fail_every > 0
                                && n.is_multiple_of(fail_every)
                            {
                                Response::builder()
                                    .status(StatusCode::SERVICE_UNAVAILABLE)
                                    .body(Full::new(Bytes::from_static(b"{}")).boxed())
                                    .unwrap()
                            } else if sse {
                                let mut frames = vec![
                                Ok::<_, Infallible>(Frame::data(Bytes::from_static(
                                    b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
                                ))),
                                Ok(Frame::data(Bytes::from_static(
                                    b"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
                                ))),
                            ];
                                if done {
                                    // Split across two frames: the reader must still find it.
                                    frames.push(Ok(Frame::data(Bytes::from_static(b"data: [DO"))));
                                    frames.push(Ok(Frame::data(Bytes::from_static(b"NE]\n\n"))));
                                }
                                Response::new(StreamBody::new(stream::iter(frames)).boxed())
                            } else {
                                Response::new(
                                    Full::new(Bytes::from_static(b"{\"choices\":[]}")).boxed(),
                                )
                            };
                            Ok::<_, Infallible>(resp)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (addr, count)
}

fn spec(addr: SocketAddr, mode: Mode, warmup_s: f64) -> LoadSpec {
    LoadSpec {
        target: "test".into(),
        url: format!("http://{addr}/v1/chat/completions"),
        mode,
        body: chat_body("m", "hi", 1, mode == Mode::Stream),
        rate_per_s: 200.0,
        warmup: Duration::from_secs_f64(warmup_s),
        duration: Duration::from_secs(1),
        max_connections: 16,
        timeout: Duration::from_secs(10),
    }
}

fn assert_ordered(p: &kinference_loadgen::report::Percentiles) {
    assert!(p.count > 0);
    assert!(p.p50_ms > 0.0);
    assert!(p.p50_ms <= p.p90_ms && p.p90_ms <= p.p99_ms, "{p:?}");
    assert!(p.p99_ms <= p.p999_ms && p.p999_ms <= p.max_ms, "{p:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_errors_by_status_and_orders_percentiles() {
    let (addr, count) = server(10, false, true).await;
    let s = load::run(&spec(addr, Mode::NonStream, 0.0)).await.unwrap();
    // 200 requests/s for one second, no warm-up: exactly 200 sent, every 10th answered 503.
    assert_eq!(s.sent, 200);
    assert_eq!(count.load(Ordering::SeqCst), 200);
    assert_eq!(s.ok, 180);
    assert_eq!(s.errors.get("status_503"), Some(&20));
    assert_eq!(s.error_count(), 20);
    assert_eq!(s.latency.count, 180);
    assert_eq!(s.schedule_lag.count, 200);
    assert_ordered(&s.latency);
    assert!(s.first_chunk.is_none());
    assert!(s.connections_opened >= 1 && s.connections_opened <= 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_requests_are_sent_but_not_counted() {
    let (addr, count) = server(0, true, true).await;
    let s = load::run(&spec(addr, Mode::Stream, 0.5)).await.unwrap();
    assert_eq!(
        count.load(Ordering::SeqCst),
        300,
        "100 warm-up + 200 measured"
    );
    assert_eq!(s.sent, 200);
    assert_eq!(s.ok, 200, "{:?}", s.errors);
    let first = s.first_chunk.as_ref().unwrap();
    assert_eq!(first.count, 200);
    assert_ordered(first);
    assert_ordered(&s.latency);
    // Each request's first chunk comes no later than its last byte, so every percentile too.
    assert!(first.p50_ms <= s.latency.p50_ms);
    assert!(first.p99_ms <= s.latency.p99_ms);
    assert!(first.max_ms <= s.latency.max_ms);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_done_is_an_error() {
    let (addr, _) = server(0, true, false).await;
    let s = load::run(&spec(addr, Mode::Stream, 0.0)).await.unwrap();
    assert_eq!(s.ok, 0);
    assert_eq!(s.errors.get("incomplete_stream"), Some(&200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_counts_connect_errors() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let s = load::run(&spec(addr, Mode::NonStream, 0.0)).await.unwrap();
    assert_eq!(s.sent, 200);
    assert_eq!(s.ok, 0);
    assert_eq!(s.errors.get("connect"), Some(&200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_instant_upstream_streams_and_answers() {
    let (up, addrs, listeners) = upstream::bind(&["127.0.0.1:0".parse().unwrap()])
        .await
        .unwrap();
    for l in listeners {
        tokio::spawn(Arc::clone(&up).serve(l));
    }
    let mut sp = spec(addrs[0], Mode::Stream, 0.0);
    sp.body = chat_body("glm-5.3", "hi", 3, true);
    let s = load::run(&sp).await.unwrap();
    assert_eq!((s.sent, s.ok), (200, 200), "{:?}", s.errors);
    let ns = load::run(&spec(addrs[0], Mode::NonStream, 0.0))
        .await
        .unwrap();
    assert_eq!(ns.ok, 200, "{:?}", ns.errors);
    assert_eq!(up.requests_total(), 400);

    // One streamed answer, read whole: three token chunks, then [DONE].
    let stream = tokio::net::TcpStream::connect(addrs[0]).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("/v1/chat/completions")
        .header("host", "x")
        .body(Full::new(chat_body("glm-5.3", "hi", 3, true)))
        .unwrap();
    let resp = tx.send_request(req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 4, "{text}");
    assert_eq!(events[3], "data: [DONE]");
    let last: serde_json::Value =
        serde_json::from_str(events[2].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(last["object"], "chat.completion.chunk");
    assert_eq!(last["model"], "glm-5.3");
    assert_eq!(last["choices"][0]["finish_reason"], "length");

    // Its metrics are what the proxy's scraper reads.
    let stream = tokio::net::TcpStream::connect(addrs[0]).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/metrics")
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let body = tx
        .send_request(req)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap();
    let text = String::from_utf8(body.to_bytes().to_vec()).unwrap();
    assert!(text.contains("vllm:num_requests_running{model_name=\"upstream\"} 0"));
    assert!(text.contains("block_size=\"16\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_loop_sends_every_body_once_and_keeps_its_connections() {
    let (addr, count) = server(5, true, true).await;
    let clients = Clients::new(&format!("http://{addr}/v1/chat/completions"), 3).unwrap();
    let bodies = Arc::new(
        (0..20)
            .map(|i| chat_body("m", &format!("hi {i}"), 1, true))
            .collect::<Vec<_>>(),
    );
    for run in 1..=2u64 {
        let samples = clients
            .run(&bodies, Mode::Stream, Duration::from_secs(10))
            .await;
        assert_eq!(count.load(Ordering::SeqCst), 20 * run);
        // In the bodies' order, each once; every 5th request was answered 503.
        let indices: Vec<usize> = samples.iter().map(|s| s.index).collect();
        assert_eq!(indices, (0..20).collect::<Vec<_>>());
        let failed = samples.iter().filter(|s| s.error.is_some()).count();
        assert_eq!(failed, 4, "{samples:?}");
        for s in samples.iter().filter(|s| s.error.is_none()) {
            let (first, token) = (s.first_chunk_us.unwrap(), s.first_token_us.unwrap());
            assert!(first <= token && token <= s.total_us, "{s:?}");
        }
    }
    // One connection per client, kept from run to run.
    assert!(
        clients.connections_opened() <= 3,
        "{}",
        clients.connections_opened()
    );
}
