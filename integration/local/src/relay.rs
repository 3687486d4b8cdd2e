//! A TCP relay that a test puts between two processes to partition the link or slow it down.
//!
//! A fault test of the signal service has to show what a sidecar does when the service is not
//! dead but unreachable or slow, which killing the process cannot show: a partition sends no FIN
//! and no RST, so the sidecar must notice by itself (its stream goes silent, its HTTP/2 pings go
//! unanswered), and a slow link still delivers every byte, only late. The relay forwards each
//! accepted connection to one upstream address and, by its [`Mode`], forwards bytes at once,
//! holds them all (a partition: nothing is dropped or closed, and everything held flows again
//! when it heals, as TCP would retransmit it), or delays each chunk by a fixed time without
//! limiting throughput (a long link, not a thin one).

use std::{net::SocketAddr, time::Duration};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{mpsc, watch},
    time::Instant,
};

/// What the relay does to the bytes it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forwarded as they arrive.
    Open,
    /// Held (both directions, every connection, new ones included) until the mode changes.
    Partitioned,
    /// Each chunk forwarded this long after it arrived.
    Delayed(Duration),
}

/// A running relay; it stops when dropped.
#[derive(Debug)]
pub struct Relay {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on a free loopback port and relays each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(Mode::Open);
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let rx = rx.clone();
                tokio::spawn(async move {
                    if let Ok(up) = TcpStream::connect(upstream).await {
                        let _ = (down.set_nodelay(true), up.set_nodelay(true));
                        let (dr, dw) = down.into_split();
                        let (ur, uw) = up.into_split();
                        tokio::join!(pipe(dr, uw, rx.clone()), pipe(ur, dw, rx));
                    }
                });
            }
        });
        Ok(Self { addr, mode, task })
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits while the relay is partitioned; the mode then in force.
async fn passable(mode: &mut watch::Receiver<Mode>) -> Option<Mode> {
    mode.wait_for(|m| *m != Mode::Partitioned)
        .await
        .ok()
        .map(|m| *m)
}

/// One direction: a reader stamps each chunk, a writer forwards it when the mode allows.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mode: watch::Receiver<Mode>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut read_mode = mode.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if passable(&mut read_mode).await.is_none() {
                return;
            }
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let mut write_mode = mode;
    let writer = async move {
        while let Some((at, chunk)) = rx.recv().await {
            loop {
                let Some(m) = passable(&mut write_mode).await else {
                    return;
                };
                if let Mode::Delayed(d) = m {
                    let due = at + d;
                    if Instant::now() < due {
                        // Re-check the mode when it changes before the chunk is due.
                        tokio::select! {
                            () = tokio::time::sleep_until(due) => {}
                            _ = write_mode.changed() => continue,
                        }
                    }
                }
                // A partition that began while this chunk was waiting holds it too.
                if *write_mode.borrow() == Mode::Partitioned {
                    continue;
                }
                break;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8], within: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        tokio::time::timeout(within, s.read_exact(&mut got))
            .await
            .ok()
            .map(|r| {
                r.unwrap();
                got
            })
    }

    // Real time: the bytes cross real sockets, which a paused clock would race.
    #[tokio::test]
    async fn it_forwards_holds_while_partitioned_and_delays() {
        let relay = Relay::start(echo().await).await.unwrap();
        let mut s = TcpStream::connect(relay.addr).await.unwrap();
        let hour = Duration::from_secs(3600);
        assert_eq!(round_trip(&mut s, b"open", hour).await.unwrap(), b"open");

        relay.set(Mode::Partitioned);
        assert_eq!(
            round_trip(&mut s, b"held", Duration::from_secs(1)).await,
            None
        );
        relay.set(Mode::Open);
        let mut got = [0u8; 4];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(
            &got, b"held",
            "what was held flows when the partition heals"
        );

        relay.set(Mode::Delayed(Duration::from_millis(300)));
        let sent = Instant::now();
        assert_eq!(round_trip(&mut s, b"slow", hour).await.unwrap(), b"slow");
        let took = sent.elapsed();
        assert!(
            took >= Duration::from_millis(600),
            "{took:?}: delayed each way"
        );
    }
}
