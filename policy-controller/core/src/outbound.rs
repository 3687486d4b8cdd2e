//! The outbound policy of a parent: its HTTP routes and their weighted backends.
//!
//! This is what the stock `OutboundPolicies` API serves; backends that are InferencePools
//! carry the pool identity so the proxy can join them with endpoint and inference
//! discovery.

use crate::target::{ParentTarget, PoolRef, ResourceRef};
use std::net::IpAddr;
use tokio::sync::watch;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboundPolicy {
    /// The Service and port.
    pub parent: ResourceRef,
    /// False when the parent Service is not known to the index.
    pub exists: bool,
    /// Routes attached to the parent, ordered by (creation, namespace, name) as the
    /// Gateway API orders them.
    pub routes: Vec<HttpRoute>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRoute {
    pub resource: ResourceRef,
    pub hostnames: Vec<String>,
    pub rules: Vec<HttpRouteRule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpRouteRule {
    /// Any may match; empty matches every request.
    pub matches: Vec<HttpRouteMatch>,
    pub backends: Vec<WeightedBackend>,
    pub request_timeout_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpRouteMatch {
    pub path: Option<PathMatch>,
    pub headers: Vec<HeaderMatch>,
    pub method: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderMatch {
    Exact { name: String, value: String },
    Regex { name: String, pattern: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
    Regex(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightedBackend {
    pub weight: u32,
    pub backend: Backend,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// An InferencePool, balanced over its endpoints.
    Pool(PoolRef),
    /// A plain Service, balanced over its endpoints.
    Service(ParentTarget),
    /// A reference the index cannot resolve; the proxy fails requests routed to it.
    Invalid {
        resource: ResourceRef,
        message: String,
    },
}

/// Serves outbound policy per parent, as Linkerd's `DiscoverOutboundPolicy` does.
pub trait DiscoverOutboundPolicy {
    /// A receiver that always holds the current policy of `target`; it changes whenever
    /// the index does. Returns `None` only when the target cannot be served at all.
    fn watch_outbound_policy(
        &self,
        target: &ParentTarget,
    ) -> Option<watch::Receiver<OutboundPolicy>>;

    /// Resolves an address (a Service's cluster IP and port) to the parent it names.
    fn lookup_ip(&self, ip: IpAddr, port: u16) -> Option<ParentTarget>;
}
