//! The webhook's TLS identity, from the PEM files a Secret mounts.

use rustls::{
    ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};
use std::{path::Path, sync::Arc};

/// Why the certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading certificates from {path}: {source}")]
    Certs {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    NoCerts(String),
    #[error("reading the private key from {path}: {source}")]
    Key {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("the certificate and key cannot be used: {0}")]
    Config(#[from] rustls::Error),
}

/// A server configuration from a PEM certificate chain and private key, offering
/// HTTP/2 and HTTP/1.1.
pub fn load_tls(cert_path: &Path, key_path: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let certs_err = |source| TlsError::Certs {
        path: cert_path.display().to_string(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(cert_path)
        .map_err(certs_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(certs_err)?;
    if certs.is_empty() {
        return Err(TlsError::NoCerts(cert_path.display().to_string()));
    }
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|source| TlsError::Key {
        path: key_path.display().to_string(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
