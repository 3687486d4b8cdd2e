//! What large prompts cost the small requests beside them (issue 19, D7): a short chat
//! request's latency through the proxy, alone and while four clients each keep a 10 MB prompt in
//! flight, for each proxy binary named in `KINFERENCE_PROXIES` (comma-separated; default: this
//! build's), side by side in one run.
//!
//! Two kinds of 10 MB prompt: one that fits the endpoints' context window (the simulators serve
//! `--max-model-len 3000000`: parsed, classified, hashed and decided on the blocking pool, then
//! prefilled), and one beyond it (`--max-model-len 200000`: refused before it is hashed). The
//! simulators run fast (`--time-scale 1000`) so that the proxy's own work dominates.
//!
//! ```text
//! cargo bench -p kinference-proxy --bench large_prompts
//! KINFERENCE_PROXIES=/tmp/proxy-before,target/release/kinference-proxy cargo bench ...
//! ```
//!
//! Prints one Markdown table; results are recorded in docs/benchmarks/large-prompts.md.

use kinference_local::{Program, Programs, Stack, StackOptions};
use serde_json::json;
use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::time::Instant;

const SMALL_REQUESTS: usize = 60;
const LARGE_CLIENTS: usize = 4;
const LARGE_BYTES: usize = 10 * 1024 * 1024;

struct Row {
    proxy: String,
    window: &'static str,
    load: &'static str,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    large_sent: u64,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

async fn small_latencies(http: &reqwest::Client, base: &str) -> Vec<f64> {
    let body = json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 1});
    let mut out = Vec::with_capacity(SMALL_REQUESTS);
    for _ in 0..SMALL_REQUESTS {
        let t = Instant::now();
        let rsp = http
            .post(format!("{base}/v1/chat/completions"))
            .json(&body)
            .send()
            .await;
        if let Ok(r) = rsp {
            let _ = r.bytes().await;
        }
        out.push(t.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    out.sort_by(f64::total_cmp);
    out
}

async fn measure(proxy: &Path, window: u32, window_name: &'static str) -> Vec<Row> {
    let opts = StackOptions {
        replicas: vec![("glm-5.3".into(), 1), ("qwen-3.6-27b".into(), 1)],
        time_scale: 1000.0,
        kv_events: false,
        sim_args: vec!["--max-model-len".into(), window.to_string()],
        ..StackOptions::default()
    };
    let mut programs = Programs::with_proxy(proxy);
    // Release-built simulators and controller, when named, so that the engines' own parsing of
    // 10 MB prompts does not dominate.
    if let Some(sim) = std::env::var_os("KINFERENCE_SIM") {
        programs.vllm_sim = Program::Path(PathBuf::from(sim));
    }
    if let Some(c) = std::env::var_os("KINFERENCE_CONTROLLER") {
        programs.controller = Program::Path(PathBuf::from(c));
    }
    let stack = tokio::task::spawn_blocking(move || Stack::start(&programs, &opts, &|_| {}))
        .await
        .unwrap()
        .expect("the local stack starts");
    let base = format!("http://{}", stack.proxy.listen);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    // Ready, and the endpoints' signals (and windows) read.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let name = proxy.display().to_string();
    let mut rows = Vec::new();
    let idle = small_latencies(&http, &base).await;
    rows.push(row(&name, window_name, "alone", &idle, 0));

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let large = Arc::new(
        json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "word ".repeat(LARGE_BYTES / 5)}], "max_tokens": 1})
            .to_string(),
    );
    let mut clients = Vec::new();
    for _ in 0..LARGE_CLIENTS {
        let (http, base, stop, sent, large) = (
            http.clone(),
            base.clone(),
            stop.clone(),
            sent.clone(),
            large.clone(),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let rsp = http
                    .post(format!("{base}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .body(large.as_str().to_owned())
                    .send()
                    .await;
                if let Ok(r) = rsp {
                    let _ = r.bytes().await;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let loaded = small_latencies(&http, &base).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    rows.push(row(
        &name,
        window_name,
        "4 x 10 MB in flight",
        &loaded,
        sent.load(Ordering::Relaxed),
    ));
    drop(stack);
    rows
}

fn row(proxy: &str, window: &'static str, load: &'static str, l: &[f64], sent: u64) -> Row {
    Row {
        proxy: proxy.to_string(),
        window,
        load,
        p50_ms: percentile(l, 0.5),
        p99_ms: percentile(l, 0.99),
        max_ms: l[l.len() - 1],
        large_sent: sent,
    }
}

fn main() {
    let proxies: Vec<PathBuf> = match std::env::var("KINFERENCE_PROXIES") {
        Ok(list) => list.split(',').map(PathBuf::from).collect(),
        Err(_) => vec![PathBuf::from(env!("CARGO_BIN_EXE_kinference-proxy"))],
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rows = Vec::new();
    for proxy in &proxies {
        rows.extend(rt.block_on(measure(proxy, 3_000_000, "fits (3M tokens)")));
        rows.extend(rt.block_on(measure(proxy, 200_000, "beyond (200k tokens)")));
    }
    println!(
        "| proxy | 10 MB prompts vs window | load | small p50 ms | small p99 ms | small max ms | 10 MB requests sent |"
    );
    println!("|---|---|---|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
            r.proxy, r.window, r.load, r.p50_ms, r.p99_ms, r.max_ms, r.large_sent
        );
    }
}
