//! Each engine's prefix cache, subscribed to once and streamed to every sidecar as block-hash
//! deltas.
//!
//! A sidecar answers "how much of this prompt is cached where" from a mirror of each endpoint's
//! cache, fed by the engine's KV events. Without the service every sidecar subscribes to every
//! engine's ZMQ publisher, so an engine has as many subscribers as the mesh has sidecars. Here the
//! controller subscribes once per endpoint of a watched pool, keeps its own mirror (the held block
//! hashes, oldest first), and relays each batch as a compact delta: the 64-bit hashes stored and
//! removed, nothing else of the event (the sidecar's mirror uses only those and the block size).
//!
//! A new watcher's first message carries every endpoint's held blocks (`reset`), taken under the
//! same lock that orders the deltas, so it sees each change exactly once after its snapshot. A
//! watcher that lags more than the ring holds is not given a gap: it gets a fresh snapshot of
//! every endpoint instead. Events the controller itself lost (a sequence gap at the publisher)
//! clear that endpoint's mirror here and at every sidecar (`reset` with nothing): under-stating a
//! cache is safe, over-stating it is not.

use kinference_proxy_api::signals as api;
use kinference_proxy_signals::{KvEventsConfig, subscribe_kv_events_with};
use kinference_routing::KvEvent;
use parking_lot::Mutex;
use std::{collections::HashMap, net::SocketAddr, sync::Arc};
use tokio::sync::broadcast;

/// Batches held for the slowest watcher before it is resynchronised with a snapshot.
const RING: usize = 1024;

/// The most blocks mirrored per endpoint (a vLLM replica's GPU blocks are far fewer): a publisher
/// that never removes cannot grow the controller without bound.
const MAX_BLOCKS: usize = 1 << 20;

/// Where a pool's endpoints publish, as the watcher said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub port: Port,
    pub topic: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Absolute(u16),
    Offset(i32),
}

impl Source {
    /// The watcher's word, if it gave a usable one.
    pub fn from_api(s: &api::KvEventsSource) -> Option<Self> {
        use api::kv_events_source::Port as P;
        let port = match s.port? {
            P::Absolute(p) => Port::Absolute(u16::try_from(p).ok().filter(|p| *p > 0)?),
            P::Offset(o) => Port::Offset(o),
        };
        Some(Self {
            port,
            topic: s.topic.clone(),
        })
    }

    /// The ZMQ address of `endpoint`'s publisher.
    pub fn publisher(&self, endpoint: SocketAddr) -> Option<String> {
        let port = match self.port {
            Port::Absolute(p) => p,
            Port::Offset(o) => u16::try_from(i64::from(endpoint.port()) + i64::from(o))
                .ok()
                .filter(|p| *p > 0)?,
        };
        Some(format!("tcp://{}", SocketAddr::new(endpoint.ip(), port)))
    }
}

/// One endpoint's held blocks, in the order they were last stored.
#[derive(Debug, Default)]
struct Mirror {
    /// Hash -> when it was last stored (a counter), so a snapshot lists them oldest first.
    blocks: HashMap<u64, u64>,
    stamp: u64,
    block_size: u32,
}

impl Mirror {
    /// Applies a batch; the delta a sidecar applies to reach the same state.
    fn apply(&mut self, events: &[KvEvent]) -> (bool, Vec<api::PrefixEvent>) {
        use api::prefix_event::Event;
        let mut reset = false;
        let mut out: Vec<api::PrefixEvent> = Vec::new();
        for e in events {
            match e {
                KvEvent::BlockStored {
                    block_hashes,
                    block_size,
                    ..
                } => {
                    if *block_size > 0 {
                        self.block_size = *block_size;
                    }
                    for &h in block_hashes {
                        self.stamp += 1;
                        if self.blocks.len() < MAX_BLOCKS || self.blocks.contains_key(&h) {
                            self.blocks.insert(h, self.stamp);
                        }
                    }
                    out.push(api::PrefixEvent {
                        event: Some(Event::Stored(api::BlockHashes {
                            hashes: block_hashes.clone(),
                            block_size_tokens: *block_size,
                        })),
                    });
                }
                KvEvent::BlockRemoved { block_hashes } => {
                    for h in block_hashes {
                        self.blocks.remove(h);
                    }
                    out.push(api::PrefixEvent {
                        event: Some(Event::Removed(api::BlockHashes {
                            hashes: block_hashes.clone(),
                            block_size_tokens: 0,
                        })),
                    });
                }
                KvEvent::AllBlocksCleared => {
                    // Everything before it in this batch is moot.
                    self.blocks.clear();
                    reset = true;
                    out.clear();
                }
            }
        }
        (reset, out)
    }

    /// What a sidecar needs to hold the same blocks: `reset`, then every block, oldest first.
    fn snapshot(&self, addr: &str) -> api::PrefixDelta {
        let mut held: Vec<(u64, u64)> = self.blocks.iter().map(|(h, s)| (*s, *h)).collect();
        held.sort_unstable();
        let events = if held.is_empty() {
            Vec::new()
        } else {
            vec![api::PrefixEvent {
                event: Some(api::prefix_event::Event::Stored(api::BlockHashes {
                    hashes: held.into_iter().map(|(_, h)| h).collect(),
                    block_size_tokens: self.block_size,
                })),
            }]
        };
        api::PrefixDelta {
            addr: addr.to_string(),
            reset: true,
            events,
        }
    }
}

/// A pool's mirrors and the ring their deltas go out on; shared by the pool's KV loops and its
/// watchers.
#[derive(Debug)]
pub struct PoolPrefix {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    mirrors: HashMap<String, Mirror>,
    tx: broadcast::Sender<Arc<api::PrefixDelta>>,
}

impl Default for PoolPrefix {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                mirrors: HashMap::new(),
                tx: broadcast::channel(RING).0,
            }),
        }
    }
}

/// A watcher's view: the snapshot to send first, then the deltas.
#[derive(Debug)]
pub struct Feed {
    pub snapshot: Vec<api::PrefixDelta>,
    pub deltas: broadcast::Receiver<Arc<api::PrefixDelta>>,
}

impl PoolPrefix {
    /// Applies one endpoint's batch and relays its delta.
    pub fn apply(&self, addr: &str, events: &[KvEvent]) {
        let mut inner = self.inner.lock();
        let (reset, events) = inner
            .mirrors
            .entry(addr.to_string())
            .or_default()
            .apply(events);
        if reset || !events.is_empty() {
            let _ = inner.tx.send(Arc::new(api::PrefixDelta {
                addr: addr.to_string(),
                reset,
                events,
            }));
        }
    }

    /// The controller lost some of the endpoint's events: its mirror is cleared everywhere.
    pub fn lost(&self, addr: &str) {
        self.apply(addr, &[KvEvent::AllBlocksCleared]);
    }

    /// The endpoint left the pool (its readings' `removed` tells the sidecars).
    pub fn forget(&self, addr: &str) {
        self.inner.lock().mirrors.remove(addr);
    }

    /// A snapshot of every endpoint and the deltas after it, with nothing missed or repeated
    /// between the two.
    pub fn feed(&self) -> Feed {
        let inner = self.inner.lock();
        Feed {
            snapshot: inner
                .mirrors
                .iter()
                .map(|(addr, m)| m.snapshot(addr))
                .collect(),
            deltas: inner.tx.subscribe(),
        }
    }

    /// Blocks mirrored, over the pool's endpoints.
    pub fn blocks(&self) -> usize {
        self.inner
            .lock()
            .mirrors
            .values()
            .map(|m| m.blocks.len())
            .sum()
    }
}

/// Follows one endpoint's KV events into the pool's mirror until aborted.
pub async fn follow(addr: SocketAddr, source: Source, prefix: Arc<PoolPrefix>) {
    let Some(publisher) = source.publisher(addr) else {
        tracing::warn!(endpoint = %addr, "no KV-event publisher port for the endpoint");
        return;
    };
    let key = addr.to_string();
    let mut rx = subscribe_kv_events_with(KvEventsConfig::new(publisher, source.topic));
    while let Some(item) = rx.recv().await {
        match item {
            Ok(events) => prefix.apply(&key, &events),
            Err(error) => {
                tracing::debug!(endpoint = %addr, %error, "KV event stream");
                if error.events_lost() {
                    prefix.lost(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[u64]) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: None,
            token_ids: vec![],
            block_size: 16,
        }
    }

    fn hashes(d: &api::PrefixDelta) -> Vec<(bool, Vec<u64>)> {
        use api::prefix_event::Event;
        d.events
            .iter()
            .map(|e| match e.event.as_ref().unwrap() {
                Event::Stored(b) => (true, b.hashes.clone()),
                Event::Removed(b) => (false, b.hashes.clone()),
            })
            .collect()
    }

    #[test]
    fn a_feed_is_the_held_blocks_then_each_change_once() {
        let p = PoolPrefix::default();
        p.apply("a", &[stored(&[1, 2, 3])]);
        p.apply(
            "a",
            &[
                KvEvent::BlockRemoved {
                    block_hashes: vec![2],
                },
                stored(&[4]),
            ],
        );
        let mut feed = p.feed();
        assert_eq!(feed.snapshot.len(), 1);
        assert!(feed.snapshot[0].reset);
        assert_eq!(
            hashes(&feed.snapshot[0]),
            [(true, vec![1, 3, 4])],
            "oldest first"
        );
        assert_eq!(
            feed.snapshot[0].events[0].event,
            Some(api::prefix_event::Event::Stored(api::BlockHashes {
                hashes: vec![1, 3, 4],
                block_size_tokens: 16
            }))
        );
        p.apply(
            "a",
            &[KvEvent::BlockRemoved {
                block_hashes: vec![1],
            }],
        );
        let d = feed.deltas.try_recv().unwrap();
        assert!(!d.reset);
        assert_eq!(hashes(&d), [(false, vec![1])]);
        assert!(
            feed.deltas.try_recv().is_err(),
            "nothing before the snapshot is repeated"
        );
    }

    #[test]
    fn a_cleared_cache_or_lost_events_reset_the_endpoint() {
        let p = PoolPrefix::default();
        let mut feed = p.feed();
        p.apply(
            "a",
            &[stored(&[1]), KvEvent::AllBlocksCleared, stored(&[9])],
        );
        let d = feed.deltas.try_recv().unwrap();
        assert!(d.reset);
        assert_eq!(
            hashes(&d),
            [(true, vec![9])],
            "what came before the clear is dropped"
        );
        p.lost("a");
        let d = feed.deltas.try_recv().unwrap();
        assert!(d.reset && d.events.is_empty());
        assert_eq!(p.blocks(), 0);
    }

    #[test]
    fn publishers_follow_the_pools_port_rule() {
        let ep: SocketAddr = "10.0.0.7:8000".parse().unwrap();
        let abs = Source::from_api(&api::KvEventsSource {
            port: Some(api::kv_events_source::Port::Absolute(5557)),
            topic: "kv".into(),
        })
        .unwrap();
        assert_eq!(abs.publisher(ep).as_deref(), Some("tcp://10.0.0.7:5557"));
        let off = Source::from_api(&api::KvEventsSource {
            port: Some(api::kv_events_source::Port::Offset(1)),
            topic: String::new(),
        })
        .unwrap();
        assert_eq!(off.publisher(ep).as_deref(), Some("tcp://10.0.0.7:8001"));
        assert!(
            Source::from_api(&api::KvEventsSource {
                port: None,
                topic: String::new()
            })
            .is_none()
        );
    }
}
