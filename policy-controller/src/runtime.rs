//! Command-line arguments and the wiring of sources, index and servers.
//!
//! Two modes share one index and one set of servers: with `--manifests` the index is fed
//! from a directory (running without a cluster); without it the controller runs in a
//! cluster, watching the API server, electing a status writer through a Lease, and
//! serving the admission webhooks over TLS.

use crate::{admin, local::LocalSource, metrics::Metrics};
use anyhow::{Context as _, bail};
use clap::Parser;
use kinference_policy_k8s_index::{Index, SharedIndex};
use std::{future::Future, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};
use tokio::{net::TcpListener, sync::watch};

#[derive(Clone, Debug, Parser)]
#[command(name = "kinference-policy-controller", version, about)]
pub struct Args {
    /// A directory of manifests (Services, HTTPRoutes, InferencePools, EndpointSlices,
    /// Pods, InferencePolicies, InferenceClassifiers), watched for changes. Without it the
    /// controller runs in Kubernetes mode: it watches the API server (in-cluster config,
    /// or the kubeconfig `KUBECONFIG` names).
    #[arg(long, env = "KINFERENCE_MANIFESTS")]
    pub manifests: Option<PathBuf>,

    /// Where the gRPC discovery APIs listen; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub grpc_addr: SocketAddr,

    /// Where `/live`, `/ready` and `/metrics` listen; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:9990")]
    pub admin_addr: SocketAddr,

    /// Where the admission webhooks listen over TLS (Kubernetes mode); port 0 picks a
    /// free port. Without it no webhook is served.
    #[arg(long, requires_all = ["admission_tls_cert", "admission_tls_key"])]
    pub admission_addr: Option<SocketAddr>,

    /// The webhooks' PEM certificate chain.
    #[arg(long)]
    pub admission_tls_cert: Option<PathBuf>,

    /// The webhooks' PEM private key.
    #[arg(long)]
    pub admission_tls_key: Option<PathBuf>,

    /// The sidecar injector's `config.json` (what it adds to a pod), as the chart's
    /// `kinference-proxy-config` ConfigMap mounts it.
    #[arg(long)]
    pub proxy_config: Option<PathBuf>,

    /// The Lease (in `POD_NAMESPACE`) that replicas compete for to write status.
    #[arg(long, default_value = "kinference-policy-controller")]
    pub lease_name: String,

    /// The cluster's DNS domain, in the Service authorities proxies ask about.
    #[arg(long, default_value = kinference_policy_core::target::CLUSTER_DOMAIN)]
    pub cluster_domain: String,

    /// This replica's pod name: its identity in the Lease (Kubernetes mode).
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,

    /// This replica's namespace: where its Lease lives (Kubernetes mode).
    #[arg(long, env = "POD_NAMESPACE")]
    pub pod_namespace: Option<String>,

    /// How long the manifest directory must be quiet before it is re-read.
    #[arg(long, default_value_t = 50)]
    pub debounce_ms: u64,

    /// Log format. The filter is `RUST_LOG` (default `info`).
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

/// Completes on SIGINT or SIGTERM (what the kubelet sends).
async fn termination() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for SIGTERM");
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// A shutdown signal every server can wait on.
#[derive(Clone, Debug)]
struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    fn signal(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|down| *down).await;
        }
    }
}

/// What Kubernetes mode needs beyond the common arguments.
#[derive(Debug)]
struct KubeArgs {
    pod_name: String,
    pod_namespace: String,
    admission: Option<(SocketAddr, PathBuf, PathBuf)>,
}

impl KubeArgs {
    fn from(args: &Args) -> anyhow::Result<Self> {
        let pod_name = args
            .pod_name
            .clone()
            .filter(|n| !n.is_empty())
            .context("Kubernetes mode (no --manifests) needs POD_NAME (or --pod-name)")?;
        let pod_namespace = args
            .pod_namespace
            .clone()
            .filter(|n| !n.is_empty())
            .context("Kubernetes mode (no --manifests) needs POD_NAMESPACE (or --pod-namespace)")?;
        let admission = match (
            args.admission_addr,
            &args.admission_tls_cert,
            &args.admission_tls_key,
        ) {
            (Some(addr), Some(cert), Some(key)) => Some((addr, cert.clone(), key.clone())),
            (None, _, _) => None,
            _ => bail!("--admission-addr needs --admission-tls-cert and --admission-tls-key"),
        };
        Ok(Self {
            pod_name,
            pod_namespace,
            admission,
        })
    }
}

/// Runs the controller until interrupted.
pub async fn run(args: Args) -> anyhow::Result<()> {
    init_logs(&args.log_format);
    let metrics = Metrics::new();
    let index = Index::shared();

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shutdown = Shutdown(shutdown_rx);
    tokio::spawn(async move {
        termination().await;
        tracing::info!("shutting down");
        let _ = shutdown_tx.send(true);
    });

    match args.manifests.clone() {
        Some(dir) => run_local(args, dir, metrics, index, shutdown).await,
        None => {
            let kube_args = KubeArgs::from(&args)?;
            run_kubernetes(args, kube_args, metrics, index, shutdown).await
        }
    }
}

/// Binds the gRPC and admin ports and starts the admin server.
async fn bind_servers(
    args: &Args,
    metrics: &Metrics,
    index: &SharedIndex,
) -> anyhow::Result<(TcpListener, SocketAddr, SocketAddr)> {
    let grpc = TcpListener::bind(args.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC to {}", args.grpc_addr))?;
    let admin = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding admin to {}", args.admin_addr))?;
    let grpc_addr = grpc.local_addr()?;
    let admin_addr = admin.local_addr()?;
    tokio::spawn(admin::serve(admin, metrics.clone(), index.clone()));
    Ok((grpc, grpc_addr, admin_addr))
}

fn grpc_config(args: &Args) -> kinference_policy_grpc::Config {
    kinference_policy_grpc::Config {
        cluster_domain: args.cluster_domain.clone(),
    }
}

async fn run_local(
    args: Args,
    dir: PathBuf,
    metrics: Metrics,
    index: SharedIndex,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let mut source = LocalSource::new(dir.clone(), index.clone(), metrics.clone());
    source.reload().context("reading the manifest directory")?;

    let (grpc, grpc_addr, admin_addr) = bind_servers(&args, &metrics, &index).await?;
    // The index holds the manifests and the gRPC port accepts: proxies may be served.
    metrics.set_ready();
    // A line tests and scripts read to find the ports.
    println!("kinference-policy-controller grpc={grpc_addr} admin={admin_addr}");
    tracing::info!(%grpc_addr, %admin_addr, manifests = %dir.display(), "serving");

    let debounce = Duration::from_millis(args.debounce_ms);
    let watch = tokio::spawn(source.watch(debounce));
    tokio::select! {
        res = kinference_policy_grpc::serve_with(grpc, index, metrics.grpc.clone(), grpc_config(&args), shutdown.signal()) => {
            res.context("gRPC server")?;
        }
        res = watch => {
            res.context("watch task")?.context("manifest watch")?;
        }
    }
    Ok(())
}

async fn run_kubernetes(
    args: Args,
    kube_args: KubeArgs,
    metrics: Metrics,
    index: SharedIndex,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("configuring the Kubernetes client (in-cluster, or KUBECONFIG)")?;

    // Load the webhook's identity before serving anything: a bad certificate is fatal.
    let webhook = match &kube_args.admission {
        Some((addr, cert, key)) => {
            let tls = kinference_policy_admission::load_tls(cert, key)
                .context("loading the admission webhook's TLS certificate")?;
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the admission webhook to {addr}"))?;
            Some((listener, tls))
        }
        None => None,
    };
    // The injector serves beside the validating webhook when the proxy defaults are
    // mounted; a missing or invalid file is fatal rather than injecting half a proxy.
    let injector = match &args.proxy_config {
        Some(path) => {
            let proxy = kinference_policy_admission::ProxyConfig::load(path)
                .context("loading the injector's proxy config")?;
            let config = kinference_policy_admission::InjectConfig {
                proxy,
                control_plane_namespace: kube_args.pod_namespace.clone(),
            };
            let events = kinference_policy_admission::KubeEventRecorder::new(
                client.clone(),
                Some(kube_args.pod_name.clone()),
            );
            Some(kinference_policy_admission::Injector::new(
                config,
                client.clone(),
                Arc::new(events),
            ))
        }
        None => None,
    };
    if injector.is_some() && webhook.is_none() {
        bail!("--proxy-config needs --admission-addr: the injector is a webhook");
    }

    let (grpc, grpc_addr, admin_addr) = bind_servers(&args, &metrics, &index).await?;
    let admission_addr = match &webhook {
        Some((listener, _)) => Some(listener.local_addr()?),
        None => None,
    };

    let lease = kinference_policy_k8s_watch::LeaseConfig::new(
        &kube_args.pod_namespace,
        &args.lease_name,
        &kube_args.pod_name,
    );
    let (synced_tx, mut synced) = watch::channel(false);
    let source = tokio::spawn(kinference_policy_k8s_watch::run_with_sync(
        client,
        index.clone(),
        kinference_policy_k8s_watch::Config::new(lease),
        synced_tx,
    ));
    let webhook = tokio::spawn({
        let shutdown = shutdown.signal();
        async move {
            match webhook {
                Some((listener, tls)) => {
                    kinference_policy_admission::serve_with_injector(
                        listener, tls, injector, shutdown,
                    )
                    .await
                }
                None => {
                    shutdown.await;
                    Ok(())
                }
            }
        }
    });

    let admission = admission_addr.map_or_else(|| "none".to_string(), |a| a.to_string());
    // A line tests and scripts read to find the ports.
    println!(
        "kinference-policy-controller grpc={grpc_addr} admin={admin_addr} admission={admission}"
    );
    tracing::info!(%grpc_addr, %admin_addr, %admission, pod = %kube_args.pod_name, namespace = %kube_args.pod_namespace, lease = %args.lease_name, "serving");

    // Ready once every kind has been listed: before that a proxy would be told that
    // policies and endpoints which exist do not.
    let ready = {
        let metrics = metrics.clone();
        async move {
            if synced.wait_for(|s| *s).await.is_ok() {
                metrics.set_ready();
                tracing::info!("ready");
            }
            std::future::pending::<()>().await;
        }
    };

    let serve = kinference_policy_grpc::serve_with(
        grpc,
        index,
        metrics.grpc.clone(),
        grpc_config(&args),
        shutdown.signal(),
    );
    tokio::select! {
        res = serve => res.context("gRPC server")?,
        res = source => match res.context("Kubernetes source task")? {
            Ok(()) => bail!("the Kubernetes source stopped"),
            Err(error) => return Err(error).context("Kubernetes source"),
        },
        res = webhook => res.context("admission webhook task")?.context("admission webhook")?,
        () = ready => {}
    }
    Ok(())
}
