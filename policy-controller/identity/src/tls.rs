//! rustls configurations whose certificate can change under them.
//!
//! [`Credentials`] holds the current certificate and key; every new handshake reads it, so a
//! refreshed certificate is used from the next connection on without rebuilding a config (tonic's
//! own TLS settings fix one identity per server or channel, which is why the servers and
//! channels here are fed TLS streams instead). The policy server requires a client certificate
//! from the trust anchors; the issuer's server, which proxies call before they have one, does not.

use rustls::{
    ClientConfig, RootCertStore, ServerConfig, SignatureScheme,
    client::ResolvesClientCert,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
    sign::CertifiedKey,
};
use std::{sync::Arc, time::SystemTime};
use tokio::sync::watch;

/// ALPN: the discovery APIs are gRPC, HTTP/2 only.
const H2: &[u8] = b"h2";

/// The crypto provider: ring, as everywhere else in the workspace.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and its PKCS#8 key as rustls signs with them.
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    pkcs8: Vec<u8>,
) -> Result<Arc<CertifiedKey>, rustls::Error> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8));
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)?;
    Ok(Arc::new(CertifiedKey::new(chain, signer)))
}

/// The current certificate and key of this side of a connection, replaced when refreshed.
#[derive(Debug)]
pub struct Credentials {
    current: watch::Sender<Option<(Arc<CertifiedKey>, SystemTime)>>,
}

impl Default for Credentials {
    fn default() -> Self {
        Self {
            current: watch::channel(None).0,
        }
    }
}

impl Credentials {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Replaces the certificate; the next handshake presents it.
    pub fn set(&self, key: Arc<CertifiedKey>, not_after: SystemTime) {
        self.current.send_replace(Some((key, not_after)));
    }

    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.borrow().as_ref().map(|(k, _)| k.clone())
    }

    /// When the current certificate expires.
    pub fn not_after(&self) -> Option<SystemTime> {
        self.current.borrow().as_ref().map(|(_, t)| *t)
    }

    /// Completes once there is a certificate.
    pub async fn ready(&self) {
        let mut rx = self.current.subscribe();
        let _ = rx.wait_for(Option::is_some).await;
    }
}

impl ResolvesServerCert for Credentials {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

impl ResolvesClientCert for Credentials {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A root store of the trust anchors.
pub fn roots(anchors: &[CertificateDer<'static>]) -> Result<Arc<RootCertStore>, rustls::Error> {
    let mut roots = RootCertStore::empty();
    for anchor in anchors {
        roots.add(anchor.clone())?;
    }
    Ok(Arc::new(roots))
}

/// The policy server's configuration: it presents `credentials` and requires a client
/// certificate that chains to `roots`.
pub fn mutual_server_config(
    roots: Arc<RootCertStore>,
    credentials: Arc<Credentials>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let provider = provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(credentials);
    config.alpn_protocols = vec![H2.to_vec()];
    Ok(Arc::new(config))
}

/// The issuer's server configuration: it presents `credentials` and asks for no client
/// certificate (the token in the request is what authenticates).
pub fn server_config(credentials: Arc<Credentials>) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(credentials);
    config.alpn_protocols = vec![H2.to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration that verifies the server against `roots` and presents `credentials`
/// (none when `None`).
pub fn client_config(
    roots: Arc<RootCertStore>,
    credentials: Option<Arc<Credentials>>,
) -> Result<Arc<ClientConfig>, rustls::Error> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match credentials {
        Some(c) => builder.with_client_cert_resolver(c),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![H2.to_vec()];
    Ok(Arc::new(config))
}
