//! The stock Linkerd `Destination.Get` API over [`DiscoverEndpoints`].
//!
//! A pool's ready endpoints stream as `add`/`remove` deltas; static facts the proxy
//! needs for prediction (model, pool, pod, LoRA adapters, accelerator) ride in
//! `metric_labels`, so no stock message changes.
//!
//! A path that is a Service authority (`<name>.<namespace>.svc.<cluster domain>:<port>`,
//! what an OutboundPolicy names for a plain Service backend or a parent without routes)
//! streams that Service port's endpoints from its EndpointSlices, as Linkerd's
//! destination controller does; a Service that does not exist is `NoEndpoints { exists:
//! false }` on a stream that stays open, so the proxy learns when it appears instead of
//! retrying. Only a path that is neither is refused (`InvalidArgument`).

use crate::{
    GrpcMetrics,
    caller::{Callers, context_namespace},
    metrics::Tracked,
    outbound::DEFAULT_WEIGHT,
};
use futures::{StreamExt, stream};
use kinference_policy_core::{
    DiscoverEndpoints, Endpoint, ParentTarget, PoolEndpoints, PoolRef, endpoints::EndpointsDiff,
    target::POOL_PATH_SUFFIX,
};
use linkerd2_proxy_api::{
    destination::{self as api, destination_server},
    net,
};
use std::{collections::HashMap, pin::Pin};
use tokio::sync::watch;
use tokio_stream::Stream;

const API: &str = "destination";

/// `metric_labels` keys on each address.
pub mod labels {
    pub const MODEL: &str = "model";
    pub const POOL: &str = "inferencepool";
    /// On endpoints of a Service backend, instead of [`POOL`].
    pub const SERVICE: &str = "service";
    pub const NAMESPACE: &str = "namespace";
    pub const POD: &str = "pod";
    pub const LORA_ADAPTERS: &str = "lora_adapters";
    pub const ACCELERATOR: &str = "accelerator";
}

#[derive(Clone, Debug)]
pub struct DestinationServer<D> {
    discover: D,
    metrics: GrpcMetrics,
    cluster_domain: std::sync::Arc<str>,
    callers: Callers,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

impl<D: DiscoverEndpoints + Send + Sync + 'static> DestinationServer<D> {
    pub fn new(discover: D, metrics: GrpcMetrics) -> Self {
        Self {
            discover,
            metrics,
            cluster_domain: kinference_policy_core::target::CLUSTER_DOMAIN.into(),
            callers: Callers::Claimed,
        }
    }

    /// Whether callers are verified (mutual TLS) or taken at their word (plaintext).
    pub fn with_callers(mut self, callers: Callers) -> Self {
        self.callers = callers;
        self
    }

    /// Parses Service authorities in `cluster_domain` rather than `cluster.local`.
    pub fn with_cluster_domain(mut self, cluster_domain: std::sync::Arc<str>) -> Self {
        self.cluster_domain = cluster_domain;
        self
    }

    pub fn svc(self) -> destination_server::DestinationServer<Self> {
        destination_server::DestinationServer::new(self)
    }
}

#[tonic::async_trait]
impl<D: DiscoverEndpoints + Send + Sync + 'static> destination_server::Destination
    for DestinationServer<D>
{
    type GetStream = Tracked<BoxStream<api::Update>>;

    async fn get(
        &self,
        req: tonic::Request<api::GetDestination>,
    ) -> Result<tonic::Response<Self::GetStream>, tonic::Status> {
        let token = &req.get_ref().context_token;
        context_namespace(&req, self.callers, token, API, &self.metrics)?;
        let path = &req.get_ref().path;
        let (set, rx) = if let Some(pool) = PoolRef::from_destination_path(path) {
            let rx = self.discover.watch_endpoints(&pool);
            (SetLabels::pool(&pool), rx)
        } else if let Ok(svc) = ParentTarget::from_authority_in(path, &self.cluster_domain) {
            let rx = self.discover.watch_service_endpoints(&svc);
            (SetLabels::service(&svc), rx)
        } else {
            return Err(tonic::Status::invalid_argument(format!(
                "{path:?} is neither an InferencePool path \
                 (<pool>.<namespace>.{POOL_PATH_SUFFIX}) nor a Service authority \
                 (<service>.<namespace>.svc.{}:<port>)",
                self.cluster_domain
            )));
        };
        let rx = rx.ok_or_else(|| tonic::Status::not_found(path.clone()))?;
        Ok(tonic::Response::new(
            self.metrics.track(API, updates(set, rx)),
        ))
    }

    type GetProfileStream = BoxStream<api::DestinationProfile>;

    async fn get_profile(
        &self,
        _req: tonic::Request<api::GetDestination>,
    ) -> Result<tonic::Response<Self::GetProfileStream>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "profiles are served by OutboundPolicies",
        ))
    }
}

/// What every address of a set shares: the backend it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetLabels {
    /// `(key, value)` on the set's `metric_labels`.
    set: Vec<(&'static str, String)>,
    /// `(key, value)` on every address's `metric_labels`.
    addr: Vec<(&'static str, String)>,
}

impl SetLabels {
    pub fn pool(pool: &PoolRef) -> Self {
        Self {
            set: vec![
                (labels::NAMESPACE, pool.namespace.clone()),
                (labels::POOL, pool.name.clone()),
            ],
            addr: vec![(labels::POOL, pool.name.clone())],
        }
    }

    pub fn service(svc: &ParentTarget) -> Self {
        Self {
            set: vec![
                (labels::NAMESPACE, svc.namespace.clone()),
                (labels::SERVICE, svc.name.clone()),
            ],
            addr: vec![(labels::SERVICE, svc.name.clone())],
        }
    }
}

/// Streams the endpoints: the full set first, then deltas.
fn updates(set: SetLabels, rx: watch::Receiver<PoolEndpoints>) -> BoxStream<api::Update> {
    let state = (rx, None::<PoolEndpoints>);
    let s = stream::unfold(state, move |(mut rx, prev)| {
        let set = set.clone();
        async move {
            if prev.is_some() && rx.changed().await.is_err() {
                return None;
            }
            let current = rx.borrow_and_update().clone();
            let msgs = diff_updates_for(&set, prev.as_ref(), &current);
            Some((msgs, (rx, Some(current))))
        }
    });
    Box::pin(s.flat_map(|msgs| stream::iter(msgs.into_iter().map(Ok))))
}

/// The messages that take a proxy from `prev` (nothing, on the first message) to `next`.
pub fn diff_updates(
    pool: &PoolRef,
    prev: Option<&PoolEndpoints>,
    next: &PoolEndpoints,
) -> Vec<api::Update> {
    diff_updates_for(&SetLabels::pool(pool), prev, next)
}

/// As [`diff_updates`], for any backend's set.
pub fn diff_updates_for(
    pool: &SetLabels,
    prev: Option<&PoolEndpoints>,
    next: &PoolEndpoints,
) -> Vec<api::Update> {
    let no_endpoints = || api::Update {
        update: Some(api::update::Update::NoEndpoints(api::NoEndpoints {
            exists: next.exists,
        })),
    };
    let Some(prev) = prev else {
        if next.is_empty() {
            return vec![no_endpoints()];
        }
        return vec![add(pool, next.endpoints.values())];
    };
    if next.is_empty() {
        if prev.is_empty() && prev.exists == next.exists {
            return vec![];
        }
        return vec![no_endpoints()];
    }
    let diff = EndpointsDiff::between(prev, next);
    let mut msgs = Vec::new();
    if !diff.removed.is_empty() {
        msgs.push(api::Update {
            update: Some(api::update::Update::Remove(api::AddrSet {
                addrs: diff
                    .removed
                    .iter()
                    .map(|a| net::TcpAddress::from(*a))
                    .collect(),
            })),
        });
    }
    if !diff.added.is_empty() {
        msgs.push(add(pool, diff.added.iter()));
    }
    msgs
}

fn add<'a>(set: &SetLabels, eps: impl Iterator<Item = &'a Endpoint>) -> api::Update {
    let set_labels = set
        .set
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    api::Update {
        update: Some(api::update::Update::Add(api::WeightedAddrSet {
            addrs: eps.map(|ep| weighted_addr_for(set, ep)).collect(),
            metric_labels: set_labels,
        })),
    }
}

/// One endpoint with its static facts in `metric_labels`.
pub fn weighted_addr(pool: &PoolRef, ep: &Endpoint) -> api::WeightedAddr {
    weighted_addr_for(&SetLabels::pool(pool), ep)
}

fn weighted_addr_for(set: &SetLabels, ep: &Endpoint) -> api::WeightedAddr {
    let mut labels: HashMap<String, String> = set
        .addr
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    if let Some(model) = &ep.model {
        labels.insert(labels::MODEL.into(), model.clone());
    }
    if let Some(pod) = &ep.pod {
        labels.insert(labels::POD.into(), pod.clone());
    }
    if !ep.lora_adapters.is_empty() {
        labels.insert(labels::LORA_ADAPTERS.into(), ep.lora_adapters.join(","));
    }
    if let Some(acc) = &ep.accelerator {
        labels.insert(labels::ACCELERATOR.into(), acc.clone());
    }
    api::WeightedAddr {
        addr: Some(ep.addr.into()),
        weight: DEFAULT_WEIGHT,
        metric_labels: labels,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn ep(port: u16) -> Endpoint {
        Endpoint {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            pod: Some(format!("pod-{port}")),
            model: Some("glm-5.3".into()),
            lora_adapters: vec!["sql".into(), "chat".into()],
            accelerator: Some("nvidia-h200".into()),
            ready: true,
        }
    }

    fn set(ports: &[u16]) -> PoolEndpoints {
        PoolEndpoints {
            exists: true,
            endpoints: ports.iter().map(|p| (ep(*p).addr, ep(*p))).collect(),
            signals_shard: None,
        }
    }

    fn pool() -> PoolRef {
        PoolRef::new("default", "glm-5.3")
    }

    #[test]
    fn first_update_adds_everything_with_facts_in_labels() {
        let msgs = diff_updates(&pool(), None, &set(&[8001, 8002]));
        assert_eq!(msgs.len(), 1);
        let Some(api::update::Update::Add(add)) = &msgs[0].update else {
            panic!("expected add, got {msgs:?}");
        };
        assert_eq!(add.addrs.len(), 2);
        assert_eq!(add.metric_labels["inferencepool"], "glm-5.3");
        assert_eq!(add.metric_labels["namespace"], "default");
        let a = &add.addrs[0];
        assert_eq!(a.addr, Some(net::TcpAddress::from(ep(8001).addr)));
        assert_eq!(a.weight, DEFAULT_WEIGHT);
        assert_eq!(a.metric_labels["model"], "glm-5.3");
        assert_eq!(a.metric_labels["pod"], "pod-8001");
        assert_eq!(a.metric_labels["lora_adapters"], "sql,chat");
        assert_eq!(a.metric_labels["accelerator"], "nvidia-h200");
    }

    #[test]
    fn changes_are_removes_then_adds() {
        let msgs = diff_updates(&pool(), Some(&set(&[8001, 8002])), &set(&[8002, 8003]));
        assert_eq!(msgs.len(), 2);
        let Some(api::update::Update::Remove(rm)) = &msgs[0].update else {
            panic!("expected remove, got {msgs:?}");
        };
        assert_eq!(rm.addrs, vec![net::TcpAddress::from(ep(8001).addr)]);
        let Some(api::update::Update::Add(add)) = &msgs[1].update else {
            panic!("expected add, got {msgs:?}");
        };
        assert_eq!(add.addrs.len(), 1);
        assert_eq!(
            add.addrs[0].addr,
            Some(net::TcpAddress::from(ep(8003).addr))
        );
        assert!(diff_updates(&pool(), Some(&set(&[8001])), &set(&[8001])).is_empty());
    }

    #[test]
    fn empty_sets_are_no_endpoints_with_existence() {
        let none = |exists| api::Update {
            update: Some(api::update::Update::NoEndpoints(api::NoEndpoints {
                exists,
            })),
        };
        let empty = PoolEndpoints {
            exists: true,
            endpoints: Default::default(),
            signals_shard: None,
        };
        assert_eq!(diff_updates(&pool(), None, &empty), vec![none(true)]);
        assert_eq!(
            diff_updates(&pool(), None, &PoolEndpoints::default()),
            vec![none(false)]
        );
        assert_eq!(
            diff_updates(&pool(), Some(&set(&[8001])), &empty),
            vec![none(true)]
        );
        assert!(diff_updates(&pool(), Some(&empty), &empty).is_empty());
        assert_eq!(
            diff_updates(&pool(), Some(&empty), &PoolEndpoints::default()),
            vec![none(false)]
        );
    }
}
