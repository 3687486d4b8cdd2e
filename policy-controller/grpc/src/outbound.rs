//! The stock Linkerd `OutboundPolicies` API over [`DiscoverOutboundPolicy`].
//!
//! Routes and backends are sent as stock messages so a stock proxy reads them; a
//! backend that is an InferencePool is a P2C balancer whose discovery path is the
//! pool's Destination path, the key the inference policy also uses.

use crate::{
    GrpcMetrics,
    caller::{Callers, source_workload},
    metrics::Tracked,
    resolve_target,
};
use futures::StreamExt;
use kinference_policy_core::{
    DiscoverOutboundPolicy, OutboundPolicy, ParentTarget, ResourceRef,
    outbound::{
        Backend, HeaderMatch, HttpRoute, HttpRouteMatch, HttpRouteRule, PathMatch, WeightedBackend,
    },
};
use linkerd2_proxy_api::{
    http_route as api_route, meta,
    outbound::{
        self as api, backend, http_route, outbound_policies_server, proxy_protocol, traffic_spec,
    },
};
use std::{pin::Pin, time::Duration};
use tokio_stream::{Stream, wrappers::WatchStream};

const API: &str = "outbound";

/// How long a proxy waits to detect the protocol before treating a connection as opaque.
const DETECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Peak-EWMA defaults, as Linkerd's controller sends them.
const DEFAULT_RTT: Duration = Duration::from_millis(30);
const EWMA_DECAY: Duration = Duration::from_secs(10);
const QUEUE_CAPACITY: u32 = 100;
const QUEUE_FAILFAST: Duration = Duration::from_secs(3);
/// Linkerd's default endpoint weight.
pub const DEFAULT_WEIGHT: u32 = 10_000;

#[derive(Clone, Debug)]
pub struct OutboundPolicyServer<D> {
    discover: D,
    metrics: GrpcMetrics,
    cluster_domain: std::sync::Arc<str>,
    callers: Callers,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

impl<D: DiscoverOutboundPolicy + Send + Sync + 'static> OutboundPolicyServer<D> {
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

    /// Names Service authorities in `cluster_domain` rather than `cluster.local`.
    pub fn with_cluster_domain(mut self, cluster_domain: std::sync::Arc<str>) -> Self {
        self.cluster_domain = cluster_domain;
        self
    }

    pub fn svc(self) -> outbound_policies_server::OutboundPoliciesServer<Self> {
        outbound_policies_server::OutboundPoliciesServer::new(self)
    }

    fn target(&self, spec: &api::TrafficSpec) -> Result<ParentTarget, tonic::Status> {
        let (authority, addr) = match &spec.target {
            Some(traffic_spec::Target::Authority(a)) => (Some(a.as_str()), None),
            Some(traffic_spec::Target::Addr(addr)) => {
                let addr = std::net::SocketAddr::try_from(*addr).map_err(|e| {
                    tonic::Status::invalid_argument(format!("invalid address: {e}"))
                })?;
                (None, Some(addr))
            }
            None => (None, None),
        };
        resolve_target(&self.discover, &self.cluster_domain, authority, addr)
    }
}

#[tonic::async_trait]
impl<D: DiscoverOutboundPolicy + Send + Sync + 'static> outbound_policies_server::OutboundPolicies
    for OutboundPolicyServer<D>
{
    async fn get(
        &self,
        req: tonic::Request<api::TrafficSpec>,
    ) -> Result<tonic::Response<api::OutboundPolicy>, tonic::Status> {
        let claimed = &req.get_ref().source_workload;
        source_workload(&req, self.callers, claimed, API, &self.metrics)?;
        let target = self.target(req.get_ref())?;
        let rx = self
            .discover
            .watch_outbound_policy(&target)
            .ok_or_else(|| tonic::Status::not_found(target.authority_in(&self.cluster_domain)))?;
        let policy = to_proto_in(&rx.borrow(), &self.cluster_domain);
        Ok(tonic::Response::new(policy))
    }

    type WatchStream = Tracked<BoxStream<api::OutboundPolicy>>;

    async fn watch(
        &self,
        req: tonic::Request<api::TrafficSpec>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        let claimed = &req.get_ref().source_workload;
        source_workload(&req, self.callers, claimed, API, &self.metrics)?;
        let target = self.target(req.get_ref())?;
        let rx = self
            .discover
            .watch_outbound_policy(&target)
            .ok_or_else(|| tonic::Status::not_found(target.authority_in(&self.cluster_domain)))?;
        let domain = self.cluster_domain.clone();
        let stream: BoxStream<api::OutboundPolicy> =
            Box::pin(WatchStream::new(rx).map(move |p| Ok(to_proto_in(&p, &domain))));
        Ok(tonic::Response::new(self.metrics.track(API, stream)))
    }
}

pub(crate) fn resource_meta(r: &ResourceRef) -> meta::Metadata {
    meta::Metadata {
        kind: Some(meta::metadata::Kind::Resource(meta::Resource {
            group: r.group.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
            namespace: r.namespace.clone(),
            section: String::new(),
            port: r.port.map(u32::from).unwrap_or_default(),
        })),
    }
}

fn duration(d: Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}

/// Converts the core policy into the stock message, naming Services in `cluster.local`.
pub fn to_proto(policy: &OutboundPolicy) -> api::OutboundPolicy {
    to_proto_in(policy, kinference_policy_core::target::CLUSTER_DOMAIN)
}

/// Converts the core policy into the stock message, naming Services in `domain`.
pub fn to_proto_in(policy: &OutboundPolicy, domain: &str) -> api::OutboundPolicy {
    let routes = if policy.routes.is_empty() {
        vec![default_route(policy, domain)]
    } else {
        policy
            .routes
            .iter()
            .map(|r| route_to_proto(r, domain))
            .collect()
    };
    let opaque = proxy_protocol::Opaque {
        routes: vec![default_opaque_route(policy, domain)],
    };
    api::OutboundPolicy {
        metadata: Some(resource_meta(&policy.parent)),
        protocol: Some(api::ProxyProtocol {
            kind: Some(proxy_protocol::Kind::Detect(proxy_protocol::Detect {
                timeout: duration(DETECT_TIMEOUT),
                opaque: Some(opaque),
                http1: Some(proxy_protocol::Http1 {
                    routes: routes.clone(),
                    failure_accrual: None,
                }),
                http2: Some(proxy_protocol::Http2 {
                    routes,
                    failure_accrual: None,
                }),
            })),
        }),
    }
}

fn parent_backend(policy: &OutboundPolicy) -> Option<ParentTarget> {
    Some(ParentTarget {
        namespace: policy.parent.namespace.clone(),
        name: policy.parent.name.clone(),
        port: policy.parent.port?,
    })
}

/// With no routes, everything goes to the parent Service itself, as in Linkerd.
fn default_route(policy: &OutboundPolicy, domain: &str) -> api::HttpRoute {
    let backend = match parent_backend(policy) {
        Some(svc) => Backend::Service(svc),
        None => Backend::Invalid {
            resource: policy.parent.clone(),
            message: "parent has no port".into(),
        },
    };
    api::HttpRoute {
        metadata: Some(meta::Metadata {
            kind: Some(meta::metadata::Kind::Default("http".into())),
        }),
        hosts: vec![],
        rules: vec![rule_to_proto(
            &HttpRouteRule {
                matches: vec![HttpRouteMatch {
                    path: Some(PathMatch::Prefix("/".into())),
                    ..Default::default()
                }],
                backends: vec![WeightedBackend { weight: 1, backend }],
                request_timeout_ms: None,
            },
            domain,
        )],
    }
}

fn default_opaque_route(policy: &OutboundPolicy, domain: &str) -> api::OpaqueRoute {
    let backend =
        parent_backend(policy).map(|svc| backend_to_proto_in(&Backend::Service(svc), domain));
    api::OpaqueRoute {
        metadata: Some(meta::Metadata {
            kind: Some(meta::metadata::Kind::Default("opaq".into())),
        }),
        rules: vec![api::opaque_route::Rule {
            backends: Some(api::opaque_route::Distribution {
                kind: Some(api::opaque_route::distribution::Kind::FirstAvailable(
                    api::opaque_route::distribution::FirstAvailable {
                        backends: backend
                            .into_iter()
                            .map(|backend| api::opaque_route::RouteBackend {
                                backend: Some(backend),
                                filters: vec![],
                            })
                            .collect(),
                    },
                )),
            }),
            filters: vec![],
        }],
    }
}

fn route_to_proto(route: &HttpRoute, domain: &str) -> api::HttpRoute {
    api::HttpRoute {
        metadata: Some(resource_meta(&route.resource)),
        hosts: route.hostnames.iter().map(|h| host_match(h)).collect(),
        rules: route
            .rules
            .iter()
            .map(|r| rule_to_proto(r, domain))
            .collect(),
    }
}

fn host_match(host: &str) -> api_route::HostMatch {
    let m = match host.strip_prefix("*.") {
        Some(suffix) => api_route::host_match::Match::Suffix(api_route::host_match::Suffix {
            reverse_labels: suffix.split('.').rev().map(str::to_string).collect(),
        }),
        None => api_route::host_match::Match::Exact(host.to_string()),
    };
    api_route::HostMatch { r#match: Some(m) }
}

fn match_to_proto(m: &HttpRouteMatch) -> api_route::HttpRouteMatch {
    api_route::HttpRouteMatch {
        path: m.path.as_ref().map(|p| api_route::PathMatch {
            kind: Some(match p {
                PathMatch::Exact(s) => api_route::path_match::Kind::Exact(s.clone()),
                PathMatch::Prefix(s) => api_route::path_match::Kind::Prefix(s.clone()),
                PathMatch::Regex(s) => api_route::path_match::Kind::Regex(s.clone()),
            }),
        }),
        headers: m
            .headers
            .iter()
            .map(|h| match h {
                HeaderMatch::Exact { name, value } => api_route::HeaderMatch {
                    name: name.clone(),
                    value: Some(api_route::header_match::Value::Exact(
                        value.as_bytes().to_vec(),
                    )),
                },
                HeaderMatch::Regex { name, pattern } => api_route::HeaderMatch {
                    name: name.clone(),
                    value: Some(api_route::header_match::Value::Regex(pattern.clone())),
                },
            })
            .collect(),
        query_params: vec![],
        method: m
            .method
            .as_deref()
            .and_then(|m| http::Method::from_bytes(m.as_bytes()).ok())
            .map(Into::into),
    }
}

fn rule_to_proto(rule: &HttpRouteRule, domain: &str) -> http_route::Rule {
    #[allow(deprecated)]
    http_route::Rule {
        matches: rule.matches.iter().map(match_to_proto).collect(),
        filters: vec![],
        backends: Some(http_route::Distribution {
            kind: Some(http_route::distribution::Kind::RandomAvailable(
                http_route::distribution::RandomAvailable {
                    backends: rule
                        .backends
                        .iter()
                        .map(|wb| http_route::WeightedRouteBackend {
                            weight: wb.weight,
                            backend: Some(route_backend(&wb.backend, domain)),
                        })
                        .collect(),
                },
            )),
        }),
        request_timeout: None,
        timeouts: rule.request_timeout_ms.map(|ms| api_route::Timeouts {
            request: duration(Duration::from_millis(ms)),
            ..Default::default()
        }),
        retry: None,
        allow_l5d_request_headers: false,
    }
}

#[allow(deprecated)]
fn route_backend(backend: &Backend, domain: &str) -> http_route::RouteBackend {
    let filters = match backend {
        Backend::Invalid { message, .. } => vec![http_route::Filter {
            kind: Some(http_route::filter::Kind::FailureInjector(
                api_route::HttpFailureInjector {
                    status: 500,
                    message: message.clone(),
                    ratio: None,
                },
            )),
        }],
        _ => vec![],
    };
    http_route::RouteBackend {
        backend: Some(backend_to_proto_in(backend, domain)),
        filters,
        request_timeout: None,
    }
}

/// The backend's identity and how its endpoints are discovered (Services in
/// `cluster.local`).
pub fn backend_to_proto(backend: &Backend) -> api::Backend {
    backend_to_proto_in(backend, kinference_policy_core::target::CLUSTER_DOMAIN)
}

/// The backend's identity and how its endpoints are discovered: a pool by its pool
/// path, a Service by its authority in `domain`.
pub fn backend_to_proto_in(backend: &Backend, domain: &str) -> api::Backend {
    let (resource, path) = match backend {
        Backend::Pool(pool) => (pool.resource(), Some(pool.destination_path())),
        Backend::Service(svc) => (svc.resource(), Some(svc.authority_in(domain))),
        Backend::Invalid { resource, .. } => (resource.clone(), None),
    };
    api::Backend {
        metadata: Some(resource_meta(&resource)),
        kind: path.map(|path| {
            backend::Kind::Balancer(backend::BalanceP2c {
                discovery: Some(backend::EndpointDiscovery {
                    kind: Some(backend::endpoint_discovery::Kind::Dst(
                        backend::endpoint_discovery::DestinationGet { path },
                    )),
                }),
                load: Some(backend::balance_p2c::Load::PeakEwma(
                    backend::balance_p2c::PeakEwma {
                        default_rtt: duration(DEFAULT_RTT),
                        decay: duration(EWMA_DECAY),
                    },
                )),
            })
        }),
        queue: Some(api::Queue {
            capacity: QUEUE_CAPACITY,
            failfast_timeout: duration(QUEUE_FAILFAST),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_policy_core::PoolRef;

    fn parent() -> ResourceRef {
        ParentTarget {
            namespace: "default".into(),
            name: "llm".into(),
            port: 8000,
        }
        .resource()
    }

    fn http1_routes(p: &api::OutboundPolicy) -> &[api::HttpRoute] {
        match p.protocol.as_ref().and_then(|p| p.kind.as_ref()) {
            Some(proxy_protocol::Kind::Detect(d)) => &d.http1.as_ref().unwrap().routes,
            other => panic!("expected detect, got {other:?}"),
        }
    }

    fn backend_of(rule: &http_route::Rule) -> Vec<(u32, api::Backend, usize)> {
        match rule.backends.as_ref().and_then(|b| b.kind.as_ref()) {
            Some(http_route::distribution::Kind::RandomAvailable(r)) => r
                .backends
                .iter()
                .map(|wb| {
                    let rb = wb.backend.as_ref().unwrap();
                    (wb.weight, rb.backend.clone().unwrap(), rb.filters.len())
                })
                .collect(),
            other => panic!("expected random available, got {other:?}"),
        }
    }

    #[test]
    fn no_routes_means_a_default_route_to_the_service() {
        let p = to_proto(&OutboundPolicy {
            parent: parent(),
            exists: true,
            routes: vec![],
        });
        assert_eq!(p.metadata, Some(resource_meta(&parent())));
        let routes = http1_routes(&p);
        assert_eq!(routes.len(), 1);
        assert_eq!(
            routes[0].metadata.as_ref().unwrap().kind,
            Some(meta::metadata::Kind::Default("http".into()))
        );
        let backends = backend_of(&routes[0].rules[0]);
        let Some(backend::Kind::Balancer(b)) = &backends[0].1.kind else {
            panic!("expected a balancer");
        };
        assert_eq!(
            b.discovery.as_ref().unwrap().kind,
            Some(backend::endpoint_discovery::Kind::Dst(
                backend::endpoint_discovery::DestinationGet {
                    path: "llm.default.svc.cluster.local:8000".into()
                }
            ))
        );
    }

    #[test]
    fn pool_backends_balance_over_the_pool_path_and_invalid_ones_fail() {
        let pool = PoolRef::new("default", "glm-5.3");
        let route = HttpRoute {
            resource: ResourceRef::new("gateway.networking.k8s.io", "HTTPRoute", "default", "llm"),
            hostnames: vec!["*.example.com".into(), "llm.local".into()],
            rules: vec![HttpRouteRule {
                matches: vec![HttpRouteMatch {
                    path: Some(PathMatch::Prefix("/v1".into())),
                    headers: vec![HeaderMatch::Exact {
                        name: "x-tenant".into(),
                        value: "a".into(),
                    }],
                    method: Some("POST".into()),
                }],
                backends: vec![
                    WeightedBackend {
                        weight: 3,
                        backend: Backend::Pool(pool.clone()),
                    },
                    WeightedBackend {
                        weight: 1,
                        backend: Backend::Invalid {
                            resource: ResourceRef::new("x", "Y", "default", "z"),
                            message: "nope".into(),
                        },
                    },
                ],
                request_timeout_ms: Some(1_500),
            }],
        };
        let p = to_proto(&OutboundPolicy {
            parent: parent(),
            exists: true,
            routes: vec![route],
        });
        let routes = http1_routes(&p);
        assert_eq!(
            routes[0].hosts[0].r#match,
            Some(api_route::host_match::Match::Suffix(
                api_route::host_match::Suffix {
                    reverse_labels: vec!["com".into(), "example".into()]
                }
            ))
        );
        let rule = &routes[0].rules[0];
        assert_eq!(
            rule.timeouts.as_ref().unwrap().request,
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
        let m = &rule.matches[0];
        assert_eq!(
            m.path.as_ref().unwrap().kind,
            Some(api_route::path_match::Kind::Prefix("/v1".into()))
        );
        assert_eq!(
            m.method,
            Some(linkerd2_proxy_api::http_types::HttpMethod::from(
                http::Method::POST
            ))
        );
        let backends = backend_of(rule);
        assert_eq!(backends[0].0, 3);
        assert_eq!(
            backends[0].1.metadata,
            Some(resource_meta(&pool.resource()))
        );
        let Some(backend::Kind::Balancer(b)) = &backends[0].1.kind else {
            panic!("expected a balancer");
        };
        assert_eq!(
            b.discovery.as_ref().unwrap().kind,
            Some(backend::endpoint_discovery::Kind::Dst(
                backend::endpoint_discovery::DestinationGet {
                    path: "glm-5.3.default.inferencepool.kinference.io".into()
                }
            ))
        );
        assert_eq!(backends[0].2, 0, "a valid backend has no filters");
        // The invalid backend has no discovery and a failure-injecting filter.
        assert_eq!(backends[1].1.kind, None);
        assert_eq!(backends[1].2, 1);
    }
}
