//! `kinference-fleet`: runs the fleet benchmark and writes its CSV and markdown report.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, bail};
use clap::Parser;
use kinference_fleet::{
    arm::Arm,
    report,
    run::RunConfig,
    suite::{self, Plan, Suite},
    tune,
    workload::WorkloadKind,
};

#[derive(Parser, Debug)]
#[command(about = "Every routing strategy against the same simulated vLLM fleet, in virtual time")]
struct Args {
    /// `full` (the published numbers) or `ci` (seconds, small fleets).
    #[arg(long, default_value = "full")]
    suite: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where `results.csv` goes; the markdown report goes to `<out>.md`.
    #[arg(long, default_value = "docs/benchmarks/fleet")]
    out: PathBuf,
    /// Comma-separated workloads (default: all).
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Comma-separated arms, `name[@instances][:no-load][:true-prior]` (default: the suite's;
    /// the full suite's are every column of the report).
    #[arg(long, alias = "strategies", value_delimiter = ',')]
    arms: Vec<String>,
    /// Comma-separated loads overriding the suite's (req/s; sessions/s for multi-turn).
    #[arg(long, value_delimiter = ',')]
    loads: Vec<f64>,
    /// Requests per (workload, load) point, overriding the suite's.
    #[arg(long)]
    requests: Option<usize>,
    /// Sidecars of each mesh strategy (Kinference, Linkerd's p2c, round-robin, random,
    /// least-request) whose arm does not say.
    #[arg(long, default_value_t = 16)]
    kinference_sidecars: usize,
    /// Replicas of each central picker (the Inference Extension, llm-d, Dynamo, SGLang, AIBrix)
    /// whose arm does not say: above 1, each system's HA set-up with its own replica sync.
    #[arg(long, default_value_t = 1)]
    peer_instances: usize,
    #[arg(long, default_value_t = 50)]
    scrape_interval_ms: u64,
    #[arg(long, default_value_t = 10)]
    kv_event_delay_ms: u64,
    /// How long a notice takes through the signal plane, for arms with `:signals`.
    #[arg(long, default_value_t = 2)]
    notice_delay_ms: u64,
    /// How often the signal service reads each replica's `GET /load` apart from its metrics, for
    /// arms with `:signals` (the service's `--signals-load-interval-ms`).
    #[arg(long, default_value_t = 10)]
    signals_load_interval_ms: u64,
    /// The share of notice deliveries lost, for arms with `:signals` (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    notice_loss: f64,
    /// The replicas do not answer vLLM's `GET /load` (as vLLM without
    /// `--enable-server-load-tracking`): routers see only the scheduler's gauges.
    #[arg(long)]
    no_server_load: bool,
    /// The traces directory (`../shared/traces` from the project root).
    #[arg(long, default_value = "../shared/traces")]
    traces: PathBuf,
    /// Overrides of the Kinference strategy's routing settings, `name=value` (comma-separated or
    /// repeated), for sweeps; the published tables use the defaults.
    #[arg(long, value_delimiter = ',')]
    kinference_set: Vec<String>,
    /// Writes every cell's per-request outcomes, with Kinference's prediction inputs, as
    /// `<dir>/<workload>-<load>-<strategy>.csv` (for studying prediction error).
    #[arg(long)]
    dump_requests: Option<PathBuf>,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let suite = match args.suite.as_str() {
        "full" => Suite::Full,
        "ci" => Suite::Ci,
        other => bail!("unknown suite {other:?} (full or ci)"),
    };
    let workloads = if args.workloads.is_empty() {
        WorkloadKind::ALL.to_vec()
    } else {
        args.workloads
            .iter()
            .map(|w| WorkloadKind::parse(w).with_context(|| format!("unknown workload {w:?}")))
            .collect::<anyhow::Result<_>>()?
    };
    let arms = if args.arms.is_empty() {
        suite.arms()
    } else {
        args.arms
            .iter()
            .map(|s| Arm::parse(s).map_err(anyhow::Error::from))
            .collect::<anyhow::Result<_>>()?
    };
    let mut kinference = kinference_routing::RouterConfig::default();
    for setting in &args.kinference_set {
        tune::apply(&mut kinference, setting).context("--kinference-set")?;
    }
    let plan = Plan {
        suite,
        workloads,
        arms,
        loads: (!args.loads.is_empty()).then_some(args.loads.clone()),
        requests: args.requests,
        run: RunConfig {
            mesh_sidecars: args.kinference_sidecars.max(1),
            peer_instances: args.peer_instances.max(1),
            scrape_interval: Duration::from_millis(args.scrape_interval_ms),
            kv_event_delay: Duration::from_millis(args.kv_event_delay_ms),
            notice_delay: Duration::from_millis(args.notice_delay_ms),
            notice_loss: args.notice_loss,
            signals_load_interval: Duration::from_millis(args.signals_load_interval_ms.max(1)),
            seed: args.seed,
            server_load: !args.no_server_load,
            kinference,
        },
        traces_dir: args.traces.clone(),
        threads: args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        dump_requests: args.dump_requests.clone(),
    };
    if let Some(dir) = &args.dump_requests {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // How long the suite took, for the report: the OS clock, outside virtual time.
    #[allow(clippy::disallowed_methods)]
    let started = std::time::Instant::now();
    let results = suite::run(&plan)?;
    let wall_s = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let csv_path = args.out.join("results.csv");
    std::fs::write(&csv_path, report::to_csv(&results))
        .with_context(|| format!("writing {}", csv_path.display()))?;
    if results.iter().any(|r| r.admission.is_some()) {
        let path = args.out.join("admission.csv");
        std::fs::write(&path, report::admission::to_csv(&results))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let md_path = args.out.with_extension("md");
    let md = render_report(&args, &results, wall_s);
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    println!("{}", report::to_markdown(&results));
    println!("{}", report::admission::to_markdown(&results));
    println!(
        "{} cells in {wall_s:.1} s; wrote {} and {}",
        results.len(),
        csv_path.display(),
        md_path.display()
    );
    Ok(())
}

/// The markdown report: the generated tables between markers, and any written text of an existing
/// report kept above and below them.
fn render_report(args: &Args, results: &[report::CellResult], wall_s: f64) -> String {
    const BEGIN: &str = "<!-- BEGIN GENERATED -->";
    const END: &str = "<!-- END GENERATED -->";
    let md_path = args.out.with_extension("md");
    let existing = std::fs::read_to_string(&md_path).unwrap_or_default();
    let preamble = existing.split_once(BEGIN).map_or_else(
        || "# Fleet benchmark\n\n".to_owned(),
        |(head, _)| head.to_owned(),
    );
    let analysis = existing
        .split_once(END)
        .map(|(_, rest)| rest.to_owned())
        .unwrap_or_default();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    format!(
        "{preamble}{BEGIN}\n\nGenerated by `{command}` (suite `{}`, seed {}; mesh strategies as {} sidecars, central \
         pickers as {} instance(s), unless an arm says `@N`; scrape every {} ms{}, KV events \
         after {} ms; {} cells in {wall_s:.0} s wall).\n\nTTFT, ITL and e2e are per request, in virtual time; `load CV` is the \
         coefficient of variation of requests per endpoint; MAPE and p90 abs err compare each request's predicted TTFT with its \
         simulated TTFT (Kinference and the oracle). Plots: `fleet/ttft_p90.png`, `fleet/ttft_p99.png`.\n\n{}{}{END}{analysis}",
        args.suite,
        args.seed,
        args.kinference_sidecars,
        args.peer_instances,
        args.scrape_interval_ms,
        if args.no_server_load {
            " without `GET /load`"
        } else {
            " with `GET /load`"
        },
        args.kv_event_delay_ms,
        results.len(),
        report::to_markdown(results),
        report::admission::to_markdown(results),
    )
}
