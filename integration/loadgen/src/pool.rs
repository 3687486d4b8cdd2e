//! A keep-alive pool of HTTP/1.1 connections to one address, built on hyper's connection API.
//!
//! The load generator must not share code with the system it measures: the proxy dispatches
//! through hyper-util's pooled client, so this pool is written directly on
//! `hyper::client::conn::http1`. A connection is taken for one request at a time, returned once
//! its response body is read to the end, and dropped when the server closed it. The number of
//! connections is bounded; a request that finds none free waits for one, and that wait counts in
//! its latency, as it would for a real client.

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};
use tokio::{
    net::TcpStream,
    sync::{OwnedSemaphorePermit, Semaphore},
};

/// The request body type every pooled connection sends.
pub type ReqBody = Full<Bytes>;

/// Why a connection could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP/1.1 handshake with {addr}: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
    #[error("the pool is closed")]
    Closed,
}

/// Connections to one address.
#[derive(Debug)]
pub struct Pool {
    addr: SocketAddr,
    idle: Mutex<Vec<SendRequest<ReqBody>>>,
    permits: Arc<Semaphore>,
    opened: AtomicU64,
}

/// One connection, held for one request; give it back with [`Pool::put`].
#[derive(Debug)]
pub struct Conn {
    pub sender: SendRequest<ReqBody>,
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    /// A pool of at most `max_connections` connections to `addr` (at least one).
    pub fn new(addr: SocketAddr, max_connections: usize) -> Self {
        Self {
            addr,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
            opened: AtomicU64::new(0),
        }
    }

    /// How many connections were opened so far.
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// A ready connection: an idle one if any is still open, else a new one.
    pub async fn get(&self) -> Result<Conn, PoolError> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| PoolError::Closed)?;
        loop {
            let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
            let Some(mut sender) = idle else {
                break;
            };
            // A connection whose previous response was read to the end is ready at once; one
            // the server closed fails here and is dropped.
            if sender.ready().await.is_ok() {
                return Ok(Conn {
                    sender,
                    _permit: permit,
                });
            }
        }
        let sender = self.connect().await?;
        Ok(Conn {
            sender,
            _permit: permit,
        })
    }

    /// Returns a connection whose response was read to the end.
    pub fn put(&self, conn: Conn) {
        if conn.sender.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn.sender);
        }
    }

    async fn connect(&self) -> Result<SendRequest<ReqBody>, PoolError> {
        let addr = self.addr;
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| PoolError::Connect { addr, source })?;
        stream
            .set_nodelay(true)
            .map_err(|source| PoolError::Connect { addr, source })?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| PoolError::Handshake { addr, source })?;
        tokio::spawn(async move {
            // The connection ends when the server closes it or the sender is dropped; either is
            // seen by the request that was using it.
            let _ = conn.await;
        });
        self.opened.fetch_add(1, Ordering::Relaxed);
        sender
            .ready()
            .await
            .map_err(|source| PoolError::Handshake { addr, source })?;
        Ok(sender)
    }
}
