//! Who is asking: the caller a request is served for.
//!
//! Over mutual TLS the caller is the verified identity of the connection
//! ([`kinference_identity::PeerInfo`], set by the TLS acceptor), and what the request says
//! about its caller (`source_workload` of `InferenceTarget` and `TrafficSpec`, the namespace in
//! `GetDestination`'s context token) must agree with it: a request that names another workload
//! is refused with `PERMISSION_DENIED` rather than quietly served as the peer, so a proxy
//! configured (or compromised) to claim someone else's workload is seen, not hidden. An empty
//! claim is served as the peer. Over plaintext (local mode) nothing is verified and the claim
//! is taken as said.

use crate::GrpcMetrics;
use kinference_identity::PeerInfo;

/// Whether callers are verified.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Callers {
    /// Plaintext: the request's own claim is its caller.
    #[default]
    Claimed,
    /// Mutual TLS: the peer's certificate is its caller.
    Verified,
}

fn peer<T>(req: &tonic::Request<T>) -> Result<&kinference_identity::PeerIdentity, tonic::Status> {
    req.extensions()
        .get::<PeerInfo>()
        .and_then(|p| p.identity.as_deref())
        .ok_or_else(|| tonic::Status::unauthenticated("the connection has no verified identity"))
}

/// The `source_workload` to serve `req` for: the claim over plaintext, the peer's workload over
/// mutual TLS (an empty claim, or one that equals it).
pub(crate) fn source_workload<T>(
    req: &tonic::Request<T>,
    callers: Callers,
    claimed: &str,
    api: &'static str,
    metrics: &GrpcMetrics,
) -> Result<String, tonic::Status> {
    if callers == Callers::Claimed {
        return Ok(claimed.to_string());
    }
    let peer = peer(req).inspect_err(|_| metrics.refused(api, "unauthenticated"))?;
    if claimed.is_empty() || claimed == peer.workload {
        return Ok(peer.workload.clone());
    }
    metrics.refused(api, "source_workload");
    tracing::warn!(api, claimed, peer = %peer.workload, spiffe_id = %peer.spiffe_id, "refused a request for another workload than the caller's certificate names");
    Err(tonic::Status::permission_denied(format!(
        "source_workload {claimed:?} is not the caller's identity {:?}",
        peer.workload
    )))
}

/// Checks the namespace of a Destination context token (`{"ns":"..."}`) against the peer's.
pub(crate) fn context_namespace<T>(
    req: &tonic::Request<T>,
    callers: Callers,
    context_token: &str,
    api: &'static str,
    metrics: &GrpcMetrics,
) -> Result<(), tonic::Status> {
    if callers == Callers::Claimed {
        return Ok(());
    }
    let peer = peer(req).inspect_err(|_| metrics.refused(api, "unauthenticated"))?;
    let claimed = token_namespace(context_token);
    match claimed {
        None => Ok(()),
        Some(ns) if ns.is_empty() || ns == peer.namespace => Ok(()),
        Some(ns) => {
            metrics.refused(api, "context_token");
            tracing::warn!(api, claimed = ns, peer = %peer.workload, "refused a Destination request from another namespace than the caller's certificate names");
            Err(tonic::Status::permission_denied(format!(
                "the context token's namespace {ns:?} is not the caller's {:?}",
                peer.namespace
            )))
        }
    }
}

/// The `ns` of a context token, `{"ns":"apps"}` as Linkerd's proxies send it.
fn token_namespace(token: &str) -> Option<&str> {
    let rest = token.split_once("\"ns\"")?.1.trim_start();
    let rest = rest.strip_prefix(':')?.trim_start().strip_prefix('"')?;
    rest.split_once('"').map(|(ns, _)| ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_identity::PeerIdentity;
    use std::sync::Arc;

    fn request(workload: Option<&str>) -> tonic::Request<()> {
        let mut req = tonic::Request::new(());
        if let Some(w) = workload {
            let (ns, _) = w.split_once('/').unwrap();
            req.extensions_mut().insert(PeerInfo {
                remote_addr: None,
                identity: Some(Arc::new(PeerIdentity {
                    spiffe_id: format!("spiffe://cluster.local/ns/{ns}/sa/default"),
                    trust_domain: "cluster.local".into(),
                    namespace: ns.into(),
                    service_account: "default".into(),
                    workload: w.into(),
                    not_after: std::time::UNIX_EPOCH,
                })),
            });
        }
        req
    }

    #[test]
    fn the_verified_peer_is_the_caller() {
        let m = GrpcMetrics::default();
        let a = request(Some("apps/a"));
        let v = Callers::Verified;
        assert_eq!(source_workload(&a, v, "apps/a", "t", &m).unwrap(), "apps/a");
        assert_eq!(source_workload(&a, v, "", "t", &m).unwrap(), "apps/a");
        let e = source_workload(&a, v, "apps/b", "t", &m).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        let e = source_workload(&request(None), v, "apps/a", "t", &m).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        // Plaintext takes the claim.
        let c = Callers::Claimed;
        assert_eq!(
            source_workload(&request(None), c, "x/y", "t", &m).unwrap(),
            "x/y"
        );
        assert_eq!(m.refusals("t", "source_workload"), 1);

        assert!(context_namespace(&a, v, r#"{"ns":"apps"}"#, "d", &m).is_ok());
        assert!(context_namespace(&a, v, r#"{"ns":""}"#, "d", &m).is_ok());
        assert!(context_namespace(&a, v, "", "d", &m).is_ok());
        let e = context_namespace(&a, v, r#"{"ns": "other"}"#, "d", &m).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
    }
}
