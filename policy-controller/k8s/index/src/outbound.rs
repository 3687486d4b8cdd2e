//! HTTPRoutes attached to a Service, translated into the core outbound policy.
//!
//! Routes attach to a Service through `parentRefs` (the Gateway API's mesh binding);
//! their backendRefs may name InferencePools, which become pool backends that the proxy
//! resolves through the Destination API.

use crate::store::{NsName, Store};
use gateway_api::apis::standard::httproutes::{
    HttpRoute as HTTPRoute, HttpRouteRules, HttpRouteRulesBackendRefs, HttpRouteRulesMatches,
    HttpRouteRulesMatchesHeadersType, HttpRouteRulesMatchesPathType,
};
use kinference_policy_core::{
    OutboundPolicy, ParentTarget, PoolRef, ResourceRef,
    outbound::{
        Backend, HeaderMatch, HttpRoute, HttpRouteMatch, HttpRouteRule, PathMatch, WeightedBackend,
    },
};
use std::net::IpAddr;

const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

fn is_core(group: Option<&str>) -> bool {
    matches!(group, None | Some("") | Some("core"))
}

/// The Services a route names in its parentRefs.
pub(crate) fn route_parents(route: &HTTPRoute) -> Vec<NsName> {
    let ns = route.metadata.namespace.clone().unwrap_or_default();
    route
        .spec
        .parent_refs
        .iter()
        .flatten()
        .filter(|p| is_core(p.group.as_deref()) && p.kind.as_deref() == Some("Service"))
        .map(|p| {
            (
                p.namespace.clone().unwrap_or_else(|| ns.clone()),
                p.name.clone(),
            )
        })
        .collect()
}

/// Whether one of the route's parentRefs names this Service and port.
fn attaches_to(route: &HTTPRoute, target: &ParentTarget) -> bool {
    let ns = route.metadata.namespace.as_deref().unwrap_or_default();
    route.spec.parent_refs.iter().flatten().any(|p| {
        is_core(p.group.as_deref())
            && p.kind.as_deref() == Some("Service")
            && p.name == target.name
            && p.namespace.as_deref().unwrap_or(ns) == target.namespace
            && p.port.is_none_or(|port| port == i32::from(target.port))
    })
}

/// The routes attached to `target`, in the Gateway API's precedence order (oldest
/// first, then by namespace and name).
pub(crate) fn attached_routes<'s>(
    store: &'s Store,
    target: &ParentTarget,
) -> Vec<(&'s NsName, &'s HTTPRoute)> {
    let key = (target.namespace.clone(), target.name.clone());
    let mut routes: Vec<_> = store
        .routes_by_parent
        .get(&key)
        .into_iter()
        .flatten()
        .filter_map(|id| store.routes.get_key_value(id))
        .filter(|(_, r)| attaches_to(r, target))
        .collect();
    routes.sort_by(|(a_id, a), (b_id, b)| {
        let a_ts = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let b_ts = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
        a_ts.cmp(&b_ts).then_with(|| a_id.cmp(b_id))
    });
    routes
}

pub(crate) fn policy(store: &Store, target: &ParentTarget) -> OutboundPolicy {
    let key = (target.namespace.clone(), target.name.clone());
    OutboundPolicy {
        parent: target.resource(),
        exists: store.services.contains_key(&key),
        routes: attached_routes(store, target)
            .into_iter()
            .map(|(id, r)| route(store, id, r))
            .collect(),
    }
}

/// Finds the Service whose cluster IP and port are `ip:port`.
pub(crate) fn lookup_ip(store: &Store, ip: IpAddr, port: u16) -> Option<ParentTarget> {
    let ip = ip.to_string();
    store.services.iter().find_map(|((namespace, name), svc)| {
        let spec = svc.spec.as_ref()?;
        let has_ip = spec.cluster_ip.as_deref() == Some(ip.as_str())
            || spec.cluster_ips.iter().flatten().any(|c| *c == ip);
        let has_port = spec
            .ports
            .iter()
            .flatten()
            .any(|p| p.port == i32::from(port));
        (has_ip && has_port).then(|| ParentTarget {
            namespace: namespace.clone(),
            name: name.clone(),
            port,
        })
    })
}

fn route(store: &Store, id: &NsName, route: &HTTPRoute) -> HttpRoute {
    HttpRoute {
        resource: ResourceRef::new(GATEWAY_GROUP, "HTTPRoute", &id.0, &id.1),
        hostnames: route.spec.hostnames.clone().unwrap_or_default(),
        rules: route
            .spec
            .rules
            .iter()
            .flatten()
            .map(|r| rule(store, &id.0, r))
            .collect(),
    }
}

fn rule(store: &Store, ns: &str, rule: &HttpRouteRules) -> HttpRouteRule {
    HttpRouteRule {
        matches: rule.matches.iter().flatten().map(route_match).collect(),
        backends: rule
            .backend_refs
            .iter()
            .flatten()
            .filter(|b| b.weight != Some(0))
            .map(|b| backend(store, ns, b))
            .collect(),
        request_timeout_ms: rule
            .timeouts
            .as_ref()
            .and_then(|t| t.request.as_deref())
            .and_then(|d| kinference_api::duration::parse(d).ok())
            .and_then(|d| u64::try_from(d.as_millis()).ok()),
    }
}

fn route_match(m: &HttpRouteRulesMatches) -> HttpRouteMatch {
    HttpRouteMatch {
        path: m.path.as_ref().map(|p| {
            let value = p.value.clone().unwrap_or_else(|| "/".to_string());
            match p.r#type {
                Some(HttpRouteRulesMatchesPathType::Exact) => PathMatch::Exact(value),
                Some(HttpRouteRulesMatchesPathType::RegularExpression) => PathMatch::Regex(value),
                Some(HttpRouteRulesMatchesPathType::PathPrefix) | None => PathMatch::Prefix(value),
            }
        }),
        headers: m
            .headers
            .iter()
            .flatten()
            .map(|h| match h.r#type {
                Some(HttpRouteRulesMatchesHeadersType::RegularExpression) => HeaderMatch::Regex {
                    name: h.name.clone(),
                    pattern: h.value.clone(),
                },
                _ => HeaderMatch::Exact {
                    name: h.name.clone(),
                    value: h.value.clone(),
                },
            })
            .collect(),
        method: m
            .method
            .as_ref()
            .map(|m| format!("{m:?}").to_ascii_uppercase()),
    }
}

fn backend(store: &Store, route_ns: &str, b: &HttpRouteRulesBackendRefs) -> WeightedBackend {
    let ns = b.namespace.clone().unwrap_or_else(|| route_ns.to_string());
    let group = b.group.as_deref().unwrap_or_default();
    let kind = b.kind.as_deref().unwrap_or("Service");
    let weight = b.weight.map_or(1, |w| u32::try_from(w).unwrap_or(0));
    let resource = ResourceRef::new(group, kind, &ns, &b.name);
    let backend = if group == kinference_api::pool::GROUP && kind == kinference_api::pool::KIND {
        if store.pools.contains_key(&(ns.clone(), b.name.clone())) {
            Backend::Pool(PoolRef::new(&ns, &b.name))
        } else {
            Backend::Invalid {
                resource,
                message: format!("InferencePool {ns}/{} not found", b.name),
            }
        }
    } else if is_core(Some(group)) && kind == "Service" {
        match b.port.and_then(|p| u16::try_from(p).ok()) {
            Some(port) => Backend::Service(ParentTarget {
                namespace: ns,
                name: b.name.clone(),
                port,
            }),
            None => Backend::Invalid {
                resource,
                message: format!("Service backend {ns}/{} needs a port", b.name),
            },
        }
    } else {
        Backend::Invalid {
            message: format!("unsupported backend kind {kind} in group {group:?}"),
            resource,
        }
    };
    WeightedBackend { weight, backend }
}
