//! The engine-signals service: each engine scraped once by the control plane, its readings
//! streamed to every sidecar that routes to its pool (issue 21, `docs/signals.md`).
//!
//! Without it every sidecar scrapes every engine's `/metrics` and `/load` on its own interval, so
//! an engine's scrape load grows with the mesh. Here the controller keeps ONE scrape loop per
//! endpoint of each pool that at least one sidecar watches ([`Hub`]), and fans each reading out
//! through a `tokio::sync::watch` per pool: a slow watcher skips to the latest state instead of
//! queueing, so no sidecar can make the controller buffer without bound. The loops of a pool stop
//! when its last watcher goes.
//!
//! [`delta`] decides what each stream sends (a snapshot, then only changed readings, each with its
//! age); [`probe`] reads one engine behind a small trait, so the hub is tested without sockets;
//! [`prefix`] mirrors each engine's KV events once and relays them as block-hash deltas;
//! [`service`] is the gRPC face (`EngineSignals.Watch`).

pub mod delta;
pub mod hub;
pub mod metrics;
pub mod prefix;
pub mod probe;
pub mod service;

pub use self::{
    hub::{Hub, HubConfig, SubscribeError, Subscription},
    metrics::SignalsMetrics,
    probe::{HttpProbe, Probe, ProbeError},
    service::SignalsServer,
};
