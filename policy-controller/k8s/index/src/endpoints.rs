//! An InferencePool's ready endpoints and their static facts.
//!
//! A pool selects pods by label and serves on its target ports. Endpoints come from
//! EndpointSlices (whose labels, or whose endpoints' pods, match the selector; only
//! ports that are target ports count) and from Pods matching the selector (their pod IP
//! on each target port). Slices are authoritative for an address both name. Facts
//! (model, LoRA adapters, accelerator) come from the pod's labels, else the slice's.
//!
//! A Service port's endpoints come from the EndpointSlices labelled
//! `kubernetes.io/service-name` with the Service's name, on the slice port named as the
//! Service port is (the EndpointSlice controller's contract), as Linkerd's destination
//! controller reads them.

use crate::{labels, store::Store};
use k8s_openapi::api::{core::v1::Pod, discovery::v1::EndpointSlice};
use kinference_api::InferencePool;
use kinference_policy_core::{Endpoint, ParentTarget, PoolEndpoints, PoolRef};
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

pub(crate) fn pool_endpoints(store: &Store, pool_ref: &PoolRef) -> PoolEndpoints {
    let Some(pool) = store.endpoints_pool(&(pool_ref.namespace.clone(), pool_ref.name.clone()))
    else {
        return PoolEndpoints::default();
    };
    let ns = &pool_ref.namespace;
    let target_ports: Vec<u16> = pool
        .spec
        .target_port_numbers()
        .filter_map(|p| u16::try_from(p).ok())
        .collect();
    let mut all = BTreeMap::new();

    for ((pod_ns, _), pod) in store.pods.range((ns.clone(), String::new())..) {
        if pod_ns != ns {
            break;
        }
        if !selects(pool, pod.metadata.labels.as_ref()) {
            continue;
        }
        for ep in pod_endpoints(pod, &target_ports) {
            all.insert(ep.addr, ep);
        }
    }

    for ((slice_ns, _), slice) in store.slices.range((ns.clone(), String::new())..) {
        if slice_ns != ns {
            break;
        }
        for ep in slice_endpoints(store, pool, slice, &target_ports) {
            all.insert(ep.addr, ep);
        }
    }

    PoolEndpoints {
        exists: true,
        endpoints: all.into_iter().filter(|(_, ep)| ep.ready).collect(),
        signals_shard: crate::inference::signals_shard(pool),
    }
}

/// The label the EndpointSlice controller puts on a Service's slices.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

pub(crate) fn service_endpoints(store: &Store, target: &ParentTarget) -> PoolEndpoints {
    let ns = &target.namespace;
    let Some(port) = store
        .services
        .get(&(ns.clone(), target.name.clone()))
        .and_then(|svc| svc.spec.as_ref())
        .and_then(|spec| spec.ports.as_ref())
        .and_then(|ports| ports.iter().find(|p| p.port == i32::from(target.port)))
    else {
        return PoolEndpoints::default();
    };
    let port_name = port.name.as_deref().unwrap_or_default();
    let mut all = BTreeMap::new();
    for ((slice_ns, _), slice) in store.slices.range((ns.clone(), String::new())..) {
        if slice_ns != ns {
            break;
        }
        let slice_labels = slice.metadata.labels.as_ref();
        if label(slice_labels, SERVICE_NAME_LABEL).as_deref() != Some(target.name.as_str()) {
            continue;
        }
        let Some(slice_port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref().unwrap_or_default() == port_name)
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for ep in slice.endpoints.iter().flatten() {
            for e in endpoint_facts(store, slice, ep, &[slice_port]) {
                all.insert(e.addr, e);
            }
        }
    }
    PoolEndpoints {
        exists: true,
        endpoints: all.into_iter().filter(|(_, ep)| ep.ready).collect(),
        signals_shard: None,
    }
}

fn selects(pool: &InferencePool, labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.is_some_and(|l| pool.spec.selector.matches(l))
}

fn label(labels: Option<&BTreeMap<String, String>>, key: &str) -> Option<String> {
    labels
        .and_then(|l| l.get(key))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn lora_adapters(labels: Option<&BTreeMap<String, String>>) -> Vec<String> {
    label(labels, labels::LORA_ADAPTERS)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn pod_ready(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_endpoints(pod: &Pod, target_ports: &[u16]) -> Vec<Endpoint> {
    let Some(ip) = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok())
    else {
        return vec![];
    };
    let labels = pod.metadata.labels.as_ref();
    let ready = pod_ready(pod);
    target_ports
        .iter()
        .map(|port| Endpoint {
            addr: SocketAddr::new(ip, *port),
            pod: pod.metadata.name.clone(),
            model: label(labels, labels::MODEL),
            lora_adapters: lora_adapters(labels),
            accelerator: label(labels, labels::ACCELERATOR),
            ready,
        })
        .collect()
}

fn slice_endpoints(
    store: &Store,
    pool: &InferencePool,
    slice: &EndpointSlice,
    target_ports: &[u16],
) -> Vec<Endpoint> {
    let ns = slice.metadata.namespace.clone().unwrap_or_default();
    let slice_labels = slice.metadata.labels.as_ref();
    let slice_selected = selects(pool, slice_labels);
    let ports: Vec<u16> = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.port.and_then(|p| u16::try_from(p).ok()))
        .filter(|p| target_ports.contains(p))
        .collect();
    let mut out = Vec::new();
    for ep in slice.endpoints.iter().flatten() {
        let pod_labels = endpoint_pod(store, &ns, ep).and_then(|p| p.metadata.labels.as_ref());
        if !slice_selected && !selects(pool, pod_labels) {
            continue;
        }
        out.extend(endpoint_facts(store, slice, ep, &ports));
    }
    out
}

fn endpoint_pod_name(ep: &k8s_openapi::api::discovery::v1::Endpoint) -> Option<&String> {
    ep.target_ref
        .as_ref()
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .and_then(|r| r.name.as_ref())
}

fn endpoint_pod<'s>(
    store: &'s Store,
    ns: &str,
    ep: &k8s_openapi::api::discovery::v1::Endpoint,
) -> Option<&'s Pod> {
    endpoint_pod_name(ep).and_then(|name| store.pods.get(&(ns.to_string(), name.clone())))
}

/// One slice endpoint on each of `ports`, with its facts from its pod, else the slice.
fn endpoint_facts(
    store: &Store,
    slice: &EndpointSlice,
    ep: &k8s_openapi::api::discovery::v1::Endpoint,
    ports: &[u16],
) -> Vec<Endpoint> {
    let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
    let slice_labels = slice.metadata.labels.as_ref();
    let pod_name = endpoint_pod_name(ep).cloned();
    let pod_labels = endpoint_pod(store, ns, ep).and_then(|p| p.metadata.labels.as_ref());
    let fact = |key| label(pod_labels, key).or_else(|| label(slice_labels, key));
    let adapters = match lora_adapters(pod_labels) {
        a if a.is_empty() => lora_adapters(slice_labels),
        a => a,
    };
    // A nil `ready` condition means ready, as Kubernetes defines it.
    let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
    let mut out = Vec::new();
    for addr in &ep.addresses {
        let Ok(ip) = addr.parse::<IpAddr>() else {
            continue;
        };
        for port in ports {
            out.push(Endpoint {
                addr: SocketAddr::new(ip, *port),
                pod: pod_name.clone(),
                model: fact(labels::MODEL),
                lora_adapters: adapters.clone(),
                accelerator: fact(labels::ACCELERATOR),
                ready,
            });
        }
    }
    out
}
