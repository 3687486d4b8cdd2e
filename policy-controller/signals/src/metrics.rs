//! The service's Prometheus metrics: who watches each pool, and how often each engine is read.
//!
//! The point of the service is that an engine's scrape count stops growing with the mesh; these
//! two families are what shows it from the controller's side. The notice families show the relay
//! of sidecars' requests to each other, and what slow watchers lost of it.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// `<namespace>/<name>`.
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScrapeLabels {
    pub pool: String,
    /// `ip:port`.
    pub endpoint: String,
    /// `ok` or `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NoticeLabels {
    pub pool: String,
    /// `relayed`, `unwatched` (nobody watches the pool) or `invalid` (not a pool path).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub pool: String,
    /// The shard that owns the pool (`(default)`: the pools without a shard).
    pub shard: String,
}

#[derive(Clone, Debug, Default)]
pub struct SignalsMetrics {
    pub watchers: Family<PoolLabels, Gauge>,
    pub scrapes: Family<ScrapeLabels, Counter>,
    /// Reads of `GET /load`, on their own interval.
    pub load_reads: Family<ScrapeLabels, Counter>,
    pub notices: Family<NoticeLabels, Counter>,
    /// Notices a watcher lost because it read too slowly.
    pub notices_lost: Family<PoolLabels, Counter>,
    /// Watches refused because another signal shard owns the pool.
    pub refused: Family<RefusedLabels, Counter>,
}

impl SignalsMetrics {
    /// Registers the families (`signals_watchers`, `signals_scrapes_total`) in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "signals_watchers",
            "EngineSignals.Watch streams open, by pool",
            m.watchers.clone(),
        );
        registry.register(
            "signals_scrapes",
            "Engine scrapes made by the signal service, by pool, endpoint and result",
            m.scrapes.clone(),
        );
        registry.register(
            "signals_load_reads",
            "Engine GET /load reads made by the signal service, by pool, endpoint and result",
            m.load_reads.clone(),
        );
        registry.register(
            "signals_notices",
            "Sidecars' notices received, by pool and what became of them",
            m.notices.clone(),
        );
        registry.register(
            "signals_notices_lost",
            "Notices a watcher lost because it read too slowly, by pool",
            m.notices_lost.clone(),
        );
        registry.register(
            "signals_refused",
            "EngineSignals.Watch calls refused because another signal shard owns the pool, by pool \
             and owning shard",
            m.refused.clone(),
        );
        m
    }

    /// The scrapes of `endpoint` in `pool` with `result`.
    pub fn scrapes_of(&self, pool: &str, endpoint: &str, result: &'static str) -> u64 {
        self.scrapes
            .get_or_create(&ScrapeLabels {
                pool: pool.into(),
                endpoint: endpoint.into(),
                result,
            })
            .get()
    }
}
