//! The ready endpoints of a pool (or of a Service port) and their static facts.
//!
//! The proxy predicts time to first token per endpoint; what it cannot observe (which
//! pod, which model and LoRA adapters it serves, on which accelerator) comes from here.
//! Service backends (a route's plain `Service` backendRef, or a parent without routes)
//! are resolved too, from the Service's EndpointSlices as Linkerd's destination
//! controller does, so a proxy's discovery of such a backend converges instead of failing.

use crate::target::{ParentTarget, PoolRef};
use std::{collections::BTreeMap, net::SocketAddr};
use tokio::sync::watch;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub pod: Option<String>,
    /// The model the endpoint serves, from the `kinference.io/model` label.
    pub model: Option<String>,
    /// From the comma-separated `kinference.io/lora-adapters` label.
    pub lora_adapters: Vec<String>,
    /// From the `kinference.io/accelerator` label, e.g. `nvidia-h200`.
    pub accelerator: Option<String>,
    pub ready: bool,
}

/// The endpoint set of one pool or Service port. Only ready endpoints are listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolEndpoints {
    /// False when the pool (or the Service, or its port) is not known to the index.
    pub exists: bool,
    pub endpoints: BTreeMap<SocketAddr, Endpoint>,
    /// The signal-service shard the pool is assigned to (its `kinference.io/signals-shard`
    /// annotation; `None`: the default shard, and always for a Service port). The signal service
    /// serves a pool only on the shard that owns it, and stops when it moves.
    pub signals_shard: Option<crate::inference::SignalsShard>,
}

impl PoolEndpoints {
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }
}

/// Serves the endpoints of a pool or of a Service port.
pub trait DiscoverEndpoints {
    /// A receiver that always holds the current endpoints of `pool`.
    fn watch_endpoints(&self, pool: &PoolRef) -> Option<watch::Receiver<PoolEndpoints>>;

    /// A receiver that always holds the current endpoints of a Service port.
    fn watch_service_endpoints(
        &self,
        service: &ParentTarget,
    ) -> Option<watch::Receiver<PoolEndpoints>>;
}

/// What changed between two endpoint sets, as a Destination stream reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointsDiff {
    /// Endpoints that are new or whose facts changed.
    pub added: Vec<Endpoint>,
    pub removed: Vec<SocketAddr>,
}

impl EndpointsDiff {
    pub fn between(old: &PoolEndpoints, new: &PoolEndpoints) -> Self {
        let added = new
            .endpoints
            .iter()
            .filter(|(addr, ep)| old.endpoints.get(addr) != Some(ep))
            .map(|(_, ep)| ep.clone())
            .collect();
        let removed = old
            .endpoints
            .keys()
            .filter(|addr| !new.endpoints.contains_key(addr))
            .copied()
            .collect();
        Self { added, removed }
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(port: u16, model: &str) -> Endpoint {
        Endpoint {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            pod: Some(format!("pod-{port}")),
            model: Some(model.to_string()),
            lora_adapters: vec![],
            accelerator: None,
            ready: true,
        }
    }

    fn set(eps: &[Endpoint]) -> PoolEndpoints {
        PoolEndpoints {
            exists: true,
            endpoints: eps.iter().map(|e| (e.addr, e.clone())).collect(),
            signals_shard: None,
        }
    }

    #[test]
    fn diff_reports_additions_changes_and_removals() {
        let old = set(&[ep(8001, "a"), ep(8002, "a")]);
        let new = set(&[ep(8002, "b"), ep(8003, "a")]);
        let diff = EndpointsDiff::between(&old, &new);
        assert_eq!(diff.added, vec![ep(8002, "b"), ep(8003, "a")]);
        assert_eq!(diff.removed, vec![SocketAddr::from(([127, 0, 0, 1], 8001))]);
        assert!(EndpointsDiff::between(&new, &new).is_empty());
    }
}
