//! Command-line arguments and the wiring of sources, index and servers.

use crate::{admin, local::LocalSource, metrics::Metrics};
use anyhow::Context as _;
use clap::Parser;
use kinference_policy_k8s_index::Index;
use std::{net::SocketAddr, path::PathBuf, time::Duration};
use tokio::net::TcpListener;

#[derive(Clone, Debug, Parser)]
#[command(name = "kinference-policy-controller", version, about)]
pub struct Args {
    /// A directory of manifests (Services, HTTPRoutes, InferencePools, EndpointSlices,
    /// Pods, InferencePolicies, InferenceClassifiers), watched for changes.
    #[arg(long, env = "KINFERENCE_MANIFESTS")]
    pub manifests: PathBuf,

    /// Where the gRPC discovery APIs listen; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub grpc_addr: SocketAddr,

    /// Where `/live`, `/ready` and `/metrics` listen; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:9990")]
    pub admin_addr: SocketAddr,

    /// How long the manifest directory must be quiet before it is re-read.
    #[arg(long, default_value_t = 50)]
    pub debounce_ms: u64,

    /// Log format.
    #[arg(long, default_value = "json", value_parser = ["json", "plain"])]
    pub log_format: String,
}

fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Runs the controller until interrupted.
pub async fn run(args: Args) -> anyhow::Result<()> {
    init_logs(&args.log_format);
    let metrics = Metrics::new();
    let index = Index::shared();

    let mut source = LocalSource::new(args.manifests.clone(), index.clone(), metrics.clone());
    source.reload().context("reading the manifest directory")?;
    // The index holds the manifests: proxies may be served.
    metrics.set_ready();

    let grpc = TcpListener::bind(args.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC to {}", args.grpc_addr))?;
    let admin = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding admin to {}", args.admin_addr))?;
    let grpc_addr = grpc.local_addr()?;
    let admin_addr = admin.local_addr()?;
    // A line tests and scripts read to find the ports.
    println!("kinference-policy-controller grpc={grpc_addr} admin={admin_addr}");
    tracing::info!(%grpc_addr, %admin_addr, manifests = %args.manifests.display(), "serving");

    tokio::spawn(admin::serve(admin, metrics.clone(), index.clone()));
    let debounce = Duration::from_millis(args.debounce_ms);
    let watch = tokio::spawn(source.watch(debounce));

    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    };
    tokio::select! {
        res = kinference_policy_grpc::serve(grpc, index, metrics.grpc.clone(), shutdown) => {
            res.context("gRPC server")?;
        }
        res = watch => {
            res.context("watch task")?.context("manifest watch")?;
        }
    }
    Ok(())
}
