//! The `vllm-sim` command line: one replica (`serve`) or a fleet (`fleet`) on loopback.
//!
//! It lives in the library so that a multi-call binary (`kinference-local`, which runs the whole
//! local stack from one build) can run the simulator as a subcommand of its own, with the very
//! flags `vllm-sim` takes. Each replica prints `listening on http://ADDR` once it accepts
//! connections, so a caller that passed `--port 0` can find it; SIGINT or SIGTERM shuts every
//! replica down gracefully.

use std::net::{IpAddr, SocketAddr};

use crate::{FaultConfig, KvEventsConfig, Replica, ReplicaConfig, serve};
use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

/// `vllm-sim`'s arguments.
#[derive(Debug, Parser)]
#[command(name = "vllm-sim", version, about = "Simulated vLLM replicas")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one replica.
    Serve(ServeArgs),
    /// Run several replicas in one process, on consecutive ports.
    Fleet(FleetArgs),
}

/// Flags shared by `serve` and `fleet`.
#[derive(Debug, Args)]
struct Common {
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Virtual seconds per wall second (10.0 runs ten times faster than real time).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Seed of fault draws and generated tokens.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output tokens when a request sets no max_tokens.
    #[arg(long, default_value_t = 64)]
    default_max_tokens: u32,
    /// LoRA adapters served beside the model, comma separated.
    #[arg(long, value_delimiter = ',')]
    lora_modules: Vec<String>,
    #[arg(long, default_value_t = 1)]
    max_loras: u32,
    /// Faults injected from the start, as the JSON `POST /sim/faults` takes.
    #[arg(long)]
    faults: Option<String>,
    /// Override the profile's KV blocks.
    #[arg(long)]
    num_gpu_blocks: Option<u32>,
    #[arg(long)]
    max_num_seqs: Option<u32>,
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    #[arg(long)]
    max_model_len: Option<u32>,
    #[arg(long)]
    block_size: Option<u32>,
    /// Turn automatic prefix caching off.
    #[arg(long)]
    no_enable_prefix_caching: bool,
    /// Count requests in `GET /load` (vLLM's flag; without it `/load` reports 0).
    #[arg(long)]
    enable_server_load_tracking: bool,
    /// Usage without `prompt_tokens_details` (`null`), as vLLM's without
    /// `--enable-prompt-tokens-details`.
    #[arg(long)]
    no_prompt_tokens_details: bool,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Text every answer begins with; `{model}` becomes the served model's name.
    #[arg(long, default_value = "")]
    answer_prefix: String,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[arg(long)]
    profile: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Served model name (defaults to the profile's).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Publish vLLM KV events on this ZMQ endpoint (`tcp://*:5557` binds, `tcp://host:port`
    /// connects, as vLLM does).
    #[arg(long)]
    kv_events_endpoint: Option<String>,
    #[arg(long, default_value = "")]
    kv_events_topic: String,
    /// The address `*` in `--kv-events-endpoint` binds (default: `--host`, which is 127.0.0.1
    /// unless set; vLLM's `*` binds every address, `--kv-events-bind-host 0.0.0.0`).
    #[arg(long)]
    kv_events_bind_host: Option<IpAddr>,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct FleetArgs {
    /// PROFILE=COUNT pairs, comma separated, e.g. `glm-5.3=2,qwen-3.6-27b=2`.
    #[arg(long, value_delimiter = ',', required = true)]
    replicas: Vec<String>,
    /// Port of the first replica; the others take the next ones (0 picks free ports).
    #[arg(long, default_value_t = 8001)]
    base_port: u16,
    #[command(flatten)]
    common: Common,
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn replica_config(profile: &str, common: &Common, seed: u64) -> Result<ReplicaConfig> {
    let mut config = ReplicaConfig::from_profile_name(profile)?;
    config.time_scale = common.time_scale;
    config.seed = seed;
    config.default_max_tokens = common.default_max_tokens;
    config.lora_modules = common.lora_modules.clone();
    config.max_loras = common.max_loras;
    config.server_load_tracking = common.enable_server_load_tracking;
    config.prompt_tokens_details = !common.no_prompt_tokens_details;
    config.answer_prefix = common.answer_prefix.clone();
    if let Some(json) = &common.faults {
        config.faults =
            serde_json::from_str::<FaultConfig>(json).context("--faults is not a fault config")?;
    }
    let e = &mut config.engine;
    if let Some(v) = common.num_gpu_blocks {
        e.num_gpu_blocks = v;
    }
    if let Some(v) = common.max_num_seqs {
        e.max_num_seqs = v;
    }
    if let Some(v) = common.max_num_batched_tokens {
        e.max_num_batched_tokens = v;
    }
    if let Some(v) = common.max_model_len {
        e.max_model_len = v;
    }
    if let Some(v) = common.block_size {
        e.block_size = v;
    }
    if common.no_enable_prefix_caching {
        e.enable_prefix_caching = false;
    }
    config.validate()?;
    Ok(config)
}

async fn start(config: ReplicaConfig, addr: SocketAddr) -> Result<Replica> {
    let model = config.model.clone();
    let replica = serve(config, addr)
        .await
        .with_context(|| format!("starting {model} on {addr}"))?;
    println!("listening on {} model={model}", replica.url());
    Ok(replica)
}

/// Resolves on SIGINT or SIGTERM. Registered before any replica starts, so a signal that arrives
/// right after a `listening on` line is never lost to the default action.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// Runs the replicas `cli` asks for until SIGINT or SIGTERM.
pub async fn run(cli: Cli) -> Result<()> {
    let stop = shutdown_signal()?;
    let replicas = match cli.command {
        Command::Serve(args) => {
            init_logging(args.common.log_json);
            let mut config = replica_config(&args.profile, &args.common, args.common.seed)?;
            if let Some(name) = args.served_model_name {
                config.model = name;
            }
            if let Some(endpoint) = args.kv_events_endpoint {
                config.kv_events = Some(KvEventsConfig {
                    endpoint,
                    topic: args.kv_events_topic,
                });
                config.kv_events_bind_host = args.kv_events_bind_host.unwrap_or(args.common.host);
            }
            config.validate()?;
            vec![start(config, SocketAddr::new(args.common.host, args.port)).await?]
        }
        Command::Fleet(args) => {
            init_logging(args.common.log_json);
            let mut replicas = Vec::new();
            let mut index: u16 = 0;
            for spec in &args.replicas {
                let Some((profile, count)) = spec.split_once('=') else {
                    bail!("--replicas takes PROFILE=COUNT pairs, not {spec:?}");
                };
                let count: u16 = count
                    .parse()
                    .with_context(|| format!("bad replica count in {spec:?}"))?;
                for _ in 0..count {
                    let port = if args.base_port == 0 {
                        0
                    } else {
                        args.base_port
                            .checked_add(index)
                            .context("ports run past 65535")?
                    };
                    // Each replica draws its own faults and tokens.
                    let seed = args.common.seed.wrapping_add(u64::from(index));
                    let config = replica_config(profile, &args.common, seed)?;
                    replicas.push(start(config, SocketAddr::new(args.common.host, port)).await?);
                    index += 1;
                }
            }
            replicas
        }
    };
    stop.await;
    tracing::info!("shutting down");
    for replica in replicas {
        replica.shutdown().await;
    }
    Ok(())
}
