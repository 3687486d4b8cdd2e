//! The engine-signal service over real processes (issue 21, docs/signals.md): simulated vLLM
//! replicas that count every `/metrics` and `/load` read (`GET /sim/state`), the controller
//! serving `EngineSignals` (`--signals-addr`), and a mesh of proxy processes.
//!
//! - Without the service each proxy reads every engine itself, so an engine's reads grow with the
//!   mesh; with it the controller reads each engine once and the reads stay where one proxy puts
//!   them, whatever the mesh's size. The engines' KV events reach the proxies' prefix indexes
//!   through the service as block-hash deltas, with no subscription of their own.
//! - Either of two controller replicas serves: when the one a proxy streams from dies, the proxy
//!   moves to the other without reading the engines itself.
//! - When the service is killed, partitioned or too slow, every proxy falls back to reading the
//!   engines itself (bounded by `--signals-fallback-interval-ms`), every request is still answered,
//!   and every proxy returns to the service when it is back.
//!
//! The mesh is 16 proxies (`KINFERENCE_SIGNALS_MESH` sets another size, for the benchmark in
//! docs/signals.md). Rates are compared with margins of several times, never timed exactly: the
//! machine is shared.

#[path = "support/client.rs"]
mod client;
#[path = "support/mesh.rs"]
mod mesh;

use client::ProxyClient;
use kinference_local::{
    Programs, Proxy, Stack, StackOptions,
    poll::wait_until,
    process::Stderr,
    relay::{Mode, Relay},
    stack::spawn_controller_to,
};
use mesh::spawn_mesh;
use serde_json::{Value, json};
use std::{net::SocketAddr, path::Path, time::Duration};
use tokio::time::Instant;

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
/// The proxies' own read interval (`--scrape-interval-ms`): the default.
const SCRAPE_MS: u64 = 100;
/// Their reads while the service is down (`--signals-fallback-interval-ms`): the default.
const FALLBACK_MS: u64 = 200;
/// How long the stream may be silent (`--signals-stale-ms`): the default.
const STALE_MS: u64 = 500;
/// The controller reads each engine's metrics this often (`--signals-interval-ms`).
const SERVICE_MS: u64 = 50;
/// And its `GET /load` this often (`--signals-load-interval-ms`, the default).
const SERVICE_LOAD_MS: u64 = 10;

/// The controller's read interval: [`SERVICE_MS`], or `KINFERENCE_SIGNALS_INTERVAL_MS` for the
/// freshness benchmark (the rate assertions assume the default).
fn service_interval_ms() -> u64 {
    std::env::var("KINFERENCE_SIGNALS_INTERVAL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SERVICE_MS)
}

fn mesh_size() -> usize {
    std::env::var("KINFERENCE_SIGNALS_MESH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
}

async fn start_stack() -> Stack {
    let opts = StackOptions {
        replicas: vec![("glm-5.3".into(), 1), ("qwen-3.6-27b".into(), 1)],
        controller_args: vec![
            "--signals-addr".into(),
            "127.0.0.1:0".into(),
            "--signals-interval-ms".into(),
            service_interval_ms().to_string(),
        ],
        ..StackOptions::default()
    };
    let mut stack = tokio::task::spawn_blocking(move || {
        Stack::start(&Programs::with_proxy(Path::new(PROXY)), &opts, &|_| {})
    })
    .await
    .unwrap()
    .expect("the local stack starts");
    // The stack's own proxy reads the engines itself; the meshes below are measured alone.
    stack.proxy.proc.kill();
    stack
}

/// Every endpoint a proxy knows, with where its signals come from.
async fn sources(c: &ProxyClient) -> Vec<(String, String)> {
    c.endpoints()
        .await
        .iter()
        .map(|e| {
            let s = e["signals_source"].as_str().unwrap_or_default().to_string();
            (e["endpoint"].as_str().unwrap_or_default().to_string(), s)
        })
        .collect()
}

/// Waits until every proxy of `mesh` has every one of the `endpoints` from `source`.
async fn wait_for_source(
    mesh: &[(Proxy, ProxyClient)],
    endpoints: usize,
    source: &str,
    within: Duration,
) {
    for (i, (_, c)) in mesh.iter().enumerate() {
        wait_until(
            &format!("proxy {i} reads all {endpoints} endpoints from {source}"),
            within,
            || async {
                let s = sources(c).await;
                (s.len() == endpoints && s.iter().all(|(_, src)| src == source)).then_some(())
            },
        )
        .await;
    }
}

/// Each replica's signal reads so far: `/metrics`, `/load`.
async fn reads(http: &reqwest::Client, stack: &Stack) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for sim in &stack.sims {
        let state = sim_json(http, sim.addr, "/sim/state").await;
        let r = &state["signal_reads"];
        out.push((r["metrics"].as_u64().unwrap(), r["load"].as_u64().unwrap()));
    }
    out
}

/// Each replica's reads per second over `over`: `/metrics`, `/load`.
async fn read_rates(http: &reqwest::Client, stack: &Stack, over: Duration) -> Vec<(f64, f64)> {
    let (before, t0) = (reads(http, stack).await, Instant::now());
    tokio::time::sleep(over).await;
    let (after, secs) = (reads(http, stack).await, t0.elapsed().as_secs_f64());
    before
        .iter()
        .zip(&after)
        .map(|(b, a)| ((a.0 - b.0) as f64 / secs, (a.1 - b.1) as f64 / secs))
        .collect()
}

/// The most reads per second (of both kinds) at any replica.
fn max(v: &[(f64, f64)]) -> f64 {
    v.iter().map(|(m, l)| m + l).fold(0.0, f64::max)
}

/// One short chat completion through each proxy; every one must be answered 200.
async fn answered_by_all(mesh: &[(Proxy, ProxyClient)], round: &str) {
    let body = json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "Hi! What is 2+2?"}], "max_tokens": 4});
    let sends = mesh.iter().enumerate().map(|(i, (_, c))| {
        let body = body.clone();
        async move {
            let rsp = c.post_chat(&body, &format!("{round}-{i}")).await;
            let status = rsp.status().as_u16();
            let text = rsp.text().await.unwrap_or_default();
            (i, status, text)
        }
    });
    for (i, status, text) in futures::future::join_all(sends).await {
        assert_eq!(status, 200, "{round}: proxy {i} answered {status}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_engines_reads_do_not_grow_with_the_mesh() {
    let n = mesh_size();
    let stack = start_stack().await;
    let signals = stack
        .controller
        .signals
        .expect("the controller serves signals");
    let endpoints = stack.sims.len();
    let http = reqwest::Client::new();
    let over = Duration::from_secs(3);

    // Without the service: each proxy reads each engine's /metrics and /load every SCRAPE_MS.
    let plain = spawn_mesh(&stack, n, &[]).await;
    wait_for_source(&plain, endpoints, "engine", Duration::from_secs(30)).await;
    answered_by_all(&plain, "plain").await;
    let plain_rate = read_rates(&http, &stack, over).await;
    drop(plain);

    // With it: the controller reads each engine's metrics every SERVICE_MS and its load every
    // SERVICE_LOAD_MS, whatever the mesh.
    let mut mesh = spawn_mesh(&stack, 1, &[signals]).await;
    wait_for_source(&mesh, endpoints, "service", Duration::from_secs(30)).await;
    let one_rate = read_rates(&http, &stack, over).await;
    mesh.extend(spawn_mesh(&stack, n - 1, &[signals]).await);
    wait_for_source(&mesh, endpoints, "service", Duration::from_secs(30)).await;
    answered_by_all(&mesh, "service").await;
    let mesh_rate = read_rates(&http, &stack, over).await;

    // Prefix knowledge through the service too: a prompt sent through one proxy is known to be
    // cached at the endpoint that served it by another, which holds no KV-event subscription of
    // its own while the service streams.
    let (sender, other) = (&mesh[0].1, &mesh[1].1);
    let own = "kinference_proxy_kv_event_batches_total";
    let relayed = "kinference_proxy_signal_prefix_deltas_total";
    let (own_before, relayed_before) = (
        other.metric(own, &[]).await,
        other.metric(relayed, &[]).await,
    );
    let words: Vec<String> = (0..400).map(|i| format!("w{i}")).collect();
    let body = json!({"model": "glm-5.3", "messages": [{"role": "user", "content": words.join(" ")}], "max_tokens": 2});
    let rsp = sender.post_chat(&body, "prefix-through-the-service").await;
    assert_eq!(rsp.status(), 200);
    let endpoint = client::served_by(&rsp);
    let held = other.wait_for_blocks_held(&endpoint, 2).await;
    assert_eq!(
        other.metric(own, &[]).await,
        own_before,
        "the other proxy subscribed itself: {held}"
    );
    assert!(
        other.metric(relayed, &[]).await > relayed_before,
        "no prefix delta came through the service"
    );

    let rss_mib: Vec<u64> = mesh
        .iter()
        .filter_map(|(p, _)| {
            let status = std::fs::read_to_string(format!("/proc/{}/status", p.proc.id())).ok()?;
            let kib: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some(kib / 1024)
        })
        .collect();
    eprintln!("proxies' resident memory, MiB: {rss_mib:?}");
    eprintln!(
        "reads/s at each engine: {n} proxies without the service {plain_rate:.0?}, \
         1 proxy with it {one_rate:.0?}, {n} proxies with it {mesh_rate:.0?}"
    );
    let nominal = (
        1000.0 / service_interval_ms() as f64,
        1000.0 / SERVICE_LOAD_MS as f64,
    );
    let plain_nominal = n as f64 * 1000.0 / SCRAPE_MS as f64;
    for (i, ((p, one), m)) in plain_rate.iter().zip(&one_rate).zip(&mesh_rate).enumerate() {
        // The service's reads of either kind do not depend on how many proxies watch.
        for (kind, one, m, nominal) in [
            ("/metrics", one.0, m.0, nominal.0),
            ("/load", one.1, m.1, nominal.1),
        ] {
            assert!(
                m <= 1.5 * nominal && one <= 1.5 * nominal && m > 0.0,
                "engine {i}: {one:.0} and {m:.0} {kind} reads/s with the service, \
                 nominal {nominal:.0}"
            );
        }
        // Without it, the metrics' reads grow with the mesh (a loaded machine slows the timers,
        // hence the margin).
        assert!(
            p.0 >= plain_nominal / 4.0 && p.0 >= 4.0 * m.0,
            "engine {i}: {:.0} /metrics reads/s from {n} proxies alone (nominal \
             {plain_nominal:.0}) against {:.0} through the service",
            p.0,
            m.0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mesh_survives_the_service_killed_partitioned_and_slow() {
    let n = mesh_size();
    let mut stack = start_stack().await;
    let signals = stack
        .controller
        .signals
        .expect("the controller serves signals");
    let endpoints = stack.sims.len();
    let http = reqwest::Client::new();
    // The proxies reach the service through a relay the test can partition and slow.
    let relay = Relay::start(signals).await.unwrap();
    let mesh = spawn_mesh(&stack, n, &[relay.addr]).await;
    wait_for_source(&mesh, endpoints, "service", Duration::from_secs(30)).await;
    answered_by_all(&mesh, "before").await;
    // Within the bound the fallback keeps: each proxy reads each engine (both routes) every
    // FALLBACK_MS, on top of the service's own reads while it runs (partitioned, slow).
    let service_reads = 1000.0 / SERVICE_MS as f64 + 1000.0 / SERVICE_LOAD_MS as f64;
    let fallback_bound = 1.5 * (n as f64 * 2.0 * 1000.0 / FALLBACK_MS as f64 + service_reads);
    let back_within = Duration::from_secs(30);
    let fall_within = Duration::from_millis(STALE_MS * 20);

    // Killed: the stream ends; the proxies read the engines themselves, and every request is
    // answered (the policy is cached too: the controller is the discovery server as well).
    stack.controller.proc.kill();
    wait_for_source(&mesh, endpoints, "engine", fall_within).await;
    answered_by_all(&mesh, "killed").await;
    let killed_rate = read_rates(&http, &stack, Duration::from_secs(2)).await;
    assert!(
        max(&killed_rate) <= fallback_bound,
        "{killed_rate:.0?} reads/s in fallback, bound {fallback_bound:.0}"
    );
    let reason = mesh[0].1.endpoints().await[0]["signals_fallback_reason"].clone();
    assert!(reason.is_string(), "a fallback says why: {reason}");
    let fallbacks = mesh[0]
        .1
        .metric("kinference_proxy_signal_fallbacks_total", &[])
        .await;
    assert!(fallbacks >= 1.0, "a fallback is counted: {fallbacks}");
    // Restarted on the same addresses: back to the service.
    let s = &mut stack;
    tokio::task::block_in_place(|| s.restart_controller(Duration::ZERO)).expect("it restarts");
    assert_eq!(stack.controller.signals, Some(signals));
    wait_for_source(&mesh, endpoints, "service", back_within).await;
    answered_by_all(&mesh, "restarted").await;

    // Partitioned: no FIN, no RST, the stream just goes silent.
    relay.set(Mode::Partitioned);
    wait_for_source(&mesh, endpoints, "engine", fall_within).await;
    answered_by_all(&mesh, "partitioned").await;
    let partitioned_rate = read_rates(&http, &stack, Duration::from_secs(2)).await;
    assert!(
        max(&partitioned_rate) <= fallback_bound,
        "{partitioned_rate:.0?} reads/s in fallback, bound {fallback_bound:.0}"
    );
    relay.set(Mode::Open);
    wait_for_source(&mesh, endpoints, "service", back_within).await;

    // Slow within the staleness budget: still the service.
    relay.set(Mode::Delayed(Duration::from_millis(STALE_MS / 10)));
    tokio::time::sleep(Duration::from_millis(STALE_MS * 4)).await;
    wait_for_source(&mesh, endpoints, "service", Duration::from_secs(5)).await;
    answered_by_all(&mesh, "slow").await;
    // Slower than the budget: readings that old are not trusted; the proxies fall back.
    relay.set(Mode::Delayed(Duration::from_millis(STALE_MS * 3)));
    wait_for_source(&mesh, endpoints, "engine", fall_within).await;
    answered_by_all(&mesh, "too slow").await;
    relay.set(Mode::Open);
    wait_for_source(&mesh, endpoints, "service", back_within).await;
    answered_by_all(&mesh, "after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn either_replica_serves() {
    let n = mesh_size();
    let mut stack = start_stack().await;
    let first = stack
        .controller
        .signals
        .expect("the controller serves signals");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let (program, manifests) = (
        stack.programs.controller.clone(),
        stack.manifests.path().to_path_buf(),
    );
    let extra = stack.controller.extra.clone();
    let second = tokio::task::spawn_blocking(move || {
        spawn_controller_to(&program, &manifests, any, any, &extra, &Stderr::quiet(true))
    })
    .await
    .unwrap()
    .expect("a second controller replica starts");
    let second_signals = second.signals.expect("the second replica serves signals");
    let endpoints = stack.sims.len();
    let mesh = spawn_mesh(&stack, n, &[first, second_signals]).await;
    wait_for_source(&mesh, endpoints, "service", Duration::from_secs(30)).await;
    answered_by_all(&mesh, "both").await;

    // The replica each proxy streams from dies; the next one serves it (the discovery stream
    // stays on the first controller's address: the proxies keep their policy cached).
    stack.controller.proc.kill();
    tokio::time::sleep(Duration::from_millis(STALE_MS * 4)).await;
    wait_for_source(&mesh, endpoints, "service", Duration::from_secs(10)).await;
    answered_by_all(&mesh, "one left").await;
    for (i, (_, c)) in mesh.iter().enumerate() {
        let fallbacks = c
            .metric("kinference_proxy_signal_fallbacks_total", &[])
            .await;
        assert_eq!(
            fallbacks, 0.0,
            "proxy {i} fell back to the engines although a replica served"
        );
    }
    drop(second);
}

/// How long an engine change takes to reach a sidecar: a request sent straight to an engine
/// (bypassing every proxy) raises its `GET /load`, and two proxies through the service and two
/// reading the engine themselves are polled every 2 ms until they see it, 50 times. Printed, not asserted
/// (the machine is shared); recorded in docs/benchmarks/signals-sizing.md. Every change must be
/// seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_engine_change_reaches_the_sidecars() {
    let stack = start_stack().await;
    let signals = stack
        .controller
        .signals
        .expect("the controller serves signals");
    let endpoints = stack.sims.len();
    let through = spawn_mesh(&stack, 2, &[signals]).await;
    let direct = spawn_mesh(&stack, 2, &[]).await;
    wait_for_source(&through, endpoints, "service", Duration::from_secs(30)).await;
    let sim = stack.sims.iter().find(|s| s.model == "glm-5.3").unwrap();
    let id = sim.addr.to_string();
    let http = reqwest::Client::new();
    let load_seen = |c: &ProxyClient| {
        let (c, id) = (c.clone(), id.clone());
        async move {
            loop {
                let e = c.endpoint(&id).await;
                if e["signals"]["server_load"]["value"].as_u64().unwrap_or(0) >= 1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    let idle = |c: &ProxyClient| {
        let (c, id) = (c.clone(), id.clone());
        async move {
            wait_until("the engine idle again", Duration::from_secs(60), || async {
                let e = c.endpoint(&id).await;
                (e["signals"]["server_load"]["value"].as_u64() == Some(0)).then_some(())
            })
            .await;
        }
    };
    let (mut via_service, mut via_scrape) = (Vec::new(), Vec::new());
    for round in 0..50 {
        for (_, c) in through.iter().chain(&direct) {
            idle(c).await;
        }
        let body =
            json!({"model": "glm-5.3", "prompt": format!("round {round}"), "max_tokens": 60});
        let send = http
            .post(format!("http://{}/v1/completions", sim.addr))
            .json(&body)
            .send();
        let sent = Instant::now();
        let request = tokio::spawn(send);
        let seen = through
            .iter()
            .map(|(_, c)| (true, c))
            .chain(direct.iter().map(|(_, c)| (false, c)))
            .map(|(service, c)| {
                let f = load_seen(c);
                async move {
                    tokio::time::timeout(Duration::from_secs(10), f)
                        .await
                        .expect("every change is seen");
                    (service, sent.elapsed().as_secs_f64() * 1e3)
                }
            });
        for (service, ms) in futures::future::join_all(seen).await {
            if service {
                via_service.push(ms);
            } else {
                via_scrape.push(ms);
            }
        }
        let rsp = request.await.unwrap().expect("the engine answers");
        assert_eq!(rsp.status(), 200);
    }
    let q = quantile;
    eprintln!(
        "engine change to sidecar, ms: through the service p50 {:.0} p90 {:.0} p99 {:.0} max {:.0} \
         ({} samples); reading the engine itself p50 {:.0} p90 {:.0} p99 {:.0} max {:.0}",
        q(&mut via_service, 0.5),
        q(&mut via_service, 0.9),
        q(&mut via_service, 0.99),
        q(&mut via_service, 1.0),
        via_service.len(),
        q(&mut via_scrape, 0.5),
        q(&mut via_scrape, 0.9),
        q(&mut via_scrape, 0.99),
        q(&mut via_scrape, 1.0),
    );
}

/// The local stack and three proxies reading through its signal service, each answered once.
async fn three_through_the_service() -> (Stack, Vec<(Proxy, ProxyClient)>) {
    let stack = start_stack().await;
    let signals = stack
        .controller
        .signals
        .expect("the controller serves signals");
    let mesh = spawn_mesh(&stack, 3, &[signals]).await;
    wait_for_source(&mesh, stack.sims.len(), "service", Duration::from_secs(30)).await;
    answered_by_all(&mesh, "warm").await;
    (stack, mesh)
}

/// Other proxies' requests pending on all endpoints, as `c`'s notices show them.
async fn others_pending(c: &ProxyClient) -> u64 {
    c.endpoints()
        .await
        .iter()
        .map(|e| e["others_pending_requests"].as_u64().unwrap_or(0))
        .sum()
}

/// A request sent through one proxy reaches the others' ledgers as a notice (dispatch), and leaves
/// them when it completes; the time from sending it to another proxy showing it is what the fleet
/// benchmark's `--notice-delay-ms` models, set against the time from sending it to its engine
/// holding it (both hold the sender's own decision, and each poll's 1 ms sleep).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dispatch_reaches_the_other_sidecars() {
    let (stack, mesh) = three_through_the_service().await;
    let (sender, others) = (&mesh[0].1, &mesh[1..]);
    let http = reqwest::Client::new();
    let (mut seen_ms, mut engine_ms, mut after_engine_ms) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..40 {
        for (_, c) in others {
            wait_until(
                "no other proxy's request pending",
                Duration::from_secs(30),
                || async { (others_pending(c).await == 0).then_some(()) },
            )
            .await;
        }
        let body = json!({"model": "glm-5.3", "messages": [{"role": "user", "content": format!("round {round}")}], "max_tokens": 60});
        let sent = Instant::now();
        let request = {
            let (c, body) = (sender.clone(), body.clone());
            tokio::spawn(async move {
                let rsp = c.post_chat(&body, &format!("notice-{round}")).await;
                rsp.status().as_u16()
            })
        };
        let seen = others
            .iter()
            .map(|(_, c)| ms_until(sent, "every dispatch is noticed", || others_pending(c)));
        let at_engine = ms_until(sent, "the request reaches an engine", || {
            engines_load(&http, &stack)
        });
        let (seen, at_engine) = tokio::join!(futures::future::join_all(seen), at_engine);
        after_engine_ms.extend(seen.iter().map(|ms| ms - at_engine));
        seen_ms.extend(seen);
        engine_ms.push(at_engine);
        assert_eq!(request.await.unwrap(), 200, "round {round}");
    }
    // Completions take the requests back out of every other ledger.
    for (i, (_, c)) in others.iter().enumerate() {
        wait_until(
            &format!("proxy {} forgets the completed requests", i + 1),
            Duration::from_secs(30),
            || async { (others_pending(c).await == 0).then_some(()) },
        )
        .await;
    }
    let q = quantile;
    eprintln!(
        "sent through one proxy, ms: at the engine p50 {:.1} p90 {:.1} p99 {:.1} ({} samples); \
         noticed by another proxy p50 {:.1} p90 {:.1} p99 {:.1} max {:.1} ({} samples); \
         noticed less at the engine, same round, p50 {:.1} p90 {:.1} p99 {:.1}",
        q(&mut engine_ms, 0.5),
        q(&mut engine_ms, 0.9),
        q(&mut engine_ms, 0.99),
        engine_ms.len(),
        q(&mut seen_ms, 0.5),
        q(&mut seen_ms, 0.9),
        q(&mut seen_ms, 0.99),
        q(&mut seen_ms, 1.0),
        seen_ms.len(),
        q(&mut after_engine_ms, 0.5),
        q(&mut after_engine_ms, 0.9),
        q(&mut after_engine_ms, 0.99),
    );
}

/// A stream through one proxy tells the others when its endpoint's engine steps end (step
/// notices, at most one per 10 ms from the proxy with the oldest stream there): while it decodes,
/// the step end another proxy shows keeps moving on, and the sender, whose own stream times the
/// steps, is told none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_tells_the_other_sidecars_when_its_engine_steps_end() {
    let (_stack, mesh) = three_through_the_service().await;
    let (sender, others) = (&mesh[0].1, &mesh[1..]);
    let body = json!({
        "model": "glm-5.3",
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": 120,
        "stream": true,
    });
    // The same prompt through every proxy first, so that each watches the pool it is routed to.
    for (i, (_, c)) in mesh.iter().enumerate() {
        let warm = json!({"model": "glm-5.3", "messages": body["messages"], "max_tokens": 2});
        let rsp = c.post_chat(&warm, &format!("step-warm-{i}")).await;
        assert_eq!(rsp.status(), 200, "proxy {i}");
        rsp.text().await.unwrap();
    }
    let streaming = {
        let (c, body) = (sender.clone(), body.clone());
        tokio::spawn(async move {
            let rsp = c.post_chat(&body, "step-notices").await;
            let status = rsp.status().as_u16();
            let text = rsp.text().await.expect("the stream ends");
            (status, text.matches("data: ").count())
        })
    };
    // Each poll dates the reported step end on the test's clock (now less its age); a step end
    // is new when it is at least 5 ms after the last one seen.
    let mut step_ends: Vec<Vec<Instant>> = vec![Vec::new(); others.len()];
    while !streaming.is_finished() {
        for (i, (_, c)) in others.iter().enumerate() {
            let now = Instant::now();
            let reported = c
                .endpoints()
                .await
                .iter()
                .filter_map(|e| e["others_step_end_age_s"].as_f64())
                .map(|age| now - Duration::from_secs_f64(age.max(0.0)))
                .max();
            if let Some(at) = reported
                && step_ends[i]
                    .last()
                    .is_none_or(|last| at > *last + Duration::from_millis(5))
            {
                step_ends[i].push(at);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, events) = streaming.await.unwrap();
    assert_eq!(status, 200);
    assert!(events > 10, "a stream of tokens: {events} events");
    for (i, ends) in step_ends.iter().enumerate() {
        assert!(
            ends.len() >= 5,
            "proxy {} saw the engine's steps move on only {} times",
            i + 1,
            ends.len()
        );
    }
    assert!(
        sender
            .endpoints()
            .await
            .iter()
            .all(|e| e["others_step_end_age_s"].is_null()),
        "the sender's own stream times the steps; nobody else streamed"
    );
    eprintln!(
        "step ends seen by the other proxies while one stream decoded ({events} events): {:?}",
        step_ends.iter().map(Vec::len).collect::<Vec<_>>()
    );
}

/// Requests the simulators' API servers hold (`GET /load` of each, summed).
async fn engines_load(http: &reqwest::Client, stack: &Stack) -> u64 {
    let mut total = 0;
    for sim in &stack.sims {
        total += sim_json(http, sim.addr, "/load").await["server_load"]
            .as_u64()
            .unwrap_or(0);
    }
    total
}

/// Milliseconds from `sent` until `count` reads above 0, polled every millisecond (at most 10 s,
/// else `what` fails the test).
async fn ms_until<F, Fut>(sent: Instant, what: &str, count: F) -> f64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let poll = async {
        while count().await == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect(what);
    sent.elapsed().as_secs_f64() * 1e3
}

/// The `p`-quantile (0..=1) of `v`, nearest rank.
fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// A simulator's JSON answer to `GET path`.
async fn sim_json(http: &reqwest::Client, addr: SocketAddr, path: &str) -> Value {
    http.get(format!("http://{addr}{path}"))
        .send()
        .await
        .expect("the simulator answers")
        .json()
        .await
        .expect("the simulator answers JSON")
}
