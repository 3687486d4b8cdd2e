//! Workload identity for the control plane, as Linkerd's identity works.
//!
//! A proxy generates a key, sends a CSR with its pod's projected service-account token to the
//! issuer in the controller ([`service::IdentityService`], the stock
//! `io.linkerd.proxy.identity.Identity/Certify`), and gets back a short-lived certificate. The
//! issuer trusts nothing in the request but the token: it asks the Kubernetes API who the token
//! belongs to (a TokenReview, [`review`]), reads the pod the token is bound to, and signs a
//! certificate naming that pod's service account (the SPIFFE ID
//! `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`) and its workload (the subject's
//! common name, `<namespace>/<workload>`, the workload the injector names the proxy's tenant
//! after). The proxy refreshes the certificate at 70% of its lifetime ([`certify`]).
//!
//! The controller serves policy only over mutual TLS ([`tls`], [`accept`]): a connection without
//! a certificate from the trust anchors fails its handshake, and each request carries the
//! verified [`peer::PeerIdentity`] of its connection, which the gRPC servers use instead of what
//! the request says about its caller. A connection is closed when its peer's certificate
//! expires, so that no proxy reads policy on an expired identity.
//!
//! Everything that decides (names, issuance, the refresh schedule) is pure and takes the time as
//! an argument; the calendar is read once, in [`clock`].

pub mod accept;
pub mod certify;
pub mod clock;
pub mod connect;
pub mod issuer;
pub mod name;
pub mod peer;
pub mod review;
pub mod service;
pub mod tls;

pub use self::{
    name::WorkloadIdentity,
    peer::{PeerIdentity, PeerInfo},
    tls::Credentials,
};

/// The audience of the projected service-account tokens proxies present: the API server issues
/// a token for it, and the issuer's TokenReview accepts no other.
pub const TOKEN_AUDIENCE: &str = "identity.kinference.io";

/// The default lifetime of a proxy's certificate (Linkerd's is 24 hours).
pub const DEFAULT_CERT_LIFETIME: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
