//! One set of scrape loops per watched pool, shared by all its watchers.
//!
//! [`Hub::subscribe`] finds the pool's loops or starts them: a task follows the pool's endpoints
//! in the controller's index (the set `Destination.Get` streams) and keeps one scrape loop per
//! endpoint, each writing its readings into the pool's `watch` channel. A [`Subscription`] holds
//! the pool alive; when the last one is dropped (its stream ended, its sidecar went away), the
//! pool's tasks are aborted. A watcher that reads slowly sees only the latest state. When the
//! first watcher says where the pool's endpoints publish KV events, each endpoint also gets one
//! KV-event subscription, mirrored in the pool's [`PoolPrefix`].
//!
//! A hub serves one signal shard (docs/signals.md, "Sharding"): only the pools whose
//! `kinference.io/signals-shard` annotation names it (the default shard: the pools without one).
//! A watch of another shard's pool is refused ([`SubscribeError::NotOwned`], counted), never
//! served empty; and a pool that moves to another shard while watched has its loops stopped and
//! its streams ended, so that its engines are never read by two shards for long.

use crate::{
    delta::{Entry, LoadEntry, PoolState},
    metrics::{PoolLabels, RefusedLabels, ScrapeLabels, SignalsMetrics},
    prefix::{self, PoolPrefix},
    probe::Probe,
};
use kinference_policy_core::{DiscoverEndpoints, PoolEndpoints, PoolRef, inference::SignalsShard};
use kinference_proxy_api::signals as api;
use kinference_proxy_signals::Engine;
use parking_lot::Mutex;
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Weak},
    time::Duration,
};
use tokio::{
    sync::{broadcast, watch},
    task::JoinHandle,
    time::Instant,
};

/// How the hub reads engines.
#[derive(Clone, Copy, Debug)]
pub struct HubConfig {
    /// Between the starts of two scrapes of one endpoint's metrics.
    pub interval: Duration,
    /// Between the starts of two reads of one endpoint's `GET /load`: one counter, cheap for the
    /// engine, and the first signal to show a new request, so read more often than the metrics
    /// (docs/signals.md, "Freshness").
    pub load_interval: Duration,
    /// How old a sidecar's copy of an unchanged reading may grow before it is sent again.
    pub refresh: Duration,
}

impl Default for HubConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(50),
            load_interval: Duration::from_millis(10),
            refresh: Duration::from_millis(100),
        }
    }
}

/// The pools being read; cheap to clone.
#[derive(Debug)]
pub struct Hub<D, P> {
    inner: Arc<Inner<D, P>>,
}

impl<D, P> Clone for Hub<D, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

#[derive(Debug)]
struct Inner<D, P> {
    discover: D,
    probe: P,
    config: HubConfig,
    metrics: SignalsMetrics,
    /// The shard served (`None`: the default shard).
    shard: Option<SignalsShard>,
    pools: Mutex<HashMap<PoolRef, Weak<Pool>>>,
}

/// Why a pool is not served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    /// The index has no such pool.
    #[error("no InferencePool {pool}")]
    UnknownPool { pool: String },
    /// Another signal shard owns the pool: its proxies are to watch it there.
    #[error(
        "InferencePool {pool} is on signal shard {owner}, and this replica serves shard {serving} \
         (the pool's kinference.io/signals-shard annotation)"
    )]
    NotOwned {
        pool: String,
        owner: String,
        serving: String,
    },
}

/// How many notices a pool holds for its slowest watcher before that watcher loses the oldest.
const NOTICE_BACKLOG: usize = 4096;

/// A watched pool: its state, the task that reads it, and the sidecars' notices on it.
#[derive(Debug)]
struct Pool {
    state: watch::Receiver<PoolState>,
    task: JoinHandle<()>,
    notices: broadcast::Sender<Relayed>,
    /// Step notices not yet in the state, the newest per endpoint: the pool's loop moves them
    /// there once per load interval, so that however often streams' steps end, they add at most
    /// that many wake-ups to each watcher.
    steps: Arc<Mutex<HashMap<String, Relayed>>>,
    prefix: Arc<PoolPrefix>,
}

/// A notice as the hub holds it: with when it arrived, so each stream adds the time it waited to
/// the notice's age.
pub type Relayed = (Instant, Arc<api::Notice>);

impl Drop for Pool {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A watcher's hold on a pool: its readings, kept coming while any subscription lives.
#[derive(Debug)]
pub struct Subscription {
    pub state: watch::Receiver<PoolState>,
    /// Every notice sent on the pool while subscribed (a ring: a watcher that lags loses the
    /// oldest, and is told how many).
    pub notices: broadcast::Receiver<Relayed>,
    /// The endpoints' held blocks and their changes since (empty without KV events).
    pub prefix: prefix::Feed,
    pool: Arc<Pool>,
    watchers: prometheus_client::metrics::gauge::Gauge,
}

impl Subscription {
    /// A fresh snapshot of every endpoint's blocks, for a watcher that lagged past the ring.
    pub fn resync_prefix(&mut self) {
        self.prefix = self.pool.prefix.feed();
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.watchers.dec();
    }
}

impl<D, P> Hub<D, P>
where
    D: DiscoverEndpoints + Send + Sync + 'static,
    P: Probe,
{
    /// A hub of the default shard (the pools without a `kinference.io/signals-shard`).
    pub fn new(discover: D, probe: P, config: HubConfig, metrics: SignalsMetrics) -> Self {
        Self::sharded(discover, probe, config, metrics, None)
    }

    /// A hub that serves the pools of `shard` only (`None`: the default shard).
    pub fn sharded(
        discover: D,
        probe: P,
        config: HubConfig,
        metrics: SignalsMetrics,
        shard: Option<SignalsShard>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                discover,
                probe,
                config,
                metrics,
                shard,
                pools: Mutex::default(),
            }),
        }
    }

    pub fn config(&self) -> HubConfig {
        self.inner.config
    }

    /// The shard served (`None`: the default shard).
    pub fn shard(&self) -> Option<&SignalsShard> {
        self.inner.shard.as_ref()
    }

    /// Watches `pool`, read as `engine` when this starts its loops; refused when the index knows
    /// no such pool or another shard owns it.
    pub fn subscribe(
        &self,
        pool: &PoolRef,
        engine: Engine,
    ) -> Result<Subscription, SubscribeError> {
        self.subscribe_with(pool, engine, None)
    }

    /// Whether this hub's shard owns the pool, as the index says now; a refusal is counted.
    fn check_owner(
        &self,
        pool: &PoolRef,
        endpoints: &watch::Receiver<PoolEndpoints>,
    ) -> Result<(), SubscribeError> {
        let owner = endpoints.borrow().signals_shard.clone();
        if owner == self.inner.shard {
            return Ok(());
        }
        let owner = SignalsShard::display(owner.as_ref()).to_string();
        self.inner
            .metrics
            .refused
            .get_or_create(&RefusedLabels {
                pool: label(pool),
                shard: owner.clone(),
            })
            .inc();
        Err(SubscribeError::NotOwned {
            pool: label(pool),
            owner,
            serving: SignalsShard::display(self.inner.shard.as_ref()).to_string(),
        })
    }

    /// [`Hub::subscribe`], also following the endpoints' KV events from `kv` when this starts the
    /// pool's loops.
    pub fn subscribe_with(
        &self,
        pool: &PoolRef,
        engine: Engine,
        kv: Option<prefix::Source>,
    ) -> Result<Subscription, SubscribeError> {
        let endpoints = self
            .inner
            .discover
            .watch_endpoints(pool)
            .ok_or_else(|| SubscribeError::UnknownPool { pool: label(pool) })?;
        // Asked of the index at every watch: a pool that moved away is refused even while its
        // old streams wind down.
        self.check_owner(pool, &endpoints)?;
        let mut pools = self.inner.pools.lock();
        pools.retain(|_, p| p.strong_count() > 0);
        // A pool whose loops stopped (it had moved to another shard, and came back) starts anew.
        let running = pools
            .get(pool)
            .and_then(Weak::upgrade)
            .filter(|p| !p.task.is_finished());
        let shared = match running {
            Some(p) => p,
            None => {
                let (tx, rx) = watch::channel(PoolState::default());
                let prefix = Arc::new(PoolPrefix::default());
                let steps = Arc::new(Mutex::new(HashMap::new()));
                let task = tokio::spawn(follow(
                    endpoints,
                    tx,
                    steps.clone(),
                    Reader {
                        probe: self.inner.probe.clone(),
                        engine,
                        interval: self.inner.config.interval,
                        load_interval: self.inner.config.load_interval,
                        metrics: self.inner.metrics.clone(),
                        pool: label(pool),
                    },
                    kv.map(|kv| (kv, prefix.clone())),
                    self.inner.shard.clone(),
                ));
                let p = Arc::new(Pool {
                    state: rx,
                    task,
                    notices: broadcast::channel(NOTICE_BACKLOG).0,
                    steps,
                    prefix,
                });
                pools.insert(pool.clone(), Arc::downgrade(&p));
                p
            }
        };
        let watchers = self
            .inner
            .metrics
            .watchers
            .get_or_create(&PoolLabels { pool: label(pool) })
            .clone();
        watchers.inc();
        Ok(Subscription {
            state: shared.state.clone(),
            notices: shared.notices.subscribe(),
            prefix: shared.prefix.feed(),
            pool: shared,
            watchers,
        })
    }

    /// Relays a sidecar's notice to every watcher of its pool; whether the pool is watched (a
    /// notice on a pool nobody watches has nobody to tell, and is dropped).
    /// A step notice is not queued: it replaces its endpoint's pending one (see `Pool::steps`).
    pub fn notify(&self, pool: &PoolRef, notice: Arc<api::Notice>) -> bool {
        let shared = self.inner.pools.lock().get(pool).and_then(Weak::upgrade);
        let Some(p) = shared else {
            return false;
        };
        if matches!(notice.event, Some(api::notice::Event::Step(_))) {
            p.steps
                .lock()
                .insert(notice.addr.clone(), (Instant::now(), notice));
            return p.notices.receiver_count() > 0;
        }
        p.notices.send((Instant::now(), notice)).is_ok()
    }

    pub fn metrics(&self) -> &SignalsMetrics {
        &self.inner.metrics
    }

    /// The pools with scrape loops running.
    pub fn watched(&self) -> usize {
        self.inner
            .pools
            .lock()
            .values()
            .filter(|p| p.strong_count() > 0)
            .count()
    }
}

fn label(pool: &PoolRef) -> String {
    format!("{}/{}", pool.namespace, pool.name)
}

/// A task aborted when dropped.
#[derive(Debug)]
struct Aborting(JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a pool's endpoints are read.
#[derive(Clone, Debug)]
struct Reader<P> {
    probe: P,
    engine: Engine,
    interval: Duration,
    load_interval: Duration,
    metrics: SignalsMetrics,
    pool: String,
}

/// An endpoint's tasks: its scrape and load loops and, with KV events, its subscription.
#[derive(Debug)]
struct EndpointTasks {
    _scrape: Aborting,
    _load: Aborting,
    _kv: Option<Aborting>,
}

/// Keeps one scrape loop (and KV-event subscription) per endpoint of the pool until aborted, or
/// until the pool moves to another shard than `shard`: then every loop stops and the pool's
/// state channel closes, which ends its streams (their sidecars ask again, and are refused or
/// sent to the new shard by their policy).
/// Moves the pool's pending step notices into its state once per `interval`: one change, so one
/// wake-up of each watcher, however many steps ended since.
async fn move_steps(
    pending: Arc<Mutex<HashMap<String, Relayed>>>,
    tx: Arc<watch::Sender<PoolState>>,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let steps = std::mem::take(&mut *pending.lock());
        if !steps.is_empty() {
            // Only endpoints of the pool: a notice naming another address is dropped here.
            tx.send_modify(|s| {
                for (addr, step) in steps {
                    if s.endpoints.contains_key(&addr) || s.loads.contains_key(&addr) {
                        s.steps.insert(addr, step);
                    }
                }
            });
        }
    }
}

async fn follow<P: Probe>(
    mut endpoints: watch::Receiver<PoolEndpoints>,
    tx: watch::Sender<PoolState>,
    steps: Arc<Mutex<HashMap<String, Relayed>>>,
    reader: Reader<P>,
    kv: Option<(prefix::Source, Arc<PoolPrefix>)>,
    shard: Option<SignalsShard>,
) {
    let tx = Arc::new(tx);
    let _steps = Aborting(tokio::spawn(move_steps(
        steps,
        tx.clone(),
        reader.load_interval,
    )));
    let mut loops: HashMap<SocketAddr, EndpointTasks> = HashMap::new();
    loop {
        let (current, owner): (Vec<SocketAddr>, _) = {
            let e = endpoints.borrow_and_update();
            (
                e.endpoints.keys().copied().collect(),
                e.signals_shard.clone(),
            )
        };
        if owner != shard {
            tracing::info!(
                pool = %reader.pool,
                to = SignalsShard::display(owner.as_ref()),
                serving = SignalsShard::display(shard.as_ref()),
                "the pool moved to another signal shard: no longer reading it"
            );
            return;
        }
        let before = loops.len();
        loops.retain(|a, _| {
            let keep = current.contains(a);
            if !keep && let Some((_, prefix)) = &kv {
                prefix.forget(&a.to_string());
            }
            keep
        });
        if loops.len() != before {
            tx.send_modify(|s| {
                let keep = |a: &String| a.parse::<SocketAddr>().is_ok_and(|a| current.contains(&a));
                s.endpoints.retain(|a, _| keep(a));
                s.loads.retain(|a, _| keep(a));
                s.steps.retain(|a, _| keep(a));
            });
        }
        for addr in current {
            loops.entry(addr).or_insert_with(|| EndpointTasks {
                _scrape: Aborting(tokio::spawn(scrape_loop(addr, tx.clone(), reader.clone()))),
                _load: Aborting(tokio::spawn(load_loop(addr, tx.clone(), reader.clone()))),
                _kv: kv.as_ref().map(|(source, prefix)| {
                    Aborting(tokio::spawn(prefix::follow(
                        addr,
                        source.clone(),
                        prefix.clone(),
                    )))
                }),
            });
        }
        if endpoints.changed().await.is_err() {
            // The index dropped the pool's channel: keep what runs until the watchers go.
            std::future::pending::<()>().await;
        }
    }
}

/// An endpoint's `ok` and `error` counters in a family of reads.
fn ok_and_error(
    family: &prometheus_client::metrics::family::Family<
        ScrapeLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    pool: &str,
    endpoint: &str,
) -> (
    prometheus_client::metrics::counter::Counter,
    prometheus_client::metrics::counter::Counter,
) {
    let counter = |result| {
        family
            .get_or_create(&ScrapeLabels {
                pool: pool.to_string(),
                endpoint: endpoint.to_string(),
                result,
            })
            .clone()
    };
    (counter("ok"), counter("error"))
}

async fn scrape_loop<P: Probe>(
    addr: SocketAddr,
    tx: Arc<watch::Sender<PoolState>>,
    reader: Reader<P>,
) {
    let Reader {
        probe,
        engine,
        interval,
        metrics,
        pool,
        ..
    } = reader;
    let key = addr.to_string();
    let (ok, error) = ok_and_error(&metrics.scrapes, &pool, &key);
    let mut reads = 0u64;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let started = Instant::now();
        match probe.read(addr, engine).await {
            Ok(mut values) => {
                ok.inc();
                values.addr = key.clone();
                values.age_ms = 0;
                values.failures = 0;
                reads += 1;
                values.read_seq = reads;
                tx.send_modify(|s| {
                    s.endpoints.insert(
                        key.clone(),
                        Entry {
                            values,
                            at: started,
                        },
                    );
                });
            }
            Err(e) => {
                error.inc();
                tracing::debug!(endpoint = %addr, error = %e, "signals scrape failed");
                tx.send_if_modified(|s| match s.endpoints.get_mut(&key) {
                    Some(e) => {
                        e.values.failures = e.values.failures.saturating_add(1);
                        true
                    }
                    None => false,
                });
            }
        }
    }
}

/// Reads one endpoint's `GET /load` every `load_interval` into the pool's state. A changed value
/// wakes the streams; an unchanged one only freshens its date, which the streams send on when
/// the copies they sent grow older than the refresh interval. An endpoint without the route
/// (vLLM without `--enable-server-load-tracking` may answer 404) is not asked again.
async fn load_loop<P: Probe>(
    addr: SocketAddr,
    tx: Arc<watch::Sender<PoolState>>,
    reader: Reader<P>,
) {
    let Reader {
        probe,
        load_interval,
        metrics,
        pool,
        ..
    } = reader;
    let key = addr.to_string();
    let (ok, error) = ok_and_error(&metrics.load_reads, &pool, &key);
    let mut tick = tokio::time::interval(load_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let started = Instant::now();
        match probe.load(addr).await {
            Ok(Some(value)) => {
                ok.inc();
                tx.send_if_modified(|s| {
                    let entry = LoadEntry { value, at: started };
                    match s.loads.insert(key.clone(), entry) {
                        Some(old) => old.value != value,
                        None => true,
                    }
                });
            }
            Ok(None) => {
                tracing::debug!(endpoint = %addr, "no GET /load: its server load is not read");
                return;
            }
            Err(e) => {
                error.inc();
                tracing::debug!(endpoint = %addr, error = %e, "signals load read failed");
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::probe::ProbeError;
    use kinference_policy_core::{Endpoint, ParentTarget};
    use kinference_proxy_api::signals as api;
    use std::{
        collections::BTreeMap,
        sync::atomic::{AtomicU64, Ordering},
    };

    /// One pool's endpoints, changeable.
    #[derive(Clone, Debug)]
    pub(crate) struct FakeIndex {
        pub pool: PoolRef,
        pub tx: Arc<watch::Sender<PoolEndpoints>>,
    }

    impl FakeIndex {
        pub fn new(ports: &[u16]) -> Self {
            let (tx, _) = watch::channel(PoolEndpoints::default());
            let index = Self {
                pool: PoolRef::new("default", "glm"),
                tx: Arc::new(tx),
            };
            index.set(ports);
            index
        }

        pub fn set(&self, ports: &[u16]) {
            let endpoints: BTreeMap<SocketAddr, Endpoint> = ports
                .iter()
                .map(|p| {
                    let addr = SocketAddr::from(([127, 0, 0, 1], *p));
                    (
                        addr,
                        Endpoint {
                            addr,
                            pod: None,
                            model: None,
                            lora_adapters: vec![],
                            accelerator: None,
                            ready: true,
                        },
                    )
                })
                .collect();
            self.tx.send_modify(|e| {
                e.exists = true;
                e.endpoints = endpoints;
            });
        }

        /// Assigns the pool to a signal shard (`None`: the default).
        pub fn set_shard(&self, shard: Option<&str>) {
            let shard = shard.map(|s| SignalsShard::new(s).unwrap());
            self.tx.send_modify(|e| e.signals_shard = shard);
        }
    }

    impl DiscoverEndpoints for FakeIndex {
        fn watch_endpoints(&self, pool: &PoolRef) -> Option<watch::Receiver<PoolEndpoints>> {
            (*pool == self.pool).then(|| self.tx.subscribe())
        }

        fn watch_service_endpoints(
            &self,
            _: &ParentTarget,
        ) -> Option<watch::Receiver<PoolEndpoints>> {
            None
        }
    }

    /// Answers every metrics read with `waiting = port`, and, unless built with
    /// [`CountingProbe::without_load`], every load read with `port + load_base`, counting both.
    #[derive(Clone, Debug)]
    pub(crate) struct CountingProbe {
        pub reads: Arc<AtomicU64>,
        pub loads: Arc<AtomicU64>,
        pub load_base: Arc<AtomicU64>,
        load: bool,
    }

    impl Default for CountingProbe {
        fn default() -> Self {
            Self {
                reads: Default::default(),
                loads: Default::default(),
                load_base: Default::default(),
                load: true,
            }
        }
    }

    impl CountingProbe {
        /// Endpoints without `GET /load` (404).
        pub fn without_load() -> Self {
            Self {
                load: false,
                ..Self::default()
            }
        }
    }

    impl Probe for CountingProbe {
        async fn read(
            &self,
            addr: SocketAddr,
            _: Engine,
        ) -> Result<api::EndpointReading, ProbeError> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            Ok(api::EndpointReading {
                num_requests_waiting: Some(u32::from(addr.port())),
                ..Default::default()
            })
        }

        async fn load(&self, addr: SocketAddr) -> Result<Option<u32>, ProbeError> {
            self.loads.fetch_add(1, Ordering::Relaxed);
            Ok(self
                .load
                .then(|| u32::from(addr.port()) + self.load_base.load(Ordering::Relaxed) as u32))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn watchers_of_a_pool_share_one_loop_per_endpoint_that_stops_with_the_last() {
        let index = FakeIndex::new(&[1, 2]);
        let probe = CountingProbe::default();
        let hub = Hub::new(
            index.clone(),
            probe.clone(),
            HubConfig::default(),
            SignalsMetrics::default(),
        );
        let subs: Vec<Subscription> = (0..16)
            .map(|_| hub.subscribe(&index.pool, Engine::Vllm).unwrap())
            .collect();
        assert_eq!(hub.watched(), 1);
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let reads = probe.reads.load(Ordering::Relaxed);
        // Two endpoints, every 50 ms for a second: about 40 reads whatever the watchers.
        assert!((38..=44).contains(&reads), "{reads}");
        assert_eq!(subs[7].state.borrow().endpoints.len(), 2);
        // An endpoint that leaves the pool leaves the state and is read no more.
        index.set(&[1]);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            subs[0].state.borrow().endpoints.keys().collect::<Vec<_>>(),
            vec!["127.0.0.1:1"]
        );
        drop(subs);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(hub.watched(), 0);
        let stopped = probe.reads.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            probe.reads.load(Ordering::Relaxed),
            stopped,
            "loops stopped"
        );
        // A new watcher starts them again.
        let _again = hub.subscribe(&index.pool, Engine::Vllm).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(probe.reads.load(Ordering::Relaxed) > stopped);
        assert_eq!(
            hub.subscribe(&PoolRef::new("default", "other"), Engine::Vllm)
                .err(),
            Some(SubscribeError::UnknownPool {
                pool: "default/other".into()
            })
        );
    }

    /// `GET /load` is read on its own, faster interval into the state's loads, and a change wakes
    /// the watchers within one load interval; an endpoint without the route is asked once.
    #[tokio::test(start_paused = true)]
    async fn loads_are_read_apart_from_the_metrics_and_faster() {
        let index = FakeIndex::new(&[1, 2]);
        let probe = CountingProbe::default();
        let hub = Hub::new(
            index.clone(),
            probe.clone(),
            HubConfig::default(),
            SignalsMetrics::default(),
        );
        let mut sub = hub.subscribe(&index.pool, Engine::Vllm).unwrap();
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let (reads, loads) = (
            probe.reads.load(Ordering::Relaxed),
            probe.loads.load(Ordering::Relaxed),
        );
        // Two endpoints for a second: metrics every 50 ms, loads every 10 ms.
        assert!((38..=44).contains(&reads), "{reads}");
        assert!((196..=204).contains(&loads), "{loads}");
        let load_of = |s: &PoolState, a: &str| s.loads.get(a).map(|l| l.value);
        assert_eq!(
            load_of(&sub.state.borrow_and_update(), "127.0.0.1:2"),
            Some(2)
        );
        probe.load_base.store(5, Ordering::Relaxed);
        let changed = Instant::now();
        loop {
            sub.state.changed().await.unwrap();
            if load_of(&sub.state.borrow_and_update(), "127.0.0.1:2") == Some(7) {
                break;
            }
        }
        assert!(changed.elapsed() <= HubConfig::default().load_interval);
        drop(sub);

        let probe = CountingProbe::without_load();
        let hub = Hub::new(
            index.clone(),
            probe.clone(),
            HubConfig::default(),
            SignalsMetrics::default(),
        );
        let sub = hub.subscribe(&index.pool, Engine::Vllm).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(probe.loads.load(Ordering::Relaxed), 2, "asked once each");
        assert!(probe.reads.load(Ordering::Relaxed) >= 18);
        assert!(sub.state.borrow().loads.is_empty());
    }

    /// A shard serves only its own pools: another shard's pool (or the default shard's) is
    /// refused and counted, read by nobody here; a pool that moves away while watched stops being
    /// read and its watchers' state ends; back on this shard, it is served anew.
    #[tokio::test(start_paused = true)]
    async fn a_shard_serves_its_own_pools_and_refuses_the_others() {
        let index = FakeIndex::new(&[1, 2]);
        let probe = CountingProbe::default();
        let metrics = SignalsMetrics::default();
        let a = SignalsShard::new("a").unwrap();
        let hub = Hub::sharded(
            index.clone(),
            probe.clone(),
            HubConfig::default(),
            metrics.clone(),
            Some(a.clone()),
        );
        let refused = |shard: &str| {
            metrics
                .refused
                .get_or_create(&RefusedLabels {
                    pool: "default/glm".into(),
                    shard: shard.into(),
                })
                .get()
        };
        // The pool is on the default shard: refused, with who owns it and who was asked.
        let e = hub.subscribe(&index.pool, Engine::Vllm).err().unwrap();
        assert_eq!(
            e,
            SubscribeError::NotOwned {
                pool: "default/glm".into(),
                owner: "(default)".into(),
                serving: "a".into()
            }
        );
        assert!(e.to_string().contains("kinference.io/signals-shard"), "{e}");
        assert_eq!(refused("(default)"), 1);
        // On shard b: refused too; nothing is read.
        index.set_shard(Some("b"));
        assert!(matches!(
            hub.subscribe(&index.pool, Engine::Vllm),
            Err(SubscribeError::NotOwned { .. })
        ));
        assert_eq!(refused("b"), 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(probe.reads.load(Ordering::Relaxed), 0);
        assert_eq!(hub.watched(), 0);

        // On shard a: served.
        index.set_shard(Some("a"));
        let mut sub = hub.subscribe(&index.pool, Engine::Vllm).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(probe.reads.load(Ordering::Relaxed) >= 18);
        assert_eq!(sub.state.borrow_and_update().endpoints.len(), 2);

        // Moved to b while watched: the loops stop and the watcher's state ends.
        index.set_shard(Some("b"));
        tokio::time::timeout(Duration::from_secs(1), async {
            while sub.state.changed().await.is_ok() {}
        })
        .await
        .expect("the moved pool's state ends");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let stopped = probe.reads.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(probe.reads.load(Ordering::Relaxed), stopped, "still read");
        assert!(hub.subscribe(&index.pool, Engine::Vllm).is_err());

        // Back on a: served anew although the old subscription is still held.
        index.set_shard(Some("a"));
        let mut again = hub.subscribe(&index.pool, Engine::Vllm).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(probe.reads.load(Ordering::Relaxed) > stopped);
        assert_eq!(again.state.borrow_and_update().endpoints.len(), 2);
        drop(sub);
    }

    /// The default shard serves the pools without a shard, and refuses a sharded one.
    #[tokio::test(start_paused = true)]
    async fn the_default_shard_refuses_a_sharded_pool() {
        let index = FakeIndex::new(&[1]);
        let hub = Hub::new(
            index.clone(),
            CountingProbe::default(),
            HubConfig::default(),
            SignalsMetrics::default(),
        );
        assert!(hub.subscribe(&index.pool, Engine::Vllm).is_ok());
        index.set_shard(Some("a"));
        assert_eq!(
            hub.subscribe(&index.pool, Engine::Vllm).err(),
            Some(SubscribeError::NotOwned {
                pool: "default/glm".into(),
                owner: "a".into(),
                serving: "(default)".into()
            })
        );
    }
}
