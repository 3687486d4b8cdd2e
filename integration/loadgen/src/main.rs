//! `kinference-loadgen`: the load generator (`run`), the instant upstream (`upstream`) and the
//! proxy overhead benchmark (`bench`), in one binary so the driver can start its own upstream.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kinference_loadgen::{
    bench::{self, BenchArgs},
    load::{self, LoadSpec, Mode},
    report::Summary,
    upstream,
    vllm_latency::{self, VllmLatencyArgs},
};
use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

#[derive(Debug, Parser)]
#[command(
    name = "kinference-loadgen",
    version,
    about = "Open-loop HTTP load and the proxy overhead benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Offer a constant request rate to one URL and print percentiles.
    Run(RunArgs),
    /// Serve instant OpenAI-shaped answers and vLLM metrics.
    Upstream(UpstreamArgs),
    /// Direct, nginx and kinference-proxy side by side; writes results to --out-dir.
    Bench(BenchArgs),
    /// Copy the example manifests with their EndpointSlices and pools pointed at local ports.
    Manifests(ManifestArgs),
    /// The proxy's added latency over real vLLM (CPU) beside the simulator's, interleaved in one
    /// run; writes results to --out-dir.
    VllmLatency(VllmLatencyArgs),
}

#[derive(Debug, clap::Args)]
struct ManifestArgs {
    #[arg(long, default_value = "examples")]
    examples: PathBuf,
    #[arg(long)]
    out: PathBuf,
    /// `MODEL=PORT`, once per replica.
    #[arg(long = "port", required = true)]
    ports: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// `http://HOST:PORT/PATH`.
    #[arg(long)]
    url: String,
    #[arg(long, value_enum, default_value = "non-stream")]
    mode: Mode,
    #[arg(long, default_value_t = 1000.0)]
    rate_per_s: f64,
    #[arg(long, default_value_t = 2.0)]
    warmup_s: f64,
    #[arg(long, default_value_t = 10.0)]
    duration_s: f64,
    #[arg(long, default_value = "glm-5.3")]
    model: String,
    #[arg(long, default_value_t = 1)]
    max_tokens: u32,
    /// A file whose content is POSTed instead of the default chat body.
    #[arg(long)]
    body_file: Option<PathBuf>,
    #[arg(long, default_value_t = 64)]
    max_connections: usize,
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// A label for the report.
    #[arg(long, default_value = "target")]
    target: String,
    /// Write the summary as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Append the summary as a CSV row here (with a header when the file is new).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Debug, clap::Args)]
struct UpstreamArgs {
    /// Addresses to listen on (repeat for several); port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: Vec<SocketAddr>,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("building the runtime")
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Run(a) => run(a),
        Cmd::Upstream(a) => serve(a),
        Cmd::Manifests(a) => {
            let mut ports: BTreeMap<String, Vec<u16>> = BTreeMap::new();
            for p in &a.ports {
                let (model, port) = p
                    .split_once('=')
                    .with_context(|| format!("--port {p:?} is not MODEL=PORT"))?;
                let port = port
                    .parse()
                    .with_context(|| format!("--port {p:?}: bad port"))?;
                ports.entry(model.to_string()).or_default().push(port);
            }
            std::fs::create_dir_all(&a.out)?;
            bench::setup::write_manifests(&a.examples, &a.out, &ports)
        }
        Cmd::VllmLatency(a) => {
            let command_line = std::env::args().collect::<Vec<_>>().join(" ");
            let report = vllm_latency::run(&a, &command_line)?;
            print!("{}", vllm_latency::markdown(&report));
            Ok(())
        }
        Cmd::Bench(a) => {
            let command_line = std::env::args().collect::<Vec<_>>().join(" ");
            let report = runtime(1)?.block_on(bench::run(&a, &command_line))?;
            print!("{}", bench::markdown(&report));
            Ok(())
        }
    }
}

fn run(a: RunArgs) -> anyhow::Result<()> {
    let body = match &a.body_file {
        Some(p) => std::fs::read(p)
            .with_context(|| format!("reading {}", p.display()))?
            .into(),
        None => load::chat_body(&a.model, "Say hello.", a.max_tokens, a.mode == Mode::Stream),
    };
    let spec = LoadSpec {
        target: a.target.clone(),
        url: a.url.clone(),
        mode: a.mode,
        body,
        rate_per_s: a.rate_per_s,
        warmup: Duration::from_secs_f64(a.warmup_s),
        duration: Duration::from_secs_f64(a.duration_s),
        max_connections: a.max_connections,
        timeout: Duration::from_millis(a.timeout_ms),
    };
    let summary = runtime(a.threads)?.block_on(load::run(&spec))?;
    let json = serde_json::to_string_pretty(&summary)?;
    println!("{json}");
    if let Some(p) = &a.json {
        std::fs::write(p, json + "\n").with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.csv {
        let mut text = if p.exists() {
            std::fs::read_to_string(p)?
        } else {
            format!("{}\n", Summary::csv_header())
        };
        text.push_str(&summary.csv_row());
        text.push('\n');
        std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn serve(a: UpstreamArgs) -> anyhow::Result<()> {
    runtime(a.threads)?.block_on(async {
        let (up, addrs, listeners) = upstream::bind(&a.listen).await?;
        let fields: Vec<String> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| format!("addr{i}={a}"))
            .collect();
        println!("kinference-loadgen upstream {}", fields.join(" "));
        let tasks: Vec<_> = listeners
            .into_iter()
            .map(|l| tokio::spawn(std::sync::Arc::clone(&up).serve(l)))
            .collect();
        for t in tasks {
            t.await??;
        }
        anyhow::Ok(())
    })
}
