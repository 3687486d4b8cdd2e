//! The outbound listener: where the application's OpenAI requests arrive.
//!
//! One port speaks HTTP/1.1 and HTTP/2 cleartext (hyper-util's `auto` builder). Each request goes
//! through its target's stack (`crate::stack`), whose first layer is the request id layer here
//! (taken from `x-request-id` or made, and put on the response). Every request is answered, with an
//! OpenAI error object when it cannot be served.
//!
//! Which stack serves a connection depends on where the app was calling ([`serve_outbound`]): a
//! connection iptables redirected here keeps its original destination, and is served by that
//! destination's stack when the controller has an inference policy for it, or forwarded as plain
//! TCP when it has none; a connection to the listener itself (direct use) is served by the stack
//! of the configured default target. Each accepted connection is counted by how it was served
//! (`kinference_proxy_connections_total`), and each failed forward by why.
//!
//! Connections are bounded ([`ConnLimits`]): at most `max_connections` at once (one more is
//! closed as soon as it is accepted, and counted as `over_limit`), HTTP/1.1 request headers must
//! arrive within the header read timeout (which also closes a keep-alive connection idle that
//! long: hyper starts the timer when it waits for the next request), and HTTP/2 connections are
//! pinged and closed when the peer stops answering.

pub mod orig_dst;
pub mod targets;

use crate::body::{ProxyBody, REQUEST_ID};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::net::{TcpListener, TcpStream};

use self::{
    orig_dst::{Destination, OrigDst},
    targets::{Resolve, Route, Targets},
};

pub use crate::front::TENANT_HEADER;

/// The request id of a request, set by [`RequestIdLayer`].
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// Takes `x-request-id` from the request (if it is sane) or makes one; puts it on the response.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestIdLayer;

impl<S> tower::Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RequestIdService<S> {
    inner: S,
}

fn valid_request_id(v: &str) -> bool {
    !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic())
}

/// A fresh request id: 128 random bits in hex.
pub fn new_request_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl<S, B> tower::Service<http::Request<B>> for RequestIdService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ProxyBody>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let id = req
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| valid_request_id(v))
            .map_or_else(new_request_id, str::to_string);
        req.extensions_mut().insert(RequestId(id.clone()));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut rsp = fut.await?;
            if let Ok(v) = http::HeaderValue::from_str(&id) {
                rsp.headers_mut().insert(REQUEST_ID, v);
            }
            Ok(rsp)
        })
    }
}

/// How a listener bounds its connections.
#[derive(Clone, Debug)]
pub struct ConnLimits {
    /// An HTTP/1.1 connection's next request headers must arrive within this (slow clients and
    /// idle keep-alive connections are closed).
    pub header_read_timeout: std::time::Duration,
    /// HTTP/2 connections are pinged this often, and closed when a ping goes unanswered as long.
    pub h2_keepalive: std::time::Duration,
    /// Connections served at once.
    slots: Arc<tokio::sync::Semaphore>,
}

impl ConnLimits {
    pub fn new(
        header_read_timeout: std::time::Duration,
        h2_keepalive: std::time::Duration,
        max_connections: usize,
    ) -> Self {
        Self {
            header_read_timeout,
            h2_keepalive,
            slots: Arc::new(tokio::sync::Semaphore::new(max_connections.max(1))),
        }
    }

    /// A slot for one more connection, if there is one.
    fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// The HTTP/1.1 and HTTP/2 server, bounded.
    fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout);
        b.http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.h2_keepalive)
            .keep_alive_timeout(self.h2_keepalive);
        b
    }
}

impl Default for ConnLimits {
    /// 30 s for headers (hyper's own default), pings every 20 s, 4,096 connections.
    fn default() -> Self {
        Self::new(
            std::time::Duration::from_secs(30),
            std::time::Duration::from_secs(20),
            4096,
        )
    }
}

/// Serves the outbound listener, all connections by one stack, until the task is dropped.
pub async fn serve<S>(listener: TcpListener, service: S, limits: ConnLimits)
where
    S: tower::Service<
            http::Request<Incoming>,
            Response = http::Response<ProxyBody>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    loop {
        let (stream, peer) = accept(&listener).await;
        let Some(permit) = limits.admit() else {
            tracing::debug!(%peer, "connection limit reached; closing");
            continue;
        };
        let (service, limits) = (service.clone(), limits.clone());
        tokio::spawn(async move {
            serve_http(stream, peer, service, &limits).await;
            drop(permit);
        });
    }
}

/// The outbound listener's routing: the default target's stack for direct use, and per original
/// destination for redirected connections.
pub struct Outbound<S, R, O> {
    /// The stack of the configured default target.
    pub direct: S,
    pub targets: Targets<S, R>,
    pub orig_dst: O,
    /// How long to connect to a forwarded connection's destination.
    pub connect_timeout: std::time::Duration,
    /// Where connections are counted (the sidecar's metrics).
    pub metrics: crate::metrics::ConnectionMetrics,
    pub limits: ConnLimits,
}

impl<S, R, O> std::fmt::Debug for Outbound<S, R, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

/// Serves the outbound listener with traffic capture until the task is dropped.
pub async fn serve_outbound<S, R, O>(listener: TcpListener, outbound: Arc<Outbound<S, R, O>>)
where
    S: tower::Service<
            http::Request<Incoming>,
            Response = http::Response<ProxyBody>,
            Error = Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    R: Resolve,
    O: OrigDst,
{
    loop {
        let (stream, peer) = accept(&listener).await;
        let Some(permit) = outbound.limits.admit() else {
            outbound.metrics.connection("over_limit");
            tracing::debug!(%peer, "connection limit reached; closing");
            continue;
        };
        let local = match stream.local_addr() {
            Ok(a) => a,
            Err(error) => {
                tracing::debug!(%peer, %error, "connection gone before it was served");
                continue;
            }
        };
        let orig = outbound.orig_dst.orig_dst(&stream).unwrap_or_else(|error| {
            tracing::warn!(%peer, %error, "cannot read the original destination; serving as direct use");
            None
        });
        let outbound = outbound.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let metrics = &outbound.metrics;
            let limits = &outbound.limits;
            match Destination::of(local, orig) {
                Destination::Direct => {
                    metrics.connection("direct");
                    serve_http(stream, peer, outbound.direct.clone(), limits).await;
                }
                Destination::Redirected(dst) => match outbound.targets.route(dst).await {
                    Route::Inference(svc, lease) => {
                        metrics.connection("inference_target");
                        serve_http(stream, peer, svc, limits).await;
                        // The target's stack may be evicted once no connection holds it.
                        drop(lease);
                    }
                    Route::Forward => {
                        metrics.connection("forwarded");
                        if let Err(reason) = forward(stream, dst, outbound.connect_timeout).await {
                            metrics.forward_error(reason);
                        }
                    }
                },
            }
        });
    }
}

async fn accept(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return (stream, peer);
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

/// Serves one connection's HTTP/1.1 or h2c requests with `service`, within `limits`.
async fn serve_http<S>(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    service: S,
    limits: &ConnLimits,
) where
    S: tower::Service<
            http::Request<Incoming>,
            Response = http::Response<ProxyBody>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let svc = TowerToHyperService::new(service);
    if let Err(error) = limits
        .builder()
        .serve_connection(TokioIo::new(stream), svc)
        .await
    {
        tracing::debug!(%peer, %error, "connection ended with an error");
    }
}

/// Copies bytes both ways between the app's connection and its original destination; on
/// failure, the reason as `forward_errors_total` labels it (`connect`, `connect_timeout`, `io`).
async fn forward(
    mut inbound: TcpStream,
    dst: std::net::SocketAddr,
    timeout: std::time::Duration,
) -> Result<(), &'static str> {
    let mut outbound = match tokio::time::timeout(timeout, TcpStream::connect(dst)).await {
        Ok(Ok(s)) => s,
        Ok(Err(error)) => {
            tracing::debug!(%dst, %error, "cannot connect to the original destination");
            return Err("connect");
        }
        Err(_) => {
            tracing::debug!(%dst, "connecting to the original destination timed out");
            return Err("connect_timeout");
        }
    };
    let _ = outbound.set_nodelay(true);
    if let Err(error) = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await {
        tracing::debug!(%dst, %error, "forwarded connection ended with an error");
        return Err("io");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::full;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A listener serving `200 ok` within `limits`, and its address.
    async fn listen(limits: ConnLimits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let svc = tower::service_fn(|_req: http::Request<Incoming>| async {
            Ok::<_, Infallible>(http::Response::new(full("ok")))
        });
        tokio::spawn(serve(listener, svc, limits));
        addr
    }

    /// Reads until the peer closes; the bytes read.
    async fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_never_finishes_its_headers_is_closed_at_the_timeout() {
        let addr = listen(ConnLimits::new(
            Duration::from_secs(5),
            Duration::from_secs(20),
            16,
        ))
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        // A slowloris: part of a request line, and then nothing.
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let _ = read_to_close(&mut s).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_keep_alive_connection_is_closed_at_the_header_timeout() {
        let addr = listen(ConnLimits::new(
            Duration::from_secs(5),
            Duration::from_secs(20),
            16,
        ))
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        // Kept alive, then idle: closed when the wait for its next request times out.
        let started = tokio::time::Instant::now();
        let _ = read_to_close(&mut s).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_at_once() {
        let addr = listen(ConnLimits::new(
            Duration::from_secs(30),
            Duration::from_secs(20),
            2,
        ))
        .await;
        let held = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        // Give the accept loop the two (they hold the slots while open).
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut third = TcpStream::connect(addr).await.unwrap();
        third
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .ok();
        assert!(
            read_to_close(&mut third).await.is_empty(),
            "closed unanswered"
        );
        // A slot freed is a slot again.
        drop(held);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut fourth = TcpStream::connect(addr).await.unwrap();
        fourth
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = read_to_close(&mut fourth).await;
        assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    }
}
