//! The scraper against real servers on loopback: the vLLM simulator, and hyper servers that
//! stall or fail.

#[path = "signals/sim.rs"]
mod sim;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use kinference_proxy_signals::{ParseError, ScrapeError, Scraper};
use std::{convert::Infallible, net::SocketAddr, time::Duration};

fn uri(addr: SocketAddr) -> http::Uri {
    format!("http://{addr}/metrics").parse().unwrap()
}

#[tokio::test]
async fn scrapes_the_simulators_metrics() {
    let replica = sim::replica(None).await;
    let scraper = Scraper::new(Duration::from_secs(10));
    let url = uri(replica.local_addr());

    let idle = scraper.scrape(&url).await.unwrap();
    let engine = &replica.config().engine;
    assert_eq!(idle.block_size, Some(engine.block_size));
    assert_eq!(idle.num_gpu_blocks, Some(engine.num_gpu_blocks));
    assert_eq!(idle.num_requests_running, Some(0.0));
    assert_eq!(idle.num_requests_waiting, Some(0.0));
    assert_eq!(idle.prefix_cache_queries_tokens, Some(0.0));
    assert_eq!(idle.max_lora, Some(replica.config().max_loras));

    // The same prompt twice: the second is served from the prefix cache.
    let prompt: Vec<u32> = (100..100 + 8 * engine.block_size).collect();
    sim::complete(&replica, &prompt).await;
    sim::complete(&replica, &prompt).await;
    let after = scraper.scrape(&url).await.unwrap();
    let stats = replica.stats();
    assert!(
        stats.prefix_cache_hits > 0,
        "the second prompt hit the cache"
    );
    assert_eq!(
        after.prefix_cache_queries_tokens,
        Some(stats.prefix_cache_queries as f64)
    );
    assert_eq!(
        after.prefix_cache_hits_tokens,
        Some(stats.prefix_cache_hits as f64)
    );
    assert_eq!(after.num_preemptions, Some(stats.num_preemptions as f64));
    assert_eq!(after.kv_cache_usage, Some(stats.kv_cache_usage));
    replica.shutdown().await;
}

/// Serves every connection with `handler`'s answer (or none, if it never returns).
async fn server<F, Fut>(handler: F) -> SocketAddr
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = http::Response<Full<Bytes>>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((io, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler().await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(io), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_stalled_server_times_out() {
    let addr = server(|| async {
        std::future::pending::<()>().await;
        http::Response::new(Full::new(Bytes::new()))
    })
    .await;
    let err = Scraper::new(Duration::from_millis(200))
        .scrape(&uri(addr))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ScrapeError::Timeout {
                timeout_ms: 200,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn refused_connections_bad_statuses_and_foreign_bodies_are_typed() {
    let closed: SocketAddr = format!("127.0.0.1:{}", sim::free_port()).parse().unwrap();
    let scraper = Scraper::new(Duration::from_secs(5));
    let err = scraper.scrape(&uri(closed)).await.unwrap_err();
    assert!(matches!(err, ScrapeError::Connect { .. }), "{err:?}");

    let unavailable = server(|| async {
        http::Response::builder()
            .status(503)
            .body(Full::new(Bytes::from_static(b"busy")))
            .unwrap()
    })
    .await;
    let err = scraper.scrape(&uri(unavailable)).await.unwrap_err();
    assert!(
        matches!(err, ScrapeError::Status { status, .. } if status == 503),
        "{err:?}"
    );

    let not_vllm = server(|| async {
        http::Response::new(Full::new(Bytes::from_static(b"# TYPE up gauge\nup 1\n")))
    })
    .await;
    let err = scraper.scrape(&uri(not_vllm)).await.unwrap_err();
    assert!(
        matches!(
            err,
            ScrapeError::Parse {
                source: ParseError::NoVllmMetrics,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn reads_vllms_server_load_and_types_what_is_not_one() {
    let load_uri = |addr: SocketAddr| format!("http://{addr}/load").parse::<http::Uri>().unwrap();
    let scraper = Scraper::new(Duration::from_secs(5));

    // The simulator without --enable-server-load-tracking answers 0, as vLLM does.
    let replica = sim::replica(None).await;
    assert_eq!(
        scraper
            .server_load(&load_uri(replica.local_addr()))
            .await
            .unwrap(),
        0
    );
    replica.shutdown().await;

    let loaded = server(|| async {
        http::Response::new(Full::new(Bytes::from_static(b"{\"server_load\": 7}")))
    })
    .await;
    assert_eq!(scraper.server_load(&load_uri(loaded)).await.unwrap(), 7);

    // An engine without the route (an older vLLM, another server): a 404 the caller can act on.
    let missing = server(|| async {
        http::Response::builder()
            .status(404)
            .body(Full::new(Bytes::from_static(b"{\"detail\":\"Not Found\"}")))
            .unwrap()
    })
    .await;
    let err = scraper.server_load(&load_uri(missing)).await.unwrap_err();
    assert!(
        matches!(err, ScrapeError::Status { status, .. } if status == 404),
        "{err:?}"
    );

    let foreign =
        server(|| async { http::Response::new(Full::new(Bytes::from_static(b"{\"load\": -1}"))) })
            .await;
    let err = scraper.server_load(&load_uri(foreign)).await.unwrap_err();
    assert!(matches!(err, ScrapeError::Load { .. }), "{err:?}");
    assert!(err.to_string().contains("server_load"), "{err}");
}
