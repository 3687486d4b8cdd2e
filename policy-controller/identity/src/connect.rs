//! The client side of TLS: a connector for tonic channels to the controller.
//!
//! The server is verified against the trust anchors under the name in the channel's URI (a DNS
//! name, or an IP address the certificate lists), and the client presents its current
//! certificate at each handshake; a connector with credentials waits for the first one before it
//! dials, so a proxy's first streams do not fail while it is being certified.

use crate::tls::Credentials;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, pki_types::ServerName};
use std::{
    io,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Dials `https://host:port` URIs over TLS.
#[derive(Clone, Debug)]
pub struct TlsConnector {
    config: Arc<ClientConfig>,
    wait_for: Option<Arc<Credentials>>,
}

impl TlsConnector {
    /// A connector with `config`; with `wait_for`, each dial first waits for a certificate.
    pub fn new(config: Arc<ClientConfig>, wait_for: Option<Arc<Credentials>>) -> Self {
        Self { config, wait_for }
    }

    /// A tonic channel to `uri` over this connector, connected on first use.
    pub fn channel(&self, endpoint: tonic::transport::Endpoint) -> tonic::transport::Channel {
        endpoint.connect_with_connector_lazy(self.clone())
    }
}

/// The host of a URI as a TLS server name (IPv6 literals lose their brackets).
fn server_name(uri: &http::Uri) -> io::Result<(String, u16, ServerName<'static>)> {
    let host = uri
        .host()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri} has no host")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let name = ServerName::try_from(host.clone())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    Ok((host, port, name))
}

impl tower::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = BoxFuture<'static, io::Result<Self::Response>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (host, port, name) = server_name(&uri)?;
            if let Some(credentials) = &this.wait_for {
                credentials.ready().await;
            }
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = tokio_rustls::TlsConnector::from(this.config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(tls))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_from_uris() {
        for (uri, host, port) in [
            (
                "https://kinference-policy-controller.kinference.svc.cluster.local:8090",
                "kinference-policy-controller.kinference.svc.cluster.local",
                8090,
            ),
            ("https://127.0.0.1:8090", "127.0.0.1", 8090),
            ("https://[::1]:8090", "::1", 8090),
            ("https://localhost", "localhost", 443),
        ] {
            let (h, p, _) = server_name(&uri.parse().unwrap()).unwrap();
            assert_eq!((h.as_str(), p), (host, port), "{uri}");
        }
    }
}
