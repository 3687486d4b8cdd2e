//! Which Destination paths the policies name.
//!
//! The inference policy names each model's backend by `destination_path`; the outbound policy
//! names its balancer backends by `DestinationGet.path`. The union is the set of Destination
//! streams to keep open, so this is recomputed on every policy change.

use kinference_proxy_api::inference::InferencePolicy;
use linkerd2_proxy_api::outbound::{
    self, OutboundPolicy, backend, grpc_route, http_route, opaque_route, proxy_protocol, tls_route,
};
use std::collections::BTreeSet;

/// The Destination paths of the inference policy's models.
pub fn inference_backends(policy: &InferencePolicy) -> BTreeSet<String> {
    policy
        .models
        .iter()
        .filter_map(|m| m.backend.as_ref())
        .map(|b| b.destination_path.clone())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The Destination paths of the outbound policy's balancer backends, over every protocol.
pub fn outbound_backends(policy: &OutboundPolicy) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let Some(kind) = policy.protocol.as_ref().and_then(|p| p.kind.as_ref()) else {
        return paths;
    };
    let mut http = |routes: &[outbound::HttpRoute]| {
        for rule in routes.iter().flat_map(|r| &r.rules) {
            match rule.backends.as_ref().and_then(|d| d.kind.as_ref()) {
                Some(http_route::distribution::Kind::FirstAvailable(d)) => {
                    for b in &d.backends {
                        push(&mut paths, b.backend.as_ref());
                    }
                }
                Some(http_route::distribution::Kind::RandomAvailable(d)) => {
                    for b in d.backends.iter().filter_map(|b| b.backend.as_ref()) {
                        push(&mut paths, b.backend.as_ref());
                    }
                }
                Some(http_route::distribution::Kind::Empty(_)) | None => {}
            }
        }
    };
    match kind {
        proxy_protocol::Kind::Detect(d) => {
            if let Some(h) = &d.http1 {
                http(&h.routes);
            }
            if let Some(h) = &d.http2 {
                http(&h.routes);
            }
            if let Some(o) = &d.opaque {
                opaque(&mut paths, &o.routes);
            }
        }
        proxy_protocol::Kind::Http1(h) => http(&h.routes),
        proxy_protocol::Kind::Http2(h) => http(&h.routes),
        proxy_protocol::Kind::Opaque(o) => opaque(&mut paths, &o.routes),
        proxy_protocol::Kind::Grpc(g) => {
            for rule in g.routes.iter().flat_map(|r| &r.rules) {
                match rule.backends.as_ref().and_then(|d| d.kind.as_ref()) {
                    Some(grpc_route::distribution::Kind::FirstAvailable(d)) => {
                        for b in &d.backends {
                            push(&mut paths, b.backend.as_ref());
                        }
                    }
                    Some(grpc_route::distribution::Kind::RandomAvailable(d)) => {
                        for b in d.backends.iter().filter_map(|b| b.backend.as_ref()) {
                            push(&mut paths, b.backend.as_ref());
                        }
                    }
                    Some(grpc_route::distribution::Kind::Empty(_)) | None => {}
                }
            }
        }
        proxy_protocol::Kind::Tls(t) => {
            for rule in t.routes.iter().flat_map(|r| &r.rules) {
                match rule.backends.as_ref().and_then(|d| d.kind.as_ref()) {
                    Some(tls_route::distribution::Kind::FirstAvailable(d)) => {
                        for b in &d.backends {
                            push(&mut paths, b.backend.as_ref());
                        }
                    }
                    Some(tls_route::distribution::Kind::RandomAvailable(d)) => {
                        for b in d.backends.iter().filter_map(|b| b.backend.as_ref()) {
                            push(&mut paths, b.backend.as_ref());
                        }
                    }
                    Some(tls_route::distribution::Kind::Empty(_)) | None => {}
                }
            }
        }
    }
    paths
}

fn opaque(paths: &mut BTreeSet<String>, routes: &[outbound::OpaqueRoute]) {
    for rule in routes.iter().flat_map(|r| &r.rules) {
        match rule.backends.as_ref().and_then(|d| d.kind.as_ref()) {
            Some(opaque_route::distribution::Kind::FirstAvailable(d)) => {
                for b in &d.backends {
                    push(paths, b.backend.as_ref());
                }
            }
            Some(opaque_route::distribution::Kind::RandomAvailable(d)) => {
                for b in d.backends.iter().filter_map(|b| b.backend.as_ref()) {
                    push(paths, b.backend.as_ref());
                }
            }
            Some(opaque_route::distribution::Kind::Empty(_)) | None => {}
        }
    }
}

fn push(paths: &mut BTreeSet<String>, backend: Option<&outbound::Backend>) {
    let Some(backend::Kind::Balancer(p2c)) = backend.and_then(|b| b.kind.as_ref()) else {
        return;
    };
    if let Some(backend::endpoint_discovery::Kind::Dst(dst)) =
        p2c.discovery.as_ref().and_then(|d| d.kind.as_ref())
        && !dst.path.is_empty()
    {
        paths.insert(dst.path.clone());
    }
}
