//! gRPC services over the policy core's discovery traits.
//!
//! One tonic server carries the stock Linkerd `OutboundPolicies` and `Destination` APIs
//! and Kinference's `InferencePolicies`. This crate only converts core values into wire
//! messages and streams them; what the values are is the index's business.

pub mod destination;
pub mod inference;
pub mod metrics;
pub mod outbound;

pub use self::metrics::GrpcMetrics;

use kinference_policy_core::{
    DiscoverEndpoints, DiscoverInferencePolicy, DiscoverOutboundPolicy, ParentTarget,
};
use std::{future::Future, net::SocketAddr};
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

/// How the server names things that depend on the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The cluster's DNS domain: Service authorities are
    /// `<name>.<namespace>.svc.<cluster_domain>:<port>`.
    pub cluster_domain: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_domain: kinference_policy_core::target::CLUSTER_DOMAIN.to_string(),
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
    let domain: std::sync::Arc<str> = config.cluster_domain.into();
    tonic::transport::Server::builder()
        .add_service(
            outbound::OutboundPolicyServer::new(discover.clone(), metrics.clone())
                .with_cluster_domain(domain.clone())
                .svc(),
        )
        .add_service(
            destination::DestinationServer::new(discover.clone(), metrics.clone())
                .with_cluster_domain(domain.clone())
                .svc(),
        )
        .add_service(
            inference::InferencePolicyServer::new(discover, metrics)
                .with_cluster_domain(domain)
                .svc(),
        )
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
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
