//! The signal service sharded by pool, over real processes (issue 21, docs/signals.md,
//! "Sharding"): two simulated engines, one per pool (each counts its `/metrics` and `/load` reads
//! in `GET /sim/state`); two controller shards, each serving the signal service for the one pool
//! whose `kinference.io/signals-shard` annotation names it (`--signals-shard`); the discovery
//! controller, told where each shard is (`--signals-shard-addr`); and a mesh of proxies given no
//! `--signals-addr` at all, which learn each pool's shard from the policy.
//!
//! - Every proxy streams each pool from its own shard (two streams per proxy), and each engine is
//!   read by its shard alone: its reads are one shard's, whatever the mesh and the other shard.
//! - A shard refuses a watch of the other shard's pool (FAILED_PRECONDITION), and counts it.
//! - Killed, one shard takes only its pool to direct reads (counted per pool); the other pool
//!   stays on its shard, every request is answered, and the restarted shard takes its pool back.
//!
//! The mesh is 8 proxies (`KINFERENCE_SHARDS_MESH` sets another size). Rates are compared with
//! margins, never timed exactly: the machine is shared.

#[path = "support/client.rs"]
mod client;
#[path = "support/mesh.rs"]
mod mesh;

use client::ProxyClient;
use kinference_local::{
    Programs, Proxy, Stack, StackOptions,
    poll::wait_until,
    process::Stderr,
    stack::{Controller, spawn_controller_to},
};
use kinference_proxy_api::signals::{SignalsTarget, engine_signals_client::EngineSignalsClient};
use mesh::spawn_mesh;
use serde_json::{Value, json};
use std::{net::SocketAddr, path::Path, time::Duration};
use tokio::time::Instant;

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
/// The controller shards read each engine's metrics this often (`--signals-interval-ms`, the
/// default).
const SERVICE_MS: u64 = 50;
/// And its `GET /load` this often (`--signals-load-interval-ms`, the default).
const SERVICE_LOAD_MS: u64 = 10;
/// The proxies' reads while their pool's shard is down (`--signals-fallback-interval-ms`).
const FALLBACK_MS: u64 = 200;
/// How long a stream may be silent (`--signals-stale-ms`, the default).
const STALE_MS: u64 = 500;

/// The two pools and the shard each is put on.
const GLM: (&str, &str) = ("glm-5.3", "a");
const QWEN: (&str, &str) = ("qwen-3.6-27b", "b");

fn mesh_size() -> usize {
    std::env::var("KINFERENCE_SHARDS_MESH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

/// Puts each InferencePool of the served manifests on its shard (the annotation an operator
/// writes), as the controllers read them at start.
fn annotate_pools(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        if !text.contains("kind: InferencePool") {
            continue;
        }
        let mut out = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut doc: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
            if doc["kind"].as_str() == Some("InferencePool") {
                let name = doc["metadata"]["name"].as_str().unwrap().to_string();
                let shard = [GLM, QWEN]
                    .iter()
                    .find(|(pool, _)| *pool == name)
                    .map(|(_, s)| *s)
                    .expect("a pool of the scenario");
                let meta = doc["metadata"].as_mapping_mut().unwrap();
                let annotations = meta
                    .entry("annotations".into())
                    .or_insert_with(|| serde_yaml::Mapping::new().into());
                annotations
                    .as_mapping_mut()
                    .unwrap()
                    .insert("kinference.io/signals-shard".into(), shard.into());
            }
            out.push(serde_yaml::to_string(&doc).unwrap());
        }
        std::fs::write(&path, out.join("---\n")).unwrap();
    }
}

/// Starts the controller shard `name` on the stack's manifests; `signals` is where its service
/// listens (port 0: any).
async fn spawn_shard(stack: &Stack, name: &str, signals: SocketAddr) -> Controller {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let (program, manifests) = (
        stack.programs.controller.clone(),
        stack.manifests.path().to_path_buf(),
    );
    let extra: Vec<String> = [
        "--signals-addr",
        &signals.to_string(),
        "--signals-shard",
        name,
        "--signals-interval-ms",
        &SERVICE_MS.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let shard = tokio::task::spawn_blocking(move || {
        spawn_controller_to(&program, &manifests, any, any, &extra, &Stderr::quiet(true))
    })
    .await
    .unwrap()
    .expect("a controller shard starts");
    assert!(shard.signals.is_some(), "shard {name} serves signals");
    shard
}

/// The stack, with its discovery controller told where shards `a` and `b` are, and the shards.
async fn start() -> (Stack, Controller, Controller) {
    let opts = StackOptions {
        replicas: vec![(GLM.0.into(), 1), (QWEN.0.into(), 1)],
        ..StackOptions::default()
    };
    let mut stack = tokio::task::spawn_blocking(move || {
        Stack::start(&Programs::with_proxy(Path::new(PROXY)), &opts, &|_| {})
    })
    .await
    .unwrap()
    .expect("the local stack starts");
    // The stack's own proxy reads the engines itself; the mesh below is measured alone.
    stack.proxy.proc.kill();
    annotate_pools(stack.manifests.path());
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let a = spawn_shard(&stack, GLM.1, any).await;
    let b = spawn_shard(&stack, QWEN.1, any).await;
    // The discovery controller serves no signals itself: it names each shard's address in the
    // policy of the pools on it.
    stack.controller.extra = vec![
        "--signals-shard-addr".into(),
        format!("a=http://{}", a.signals.unwrap()),
        "--signals-shard-addr".into(),
        format!("b=http://{}", b.signals.unwrap()),
    ];
    let s = &mut stack;
    tokio::task::block_in_place(|| s.restart_controller(Duration::ZERO))
        .expect("the discovery controller restarts");
    (stack, a, b)
}

/// Each endpoint a proxy knows by pool: (signals source, shard name).
async fn sources(c: &ProxyClient) -> Vec<(String, String, String)> {
    c.endpoints()
        .await
        .iter()
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e["pool"]),
                s(&e["signals_source"]),
                s(&e["signals_shard"]["name"]),
            )
        })
        .collect()
}

/// Waits until every proxy reads both pools as `want` says ((pool, source) pairs), each pool on
/// its shard.
async fn wait_for(mesh: &[(Proxy, ProxyClient)], want: &[(&str, &str)], within: Duration) {
    for (i, (_, c)) in mesh.iter().enumerate() {
        wait_until(&format!("proxy {i} reads {want:?}"), within, || async {
            let s = sources(c).await;
            let ok = s.len() == want.len()
                && want.iter().all(|(pool, source)| {
                    let shard = [GLM, QWEN].iter().find(|(p, _)| p == pool).unwrap().1;
                    s.iter()
                        .any(|(p, src, sh)| p == pool && src == source && sh == shard)
                });
            ok.then_some(())
        })
        .await;
    }
}

/// Each engine's signal reads so far (`/metrics` plus `/load`), by model.
async fn reads(http: &reqwest::Client, stack: &Stack) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for sim in &stack.sims {
        let state: Value = http
            .get(format!("http://{}/sim/state", sim.addr))
            .send()
            .await
            .expect("the simulator answers")
            .json()
            .await
            .expect("/sim/state is JSON");
        let r = &state["signal_reads"];
        let n = r["metrics"].as_u64().unwrap() + r["load"].as_u64().unwrap();
        out.push((sim.model.clone(), n));
    }
    out
}

/// Reads per second at the engine of `model`'s pool, over `over`, for each model.
async fn read_rates(http: &reqwest::Client, stack: &Stack, over: Duration) -> (f64, f64) {
    let (before, t0) = (reads(http, stack).await, Instant::now());
    tokio::time::sleep(over).await;
    let (after, secs) = (reads(http, stack).await, t0.elapsed().as_secs_f64());
    let rate = |model: &str| {
        let of = |v: &[(String, u64)]| v.iter().find(|(m, _)| m == model).unwrap().1;
        (of(&after) - of(&before)) as f64 / secs
    };
    (rate(GLM.0), rate(QWEN.0))
}

/// One short chat completion for each model through each proxy; every one must be answered 200.
async fn answered_by_all(mesh: &[(Proxy, ProxyClient)], round: &str) {
    let sends = mesh.iter().enumerate().flat_map(|(i, (_, c))| {
        [GLM.0, QWEN.0].map(|model| {
            let body = json!({"model": model, "messages": [{"role": "user", "content": "Hi! What is 2+2?"}], "max_tokens": 4});
            async move {
                let rsp = c.post_chat(&body, &format!("{round}-{model}-{i}")).await;
                let status = rsp.status().as_u16();
                let text = rsp.text().await.unwrap_or_default();
                (i, model, status, text)
            }
        })
    });
    for (i, model, status, text) in futures::future::join_all(sends).await {
        assert_eq!(
            status, 200,
            "{round}: proxy {i} answered {status} for {model}: {text}"
        );
    }
}

/// A controller's metric (summed over the series whose labels contain every one of `labels`).
async fn controller_metric(
    http: &reqwest::Client,
    c: &Controller,
    name: &str,
    labels: &[&str],
) -> f64 {
    let text = http
        .get(format!("http://{}/metrics", c.admin))
        .send()
        .await
        .expect("the controller's admin answers")
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|s| l.contains(s)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn pool_label(pool: &str) -> String {
    format!("pool=\"default/{pool}\"")
}

fn path(pool: &str) -> String {
    format!("{pool}.default.inferencepool.kinference.io")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_pool_is_read_by_its_own_shard_and_a_lost_shard_costs_only_its_pool() {
    let n = mesh_size();
    let (stack, mut a, b) = start().await;
    let http = reqwest::Client::new();
    let service_nominal = 1000.0 / SERVICE_MS as f64 + 1000.0 / SERVICE_LOAD_MS as f64;
    let both_service = [(GLM.0, "service"), (QWEN.0, "service")];

    let mesh = spawn_mesh(&stack, n, &[]).await;
    wait_for(&mesh, &both_service, Duration::from_secs(30)).await;
    answered_by_all(&mesh, "sharded").await;
    let (glm_rate, qwen_rate) = read_rates(&http, &stack, Duration::from_secs(3)).await;

    // Each shard reads its own pool's engine and never the other's; each serves all the mesh's
    // streams of its pool and none of the other's.
    let scrapes = "kinference_policy_signals_scrapes_total";
    let watchers = "kinference_policy_signals_watchers";
    for (shard, own, other) in [(&a, GLM.0, QWEN.0), (&b, QWEN.0, GLM.0)] {
        let (own_l, other_l) = (pool_label(own), pool_label(other));
        assert!(controller_metric(&http, shard, scrapes, &[&own_l]).await > 0.0);
        assert_eq!(
            controller_metric(&http, shard, scrapes, &[&other_l]).await,
            0.0,
            "the shard of {own} read {other}'s engine"
        );
        assert_eq!(
            controller_metric(&http, shard, watchers, &[&own_l]).await,
            n as f64
        );
        assert_eq!(
            controller_metric(&http, shard, watchers, &[&other_l]).await,
            0.0
        );
    }

    // A watch of the other shard's pool is refused, said and counted, never served empty.
    let mut client = EngineSignalsClient::connect(format!("http://{}", a.signals.unwrap()))
        .await
        .unwrap();
    let refused = client
        .watch(SignalsTarget {
            path: path(QWEN.0),
            engine: String::new(),
            kv_events: None,
        })
        .await
        .expect_err("shard a refuses qwen's pool");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("default/qwen-3.6-27b") && refused.message().contains("shard b"),
        "{}",
        refused.message()
    );
    let refused_total = controller_metric(
        &http,
        &a,
        "kinference_policy_signals_refused_total",
        &[&pool_label(QWEN.0), "shard=\"b\""],
    )
    .await;
    assert!(refused_total >= 1.0, "{refused_total}");

    // Shard a is killed: only glm's streams end. Its proxies read its engine themselves (within
    // the fallback's bound); qwen stays on shard b, read by it alone.
    let signals_a = a.signals.unwrap();
    a.proc.kill();
    let fall_within = Duration::from_millis(STALE_MS * 20);
    wait_for(
        &mesh,
        &[(GLM.0, "engine"), (QWEN.0, "service")],
        fall_within,
    )
    .await;
    answered_by_all(&mesh, "shard a down").await;
    let (glm_down, qwen_down) = read_rates(&http, &stack, Duration::from_secs(2)).await;
    let fallbacks = "kinference_proxy_signal_fallbacks_total";
    let (mut glm_fallbacks, mut qwen_fallbacks) = (0.0, 0.0);
    for (i, (_, c)) in mesh.iter().enumerate() {
        let glm = c.metric(fallbacks, &["pool=\"glm-5.3\""]).await;
        let qwen = c.metric(fallbacks, &["pool=\"qwen-3.6-27b\""]).await;
        assert!(glm >= 1.0, "proxy {i}: glm's fall back is not counted");
        assert_eq!(qwen, 0.0, "proxy {i}: qwen fell back with its shard up");
        glm_fallbacks += glm;
        qwen_fallbacks += qwen;
    }
    let reason = mesh[0]
        .1
        .endpoints()
        .await
        .into_iter()
        .find(|e| e["pool"] == GLM.0)
        .unwrap()["signals_fallback_reason"]
        .clone();
    assert!(reason.is_string(), "a fallback says why: {reason}");

    // Shard a restarts on its address: glm returns to it.
    let a = spawn_shard(&stack, GLM.1, signals_a).await;
    wait_for(&mesh, &both_service, Duration::from_secs(30)).await;
    answered_by_all(&mesh, "shard a back").await;
    let (glm_back, qwen_back) = read_rates(&http, &stack, Duration::from_secs(2)).await;

    eprintln!(
        "reads/s at each engine, {n} proxies, two shards: glm {glm_rate:.0}, qwen {qwen_rate:.0} \
         (nominal {service_nominal:.0} each); shard a down: glm {glm_down:.0}, qwen {qwen_down:.0}; \
         shard a back: glm {glm_back:.0}, qwen {qwen_back:.0}; fallbacks counted: glm \
         {glm_fallbacks}, qwen {qwen_fallbacks}; fall back reason: {reason}"
    );
    // One shard's reads at each engine: had both shards (or the mesh) read an engine, it would
    // see twice the nominal rate or more.
    for (what, rate) in [
        ("glm", glm_rate),
        ("qwen", qwen_rate),
        ("qwen with shard a down", qwen_down),
        ("glm with shard a back", glm_back),
        ("qwen with shard a back", qwen_back),
    ] {
        assert!(
            rate > 0.0 && rate <= 1.5 * service_nominal,
            "{what}: {rate:.0} reads/s, one shard's nominal {service_nominal:.0}"
        );
    }
    // With its shard down, glm's engine is read by the mesh itself, within the fallback's bound.
    let fallback_nominal = n as f64 * 2.0 * 1000.0 / FALLBACK_MS as f64;
    assert!(
        glm_down <= 1.5 * fallback_nominal && glm_down >= fallback_nominal / 4.0,
        "glm with its shard down: {glm_down:.0} reads/s, the mesh's nominal {fallback_nominal:.0}"
    );
    drop((a, b));
}
