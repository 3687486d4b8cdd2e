//! The identity of a verified peer, read from its leaf certificate.
//!
//! rustls has already verified the chain to the trust anchors, the validity dates and the client
//! usage by the time this runs; this only reads the names out of the leaf.

use crate::name::parse_spiffe_id;
use rustls::pki_types::CertificateDer;
use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use x509_parser::{extensions::GeneralName, prelude::FromDer as _};

/// Who is on the other end of a mutual-TLS connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The SPIFFE ID, `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
    pub spiffe_id: String,
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
    /// `<namespace>/<workload>`, the subject's common name.
    pub workload: String,
    /// When the certificate expires.
    pub not_after: SystemTime,
}

/// What the controller knows about a connection: where it comes from and, over mutual TLS, who
/// it is. Every request on the connection carries it (tonic's connect info).
#[derive(Clone, Debug, Default)]
pub struct PeerInfo {
    pub remote_addr: Option<SocketAddr>,
    pub identity: Option<Arc<PeerIdentity>>,
}

/// Why a certificate names no workload.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("the certificate cannot be parsed: {0}")]
    Parse(String),
    #[error("the certificate has no SPIFFE ID of a service account")]
    NoSpiffeId,
    #[error(
        "the certificate's common name {0:?} is not `<namespace>/<workload>` in its SPIFFE ID's namespace"
    )]
    Workload(String),
}

impl PeerIdentity {
    /// Reads a workload certificate this crate's issuer wrote.
    pub fn from_leaf(der: &CertificateDer<'_>) -> Result<Self, PeerError> {
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
            .map_err(|e| PeerError::Parse(e.to_string()))?;
        let spiffe_id = cert
            .subject_alternative_name()
            .map_err(|e| PeerError::Parse(e.to_string()))?
            .into_iter()
            .flat_map(|san| san.value.general_names.iter())
            .find_map(|name| match name {
                GeneralName::URI(uri) if uri.starts_with("spiffe://") => Some(uri.to_string()),
                _ => None,
            })
            .ok_or(PeerError::NoSpiffeId)?;
        let (trust_domain, namespace, service_account) =
            parse_spiffe_id(&spiffe_id).ok_or(PeerError::NoSpiffeId)?;
        let (trust_domain, namespace, service_account) = (
            trust_domain.to_string(),
            namespace.to_string(),
            service_account.to_string(),
        );
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_string();
        match cn.split_once('/') {
            Some((ns, name)) if ns == namespace && !name.is_empty() && !name.contains('/') => {}
            _ => return Err(PeerError::Workload(cn)),
        }
        let secs = cert.validity().not_after.timestamp();
        let not_after = UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or_default());
        Ok(Self {
            spiffe_id,
            trust_domain,
            namespace,
            service_account,
            workload: cn,
            not_after,
        })
    }
}
