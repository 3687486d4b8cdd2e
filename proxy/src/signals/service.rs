//! A pool's engine readings from the control plane's signal service (`EngineSignals.Watch`), and
//! the fall back to reading the engines directly while it is away.
//!
//! Without the service every sidecar scrapes every engine, so an engine's scrape load grows with
//! the mesh. With it, one task per pool holds a stream from the controller, which reads each
//! engine once, and applies each reading to the router as if this proxy had scraped it, dated
//! on this proxy's clock by the age the message carries. The endpoint scrapers then only read
//! what the service does not carry (the context window, rarely).
//!
//! With KV events, the stream carries the engines' prefix-cache changes too (block-hash deltas,
//! the controller subscribed once per engine), applied to the precise index; the endpoint's own
//! KV-event subscription then stands down, and takes over again (from an emptied mirror) while
//! the service is away.
//!
//! The stream also carries the other sidecars' notices (their dispatches, first tokens and
//! completions on the pool's endpoints, relayed by the service), which the router adds to its
//! endpoints' queues ([`kinference_routing::Router::observe_notice`]); [`spawn_notifier`] sends
//! this proxy's own. A lost notice costs accuracy, never a request: notices are dropped rather
//! than waited for, and a foreign request whose completion never comes ages out.
//!
//! The stream is trusted only while it speaks: the service sends at least every refresh interval
//! (an empty delta when nothing changed), so a stream silent for `stale`, a failed connection or
//! an ended stream all turn the pool to direct reads at `fallback_interval`, counted in
//! `kinference_proxy_signal_fallbacks_total` and shown in `/debug/endpoints`. The task keeps
//! reconnecting with backoff, and the pool returns to the service with the next snapshot. With
//! several addresses (controller replicas, any of which serves) a failed stream moves to the next
//! at once, and backs off only when a whole round has failed.
//!
//! Each pool streams from its own signal shard when the policy puts it on one (the controller
//! names the shard's addresses in the pool's backend), else from `--signals-addr`: a proxy with
//! pools on two shards holds two streams, and losing one shard turns only that shard's pools to
//! direct reads. Its notices go to the shard of their pool the same way ([`spawn_notifiers`]).

use crate::{
    endpoints::EndpointTable,
    metrics::{NoticeLabels, PoolLabels, SignalMetrics},
    router::{NOTICE_PROMPT_CHUNKS, NoticePrompt, OwnNotice, RouterHandle},
};
use kinference_proxy_api::signals::{
    self as api, SignalsTarget, engine_signals_client::EngineSignalsClient,
};
use kinference_proxy_signals::Engine;
use kinference_routing::{
    EndpointId, KvEvent, Notice, Scrape,
    endpoint::{CacheConfig, PrefixCacheCounters},
    inflight::InFlightRequest,
};
use std::{collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};
use tokio::{sync::watch, task::JoinHandle, time::Instant};

/// The first wait before reconnecting, doubled per failure up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How a proxy reaches the signal service.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// The service's addresses (`http://host:port`): one, or each controller replica's, tried
    /// in turn. Never empty in a pool's stream; empty as `--signals-addr` when none is given.
    pub addrs: Vec<http::Uri>,
    /// How long the stream may be silent before the pool reads its engines directly.
    pub stale: Duration,
    /// How often each endpoint is read directly meanwhile.
    pub fallback_interval: Duration,
    pub connect_timeout: Duration,
}

/// The capacity of a target's notice tap: notices beyond it (the service away, or slower than
/// the request rate) are dropped, not waited for.
pub const NOTICE_TAP: usize = 4096;

/// The most notices sent in one batch.
const NOTICE_BATCH: usize = 256;

/// Where a pool's readings come from now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// No stream yet: the engines are read directly meanwhile.
    Connecting,
    /// The service's stream is live.
    Service,
    /// The service failed (why): the engines are read directly until it is back.
    Fallback(String),
}

impl Source {
    /// `service` or `engine`: who reads the engines for this proxy.
    pub fn reader(&self) -> &'static str {
        match self {
            Source::Service => "service",
            Source::Connecting | Source::Fallback(_) => "engine",
        }
    }

    /// Why the pool reads its engines directly, if it does because the service failed.
    pub fn fallback_reason(&self) -> Option<&str> {
        match self {
            Source::Fallback(why) => Some(why),
            _ => None,
        }
    }
}

/// Whether the pool's readings come from the service now. A stream task that has gone (its pool
/// left the policy) leaves the endpoint to read directly.
pub fn from_service(source: &watch::Receiver<Source>) -> bool {
    source.has_changed().is_ok() && *source.borrow() == Source::Service
}

/// One pool's stream task; dropped, it stops.
#[derive(Debug)]
pub struct PoolStream {
    pub source: watch::Receiver<Source>,
    task: JoinHandle<()>,
}

impl Drop for PoolStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a pool's stream task needs.
#[derive(Clone, Debug)]
pub struct PoolParams {
    pub config: ServiceConfig,
    /// The pool's Destination path.
    pub destination: String,
    pub engine: Engine,
    pub labels: PoolLabels,
    pub table: EndpointTable,
    pub router: RouterHandle,
    pub metrics: SignalMetrics,
    /// This target's name in notices: its own are skipped when the stream relays them back.
    pub sender: String,
    /// Where the pool's endpoints publish KV events: the service is asked to subscribe in this
    /// proxy's stead and stream the prefix knowledge.
    pub kv_events: Option<api::KvEventsSource>,
}

/// The service's form of a pool's KV-event publisher rule.
pub fn kv_source(sub: &crate::endpoints::KvSubscription) -> api::KvEventsSource {
    use api::kv_events_source::Port;
    use kinference_decision::policy::KvEventsPort;
    api::KvEventsSource {
        port: Some(match sub.port {
            KvEventsPort::Absolute(p) => Port::Absolute(u32::from(p)),
            KvEventsPort::Offset(o) => Port::Offset(o),
        }),
        topic: sub.topic.clone(),
    }
}

/// Starts following the pool's readings at the service.
pub fn spawn_pool(params: PoolParams) -> PoolStream {
    let (tx, source) = watch::channel(Source::Connecting);
    params
        .table
        .record_signal_source(&params.destination, Source::Connecting);
    PoolStream {
        source,
        task: tokio::spawn(follow(params, tx)),
    }
}

/// A channel endpoint for each of the service's addresses.
///
/// Plaintext (h2c), by the rule of the proxy's policy channel (`kinference-proxy-discovery`): TLS
/// exactly when the proxy has a workload identity, whatever the URI's scheme (`--signals-addr` and
/// the policy's `signals_addrs` are `http://` either way). The proxy has none yet (it does not
/// certify itself), so both channels are plaintext, which a controller with an identity issuer
/// refuses on both listeners; when it has one, both are to dial with
/// `kinference_identity::connect::TlsConnector` and its credentials.
fn endpoints(config: &ServiceConfig) -> Vec<(http::Uri, tonic::transport::Endpoint)> {
    config
        .addrs
        .iter()
        .map(|addr| {
            let e = tonic::transport::Endpoint::from(addr.clone())
                .connect_timeout(config.connect_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(config.stale)
                .keep_alive_timeout(config.stale);
            (addr.clone(), e)
        })
        .collect()
}

async fn follow(p: PoolParams, tx: watch::Sender<Source>) {
    let replicas = endpoints(&p.config);
    let live = p
        .metrics
        .signal_stream_live
        .get_or_create(&p.labels)
        .clone();
    let mut backoff = BACKOFF_MIN;
    // The replica tried next, and how many have failed in a row without delivering anything.
    let (mut next, mut failed) = (0, 0);
    loop {
        let (addr, endpoint) = &replicas[next % replicas.len()];
        next += 1;
        let (why, spoke) = stream_once(&p, addr, endpoint, &tx).await;
        live.set(0);
        failed = if spoke { 1 } else { failed + 1 };
        if spoke {
            backoff = BACKOFF_MIN;
        }
        // Another replica not yet tried in this round: try it at once, still trusting the
        // readings held (they age, and `stale` bounds how long they are used).
        if failed < replicas.len() {
            tracing::debug!(pool = %p.labels.pool, %addr, %why, "signal service replica failed: trying the next");
            continue;
        }
        if tx.borrow().fallback_reason().is_none() {
            p.metrics.signal_fallbacks.get_or_create(&p.labels).inc();
            tracing::warn!(
                pool = %p.labels.pool,
                %addr,
                %why,
                "signal service unavailable: reading the engines directly"
            );
        } else {
            tracing::debug!(pool = %p.labels.pool, %why, "signal service still unavailable");
        }
        let source = Source::Fallback(why);
        p.table.record_signal_source(&p.destination, source.clone());
        tx.send_replace(source);
        failed = 0;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Holds one stream until it fails; why it ended, and whether it delivered anything.
async fn stream_once(
    p: &PoolParams,
    addr: &http::Uri,
    endpoint: &tonic::transport::Endpoint,
    tx: &watch::Sender<Source>,
) -> (String, bool) {
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => return (format!("connect: {e}"), false),
    };
    let mut client = EngineSignalsClient::new(channel);
    let target = SignalsTarget {
        path: p.destination.clone(),
        engine: p.engine.name().to_string(),
        kv_events: p.kv_events.clone(),
    };
    let watch = tokio::time::timeout(p.config.stale, client.watch(target));
    let mut stream = match watch.await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(status)) => return (format!("watch: {}", status.message()), false),
        Err(_) => return ("watch: no answer".into(), false),
    };
    let updates = p.metrics.signal_updates.get_or_create(&p.labels).clone();
    let live = p
        .metrics
        .signal_stream_live
        .get_or_create(&p.labels)
        .clone();
    let mut applied = Applied::default();
    let mut spoke = false;
    loop {
        let update = match tokio::time::timeout(p.config.stale, stream.message()).await {
            Err(_) => {
                let ms = p.config.stale.as_millis();
                return (format!("no update for {ms} ms"), spoke);
            }
            Ok(Err(status)) => return (format!("stream: {}", status.message()), spoke),
            Ok(Ok(None)) => return ("the service ended the stream".into(), spoke),
            Ok(Ok(Some(u))) => u,
        };
        // Dated on arrival: an age is relative to when the message was written.
        let arrived = Instant::now();
        if !spoke && !update.full {
            return ("the stream did not begin with a snapshot".into(), false);
        }
        spoke = true;
        applied.apply(&update, arrived, p);
        apply_notices(&update, arrived, p);
        apply_prefix(&update, p);
        updates.inc();
        if update.full && *tx.borrow() != Source::Service {
            tracing::info!(pool = %p.labels.pool, %addr, "reading engines through the signal service");
            live.set(1);
            p.table
                .record_signal_source(&p.destination, Source::Service);
            tx.send_replace(Source::Service);
        }
    }
}

/// The engines' prefix-cache changes, applied to the precise index as the proxy's own KV-event
/// subscription would apply them (the service sends only what the index uses: the hashes and the
/// block size).
fn apply_prefix(update: &api::SignalsUpdate, p: &PoolParams) {
    use api::prefix_event::Event;
    if update.prefix.is_empty() {
        return;
    }
    let applied = p
        .metrics
        .signal_prefix_deltas
        .get_or_create(&p.labels)
        .clone();
    let now = p.router.now();
    for d in &update.prefix {
        let Ok(addr) = d.addr.parse::<SocketAddr>() else {
            continue;
        };
        let id = EndpointId::from(addr.to_string());
        let mut events = Vec::with_capacity(d.events.len() + 1);
        if d.reset {
            events.push(KvEvent::AllBlocksCleared);
        }
        events.extend(d.events.iter().filter_map(|e| match e.event.as_ref()? {
            Event::Stored(b) => Some(KvEvent::BlockStored {
                block_hashes: b.hashes.clone(),
                parent_block_hash: None,
                token_ids: Vec::new(),
                block_size: b.block_size_tokens,
            }),
            Event::Removed(b) => Some(KvEvent::BlockRemoved {
                block_hashes: b.hashes.clone(),
            }),
        }));
        if p.router.apply_kv_events(&id, &events) {
            p.table.record_kv_batch(&id, &events, now);
            applied.inc();
        }
    }
}

/// The read of each address applied last, so that a reading re-sent with only its failure count
/// changed is not taken for a new read.
#[derive(Debug, Default)]
struct Applied {
    seq: HashMap<String, u64>,
}

impl Applied {
    fn apply(&mut self, update: &api::SignalsUpdate, arrived: Instant, p: &PoolParams) {
        if update.full {
            self.seq.clear();
        }
        for addr in &update.removed {
            self.seq.remove(addr);
        }
        let clock = p.router.clock();
        let ages = p
            .metrics
            .signal_reading_age_seconds
            .get_or_create(&p.labels)
            .clone();
        for r in &update.readings {
            if self.seq.get(&r.addr) == Some(&r.read_seq) {
                continue;
            }
            let Some(id) = pool_endpoint(&r.addr, p) else {
                continue;
            };
            self.seq.insert(r.addr.clone(), r.read_seq);
            ages.observe(r.age_ms as f64 / 1000.0);
            let at = clock.time_of(read_at(arrived, r.age_ms));
            p.router.observe_scrape(&id, &scrape_of(r), at);
        }
        // `GET /load`, dated on its own: the router keeps each signal's time, so a load newer
        // than the metrics moves only the server load (and the notices' reconciliation).
        for l in &update.loads {
            let Some(id) = pool_endpoint(&l.addr, p) else {
                continue;
            };
            let scrape = Scrape {
                server_load: Some(l.server_load),
                ..Scrape::default()
            };
            let at = clock.time_of(read_at(arrived, l.age_ms));
            p.router.observe_scrape(&id, &scrape, at);
        }
    }
}

/// The endpoint at `addr` if it is one of this pool's as this proxy's policy knows them.
fn pool_endpoint(addr: &str, p: &PoolParams) -> Option<EndpointId> {
    let addr = addr.parse::<SocketAddr>().ok()?;
    let id = EndpointId::from(addr.to_string());
    p.table
        .info(&id)
        .is_some_and(|e| e.destination == p.destination)
        .then_some(id)
}

/// When a reading `age_ms` old on arrival at `arrived` was read.
fn read_at(arrived: Instant, age_ms: u64) -> Instant {
    arrived
        .checked_sub(Duration::from_millis(age_ms))
        .unwrap_or(arrived)
}

/// Applies the other sidecars' notices in `update` to the router.
fn apply_notices(update: &api::SignalsUpdate, arrived: Instant, p: &PoolParams) {
    if update.notices_lost > 0 {
        p.metrics
            .signal_notices
            .get_or_create(&NoticeLabels {
                pool: p.labels.pool.clone(),
                model: p.labels.model.clone(),
                result: "lost",
            })
            .inc_by(update.notices_lost);
    }
    if update.notices.is_empty() {
        return;
    }
    let clock = p.router.clock();
    let mut applied = 0;
    for n in &update.notices {
        if n.sender == p.sender || n.path != p.destination {
            continue;
        }
        let Ok(addr) = n.addr.parse::<SocketAddr>() else {
            continue;
        };
        let id = EndpointId::from(addr.to_string());
        let at = clock.time_of(
            arrived
                .checked_sub(Duration::from_micros(n.age_us))
                .unwrap_or(arrived),
        );
        if apply_notice(&p.router, &id, n, at) {
            applied += 1;
        }
    }
    p.metrics
        .signal_notices
        .get_or_create(&NoticeLabels {
            pool: p.labels.pool.clone(),
            model: p.labels.model.clone(),
            result: "applied",
        })
        .inc_by(applied);
}

/// Another sidecar's notice as the router's, dated `at` on this proxy's clock; its request keyed
/// by (sender, id), so two senders' ids never collide in the foreign ledger.
pub fn notice_of(n: &api::Notice, at: kinference_routing::Time) -> Option<Notice> {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&n.sender, n.request_id).hash(&mut h);
    let id = h.finish();
    Some(match n.event.as_ref()? {
        api::notice::Event::Dispatch(d) => match &d.prediction {
            None => Notice::dispatch(id, at, d.prompt_tokens, d.uncached_tokens),
            Some(p) => Notice::Dispatch(InFlightRequest {
                id,
                dispatched_at: at,
                prompt_tokens: d.prompt_tokens,
                uncached_tokens: d.uncached_tokens,
                first_token_at: None,
                last_token_at: None,
                predicted_non_prefill_s: finite(p.non_prefill_s, 0.0),
                kv_pressure_factor: finite(p.kv_pressure_factor, 1.0),
                predicted_raw_ttft_s: finite(p.raw_ttft_s, 0.0),
                predicted_wait_s: finite(p.wait_s, 0.0),
                teaches_rate: p.teaches_rate,
                prefill_expected_at: at + Duration::from_micros(p.prefill_expected_after_us),
            }),
        },
        api::notice::Event::FirstToken(_) => Notice::FirstToken { id, at },
        api::notice::Event::Complete(_) => Notice::Complete { id, at },
        api::notice::Event::Step(_) => Notice::Step { id, at },
    })
}

fn finite(v: f64, or: f64) -> f64 {
    if v.is_finite() { v } else { or }
}

/// Applies another proxy's notice `n` on `id`, its event dated `at`: to the router's ledger and,
/// for a dispatch whose prompt chunks came with it, as pending prefix. Whether it was one.
pub fn apply_notice(
    router: &RouterHandle,
    id: &EndpointId,
    n: &api::Notice,
    at: kinference_routing::Time,
) -> bool {
    let Some(notice) = notice_of(n, at) else {
        return false;
    };
    router.observe_notice(id, notice);
    if let (Notice::Dispatch(r), Some(api::notice::Event::Dispatch(d))) = (&notice, &n.event)
        && !d.prompt_chunks.is_empty()
    {
        let chunks = &d.prompt_chunks[..d.prompt_chunks.len().min(NOTICE_PROMPT_CHUNKS)];
        let prompt = NoticePrompt {
            chunks: Arc::from(chunks),
            chunk_tokens: d.prompt_chunk_tokens,
            chunk_chars: d.prompt_chunk_chars,
        };
        router.observe_notice_prompt(id, r.id, &prompt);
    }
    true
}

/// This proxy's own notice as the wire's, `age` after its event.
pub fn wire_notice(
    own: &OwnNotice,
    sender: &str,
    path: &str,
    addr: SocketAddr,
    age: Duration,
) -> api::Notice {
    let prompt = own.prompt.as_ref();
    let (request_id, event) = match &own.notice {
        Notice::Dispatch(r) => (
            r.id,
            api::notice::Event::Dispatch(api::Dispatch {
                prompt_tokens: r.prompt_tokens,
                uncached_tokens: r.uncached_tokens,
                prediction: Some(api::SenderPrediction {
                    raw_ttft_s: r.predicted_raw_ttft_s,
                    wait_s: r.predicted_wait_s,
                    non_prefill_s: r.predicted_non_prefill_s,
                    kv_pressure_factor: r.kv_pressure_factor,
                    teaches_rate: r.teaches_rate,
                    prefill_expected_after_us: u64::try_from(
                        r.prefill_expected_at
                            .saturating_since(r.dispatched_at)
                            .as_micros(),
                    )
                    .unwrap_or(u64::MAX),
                }),
                prompt_chunks: prompt.map(|p| p.chunks.to_vec()).unwrap_or_default(),
                prompt_chunk_tokens: prompt.map_or(0, |p| p.chunk_tokens),
                prompt_chunk_chars: prompt.map_or(0, |p| p.chunk_chars),
            }),
        ),
        Notice::FirstToken { id, .. } => (*id, api::notice::Event::FirstToken(api::FirstToken {})),
        Notice::Complete { id, .. } => (*id, api::notice::Event::Complete(api::Complete {})),
        Notice::Step { id, .. } => (*id, api::notice::Event::Step(api::Step {})),
    };
    api::Notice {
        path: path.to_string(),
        addr: addr.to_string(),
        sender: sender.to_string(),
        request_id,
        age_us: u64::try_from(age.as_micros()).unwrap_or(u64::MAX),
        event: Some(event),
    }
}

/// Routes this target's own notices (from its router's tap) to the service of each notice's
/// pool: its signal shard's, or `config.addrs` (`--signals-addr`) for a pool on the default
/// shard, with one notice stream ([`spawn_notifier`]) per distinct set of addresses, until
/// aborted. A notice for a pool with no service is not sent (nobody would relay it); one that
/// finds its stream's queue full is dropped and counted.
pub fn spawn_notifiers(
    config: ServiceConfig,
    sender: String,
    table: EndpointTable,
    router: RouterHandle,
    metrics: SignalMetrics,
    mut tap: tokio::sync::mpsc::Receiver<OwnNotice>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        type Stream = (tokio::sync::mpsc::Sender<OwnNotice>, super::Aborting);
        let mut streams: HashMap<Vec<http::Uri>, Stream> = HashMap::new();
        while let Some(notice) = tap.recv().await {
            let Some(e) = table.info(&notice.endpoint) else {
                continue;
            };
            let addrs = super::service_addrs(&e, &config.addrs);
            if addrs.is_empty() {
                continue;
            }
            let tx = match streams.get(addrs) {
                Some((tx, _)) => tx,
                None => {
                    let (tx, rx) = tokio::sync::mpsc::channel(NOTICE_TAP);
                    let task = spawn_notifier(
                        ServiceConfig {
                            addrs: addrs.to_vec(),
                            ..config.clone()
                        },
                        sender.clone(),
                        table.clone(),
                        router.clone(),
                        metrics.clone(),
                        rx,
                    );
                    &streams
                        .entry(addrs.to_vec())
                        .or_insert((tx, super::Aborting(task)))
                        .0
                }
            };
            if tx.try_send(notice).is_err() {
                let labels = labels_of(&e);
                metrics
                    .signal_notices
                    .get_or_create(&NoticeLabels {
                        pool: labels.pool,
                        model: labels.model,
                        result: "dropped",
                    })
                    .inc();
            }
        }
    })
}

/// Sends this target's own notices (from `tap`) to the service at `config.addrs` until aborted,
/// reconnecting with backoff; what arrives while it is away is dropped and counted.
pub fn spawn_notifier(
    config: ServiceConfig,
    sender: String,
    table: EndpointTable,
    router: RouterHandle,
    metrics: SignalMetrics,
    mut tap: tokio::sync::mpsc::Receiver<OwnNotice>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let replicas = endpoints(&config);
        let mut next = 0;
        let count = |labels: &PoolLabels, result: &'static str, n: u64| {
            metrics
                .signal_notices
                .get_or_create(&NoticeLabels {
                    pool: labels.pool.clone(),
                    model: labels.model.clone(),
                    result,
                })
                .inc_by(n);
        };
        let mut backoff = BACKOFF_MIN;
        loop {
            let (tx, rx) = tokio::sync::mpsc::channel::<api::NoticeBatch>(16);
            let (_, endpoint) = &replicas[next % replicas.len()];
            next += 1;
            let call = match endpoint.connect().await {
                Ok(channel) => Some(tokio::spawn(async move {
                    EngineSignalsClient::new(channel)
                        .notify(tokio_stream::wrappers::ReceiverStream::new(rx))
                        .await
                })),
                Err(e) => {
                    tracing::debug!(error = %e, "signal service: notices not sent");
                    None
                }
            };
            let Some(mut call) = call else {
                // Away: drop what is tapped meanwhile rather than let the tap fill.
                let until = Instant::now() + backoff;
                while let Ok(Some(n)) = tokio::time::timeout_at(until, tap.recv()).await {
                    if let Some(e) = table.info(&n.endpoint) {
                        count(&labels_of(&e), "dropped", 1);
                    }
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            };
            backoff = BACKOFF_MIN;
            loop {
                let first = tokio::select! {
                    n = tap.recv() => match n {
                        Some(n) => n,
                        None => return,
                    },
                    _ = &mut call => break,
                };
                let mut batch = vec![first];
                while batch.len() < NOTICE_BATCH {
                    match tap.try_recv() {
                        Ok(n) => batch.push(n),
                        Err(_) => break,
                    }
                }
                let now = router.now();
                let mut by_pool: HashMap<PoolLabels, u64> = HashMap::new();
                let notices: Vec<api::Notice> = batch
                    .iter()
                    .filter_map(|own| {
                        let e = table.info(&own.endpoint)?;
                        *by_pool.entry(labels_of(&e)).or_default() += 1;
                        Some(wire_notice(
                            own,
                            &sender,
                            &e.destination,
                            e.addr,
                            now.saturating_since(own.at),
                        ))
                    })
                    .collect();
                let sent = tx.try_send(api::NoticeBatch { notices }).is_ok();
                for (labels, n) in &by_pool {
                    count(labels, if sent { "sent" } else { "dropped" }, *n);
                }
            }
            tracing::debug!("signal service: the notice stream ended");
        }
    })
}

fn labels_of(e: &crate::endpoints::EndpointInfo) -> PoolLabels {
    PoolLabels {
        pool: e.pool.clone(),
        model: e.model.clone(),
    }
}

/// A reading as the router's scrape (the service already rounded and filtered it as the proxy's
/// own scrapes are, `VllmMetrics::to_scrape`).
pub fn scrape_of(r: &api::EndpointReading) -> Scrape {
    Scrape {
        num_requests_waiting: r.num_requests_waiting,
        num_requests_running: r.num_requests_running,
        kv_cache_usage: r.kv_cache_usage.filter(|v| v.is_finite()),
        cache_config: r
            .cache_config
            .filter(|c| c.block_size_tokens > 0)
            .map(|c| CacheConfig {
                block_size_tokens: c.block_size_tokens,
                num_gpu_blocks: c.num_gpu_blocks,
            }),
        prefix_cache: r.prefix_cache.map(|c| PrefixCacheCounters {
            queries_tokens: c.queries_tokens,
            hits_tokens: c.hits_tokens,
            prompt_tokens: c.prompt_tokens,
        }),
        server_load: r.server_load,
        generation_tokens: r.generation_tokens,
    }
}

#[cfg(test)]
mod tests;
