//! The proxy overhead benchmark: direct, via nginx and via kinference-proxy, in one run.
//!
//! A latency added by a proxy is only meaningful against the same upstream, under the same load,
//! on the same machine at the same time. The driver starts the instant upstream, the controller
//! on `examples/` pointed at it, the proxy and nginx; then for each mode (non-streaming,
//! streaming) it offers the same open-loop load to the upstream directly, through nginx and
//! through the proxy, one after the other; and it records the proxy's resident memory before any
//! load and at its peak under load, and every process's CPU time per request.

mod procs;
pub mod setup;

use crate::{
    load::{self, LoadSpec, Mode, chat_body},
    report::Summary,
};
use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
pub use procs::Memory;
use procs::addr_field;
use serde::Serialize;
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

/// The benchmark's settings.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// The proxy binary (build it with `cargo build --release -p kinference-proxy`).
    #[arg(long, default_value = "target/release/kinference-proxy")]
    pub proxy_bin: PathBuf,
    /// The policy controller binary.
    #[arg(long, default_value = "target/debug/kinference-policy-controller")]
    pub controller_bin: PathBuf,
    #[arg(long, default_value = "nginx")]
    pub nginx_bin: PathBuf,
    /// The manifests the controller serves, rewritten to point at the upstream.
    #[arg(long, default_value = "examples")]
    pub examples: PathBuf,
    /// Where results.json, results.csv and results.md are written.
    #[arg(long, default_value = "docs/benchmarks/proxy")]
    pub out_dir: PathBuf,
    #[arg(long, default_value_t = 1000.0)]
    pub rate_per_s: f64,
    #[arg(long, default_value_t = 5.0)]
    pub warmup_s: f64,
    #[arg(long, default_value_t = 20.0)]
    pub duration_s: f64,
    /// Repetitions of the whole direct/nginx/proxy sequence.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Tokens each request asks for (`max_tokens`).
    #[arg(long, default_value_t = 1)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 64)]
    pub max_connections: usize,
    /// Worker threads of the upstream process.
    #[arg(long, default_value_t = 1)]
    pub upstream_threads: usize,
    /// How long the proxy sits idle before its idle memory is read.
    #[arg(long, default_value_t = 3.0)]
    pub idle_s: f64,
}

/// CPU time a process spent during one scenario.
#[derive(Clone, Debug, Serialize)]
pub struct Cpu {
    pub process: String,
    pub cpu_ms: f64,
    pub cpu_us_per_request: f64,
}

/// One target in one mode.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    pub round: u32,
    pub summary: Summary,
    pub cpu: Vec<Cpu>,
    /// The proxy's largest `VmRSS` sampled during this scenario (proxy scenarios only).
    pub proxy_peak_rss_kib: Option<u64>,
}

/// What a proxy added to the direct latency, same round and mode.
#[derive(Clone, Debug, Serialize)]
pub struct Added {
    pub round: u32,
    pub mode: String,
    pub via: String,
    pub p50_added_ms: f64,
    pub p99_added_ms: f64,
    pub first_chunk_p50_added_ms: Option<f64>,
    pub first_chunk_p99_added_ms: Option<f64>,
}

/// The proxy's memory over the run.
#[derive(Clone, Debug, Serialize)]
pub struct ProxyMemory {
    /// After startup, policy received and `idle_s` without requests.
    pub idle: Memory,
    /// The largest `VmRSS` sampled while it carried load.
    pub peak_rss_under_load_kib: u64,
    /// At the end of the run (its `hwm_kib` is the peak of the whole run).
    pub end: Memory,
    /// nginx's master and workers together, idle, for comparison.
    pub nginx_idle_rss_kib: u64,
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub machine: BTreeMap<String, String>,
    pub settings: BTreeMap<String, String>,
    pub scenarios: Vec<Scenario>,
    pub added: Vec<Added>,
    pub proxy_memory: ProxyMemory,
}

pub(crate) fn machine() -> BTreeMap<String, String> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    BTreeMap::from([
        ("cpu".into(), cpu),
        ("cores".into(), cores.to_string()),
        ("kernel".into(), kernel.trim().to_string()),
    ])
}

fn free_port() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?)
}

/// One HTTP/1.1 request on a new connection: its status, `x-kinference-endpoint` and body.
async fn request(
    addr: SocketAddr,
    method: http::Method,
    path: &str,
    body: Bytes,
) -> anyhow::Result<(http::StatusCode, Option<String>, Bytes)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let endpoint = resp
        .headers()
        .get("x-kinference-endpoint")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, endpoint, body))
}

/// Retries `check` every 100 ms until it succeeds or `timeout` passes.
async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let deadline = crate::clock::now() + timeout;
    loop {
        let err = match check().await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if crate::clock::now() > deadline {
            return Err(err.context(format!("{what} not ready within {timeout:?}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Samples the largest `VmRSS` of `pid` every 50 ms until stopped.
fn sample_peak_rss(pid: u32) -> (Arc<AtomicBool>, Arc<AtomicU64>, std::thread::JoinHandle<()>) {
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let (s, p) = (Arc::clone(&stop), Arc::clone(&peak));
    let handle = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            if let Ok(m) = procs::memory(pid) {
                p.fetch_max(m.rss_kib, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    (stop, peak, handle)
}

/// Runs the benchmark and writes its results to `args.out_dir`.
pub async fn run(args: &BenchArgs, command_line: &str) -> anyhow::Result<BenchReport> {
    let work = tempfile::tempdir().context("creating the work directory")?;
    let self_exe = std::env::current_exe().context("finding this binary")?;

    // The upstream: one process, one listener per model.
    let mut cmd = Command::new(&self_exe);
    cmd.args([
        "upstream",
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
    ])
    .args(["--threads", &args.upstream_threads.to_string()]);
    let (upstream, line) = procs::spawn(
        "upstream",
        cmd,
        &work.path().join("upstream.log"),
        "kinference-loadgen upstream ",
        Duration::from_secs(10),
    )?;
    let up_a = addr_field(&line, "addr0")?;
    let up_b = addr_field(&line, "addr1")?;

    // The controller on the examples, pointed at the upstream.
    let manifests = work.path().join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let ports = BTreeMap::from([
        ("glm-5.3".to_string(), vec![up_a.port()]),
        ("qwen-3.6-27b".to_string(), vec![up_b.port()]),
    ]);
    setup::write_manifests(&args.examples, &manifests, &ports)?;
    let mut cmd = Command::new(&args.controller_bin);
    cmd.arg("--manifests").arg(&manifests).args([
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ]);
    let (_controller, line) = procs::spawn(
        "controller",
        cmd,
        &work.path().join("controller.log"),
        "kinference-policy-controller ",
        Duration::from_secs(30),
    )?;
    let grpc = addr_field(&line, "grpc")?;

    // The proxy, with its defaults.
    let mut cmd = Command::new(&args.proxy_bin);
    cmd.args([
        "--listen-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
        "--controller-addr",
        &format!("http://{grpc}"),
        "--target",
        "llm.default.svc.cluster.local:8000",
        "--workload",
        "default/app",
    ]);
    let (proxy, line) = procs::spawn(
        "proxy",
        cmd,
        &work.path().join("proxy.log"),
        "kinference-proxy ",
        Duration::from_secs(30),
    )?;
    let proxy_addr = addr_field(&line, "listen")?;
    let proxy_admin = addr_field(&line, "admin")?;

    // nginx as a plain reverse proxy to the first listener.
    let nginx_dir = work.path().join("nginx");
    std::fs::create_dir_all(&nginx_dir)?;
    let nginx_addr = free_port()?;
    let conf = nginx_dir.join("nginx.conf");
    std::fs::write(&conf, setup::nginx_conf(&nginx_dir, nginx_addr, up_a))?;
    let mut cmd = Command::new(&args.nginx_bin);
    cmd.arg("-p").arg(&nginx_dir).arg("-c").arg(&conf);
    cmd.args(["-e", "stderr"]);
    let (nginx, _) = procs::spawn(
        "nginx",
        cmd,
        &work.path().join("nginx.log"),
        "",
        Duration::ZERO,
    )?;

    let path = "/v1/chat/completions";
    let probe = chat_body("glm-5.3", "Say hello.", 1, false);
    let ready = |addr: SocketAddr, needs_endpoint: bool| {
        let probe = probe.clone();
        move || {
            let probe = probe.clone();
            async move {
                let (status, endpoint, _) = request(addr, http::Method::POST, path, probe).await?;
                if !status.is_success() {
                    bail!("status {status}");
                }
                if needs_endpoint && endpoint.is_none() {
                    bail!("no x-kinference-endpoint header");
                }
                Ok(())
            }
        }
    };
    wait_for("upstream", Duration::from_secs(10), ready(up_a, false)).await?;
    wait_for("nginx", Duration::from_secs(10), ready(nginx_addr, false)).await?;
    wait_for("proxy admin", Duration::from_secs(30), || async move {
        let (status, _, _) =
            request(proxy_admin, http::Method::GET, "/ready", Bytes::new()).await?;
        anyhow::ensure!(status.is_success(), "status {status}");
        Ok(())
    })
    .await?;
    wait_for("proxy", Duration::from_secs(30), ready(proxy_addr, true)).await?;

    // Idle memory: policy received, scrapers running, no requests for a while.
    tokio::time::sleep(Duration::from_secs_f64(args.idle_s)).await;
    let idle = procs::memory(proxy.id())?;
    let nginx_pids = procs::with_children(nginx.id());
    let nginx_idle_rss_kib = nginx_pids
        .iter()
        .filter_map(|p| procs::memory(*p).ok())
        .map(|m| m.rss_kib)
        .sum();

    let ticks = procs::ticks_per_s() as f64;
    let targets = [
        ("direct", up_a),
        ("nginx", nginx_addr),
        ("kinference-proxy", proxy_addr),
    ];
    let mut scenarios = Vec::new();
    let mut peak_under_load = 0;
    for round in 1..=args.rounds {
        for mode in [Mode::NonStream, Mode::Stream] {
            for (name, addr) in targets {
                let spec = LoadSpec {
                    target: name.into(),
                    url: format!("http://{addr}{path}"),
                    mode,
                    body: chat_body(
                        "glm-5.3",
                        "Say hello.",
                        args.max_tokens,
                        mode == Mode::Stream,
                    ),
                    rate_per_s: args.rate_per_s,
                    warmup: Duration::from_secs_f64(args.warmup_s),
                    duration: Duration::from_secs_f64(args.duration_s),
                    max_connections: args.max_connections,
                    timeout: Duration::from_secs(10),
                };
                let watched: Vec<(&str, Vec<u32>)> = vec![
                    ("upstream", vec![upstream.id()]),
                    ("nginx", nginx_pids.clone()),
                    ("kinference-proxy", vec![proxy.id()]),
                    ("loadgen", vec![std::process::id()]),
                ];
                let cpu_of = |pids: &[u32]| -> u64 {
                    pids.iter().filter_map(|p| procs::cpu_ticks(*p).ok()).sum()
                };
                let before: Vec<u64> = watched.iter().map(|(_, p)| cpu_of(p)).collect();
                let sampler = (name == "kinference-proxy").then(|| sample_peak_rss(proxy.id()));
                let t0 = crate::clock::now();
                let summary = load::run(&spec).await?;
                let elapsed_s = t0.elapsed().as_secs_f64();
                let peak = sampler.map(|(stop, peak, h)| {
                    stop.store(true, Ordering::Relaxed);
                    let _ = h.join();
                    peak.load(Ordering::Relaxed)
                });
                if let Some(p) = peak {
                    peak_under_load = peak_under_load.max(p);
                }
                // Every request of the run, warm-up included, over the whole run's CPU time.
                let all_requests = args.rate_per_s * (args.warmup_s + args.duration_s);
                let cpu = watched
                    .iter()
                    .zip(before)
                    .map(|((process, pids), b)| {
                        let cpu_ms = (cpu_of(pids).saturating_sub(b)) as f64 / ticks * 1_000.0;
                        Cpu {
                            process: (*process).into(),
                            cpu_ms,
                            cpu_us_per_request: cpu_ms * 1_000.0 / all_requests.max(1.0),
                        }
                    })
                    .collect();
                eprintln!(
                    "round {round} {:<10} {:<16} ok {}/{} p50 {:.3} ms p99 {:.3} ms ({elapsed_s:.1} s)",
                    summary.mode,
                    name,
                    summary.ok,
                    summary.sent,
                    summary.latency.p50_ms,
                    summary.latency.p99_ms
                );
                scenarios.push(Scenario {
                    round,
                    summary,
                    cpu,
                    proxy_peak_rss_kib: peak,
                });
            }
        }
    }
    let end = procs::memory(proxy.id())?;
    let report = BenchReport {
        machine: machine(),
        settings: BTreeMap::from([
            ("command".into(), command_line.to_string()),
            ("rate_per_s".into(), args.rate_per_s.to_string()),
            ("warmup_s".into(), args.warmup_s.to_string()),
            ("duration_s".into(), args.duration_s.to_string()),
            ("rounds".into(), args.rounds.to_string()),
            ("max_tokens".into(), args.max_tokens.to_string()),
            ("max_connections".into(), args.max_connections.to_string()),
            ("upstream_threads".into(), args.upstream_threads.to_string()),
            ("nginx".into(), nginx_version(&args.nginx_bin)),
        ]),
        added: added(&scenarios),
        scenarios,
        proxy_memory: ProxyMemory {
            idle,
            peak_rss_under_load_kib: peak_under_load,
            end,
            nginx_idle_rss_kib,
        },
    };
    write(&args.out_dir, &report)?;
    Ok(report)
}

fn nginx_version(bin: &std::path::Path) -> String {
    Command::new(bin)
        .arg("-v")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .unwrap_or_default()
}

/// The latency each proxy added to the direct one, per round and mode.
pub fn added(scenarios: &[Scenario]) -> Vec<Added> {
    let mut out = Vec::new();
    for direct in scenarios.iter().filter(|s| s.summary.target == "direct") {
        for via in scenarios.iter().filter(|s| {
            s.round == direct.round
                && s.summary.mode == direct.summary.mode
                && s.summary.target != "direct"
        }) {
            let (d, v) = (&direct.summary, &via.summary);
            let fc = |f: fn(&crate::report::Percentiles) -> f64| {
                Some(f(v.first_chunk.as_ref()?) - f(d.first_chunk.as_ref()?))
            };
            out.push(Added {
                round: direct.round,
                mode: d.mode.clone(),
                via: v.target.clone(),
                p50_added_ms: v.latency.p50_ms - d.latency.p50_ms,
                p99_added_ms: v.latency.p99_ms - d.latency.p99_ms,
                first_chunk_p50_added_ms: fc(|p| p.p50_ms),
                first_chunk_p99_added_ms: fc(|p| p.p99_ms),
            });
        }
    }
    out
}

/// Writes `results.json`, `results.csv` and `results.md` into `dir`.
pub fn write(dir: &std::path::Path, report: &BenchReport) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(report)? + "\n",
    )?;
    let mut csv = format!("round,{}\n", Summary::csv_header());
    for s in &report.scenarios {
        csv.push_str(&format!("{},{}\n", s.round, s.summary.csv_row()));
    }
    std::fs::write(dir.join("results.csv"), csv)?;
    std::fs::write(dir.join("results.md"), markdown(report))?;
    Ok(())
}

/// The results as Markdown tables.
pub fn markdown(r: &BenchReport) -> String {
    let mut md = String::new();
    md.push_str(
        "| round | mode | target | ok/sent | errors | p50 ms | p90 ms | p99 ms | max ms \
         | first chunk p50 ms | first chunk p99 ms | CPU µs/req (target) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &r.scenarios {
        let m = &s.summary;
        let fc = |f: fn(&crate::report::Percentiles) -> f64| {
            m.first_chunk
                .as_ref()
                .map_or("–".to_string(), |p| format!("{:.3}", f(p)))
        };
        let own = match m.target.as_str() {
            "direct" => "upstream",
            t => t,
        };
        let cpu = s
            .cpu
            .iter()
            .find(|c| c.process == own)
            .map_or("–".to_string(), |c| {
                format!("{:.0} ({own})", c.cpu_us_per_request)
            });
        md.push_str(&format!(
            "| {} | {} | {} | {}/{} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} | {} |\n",
            s.round,
            m.mode,
            m.target,
            m.ok,
            m.sent,
            m.error_count(),
            m.latency.p50_ms,
            m.latency.p90_ms,
            m.latency.p99_ms,
            m.latency.max_ms,
            fc(|p| p.p50_ms),
            fc(|p| p.p99_ms),
            cpu
        ));
    }
    md.push_str(
        "\n| round | mode | via | p50 added ms | p99 added ms | first chunk p50 added ms \
         | first chunk p99 added ms |\n|---|---|---|---|---|---|---|\n",
    );
    let opt = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:+.3}"));
    for a in &r.added {
        md.push_str(&format!(
            "| {} | {} | {} | {:+.3} | {:+.3} | {} | {} |\n",
            a.round,
            a.mode,
            a.via,
            a.p50_added_ms,
            a.p99_added_ms,
            opt(a.first_chunk_p50_added_ms),
            opt(a.first_chunk_p99_added_ms)
        ));
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    let m = &r.proxy_memory;
    md.push_str(&format!(
        "\n| kinference-proxy memory | MiB |\n|---|---|\n\
         | idle VmRSS (policy loaded, no requests) | {:.1} |\n\
         | peak VmRSS sampled under load | {:.1} |\n\
         | VmHWM at the end of the run | {:.1} |\n\
         | VmRSS at the end of the run | {:.1} |\n\
         | nginx idle VmRSS (master + workers), for comparison | {:.1} |\n",
        mib(m.idle.rss_kib),
        mib(m.peak_rss_under_load_kib),
        mib(m.end.hwm_kib),
        mib(m.end.rss_kib),
        mib(m.nginx_idle_rss_kib),
    ));
    md
}
