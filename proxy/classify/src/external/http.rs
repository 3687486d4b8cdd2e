//! The HTTP external classifier: POSTs `{"tag": ..., "prompt": ...}` as JSON to a URL and reads
//! `{"value": "...", "confidence": x}`. HTTP/1.1 over hyper 1, one pooled client per tag; `https`
//! URLs are verified against the system's root certificates (read once per process) or against the
//! roots a caller gives, with rustls on ring.

use super::{BoxFuture, ExternalAnswer, ExternalClassifier, ExternalError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use rustls::{ClientConfig, RootCertStore};
use std::sync::{Arc, OnceLock};

/// Answers larger than this are refused.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UrlError {
    #[error("invalid URL {url:?}: {error}")]
    Invalid { url: String, error: String },
    #[error("URL {0:?} must be http:// or https:// with a host")]
    Scheme(String),
    #[error("URL {url:?}: no TLS roots: {error}")]
    Tls { url: String, error: String },
}

#[derive(Debug)]
pub struct HttpClassifier {
    uri: hyper::Uri,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl HttpClassifier {
    /// A client for `url`; an `https` URL is verified against the system's root certificates.
    pub fn new(url: &str) -> Result<Self, UrlError> {
        let uri = parse(url)?;
        let tls = if uri.scheme_str() == Some("https") {
            native_roots().clone().map_err(|error| UrlError::Tls {
                url: url.to_string(),
                error,
            })?
        } else {
            // Plain HTTP never uses it; no need to read the system's certificates.
            config(RootCertStore::empty())
        };
        Ok(Self::build(uri, tls))
    }

    /// A client for `url` whose `https` connections trust exactly `roots` (a private CA).
    pub fn with_roots(url: &str, roots: RootCertStore) -> Result<Self, UrlError> {
        Ok(Self::build(parse(url)?, config(roots)))
    }

    fn build(uri: hyper::Uri, tls: Arc<ClientConfig>) -> Self {
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config((*tls).clone())
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Self { uri, client }
    }
}

fn parse(url: &str) -> Result<hyper::Uri, UrlError> {
    let uri: hyper::Uri =
        url.parse()
            .map_err(|e: hyper::http::uri::InvalidUri| UrlError::Invalid {
                url: url.to_string(),
                error: e.to_string(),
            })?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(UrlError::Scheme(url.to_string()));
    }
    Ok(uri)
}

fn config(roots: RootCertStore) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// The system's root certificates, read once per process.
fn native_roots() -> &'static Result<Arc<ClientConfig>, String> {
    static ROOTS: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
        if roots.is_empty() {
            let why = found
                .errors
                .first()
                .map_or_else(|| "none found".to_string(), |e| e.to_string());
            return Err(format!("no usable system root certificates ({why})"));
        }
        Ok(config(roots))
    })
}

#[derive(serde::Serialize)]
struct Request<'a> {
    tag: &'a str,
    prompt: &'a str,
}

impl ExternalClassifier for HttpClassifier {
    fn classify<'a>(
        &'a self,
        tag: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<ExternalAnswer, ExternalError>> {
        Box::pin(async move {
            let body = serde_json::to_vec(&Request { tag, prompt: text })
                .map_err(|e| ExternalError::Unavailable(e.to_string()))?;
            let req = hyper::Request::post(self.uri.clone())
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| ExternalError::Unavailable(e.to_string()))?;
            let rsp = self
                .client
                .request(req)
                .await
                .map_err(|e| ExternalError::Unavailable(e.to_string()))?;
            if !rsp.status().is_success() {
                return Err(ExternalError::Unavailable(format!(
                    "status {}",
                    rsp.status()
                )));
            }
            let body = Limited::new(rsp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| ExternalError::InvalidResponse(e.to_string()))?
                .to_bytes();
            serde_json::from_slice::<ExternalAnswer>(&body)
                .map_err(|e| ExternalError::InvalidResponse(e.to_string()))
        })
    }
}
