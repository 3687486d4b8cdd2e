//! gRPC services over the policy core's discovery traits.
//!
//! One tonic server carries the stock Linkerd `OutboundPolicies` and `Destination` APIs
//! and Kinference's `InferencePolicies`. This crate only converts core values into wire
//! messages and streams them; what the values are is the index's business.
//!
//! [`serve_with`] serves plaintext (local mode), taking each request's word for its caller;
//! [`serve_tls`] serves mutual TLS only, and each request is served for the verified identity of
//! its connection ([`caller`]).

pub mod caller;
pub mod destination;
pub mod inference;
pub mod metrics;
pub mod outbound;

pub use self::{caller::Callers, metrics::GrpcMetrics};

use kinference_policy_core::{
    DiscoverEndpoints, DiscoverInferencePolicy, DiscoverOutboundPolicy, ParentTarget,
};
use std::{future::Future, net::SocketAddr, sync::Arc};
use tokio::net::TcpListener;

/// Everything the server needs to discover.
pub trait Discover:
    DiscoverOutboundPolicy + DiscoverEndpoints + DiscoverInferencePolicy + Clone + Send + Sync + 'static
{
}

impl<T> Discover for T where
    T: DiscoverOutboundPolicy
        + DiscoverEndpoints
        + DiscoverInferencePolicy
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// How the server names things that depend on the cluster, and where proxies' reports go.
#[derive(Clone, Debug)]
pub struct Config {
    /// The cluster's DNS domain: Service authorities are
    /// `<name>.<namespace>.svc.<cluster_domain>:<port>`.
    pub cluster_domain: String,
    /// Where `InferencePolicies.ReportGuards` puts the proxies' quality-guard reports.
    pub guards: Arc<kinference_policy_core::guard::GuardReports>,
    /// Where `InferencePolicies.ReportRollout` puts the proxies' rollout reports.
    pub rollouts: Arc<kinference_policy_core::rollout::judge::Rollouts>,
    /// Where each signal shard is reached (`InferencePolicies` names a sharded pool's addresses).
    pub signals_shards: Arc<kinference_policy_core::inference::SignalsShardAddrs>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_domain: kinference_policy_core::target::CLUSTER_DOMAIN.to_string(),
            guards: Arc::default(),
            rollouts: Arc::default(),
            signals_shards: Arc::default(),
        }
    }
}

/// Serves the three APIs on `listener` until `shutdown` completes.
pub async fn serve<D: Discover>(
    listener: TcpListener,
    discover: D,
    metrics: GrpcMetrics,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with(listener, discover, metrics, Config::default(), shutdown).await
}

/// As [`serve`], with a [`Config`].
pub async fn serve_with<D: Discover>(
    listener: TcpListener,
    discover: D,
    metrics: GrpcMetrics,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    router(discover, metrics, config, Callers::Claimed)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// As [`serve_with`], over mutual TLS with `tls` (which must require client certificates, as
/// [`kinference_identity::tls::mutual_server_config`]'s does): a client without a workload
/// certificate from the trust anchors never completes a handshake, and each request is served
/// for its connection's verified identity.
pub async fn serve_tls<D: Discover>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    discover: D,
    metrics: GrpcMetrics,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = kinference_identity::accept::incoming(
        listener,
        tls,
        kinference_identity::accept::ClientAuth::Workload,
        "grpc",
    );
    router(discover, metrics, config, Callers::Verified)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// The three services on one tonic router.
fn router<D: Discover>(
    discover: D,
    metrics: GrpcMetrics,
    config: Config,
    callers: Callers,
) -> tonic::transport::server::Router {
    let domain: Arc<str> = config.cluster_domain.clone().into();
    tonic::transport::Server::builder()
        .add_service(
            outbound::OutboundPolicyServer::new(discover.clone(), metrics.clone())
                .with_cluster_domain(domain.clone())
                .with_callers(callers)
                .svc(),
        )
        .add_service(
            destination::DestinationServer::new(discover.clone(), metrics.clone())
                .with_cluster_domain(domain.clone())
                .with_callers(callers)
                .svc(),
        )
        .add_service(
            inference::InferencePolicyServer::new(discover, metrics)
                .with_cluster_domain(domain)
                .with_guard_reports(config.guards)
                .with_rollouts(config.rollouts)
                .with_signals_shards(config.signals_shards)
                .with_callers(callers)
                .svc(),
        )
}

/// Resolves a linkerd-style target (an authority or an address) to a parent.
pub(crate) fn resolve_target<D: DiscoverOutboundPolicy>(
    discover: &D,
    cluster_domain: &str,
    authority: Option<&str>,
    addr: Option<SocketAddr>,
) -> Result<ParentTarget, tonic::Status> {
    match (authority, addr) {
        (Some(authority), _) => ParentTarget::from_authority_in(authority, cluster_domain)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string())),
        (None, Some(addr)) => discover.lookup_ip(addr.ip(), addr.port()).ok_or_else(|| {
            tonic::Status::not_found(format!("no Service has cluster IP and port {addr}"))
        }),
        (None, None) => Err(tonic::Status::invalid_argument("target is required")),
    }
}
