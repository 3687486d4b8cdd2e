//! The forward service: one attempt of a request to one endpoint, over pooled connections.
//!
//! The bottom of the stack. hyper-util's client keeps a pool per endpoint authority: HTTP/1.1
//! keep-alive connections, or one multiplexed HTTP/2 connection with prior knowledge. [`Forward`]
//! is a `tower::Service` of [`Attempt`]s, so the retry layer above it tries the next endpoint of a
//! plan without knowing about sockets, and unit tests put a fake in its place.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use crate::config::UpstreamProtocol;

/// One attempt: a request for one endpoint.
#[derive(Debug)]
pub struct Attempt {
    pub addr: SocketAddr,
    pub request: http::Request<Full<Bytes>>,
}

/// What the layers above need of the service that sends attempts upstream: [`Forward`] in
/// production, a fake in unit tests. One name for the bounds every layer above it repeats.
pub trait ForwardService<B>:
    tower::Service<Attempt, Response = http::Response<B>, Error = ForwardError, Future: Send>
    + Clone
    + Send
    + 'static
{
}

impl<S, B> ForwardService<B> for S where
    S: tower::Service<Attempt, Response = http::Response<B>, Error = ForwardError, Future: Send>
        + Clone
        + Send
        + 'static
{
}

/// An upstream response body the proxy streams through to the client.
pub trait UpstreamBody:
    http_body::Body<Data = Bytes, Error: std::fmt::Display> + Send + Unpin + 'static
{
}

impl<B> UpstreamBody for B where
    B: http_body::Body<Data = Bytes, Error: std::fmt::Display> + Send + Unpin + 'static
{
}

/// Why an attempt got no response.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot connect to {0}: {1}")]
    Connect(SocketAddr, String),
    #[error("{0} did not answer within {1:?}")]
    Timeout(SocketAddr, Duration),
    #[error("{0} failed before answering: {1}")]
    Failed(SocketAddr, String),
    #[error("invalid upstream request: {0}")]
    Invalid(String),
}

impl ForwardError {
    /// Whether the endpoint is likely gone (it refused or dropped the connection).
    pub fn is_connect(&self) -> bool {
        matches!(self, Self::Connect(..))
    }
}

/// The upstream client.
#[derive(Clone, Debug)]
pub struct Forward {
    client: Client<HttpConnector, Full<Bytes>>,
    response_timeout: Option<Duration>,
}

impl Forward {
    pub fn new(
        protocol: UpstreamProtocol,
        connect_timeout: Duration,
        response_timeout: Option<Duration>,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_idle_timeout(Duration::from_secs(90));
        if protocol == UpstreamProtocol::H2 {
            builder.http2_only(true);
        }
        Self {
            client: builder.build(connector),
            response_timeout,
        }
    }

    async fn send(self, attempt: Attempt) -> Result<http::Response<Incoming>, ForwardError> {
        let addr = attempt.addr;
        let mut req = attempt.request;
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        *req.uri_mut() = format!("http://{addr}{path}")
            .parse()
            .map_err(|e: http::uri::InvalidUri| ForwardError::Invalid(e.to_string()))?;
        let fut = self.client.request(req);
        let res = match self.response_timeout {
            Some(t) => tokio::time::timeout(t, fut)
                .await
                .map_err(|_| ForwardError::Timeout(addr, t))?,
            None => fut.await,
        };
        res.map_err(|e| {
            if e.is_connect() {
                ForwardError::Connect(addr, source_chain(&e))
            } else {
                ForwardError::Failed(addr, source_chain(&e))
            }
        })
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl tower::Service<Attempt> for Forward {
    type Response = http::Response<Incoming>;
    type Error = ForwardError;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, attempt: Attempt) -> Self::Future {
        Box::pin(self.clone().send(attempt))
    }
}

/// Headers of the client's request that are not forwarded: hop-by-hop ones (RFC 9110 §7.6.1),
/// those that describe the client's connection or body (the proxy sets its own), and internal
/// ones a client must not be able to send an engine: Kinference's own (`x-kinference-*`, such
/// as the tenant header) and the simulator's fault controls (`x-sim-*`). `docs/proxy.md` lists
/// them.
pub fn is_hop_by_hop(name: &http::HeaderName) -> bool {
    let name = name.as_str();
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authorization"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "host"
            | "content-length"
    ) || name.starts_with("x-kinference-")
        || name.starts_with("x-sim-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn a_closed_port_is_a_connect_error() {
        // Bind and drop a listener so the port is (very likely) closed.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let d = Forward::new(UpstreamProtocol::Http1, Duration::from_millis(500), None);
        let req = http::Request::post("/v1/completions")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let err = d.oneshot(Attempt { addr, request: req }).await.unwrap_err();
        assert!(err.is_connect(), "{err}");
    }
}
