//! The pool stream over real sockets: a fake `EngineSignals` server (tonic, loopback) and an
//! engine that counts its scrapes. The fake reports 7 waiting, the engine itself 1, so the
//! router's reading tells who read it.

use super::*;
use crate::signals::{SignalsConfig, spawn};
use kinference_proxy_api::signals::engine_signals_server::{EngineSignals, EngineSignalsServer};
use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
};
use tokio_stream::Stream;

/// What the fake service does with its streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A snapshot, then a fresh reading every 20 ms.
    Serve,
    /// Holds streams open and says nothing.
    Silent,
    /// Fails its streams and refuses new ones, as a service going away does (the connection
    /// itself dying is the real-process tests' part, `proxy/tests/signal_service.rs`).
    Gone,
}

#[derive(Clone)]
struct Fake {
    mode: watch::Receiver<Mode>,
    endpoint: SocketAddr,
    watches: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl EngineSignals for Fake {
    type WatchStream =
        Pin<Box<dyn Stream<Item = Result<api::SignalsUpdate, tonic::Status>> + Send>>;

    async fn watch(
        &self,
        req: tonic::Request<SignalsTarget>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        assert_eq!(
            req.into_inner().path,
            "glm-5.3.default.inferencepool.kinference.io"
        );
        if *self.mode.borrow() == Mode::Gone {
            return Err(tonic::Status::unavailable("going away"));
        }
        self.watches.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let (mut mode, addr) = (self.mode.clone(), self.endpoint.to_string());
        tokio::spawn(async move {
            let mut version = 0;
            loop {
                if *mode.borrow() == Mode::Gone {
                    let _ = tx.send(Err(tonic::Status::unavailable("going away"))).await;
                    return;
                }
                if *mode.borrow_and_update() == Mode::Silent {
                    if mode.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                version += 1;
                let update = api::SignalsUpdate {
                    version,
                    full: version == 1,
                    readings: vec![api::EndpointReading {
                        addr: addr.clone(),
                        age_ms: 5,
                        num_requests_waiting: Some(7),
                        num_requests_running: Some(2),
                        read_seq: version,
                        ..Default::default()
                    }],
                    // The load, read apart: 40 + the message's number, 1 ms old.
                    loads: vec![api::LoadReading {
                        addr: addr.clone(),
                        age_ms: 1,
                        server_load: 40 + u32::try_from(version).unwrap_or(0),
                    }],
                    ..Default::default()
                };
                if tx.send(Ok(update)).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn notify(
        &self,
        _: tonic::Request<tonic::Streaming<api::NoticeBatch>>,
    ) -> Result<tonic::Response<api::NotifyAck>, tonic::Status> {
        Err(tonic::Status::unimplemented("the fake relays no notices"))
    }
}

/// Serves the fake on `listener` until the returned task is aborted.
fn serve(fake: Fake, listener: tokio::net::TcpListener) -> JoinHandle<()> {
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(EngineSignalsServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    })
}

/// An engine whose `/metrics` reports 1 waiting and counts its reads.
async fn engine(reads: Arc<AtomicU64>) -> SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = "vllm:num_requests_waiting{model_name=\"tiny\"} 1.0\n\
                vllm:num_requests_running{model_name=\"tiny\"} 0.0\n";
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let reads = reads.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let rsp = if buf[..n].starts_with(b"GET /metrics") {
                    reads.fetch_add(1, Ordering::SeqCst);
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                } else {
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        .to_string()
                };
                let _ = s.write_all(rsp.as_bytes()).await;
            });
        }
    });
    addr
}

/// Polls `f` every 10 ms until it answers, for at most 10 s.
async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_reads_through_the_service_falls_back_when_it_fails_and_returns() {
    let reads = Arc::new(AtomicU64::new(0));
    let engine_addr = engine(reads.clone()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let service_addr = listener.local_addr().unwrap();
    let (mode, mode_rx) = watch::channel(Mode::Serve);
    let watches = Arc::new(AtomicUsize::new(0));
    let fake = Fake {
        mode: mode_rx,
        endpoint: engine_addr,
        watches: watches.clone(),
    };
    let _server = serve(fake.clone(), listener);

    let mut p = kinference_proxy_discovery::convert::policy(
        &kinference_proxy_discovery::testing::example_proto(),
    );
    p.models.truncate(1);
    let table = EndpointTable::default();
    let router = RouterHandle::default();
    let metrics = crate::metrics::Metrics::new().signals;
    let mut by_backend = std::collections::BTreeMap::new();
    by_backend.insert(
        p.models[0].destination_path.clone(),
        vec![kinference_proxy_discovery::Endpoint {
            addr: engine_addr,
            labels: Default::default(),
        }],
    );
    table.sync(
        &p,
        &kinference_proxy_discovery::Endpoints { by_backend },
        &router,
    );
    let destination = p.models[0].destination_path.clone();
    let labels = PoolLabels {
        pool: p.models[0].pool.clone(),
        model: p.models[0].name.clone(),
    };
    let _task = spawn(
        table.clone(),
        router.clone(),
        metrics.clone(),
        SignalsConfig {
            interval: Duration::from_millis(20),
            timeout: Duration::from_secs(1),
            service: Some(ServiceConfig {
                addrs: vec![format!("http://{service_addr}").parse().unwrap()],
                stale: Duration::from_millis(200),
                fallback_interval: Duration::from_millis(50),
                connect_timeout: Duration::from_millis(250),
            }),
        },
    );
    let id = EndpointId::from(engine_addr.to_string());
    let waiting = || {
        router.read(|r, _| {
            r.signals(&id)
                .and_then(|s| s.num_requests_waiting.map(|o| o.value))
        })
    };
    let source = || table.signal_source(&destination);
    let fallbacks = || metrics.signal_fallbacks.get_or_create(&labels).get();

    // Live: the router holds the service's reading, and the engine is not read meanwhile.
    until("the service's reading", || {
        (source() == Some(Source::Service) && waiting() == Some(7)).then_some(())
    })
    .await;
    // The load, from the stream's own entries, dated apart from the reading (1 ms old, not 5).
    let load = || {
        router.read(|r, _| {
            r.signals(&id)
                .and_then(|s| s.server_load.zip(s.num_requests_waiting))
                .map(|(l, w)| (l.value, l.at, w.at))
        })
    };
    until("the service's load", || {
        load().filter(|(v, _, _)| *v > 40).map(|_| ())
    })
    .await;
    let (_, load_at, reading_at) = load().unwrap();
    assert!(load_at > reading_at, "the load is dated on its own");
    let before = reads.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        reads.load(Ordering::SeqCst),
        before,
        "no direct reads while live"
    );
    assert_eq!(fallbacks(), 0);
    assert_eq!(metrics.signal_stream_live.get_or_create(&labels).get(), 1);

    // Silent past `stale`: the engine is read directly, at the fallback interval, and counted.
    mode.send_replace(Mode::Silent);
    until("the fall back to direct reads", || {
        (waiting() == Some(1)).then_some(())
    })
    .await;
    let why = source().and_then(|s| s.fallback_reason().map(str::to_string));
    assert!(
        why.as_deref().is_some_and(|w| w.contains("no update")),
        "{why:?}"
    );
    assert_eq!(fallbacks(), 1);
    let from = reads.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let direct = reads.load(Ordering::SeqCst) - from;
    // 500 ms at one read per 50 ms, never the 20 ms scrape interval's 25.
    assert!(
        (3..=12).contains(&direct),
        "{direct} direct reads in 500 ms"
    );

    // Back: a new stream's snapshot makes the service the source again.
    mode.send_replace(Mode::Serve);
    until("the return to the service", || {
        (source() == Some(Source::Service) && waiting() == Some(7)).then_some(())
    })
    .await;
    assert!(watches.load(Ordering::SeqCst) >= 2);

    // The service gone: fall back again (one more count), and keep serving readings.
    mode.send_replace(Mode::Gone);
    until("the fall back after the service went", || {
        (source().is_some_and(|s| s != Source::Service) && waiting() == Some(1)).then_some(())
    })
    .await;
    assert_eq!(fallbacks(), 2);
    assert_eq!(metrics.signal_stream_live.get_or_create(&labels).get(), 0);
}

#[test]
fn a_reading_becomes_the_routers_scrape() {
    let r = api::EndpointReading {
        addr: "10.0.0.1:8000".into(),
        num_requests_waiting: Some(3),
        num_requests_running: Some(4),
        kv_cache_usage: Some(f64::NAN),
        cache_config: Some(api::CacheConfig {
            block_size_tokens: 16,
            num_gpu_blocks: 100,
        }),
        server_load: Some(5),
        generation_tokens: Some(9),
        ..Default::default()
    };
    let s = scrape_of(&r);
    assert_eq!(s.num_requests_waiting, Some(3));
    assert_eq!(s.num_requests_running, Some(4));
    assert_eq!(s.kv_cache_usage, None);
    assert_eq!(s.cache_config.map(|c| c.capacity_tokens()), Some(1600));
    assert_eq!((s.server_load, s.generation_tokens), (Some(5), Some(9)));
}
