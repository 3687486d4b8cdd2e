//! The command line: `serve` for a cluster (or any Prometheus and proxies), `local` for a laptop.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kinference_viz::{
    api::State,
    local::{self, LocalUrls, PrometheusProc},
    policies, prom, server,
};
use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::PathBuf,
    process::Stdio,
    time::Duration,
};

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
    /// Run kinference-local, a Prometheus scraping it, and viz; print the dashboard's URL.
    Local(LocalArgs),
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
    /// `json` or `plain`.
    #[arg(long, env = "KINFERENCE_VIZ_LOG_FORMAT", default_value = "json")]
    log_format: String,
}

#[derive(Debug, clap::Args)]
struct LocalArgs {
    /// viz's address (port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:8084")]
    listen_addr: SocketAddr,
    #[arg(long, default_value = local::PROMETHEUS_BIN)]
    prometheus_bin: PathBuf,
    /// The kinference-local binary; by default the one beside this binary, else `cargo run`.
    #[arg(long)]
    local_bin: Option<PathBuf>,
    /// The manifests kinference-local serves (for the Policies page).
    #[arg(long)]
    manifests: Option<PathBuf>,
    /// Arguments passed to kinference-local (after `--`), e.g. `-- --time-scale 10`.
    #[arg(last = true)]
    local_args: Vec<String>,
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
        Command::Local(args) => rt.block_on(run_local(args)),
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
    let listener = local::bind(args.listen_addr).await?;
    let addr = listener.local_addr()?;
    println!("kinference-viz listen={addr}");
    tracing::info!(%addr, prometheus = %args.prometheus_url, "serving");
    tokio::select! {
        _ = server::serve(listener, state) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

/// The command that runs kinference-local: `--local-bin`, else the binary beside this one, else
/// `cargo run -p kinference-proxy --bin kinference-local`.
fn local_command(args: &LocalArgs) -> std::process::Command {
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("kinference-local")));
    let mut cmd = match (&args.local_bin, sibling) {
        (Some(bin), _) => std::process::Command::new(bin),
        (None, Some(bin)) if bin.exists() => std::process::Command::new(bin),
        _ => {
            let mut c = std::process::Command::new(
                std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()),
            );
            c.args([
                "run",
                "-p",
                "kinference-proxy",
                "--bin",
                "kinference-local",
                "--",
            ]);
            c
        }
    };
    cmd.args(&args.local_args);
    cmd
}

/// Starts kinference-local and returns it with the URLs it printed.
fn start_local(args: &LocalArgs) -> anyhow::Result<(std::process::Child, LocalUrls)> {
    let mut cmd = local_command(args);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut child = cmd.spawn().context("starting kinference-local")?;
    let stdout = child
        .stdout
        .take()
        .context("kinference-local has no stdout")?;
    let mut urls = LocalUrls::default();
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.context("reading kinference-local's output")?;
        urls.read_line(&line);
        if line.starts_with("Press Ctrl-C") {
            break;
        }
    }
    // Keep draining, so kinference-local never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    if urls.proxy_admin.is_empty() {
        let _ = child.kill();
        anyhow::bail!("kinference-local exited without printing its URLs");
    }
    Ok((child, urls))
}

async fn run_local(args: LocalArgs) -> anyhow::Result<()> {
    init_logs("plain");
    if !args.prometheus_bin.exists() {
        // Without Prometheus there is nothing for the dashboard to read: run the local system
        // alone, in the foreground, and say how to get the rest.
        println!(
            "{} not found: running the local system without Prometheus and the dashboard \
             (Debian: apt-get install prometheus).",
            args.prometheus_bin.display()
        );
        let status = tokio::task::spawn_blocking({
            let mut cmd = local_command(&args);
            move || cmd.status()
        })
        .await?
        .context("running kinference-local")?;
        anyhow::ensure!(status.success(), "kinference-local exited with {status}");
        return Ok(());
    }
    let (mut local_child, urls) = {
        let args_ = LocalArgs {
            listen_addr: args.listen_addr,
            prometheus_bin: args.prometheus_bin.clone(),
            local_bin: args.local_bin.clone(),
            manifests: args.manifests.clone(),
            local_args: args.local_args.clone(),
        };
        tokio::task::spawn_blocking(move || start_local(&args_)).await??
    };
    let listener = local::bind(args.listen_addr).await?;
    let viz_addr = listener.local_addr()?;
    let config = local::prometheus_config(
        &[local::host_port(&urls.proxy_admin)],
        &urls.replicas,
        Some(&viz_addr.to_string()),
        1,
    );
    let prometheus =
        match PrometheusProc::start(&args.prometheus_bin, &config, Duration::from_secs(30)).await {
            Ok(p) => p,
            Err(e) => {
                let _ = local_child.kill();
                return Err(e);
            }
        };
    let state = State {
        prometheus: prom::Prometheus::new(&prometheus.url, Duration::from_secs(10)),
        proxies: vec![urls.proxy_admin.clone()],
        proxy_job: None,
        policies: policies::Source::Manifests(
            args.manifests
                .clone()
                .unwrap_or_else(local::default_manifests),
        ),
        http: http_client(),
    };
    println!();
    println!("Kinference viz is running beside the local system.");
    println!("  dashboard:        http://{viz_addr}/");
    println!("  Prometheus:       {}", prometheus.url);
    println!("  OpenAI base URL:  {}", urls.openai_base);
    println!("  proxy admin:      {}", urls.proxy_admin);
    println!(
        "kinference-viz dashboard=http://{viz_addr}/ prometheus={} openai={} admin={}",
        prometheus.url, urls.openai_base, urls.proxy_admin
    );
    println!("Press Ctrl-C to stop.");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = server::serve(listener, state) => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(prometheus);
    // kinference-local stops its children when it gets SIGINT; a kill leaves them orphaned, so
    // ask it the way Ctrl-C would.
    let _ = std::process::Command::new("kill")
        .args(["-INT", &local_child.id().to_string()])
        .status();
    let _ = local_child.wait();
    Ok(())
}
