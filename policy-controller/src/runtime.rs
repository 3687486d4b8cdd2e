//! Command-line arguments and the wiring of sources, index and servers.
//!
//! Two modes share one index and one set of servers: with `--manifests` the index is fed
//! from a directory (running without a cluster); without it the controller runs in a
//! cluster, watching the API server, electing a status writer through a Lease, and
//! serving the admission webhooks over TLS.
//!
//! With an identity issuer (`--identity-issuer-cert`, `--identity-issuer-key`,
//! `--identity-trust-anchors`, Kubernetes mode only; the chart does not set them yet: the proxy
//! does not certify itself yet, and would then read no policy) the gRPC discovery APIs and the engine-signals service (`--signals-addr`) are served over mutual TLS
//! only (one configuration: the controller's serving certificate, a client certificate from the
//! trust anchors required), and the issuer (`Identity.Certify`) listens on `--identity-addr`.
//! Without one (local mode) both are plaintext and unauthenticated, and the controller says so on
//! stdout (`tls=off`, which covers `signals=` too) and in its log.

use crate::{admin, manifests::ManifestSource, metrics::Metrics};
use anyhow::{Context as _, bail};
use clap::Parser;
use kinference_policy_core::{guard::GuardReports, rollout::judge::Rollouts};
use kinference_policy_k8s_index::{Index, SharedIndex};
use std::{future::Future, net::SocketAddr, path::PathBuf, pin::Pin, sync::Arc, time::Duration};
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

    /// The identity issuer's PEM certificate: with its key and the trust anchors, gRPC is served
    /// over mutual TLS and the issuer signs proxies' certificates (Kubernetes mode).
    #[arg(long, requires_all = ["identity_issuer_key", "identity_trust_anchors"])]
    pub identity_issuer_cert: Option<PathBuf>,

    /// The identity issuer's PEM private key (PKCS#8, or PKCS#1 RSA).
    #[arg(long, requires = "identity_issuer_cert")]
    pub identity_issuer_key: Option<PathBuf>,

    /// The PEM trust anchors proxies and the controller verify each other with.
    #[arg(long, requires = "identity_issuer_cert")]
    pub identity_trust_anchors: Option<PathBuf>,

    /// Where the identity issuer (`io.linkerd.proxy.identity.Identity`) listens over TLS; port 0
    /// picks a free port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub identity_addr: SocketAddr,

    /// The SPIFFE trust domain of workload identities.
    #[arg(long, default_value = "cluster.local")]
    pub identity_trust_domain: String,

    /// How long issued certificates (proxies' and the controller's own) are valid: `90s`, `1h`,
    /// `24h`. Each is refreshed at 70% of its lifetime.
    #[arg(long, default_value = "24h", value_parser = kinference_policy_admission::inject::annotations::parse_duration)]
    pub identity_cert_lifetime: Duration,

    /// A DNS name (or IP address) of the controller's serving certificate, repeatable; by default
    /// its Service's names, `<service>.<POD_NAMESPACE>.svc[.<cluster domain>]`.
    #[arg(long = "identity-server-name")]
    pub identity_server_names: Vec<String>,

    /// The controller's Service, whose names its serving certificate carries by default.
    #[arg(long, default_value = "kinference-policy-controller")]
    pub service_name: String,

    /// Where the engine-signals service (`EngineSignals.Watch`) listens; port 0 picks a free port.
    /// Without it no signal service runs and sidecars scrape engines themselves. Served as the
    /// gRPC discovery APIs are: over mutual TLS with an identity issuer, else plaintext.
    #[arg(long)]
    pub signals_addr: Option<SocketAddr>,

    /// How often the signal service scrapes each endpoint of a watched pool, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub signals_interval_ms: u64,

    /// How often the signal service reads each endpoint's `GET /load`, in milliseconds: apart from
    /// the metrics and more often, because it is one counter, cheap for the engine to serve, and
    /// the first signal to show a new request (docs/signals.md, "Freshness").
    #[arg(long, default_value_t = 10)]
    pub signals_load_interval_ms: u64,

    /// How old a sidecar's copy of an unchanged reading may grow before the signal service sends
    /// it again, in milliseconds (the router's freshness budget is 500 ms).
    #[arg(long, default_value_t = 100)]
    pub signals_refresh_ms: u64,

    /// Each signal-service scrape's timeout, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub signals_timeout_ms: u64,

    /// The signal shard this replica's signal service serves (docs/signals.md, "Sharding"): only
    /// the InferencePools whose `kinference.io/signals-shard` annotation names it; a watch of
    /// another pool is refused (FAILED_PRECONDITION). Without it, the pools without the
    /// annotation (the default shard).
    #[arg(long, env = "KINFERENCE_SIGNALS_SHARD", requires = "signals_addr")]
    pub signals_shard: Option<kinference_policy_core::inference::SignalsShard>,

    /// Where proxies reach a signal shard, `SHARD=URI[,URI...]` (e.g.
    /// `a=http://kinference-signals-a.kinference.svc.cluster.local:8092`), repeatable: the policy
    /// of a pool on that shard names these addresses, so proxies need no per-shard flags. A pool
    /// on a shard not named here is served with no address (its proxies read its engines).
    #[arg(long = "signals-shard-addr")]
    pub signals_shard_addrs: Vec<String>,

    /// The controller replicas' admin port, `host:port` resolving to every replica (in
    /// Kubernetes, the controller's headless Service), or several `host:port` separated by
    /// commas. Each replica judges its own proxies'
    /// rollout reports plus its peers' window sums, fetched every judge interval, so every
    /// replica judges all the traffic (docs/rollout.md, "Several replicas").
    #[arg(long, env = "KINFERENCE_ROLLOUT_PEERS")]
    pub rollout_peers: Option<String>,

    /// How often the rollout loop judges each running rollout's window, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub rollout_judge_interval_ms: u64,

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

/// The control plane's identity: the issuer, and the serving credentials it keeps current.
struct Identity {
    issuer: Arc<kinference_identity::issuer::Issuer>,
    credentials: Arc<kinference_identity::Credentials>,
    renew: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Identity {
    /// The mutual-TLS configuration of every listener proxies call with their certificate (the
    /// gRPC discovery APIs and the signal service): the controller's serving certificate, and a
    /// client certificate from the trust anchors required.
    fn mutual_tls(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let roots = kinference_identity::tls::roots(self.issuer.anchors())
            .context("the identity trust anchors")?;
        kinference_identity::tls::mutual_server_config(roots, self.credentials.clone())
            .context("the gRPC servers' mutual TLS configuration")
    }

    /// Loads the issuer and issues the serving certificate; `None` without issuer flags.
    async fn load(args: &Args, namespace: &str) -> anyhow::Result<Option<Self>> {
        let (Some(cert), Some(key), Some(anchors)) = (
            &args.identity_issuer_cert,
            &args.identity_issuer_key,
            &args.identity_trust_anchors,
        ) else {
            return Ok(None);
        };
        let read =
            |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let issuer = kinference_identity::issuer::Issuer::from_pem(
            &read(cert)?,
            &read(key)?,
            &read(anchors)?,
            &args.identity_trust_domain,
        )
        .context("loading the identity issuer")?;
        let issuer = Arc::new(issuer);
        let names = if args.identity_server_names.is_empty() {
            let svc = format!("{}.{namespace}.svc", args.service_name);
            vec![svc.clone(), format!("{svc}.{}", args.cluster_domain)]
        } else {
            args.identity_server_names.clone()
        };
        let credentials = kinference_identity::Credentials::new();
        let renew = kinference_identity::service::serve_certificate(
            issuer.clone(),
            names,
            None,
            args.identity_cert_lifetime,
            credentials.clone(),
        )
        .await
        .context("issuing the controller's serving certificate")?;
        Ok(Some(Self {
            issuer,
            credentials,
            renew: Box::pin(renew),
        }))
    }
}

/// The gRPC server, plaintext or mutual TLS.
type GrpcServe = Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// Says, on stdout's line and in the log, that gRPC is plaintext.
const PLAINTEXT: &str = "gRPC is plaintext and unauthenticated: any process that reaches it reads every target's policy and names its own source_workload (local mode; in a cluster, give the controller an identity issuer)";

/// Says, in the log, that the signal service is plaintext (stdout's line says `tls=off`).
const SIGNALS_PLAINTEXT: &str = "the signal service is plaintext and unauthenticated: any process that reaches it watches every pool's engine readings and relays notices to its sidecars (local mode; in a cluster, give the controller an identity issuer)";

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

    // The proxies' quality-guard reports: the gRPC server fills it, admin and status read it.
    let guards = Arc::new(GuardReports::default());
    // The proxies' rollout reports and the loop's outcomes: the gRPC server fills the windows,
    // the loop judges them, the status writer and admin read the outcomes.
    let reports = Reports {
        guards,
        rollouts: Arc::new(Rollouts::default()),
    };
    spawn_rollout_loop(&args, &metrics, &index, &reports.rollouts);
    match args.manifests.clone() {
        Some(dir) => run_manifests(args, dir, metrics, index, reports, shutdown).await,
        None => {
            let kube_args = KubeArgs::from(&args)?;
            run_kubernetes(args, kube_args, metrics, index, reports, shutdown).await
        }
    }
}

/// What the proxies report, shared by the gRPC server, the loops, status and admin.
#[derive(Clone, Debug)]
struct Reports {
    guards: Arc<GuardReports>,
    rollouts: Arc<Rollouts>,
}

/// Judges every running rollout every `--rollout-judge-interval-ms`: a cohort past a threshold
/// is moved back to the control policy (the index stops serving the rollout), counted and logged.
fn spawn_rollout_loop(
    args: &Args,
    metrics: &Metrics,
    index: &SharedIndex,
    rollouts: &Arc<Rollouts>,
) {
    let every = Duration::from_millis(args.rollout_judge_interval_ms.max(10));
    if let Some(peers) = &args.rollout_peers {
        tokio::spawn(crate::peers::run(
            peers.clone(),
            replica_id(args).to_string(),
            rollouts.clone(),
            every,
            metrics.rollout.peer_fetches.clone(),
        ));
    }
    let metrics = metrics.rollout.clone();
    tokio::spawn(kinference_policy_core::rollout::judge::run(
        rollouts.clone(),
        index.clone(),
        every,
        move |rb| {
            metrics.rolled_back(rb);
            tracing::warn!(rollout = %rb.key, threshold = rb.crossed.threshold.as_str(), message = %rb.message, "rolled the cohort back");
        },
    ));
}

/// This replica's identity among its peers: its pod's name, else a random one (manifest mode,
/// where no pod names it), drawn once per process.
fn replica_id(args: &Args) -> Arc<str> {
    static RANDOM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    match &args.pod_name {
        Some(name) => Arc::from(name.as_str()),
        None => Arc::from(
            RANDOM
                .get_or_init(|| {
                    use std::hash::{BuildHasher, Hasher};
                    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                    h.write_u32(std::process::id());
                    format!("controller-{:016x}", h.finish())
                })
                .as_str(),
        ),
    }
}

/// Binds the gRPC and admin ports and starts the admin server.
async fn bind_servers(
    args: &Args,
    metrics: &Metrics,
    index: &SharedIndex,
    reports: &Reports,
) -> anyhow::Result<(TcpListener, SocketAddr, SocketAddr)> {
    let grpc = TcpListener::bind(args.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC to {}", args.grpc_addr))?;
    let admin = TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding admin to {}", args.admin_addr))?;
    let grpc_addr = grpc.local_addr()?;
    let admin_addr = admin.local_addr()?;
    tokio::spawn(admin::serve(
        admin,
        metrics.clone(),
        index.clone(),
        reports.guards.clone(),
        reports.rollouts.clone(),
        replica_id(args),
    ));
    Ok((grpc, grpc_addr, admin_addr))
}

/// Starts the engine-signals service where `--signals-addr` says, over mutual TLS with `tls` (the
/// controller's identity) or plaintext without; its bound address, if any.
async fn spawn_signals(
    args: &Args,
    metrics: &Metrics,
    index: &SharedIndex,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: &Shutdown,
) -> anyhow::Result<Option<SocketAddr>> {
    let Some(addr) = args.signals_addr else {
        return Ok(None);
    };
    let hub = kinference_policy_signals::Hub::sharded(
        index.clone(),
        kinference_policy_signals::HttpProbe::new(Duration::from_millis(args.signals_timeout_ms)),
        kinference_policy_signals::HubConfig {
            interval: Duration::from_millis(args.signals_interval_ms.max(1)),
            load_interval: Duration::from_millis(args.signals_load_interval_ms.max(1)),
            refresh: Duration::from_millis(args.signals_refresh_ms),
        },
        metrics.signals.clone(),
        args.signals_shard.clone(),
    );
    let server = kinference_policy_signals::SignalsServer::new(hub);
    let mtls = tls.is_some();
    let bound: std::io::Result<(SocketAddr, GrpcServe)> = match tls {
        Some(tls) => server
            .bind_tls(addr, tls, shutdown.signal())
            .await
            .map(|(a, serve)| (a, Box::pin(serve) as GrpcServe)),
        None => server
            .bind(addr, shutdown.signal())
            .await
            .map(|(a, serve)| (a, Box::pin(serve) as GrpcServe)),
    };
    let (bound, serve) = bound.with_context(|| format!("binding the signal service to {addr}"))?;
    tokio::spawn(async move {
        if let Err(error) = serve.await {
            tracing::error!(%error, "the signal service stopped");
        }
    });
    tracing::info!(
        signals_addr = %bound,
        shard = kinference_policy_core::inference::SignalsShard::display(args.signals_shard.as_ref()),
        tls = if mtls { "mtls" } else { "off" },
        "serving engine signals"
    );
    if !mtls {
        tracing::warn!(signals_addr = %bound, "{SIGNALS_PLAINTEXT}");
    }
    Ok(Some(bound))
}

/// ` signals=ADDR` on the startup line when the signal service runs.
fn signals_field(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(String::new, |a| format!(" signals={a}"))
}

fn grpc_config(args: &Args, reports: &Reports) -> anyhow::Result<kinference_policy_grpc::Config> {
    let shards =
        kinference_policy_core::inference::SignalsShardAddrs::parse(&args.signals_shard_addrs)
            .map_err(|e| anyhow::anyhow!("--signals-shard-addr: {e}"))?;
    Ok(kinference_policy_grpc::Config {
        cluster_domain: args.cluster_domain.clone(),
        guards: reports.guards.clone(),
        rollouts: reports.rollouts.clone(),
        signals_shards: Arc::new(shards),
    })
}

async fn run_manifests(
    args: Args,
    dir: PathBuf,
    metrics: Metrics,
    index: SharedIndex,
    reports: Reports,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    if args.identity_issuer_cert.is_some() {
        bail!(
            "an identity issuer needs Kubernetes mode: proxies' tokens are reviewed by the API server"
        );
    }
    let grpc_config = grpc_config(&args, &reports)?;
    let mut source = ManifestSource::new(dir.clone(), index.clone(), metrics.clone());
    source.reload().context("reading the manifest directory")?;

    let (grpc, grpc_addr, admin_addr) = bind_servers(&args, &metrics, &index, &reports).await?;
    let signals = spawn_signals(&args, &metrics, &index, None, &shutdown).await?;
    // The index holds the manifests and the gRPC port accepts: proxies may be served.
    metrics.set_ready();
    // A line tests and scripts read to find the ports.
    println!(
        "kinference-policy-controller grpc={grpc_addr} admin={admin_addr} tls=off{}",
        signals_field(signals)
    );
    tracing::info!(%grpc_addr, %admin_addr, manifests = %dir.display(), "serving");
    tracing::warn!(%grpc_addr, "{PLAINTEXT}");

    let debounce = Duration::from_millis(args.debounce_ms);
    let watch = tokio::spawn(source.watch(debounce));
    tokio::select! {
        res = kinference_policy_grpc::serve_with(grpc, index, metrics.grpc.clone(), grpc_config, shutdown.signal()) => {
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
    reports: Reports,
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

    let identity = Identity::load(&args, &kube_args.pod_namespace).await?;
    let identity_listener = match &identity {
        Some(_) => Some(
            TcpListener::bind(args.identity_addr)
                .await
                .with_context(|| {
                    format!("binding the identity issuer to {}", args.identity_addr)
                })?,
        ),
        None => None,
    };

    let (grpc, grpc_addr, admin_addr) = bind_servers(&args, &metrics, &index, &reports).await?;
    // One mutual-TLS configuration for the gRPC discovery APIs and the signal service.
    let mtls = identity.as_ref().map(Identity::mutual_tls).transpose()?;
    let signals = spawn_signals(&args, &metrics, &index, mtls.clone(), &shutdown).await?;
    let admission_addr = match &webhook {
        Some((listener, _)) => Some(listener.local_addr()?),
        None => None,
    };

    let identity_addr = match &identity_listener {
        Some(l) => Some(l.local_addr()?),
        None => None,
    };
    let (serve, tls): (GrpcServe, &str) = match identity.zip(mtls) {
        Some((identity, grpc_tls)) => {
            let issuer_tls = kinference_identity::tls::server_config(identity.credentials.clone())
                .context("the identity issuer's TLS configuration")?;
            let service = kinference_identity::service::IdentityService::new(
                identity.issuer.clone(),
                kinference_identity::review::TokenReviewer::new(
                    client.clone(),
                    kinference_identity::TOKEN_AUDIENCE,
                ),
                args.identity_cert_lifetime,
                metrics.grpc.identity.clone(),
            );
            tokio::spawn(identity.renew);
            if let Some(listener) = identity_listener {
                let shutdown = shutdown.signal();
                tokio::spawn(async move {
                    if let Err(error) =
                        kinference_identity::service::serve(listener, issuer_tls, service, shutdown)
                            .await
                    {
                        tracing::error!(%error, "the identity issuer stopped");
                    }
                });
            }
            let serve = kinference_policy_grpc::serve_tls(
                grpc,
                grpc_tls,
                index.clone(),
                metrics.grpc.clone(),
                grpc_config(&args, &reports)?,
                shutdown.signal(),
            );
            (Box::pin(serve) as GrpcServe, "mtls")
        }
        None => {
            tracing::warn!(%grpc_addr, "{PLAINTEXT}");
            let serve = kinference_policy_grpc::serve_with(
                grpc,
                index.clone(),
                metrics.grpc.clone(),
                grpc_config(&args, &reports)?,
                shutdown.signal(),
            );
            (Box::pin(serve) as GrpcServe, "off")
        }
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
        kinference_policy_k8s_watch::Config {
            guards: reports.guards.clone(),
            rollouts: reports.rollouts.clone(),
            ..kinference_policy_k8s_watch::Config::new(lease)
        },
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
    let identity = identity_addr.map_or_else(|| "none".to_string(), |a| a.to_string());
    // A line tests and scripts read to find the ports.
    println!(
        "kinference-policy-controller grpc={grpc_addr} admin={admin_addr} admission={admission} identity={identity} tls={tls}{}",
        signals_field(signals)
    );
    tracing::info!(%grpc_addr, %admin_addr, %admission, %identity, tls, pod = %kube_args.pod_name, namespace = %kube_args.pod_namespace, lease = %args.lease_name, "serving");

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
