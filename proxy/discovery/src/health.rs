//! Whether every stream to the controller is up, as one boolean.
//!
//! Each stream reports its own state under a key; `connected` is true when every registered
//! stream is up. A stream that ends or fails reports down until its replacement answers.

use std::{collections::BTreeMap, sync::Arc};
use tokio::sync::watch;

/// The identity of one stream to the controller.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stream {
    Inference,
    Outbound,
    Destination(String),
}

/// Shared by every discovery task.
#[derive(Clone, Debug)]
pub(crate) struct Health {
    streams: Arc<std::sync::Mutex<BTreeMap<Stream, bool>>>,
    tx: Arc<watch::Sender<bool>>,
}

impl Health {
    /// Policy streams start down: nothing has been received yet.
    pub(crate) fn new() -> (Self, watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(false);
        let streams = BTreeMap::from([(Stream::Inference, false), (Stream::Outbound, false)]);
        let health = Self {
            streams: Arc::new(std::sync::Mutex::new(streams)),
            tx: Arc::new(tx),
        };
        (health, rx)
    }

    pub(crate) fn set(&self, stream: Stream, up: bool) {
        self.update(|streams| {
            streams.insert(stream, up);
        });
    }

    pub(crate) fn remove(&self, stream: &Stream) {
        self.update(|streams| {
            streams.remove(stream);
        });
    }

    fn update(&self, f: impl FnOnce(&mut BTreeMap<Stream, bool>)) {
        // A poisoned lock only means another task panicked mid-update; the map is still valid.
        let mut streams = self
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut streams);
        let connected = streams.values().all(|up| *up);
        self.tx.send_if_modified(|c| {
            let changed = *c != connected;
            *c = connected;
            changed
        });
    }
}
