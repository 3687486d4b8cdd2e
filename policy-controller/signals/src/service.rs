//! `EngineSignals.Watch`: a pool's readings as a versioned stream of deltas.
//!
//! The first message is the pool's snapshot; after it each change of the pool's state becomes a
//! message with what changed ([`crate::delta`]). The stream is pulled by the transport: a sidecar
//! that reads slowly makes its stream skip states, never the controller queue them.
//!
//! The service is served in plaintext ([`SignalsServer::bind`], local mode) or over mutual TLS
//! ([`SignalsServer::bind_tls`], a controller with an identity issuer), by the same rule as the
//! controller's policy gRPC.

use crate::{
    delta,
    hub::{Hub, SubscribeError, Subscription},
    metrics::{NoticeLabels, PoolLabels},
    probe::Probe,
};
use futures::stream;
use kinference_policy_core::{DiscoverEndpoints, PoolRef};
use kinference_proxy_api::signals::{
    self as api,
    engine_signals_server::{EngineSignals, EngineSignalsServer},
};
use kinference_proxy_signals::Engine;
use std::{collections::HashMap, net::SocketAddr, pin::Pin, sync::Arc, time::Duration};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_stream::Stream;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

/// The gRPC service over a [`Hub`].
#[derive(Debug)]
pub struct SignalsServer<D, P> {
    hub: Hub<D, P>,
}

impl<D, P> SignalsServer<D, P>
where
    D: DiscoverEndpoints + Send + Sync + 'static,
    P: Probe,
{
    pub fn new(hub: Hub<D, P>) -> Self {
        Self { hub }
    }

    pub fn svc(self) -> EngineSignalsServer<Self> {
        EngineSignalsServer::new(self)
    }

    /// Serves the service alone, in plaintext, on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .add_service(self.svc())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }

    /// Serves the service alone over mutual TLS with `tls` on `listener` until `shutdown`
    /// completes, as the controller serves its policy gRPC: `tls` must require client
    /// certificates ([`kinference_identity::tls::mutual_server_config`]'s does), so a client
    /// without a workload certificate from the trust anchors (plaintext, no certificate, one
    /// from another authority) never completes a handshake and never reaches `Watch` or `Notify`.
    pub async fn serve_tls(
        self,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = kinference_identity::accept::incoming(
            listener,
            tls,
            kinference_identity::accept::ClientAuth::Workload,
            "signals",
        );
        tonic::transport::Server::builder()
            .add_service(self.svc())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }

    /// Binds `addr` and serves there, in plaintext; the bound address comes back with the
    /// server's future.
    pub async fn bind(
        self,
        addr: SocketAddr,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<(
        SocketAddr,
        impl Future<Output = Result<(), tonic::transport::Error>> + Send,
    )> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        Ok((local, self.serve(listener, shutdown)))
    }

    /// As [`Self::bind`], over mutual TLS with `tls` ([`Self::serve_tls`]).
    pub async fn bind_tls(
        self,
        addr: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<(
        SocketAddr,
        impl Future<Output = Result<(), tonic::transport::Error>> + Send,
    )> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        Ok((local, self.serve_tls(listener, tls, shutdown)))
    }
}

#[tonic::async_trait]
impl<D, P> EngineSignals for SignalsServer<D, P>
where
    D: DiscoverEndpoints + Send + Sync + 'static,
    P: Probe,
{
    type WatchStream = BoxStream<api::SignalsUpdate>;

    async fn watch(
        &self,
        req: tonic::Request<api::SignalsTarget>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        let target = req.into_inner();
        let pool = PoolRef::from_destination_path(&target.path).ok_or_else(|| {
            tonic::Status::invalid_argument(format!(
                "{:?} is not an InferencePool path (<pool>.<namespace>.inferencepool.kinference.io)",
                target.path
            ))
        })?;
        let engine = if target.engine.is_empty() {
            Engine::Vllm
        } else {
            Engine::parse(&target.engine).ok_or_else(|| {
                tonic::Status::invalid_argument(format!("unknown engine {:?}", target.engine))
            })?
        };
        let kv = match &target.kv_events {
            None => None,
            Some(k) => Some(crate::prefix::Source::from_api(k).ok_or_else(|| {
                tonic::Status::invalid_argument("kv_events names no usable publisher port")
            })?),
        };
        let sub = self
            .hub
            .subscribe_with(&pool, engine, kv)
            .map_err(|e| match e {
                SubscribeError::UnknownPool { .. } => tonic::Status::not_found(e.to_string()),
                SubscribeError::NotOwned { .. } => {
                    tracing::debug!(pool = %pool, error = %e, "watch refused");
                    tonic::Status::failed_precondition(e.to_string())
                }
            })?;
        let lost = self
            .hub
            .metrics()
            .notices_lost
            .get_or_create(&PoolLabels {
                pool: format!("{}/{}", pool.namespace, pool.name),
            })
            .clone();
        Ok(tonic::Response::new(updates(
            sub,
            self.hub.config().refresh,
            lost,
        )))
    }

    async fn notify(
        &self,
        req: tonic::Request<tonic::Streaming<api::NoticeBatch>>,
    ) -> Result<tonic::Response<api::NotifyAck>, tonic::Status> {
        let mut stream = req.into_inner();
        let metrics = self.hub.metrics().clone();
        let mut pools: HashMap<String, Option<PoolRef>> = HashMap::new();
        while let Some(batch) = stream.message().await? {
            for n in batch.notices {
                let pool = pools
                    .entry(n.path.clone())
                    .or_insert_with(|| PoolRef::from_destination_path(&n.path))
                    .clone();
                let (label, result) = match pool {
                    None => (String::new(), "invalid"),
                    Some(pool) => {
                        let label = format!("{}/{}", pool.namespace, pool.name);
                        if self.hub.notify(&pool, Arc::new(n)) {
                            (label, "relayed")
                        } else {
                            (label, "unwatched")
                        }
                    }
                };
                metrics
                    .notices
                    .get_or_create(&NoticeLabels {
                        pool: label,
                        result,
                    })
                    .inc();
            }
        }
        Ok(tonic::Response::new(api::NotifyAck {}))
    }
}

/// The most notices one message carries.
const MAX_NOTICES_PER_MESSAGE: usize = 512;
/// The most prefix deltas one message carries.
const MAX_PREFIX_PER_MESSAGE: usize = 256;

/// The stream of one subscription: the snapshot (with every endpoint's held blocks), then
/// numbered deltas with the sidecars' notices and the engines' prefix changes since the last
/// message. A stream with nothing new for `refresh` sends an empty delta, so a
/// sidecar tells a quiet pool (no endpoints, or engines that stopped answering) from a dead
/// stream by silence alone.
pub fn updates(
    sub: Subscription,
    refresh: Duration,
    lost: prometheus_client::metrics::counter::Counter,
) -> BoxStream<api::SignalsUpdate> {
    let heartbeat = refresh.max(Duration::from_millis(10));
    let s = stream::unfold(
        (sub, None::<delta::Sent>, 0u64, tokio::time::Instant::now()),
        move |(mut sub, mut sent, mut version, mut last)| {
            let lost = lost.clone();
            async move {
                loop {
                    let mut msg = None;
                    let mut notices = Vec::new();
                    let mut notices_lost = 0u64;
                    let mut prefix: Vec<Arc<api::PrefixDelta>> = Vec::new();
                    let mut resync = false;
                    if sent.is_some() {
                        tokio::select! {
                            biased;
                            n = sub.notices.recv() => match n {
                                Ok(n) => notices.push(n),
                                Err(broadcast::error::RecvError::Lagged(k)) => notices_lost += k,
                                Err(broadcast::error::RecvError::Closed) => return None,
                            },
                            d = sub.prefix.deltas.recv() => match d {
                                Ok(d) => prefix.push(d),
                                Err(broadcast::error::RecvError::Lagged(_)) => resync = true,
                                Err(broadcast::error::RecvError::Closed) => return None,
                            },
                            changed = tokio::time::timeout_at(last + heartbeat, sub.state.changed()) => {
                                match changed {
                                    Ok(Err(_)) => return None,
                                    Ok(Ok(())) => {}
                                    Err(_) => msg = Some(api::SignalsUpdate::default()),
                                }
                            }
                        }
                        while notices.len() < MAX_NOTICES_PER_MESSAGE {
                            match sub.notices.try_recv() {
                                Ok(n) => notices.push(n),
                                Err(broadcast::error::TryRecvError::Lagged(k)) => notices_lost += k,
                                Err(_) => break,
                            }
                        }
                        while !resync && prefix.len() < MAX_PREFIX_PER_MESSAGE {
                            match sub.prefix.deltas.try_recv() {
                                Ok(d) => prefix.push(d),
                                Err(broadcast::error::TryRecvError::Lagged(_)) => resync = true,
                                Err(_) => break,
                            }
                        }
                    }
                    // The first message, or a watcher that lagged past the ring: every
                    // endpoint's held blocks, which supersede any delta collected.
                    let first = sent.is_none();
                    if resync {
                        sub.resync_prefix();
                    }
                    let snapshot = if first || resync {
                        prefix.clear();
                        std::mem::take(&mut sub.prefix.snapshot)
                    } else {
                        Vec::new()
                    };
                    let now = tokio::time::Instant::now();
                    if msg.is_none() {
                        let state = sub.state.borrow_and_update();
                        msg = delta::next(&mut sent, &state, now, refresh);
                    }
                    if msg.is_none()
                        && (!notices.is_empty()
                            || notices_lost > 0
                            || !prefix.is_empty()
                            || !snapshot.is_empty())
                    {
                        msg = Some(api::SignalsUpdate::default());
                    }
                    if let Some(mut msg) = msg {
                        version += 1;
                        msg.version = version;
                        // The ring's notices, then the endpoints' newest steps (from the state).
                        let steps = std::mem::take(&mut msg.notices);
                        msg.notices = notices
                            .into_iter()
                            .map(|(arrived, n)| {
                                let mut n = (*n).clone();
                                let held = now.saturating_duration_since(arrived).as_micros();
                                n.age_us = n
                                    .age_us
                                    .saturating_add(u64::try_from(held).unwrap_or(u64::MAX));
                                n
                            })
                            .chain(steps)
                            .collect();
                        msg.notices_lost = notices_lost;
                        msg.prefix = snapshot;
                        msg.prefix.extend(prefix.iter().map(|d| (**d).clone()));
                        lost.inc_by(notices_lost);
                        last = now;
                        return Some((Ok(msg), (sub, sent, version, last)));
                    }
                }
            }
        },
    );
    Box::pin(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        HubConfig, SignalsMetrics,
        hub::tests::{CountingProbe, FakeIndex},
    };
    use futures::StreamExt as _;

    #[tokio::test(start_paused = true)]
    async fn a_stream_is_a_snapshot_then_numbered_deltas() {
        let index = FakeIndex::new(&[1, 2]);
        let hub = Hub::new(
            index.clone(),
            CountingProbe::default(),
            HubConfig::default(),
            SignalsMetrics::default(),
        );
        let sub = hub.subscribe(&index.pool, Engine::Vllm).unwrap();
        // Let the loops read once.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut s = updates(sub, hub.config().refresh, Default::default());
        let first = s.next().await.unwrap().unwrap();
        assert_eq!((first.version, first.full), (1, true));
        assert_eq!(first.readings.len(), 2);
        assert_eq!(first.readings[0].num_requests_waiting, Some(1));
        // Unchanged readings come again once the held copy is older than the refresh interval,
        // fresher; versions count up by one.
        let mut last = 1;
        for _ in 0..4 {
            let m = s.next().await.unwrap().unwrap();
            assert_eq!(m.version, last + 1);
            last = m.version;
            assert!(!m.full);
            assert!(m.readings.iter().all(|r| r.age_ms < 100), "{m:?}");
        }
        index.set(&[2]);
        let removed = loop {
            let m = s.next().await.unwrap().unwrap();
            if !m.removed.is_empty() {
                break m.removed;
            }
        };
        assert_eq!(removed, vec!["127.0.0.1:1".to_string()]);
    }

    /// A pool with nothing to say still speaks every refresh interval (an empty delta), and each
    /// new read of an endpoint carries the next `read_seq`.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_beats_and_reads_are_numbered() {
        let index = FakeIndex::new(&[]);
        let hub = Hub::new(
            index.clone(),
            CountingProbe::default(),
            HubConfig::default(),
            SignalsMetrics::default(),
        );
        let refresh = hub.config().refresh;
        let sub = hub.subscribe(&index.pool, Engine::Vllm).unwrap();
        let mut s = updates(sub, refresh, Default::default());
        let first = s.next().await.unwrap().unwrap();
        assert!(first.full && first.readings.is_empty());
        let started = tokio::time::Instant::now();
        let beat = s.next().await.unwrap().unwrap();
        assert_eq!(beat.version, 2);
        assert!(!beat.full && beat.readings.is_empty() && beat.removed.is_empty());
        assert_eq!(started.elapsed(), refresh);

        index.set(&[7]);
        let mut seqs = Vec::new();
        while seqs.len() < 3 {
            let m = s.next().await.unwrap().unwrap();
            seqs.extend(m.readings.iter().map(|r| r.read_seq));
        }
        assert!(seqs.windows(2).all(|w| w[1] > w[0]), "{seqs:?}");
        assert_eq!(seqs[0], 1);
    }

    /// A sidecar's notices reach every watcher of their pool over real sockets, aged by the time
    /// they waited; a notice on a pool nobody watches, or on no pool, is counted and dropped.
    #[tokio::test]
    async fn notices_are_relayed_to_the_pools_watchers() {
        let metrics = SignalsMetrics::default();
        let (mut client, mut watch) = served_and_watched(metrics.clone()).await;
        let path = GLM_PATH;
        assert!(watch.message().await.unwrap().unwrap().full);
        let notice = |path: &str, id| api::Notice {
            path: path.into(),
            addr: "127.0.0.1:1".into(),
            sender: "a".into(),
            request_id: id,
            age_us: 1_000,
            event: Some(api::notice::Event::Dispatch(api::Dispatch {
                prompt_tokens: 900,
                uncached_tokens: 800,
                prediction: None,
                prompt_chunks: vec![7, 8],
                prompt_chunk_tokens: 16,
                prompt_chunk_chars: 64,
            })),
        };
        let batch = api::NoticeBatch {
            notices: vec![
                notice(path, 1),
                notice(path, 2),
                notice("other.default.inferencepool.kinference.io", 3),
                notice("nope", 4),
            ],
        };
        client
            .notify(tokio_stream::iter([batch]))
            .await
            .expect("the service takes the batch");
        let mut relayed = Vec::new();
        while relayed.len() < 2 {
            let m = tokio::time::timeout(Duration::from_secs(5), watch.message())
                .await
                .expect("the notices come")
                .unwrap()
                .unwrap();
            relayed.extend(m.notices);
        }
        assert_eq!(
            relayed.iter().map(|n| n.request_id).collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(relayed.iter().all(|n| n.age_us >= 1_000 && n.sender == "a"));
        // The prompt's chunks travel as the sender wrote them.
        assert!(relayed.iter().all(|n| matches!(
            &n.event,
            Some(api::notice::Event::Dispatch(d)) if d.prompt_chunks == [7, 8]
        )));
        let count = |pool: &str, result| {
            metrics
                .notices
                .get_or_create(&NoticeLabels {
                    pool: pool.into(),
                    result,
                })
                .get()
        };
        assert_eq!(count("default/glm", "relayed"), 2);
        assert_eq!(count("default/other", "unwatched"), 1);
        assert_eq!(count("", "invalid"), 1);
    }

    const GLM_PATH: &str = "glm.default.inferencepool.kinference.io";

    /// A service over one pool (`glm`, one endpoint) on loopback, a client of it, and that
    /// client's watch of the pool.
    async fn served_and_watched(
        metrics: SignalsMetrics,
    ) -> (
        kinference_proxy_api::signals::engine_signals_client::EngineSignalsClient<
            tonic::transport::Channel,
        >,
        tonic::Streaming<api::SignalsUpdate>,
    ) {
        use kinference_proxy_api::signals::engine_signals_client::EngineSignalsClient;
        let hub = Hub::new(
            FakeIndex::new(&[1]),
            CountingProbe::default(),
            HubConfig::default(),
            metrics,
        );
        let (addr, serve) = SignalsServer::new(hub)
            .bind("127.0.0.1:0".parse().unwrap(), std::future::pending())
            .await
            .unwrap();
        tokio::spawn(serve);
        let mut client = EngineSignalsClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let watch = client
            .watch(api::SignalsTarget {
                path: GLM_PATH.into(),
                engine: String::new(),
                kv_events: None,
            })
            .await
            .unwrap()
            .into_inner();
        (client, watch)
    }

    async fn next_update(watch: &mut tonic::Streaming<api::SignalsUpdate>) -> api::SignalsUpdate {
        tokio::time::timeout(Duration::from_secs(5), watch.message())
            .await
            .expect("a message comes")
            .unwrap()
            .unwrap()
    }

    /// Step notices are not queued: each endpoint's newest reaches the watchers, at most once per
    /// load interval, so fifty steps sent at once arrive as the last of them.
    #[tokio::test]
    async fn step_notices_reach_the_watchers_as_each_endpoints_newest() {
        let (mut client, mut watch) = served_and_watched(SignalsMetrics::default()).await;
        let path = GLM_PATH;
        // The endpoint read once, so that the pool knows it.
        while next_update(&mut watch).await.readings.is_empty() {}
        let step = |id| api::Notice {
            path: path.into(),
            addr: "127.0.0.1:1".into(),
            sender: "a".into(),
            request_id: id,
            age_us: 100,
            event: Some(api::notice::Event::Step(api::Step {})),
        };
        let batch = api::NoticeBatch {
            notices: (0..50).map(step).collect(),
        };
        client
            .notify(tokio_stream::iter([batch]))
            .await
            .expect("the service takes the batch");
        let mut steps = Vec::new();
        while steps.last() != Some(&49) {
            steps.extend(
                next_update(&mut watch)
                    .await
                    .notices
                    .iter()
                    .map(|n| n.request_id),
            );
        }
        assert_eq!(steps, [49], "only the newest of the fifty");
    }

    #[tokio::test]
    async fn an_unknown_path_is_refused() {
        let index = FakeIndex::new(&[1]);
        let server = SignalsServer::new(Hub::new(
            index,
            CountingProbe::default(),
            HubConfig::default(),
            SignalsMetrics::default(),
        ));
        let bad = server
            .watch(tonic::Request::new(api::SignalsTarget {
                path: "nope".into(),
                engine: String::new(),
                kv_events: None,
            }))
            .await
            .err()
            .unwrap();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        let missing = server
            .watch(tonic::Request::new(api::SignalsTarget {
                path: "other.default.inferencepool.kinference.io".into(),
                engine: String::new(),
                kv_events: None,
            }))
            .await
            .err()
            .unwrap();
        assert_eq!(missing.code(), tonic::Code::NotFound);
    }

    /// A watch of a pool another shard owns is refused with FAILED_PRECONDITION naming the pool
    /// and both shards, never answered with an empty stream.
    #[tokio::test]
    async fn another_shards_pool_is_refused_with_failed_precondition() {
        let index = FakeIndex::new(&[1]);
        index.set_shard(Some("b"));
        let probe = CountingProbe::default();
        let server = SignalsServer::new(Hub::sharded(
            index,
            probe.clone(),
            HubConfig::default(),
            SignalsMetrics::default(),
            Some(kinference_policy_core::inference::SignalsShard::new("a").unwrap()),
        ));
        let refused = server
            .watch(tonic::Request::new(api::SignalsTarget {
                path: "glm.default.inferencepool.kinference.io".into(),
                engine: String::new(),
                kv_events: None,
            }))
            .await
            .err()
            .unwrap();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        let m = refused.message();
        assert!(
            m.contains("default/glm") && m.contains("shard b") && m.contains("shard a"),
            "{m}"
        );
        assert_eq!(probe.reads.load(std::sync::atomic::Ordering::Relaxed), 0);
    }
}
