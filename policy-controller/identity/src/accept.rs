//! The server side of TLS: accepted TCP connections in, TLS streams that tonic serves out.
//!
//! Each handshake runs in a task of its own (bounded by [`HANDSHAKE_TIMEOUT`]), so a slow or
//! hostile client never holds up the next. A connection that fails its handshake (no client
//! certificate, one from another authority, an expired one, or plaintext) is dropped and logged;
//! it never reaches a gRPC service. Each stream carries its [`PeerInfo`] as tonic's connect info,
//! and a mutual-TLS stream fails once its peer's certificate expires, so the peer reconnects with
//! its refreshed one.

use crate::{
    clock,
    peer::{PeerIdentity, PeerInfo},
};
use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    time::Sleep,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::wrappers::ReceiverStream;

/// How long a client has to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the listener requires a workload certificate of each client.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// Mutual TLS: the configuration requires a client certificate, and it must name a workload.
    Workload,
    /// Server authentication only (the issuer, which proxies call before they have a certificate).
    None,
}

/// One accepted TLS connection.
#[derive(Debug)]
pub struct TlsConn {
    io: TlsStream<TcpStream>,
    info: PeerInfo,
    expires: Option<Pin<Box<Sleep>>>,
}

impl TlsConn {
    pub fn peer(&self) -> &PeerInfo {
        &self.info
    }
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(expires) = self.expires.as_mut()
            && expires.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::other("the peer's certificate expired")));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Accepts on `listener` and completes handshakes until the returned stream is dropped.
/// `name` names the listener in logs.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    auth: ClientAuth,
    name: &'static str,
) -> ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let (tcp, remote) = match accepted {
                Ok(conn) => conn,
                Err(error) => {
                    tracing::warn!(listener = name, %error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let io = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(io)) => io,
                    Ok(Err(error)) => {
                        tracing::info!(listener = name, %remote, %error, "TLS handshake refused");
                        return;
                    }
                    Err(_) => {
                        tracing::info!(listener = name, %remote, "TLS handshake timed out");
                        return;
                    }
                };
                let identity = match auth {
                    ClientAuth::None => None,
                    ClientAuth::Workload => {
                        let leaf = io.get_ref().1.peer_certificates().and_then(|c| c.first());
                        match leaf.map(PeerIdentity::from_leaf) {
                            Some(Ok(id)) => Some(Arc::new(id)),
                            Some(Err(error)) => {
                                tracing::info!(listener = name, %remote, %error, "refused a certificate that names no workload");
                                return;
                            }
                            None => {
                                tracing::info!(listener = name, %remote, "refused a client without a certificate");
                                return;
                            }
                        }
                    }
                };
                let expires = identity.as_ref().map(|id| {
                    let left = id
                        .not_after
                        .duration_since(clock::calendar_now())
                        .unwrap_or_default();
                    Box::pin(tokio::time::sleep(left))
                });
                tracing::debug!(listener = name, %remote, peer = identity.as_ref().map(|i| i.workload.as_str()), "TLS connection");
                let conn = TlsConn {
                    io,
                    info: PeerInfo {
                        remote_addr: Some(remote),
                        identity,
                    },
                    expires,
                };
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    ReceiverStream::new(rx)
}
