//! The command line: `serve` for a cluster, or for any Prometheus and proxies (`kinference-local`
//! serves viz beside the local stack itself, through this crate's library).

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kinference_viz::{api::State, policies, prom, server};
use std::{net::SocketAddr, path::PathBuf, time::Duration};

#[derive(Debug, Parser)]
#[command(
    name = "kinference-viz",
    version,
    about = "Kinference's metrics API and dashboard"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API and dashboard over a Prometheus and the proxies' admin ports.
    Serve(ServeArgs),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    #[arg(
        long,
        env = "KINFERENCE_VIZ_LISTEN_ADDR",
        default_value = "0.0.0.0:8084"
    )]
    listen_addr: SocketAddr,
    /// Prometheus' base URL.
    #[arg(long, env = "KINFERENCE_VIZ_PROMETHEUS_URL")]
    prometheus_url: String,
    /// A proxy's admin base URL (`http://10.0.0.5:4191`); repeat or separate with commas.
    #[arg(
        long = "proxy-admin",
        env = "KINFERENCE_VIZ_PROXY_ADMIN",
        value_delimiter = ','
    )]
    proxy_admin: Vec<String>,
    /// Also read the decision records of every healthy target of this Prometheus job (the
    /// proxies' admin ports, as the chart's Prometheus scrapes them).
    #[arg(long, env = "KINFERENCE_VIZ_PROXY_JOB")]
    proxy_job: Option<String>,
    /// Read policies from this manifest directory instead of the Kubernetes API.
    #[arg(long, env = "KINFERENCE_VIZ_MANIFESTS")]
    manifests: Option<PathBuf>,
    /// A directory of `kinfctl replay` reports (`*.json`) for the experiment page.
    #[arg(long, env = "KINFERENCE_VIZ_REPLAY_DIR")]
    replay_dir: Option<PathBuf>,
    /// `json` or `plain`.
    #[arg(long, env = "KINFERENCE_VIZ_LOG_FORMAT", default_value = "json")]
    log_format: String,
}

fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter);
    if format == "json" {
        let _ = b.json().try_init();
    } else {
        let _ = b.try_init();
    }
}

pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match cli.command {
        Command::Serve(args) => rt.block_on(serve(args)),
    }
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default()
}

/// The in-cluster or kubeconfig client, without kube's retry layer: it retries a 429, 503 or 504
/// up to 15 times over minutes, while the dashboard asks again every two seconds, so a failed list
/// is shown at once and the next poll retries it.
async fn cluster_client() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer().await?;
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logs(&args.log_format);
    let policies = match args.manifests {
        Some(dir) => policies::Source::Manifests(dir),
        None => policies::Source::Kubernetes(
            cluster_client()
                .await
                .context("connecting to the Kubernetes API (or pass --manifests)")?,
        ),
    };
    let state = State {
        prometheus: prom::Prometheus::new(&args.prometheus_url, Duration::from_secs(10)),
        proxies: args.proxy_admin,
        proxy_job: args.proxy_job,
        policies,
        http: http_client(),
    };
    let listener = tokio::net::TcpListener::bind(args.listen_addr)
        .await
        .with_context(|| format!("binding {}", args.listen_addr))?;
    let addr = listener.local_addr()?;
    println!("kinference-viz listen={addr}");
    tracing::info!(%addr, prometheus = %args.prometheus_url, "serving");
    tokio::select! {
        _ = server::serve_with(listener, state, server::Options { replay_dir: args.replay_dir }) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
