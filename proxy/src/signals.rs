//! Endpoint signals: one scraper per endpoint, and one KV-event subscriber per endpoint whose pool
//! publishes them, feeding the router.
//!
//! The TTFT prediction needs each endpoint's queue, running batch, KV-cache usage and cache
//! configuration, fresh. A task per endpoint scrapes its `/metrics` on an interval (each scrape
//! within a timeout) and hands the result, stamped with the time it was taken, to the router. The
//! set of tasks follows the endpoint set; a failed scrape is counted and simply leaves the signals
//! to age, which is what makes the balancer fall back. With each scrape it polls vLLM's
//! `GET /load` (requests the API server holds, counted on arrival with
//! `--enable-server-load-tracking`): the scheduler's gauges change only when an engine step ends,
//! so during a long prefill step they miss what other proxies sent meanwhile, and `/load` does not.
//! An endpoint that answers 404 is not asked again. Its context window (`max_model_len` in
//! `GET /v1/models`) is asked once it answers and every few minutes after, so that a prompt
//! longer than every candidate's window is refused before it is hashed or sent.
//!
//! With a signal service (`--signals-addr`), [`service`] reads each pool's engines through the
//! control plane instead, and the scrapers read directly only while its stream is down.
//!
//! Where the policy says a pool's endpoints publish vLLM KV events, a second task per endpoint
//! subscribes to its ZMQ publisher and applies each batch to the router's precise prefix index.
//! A lost batch (a sequence gap, an undecodable message) clears that endpoint's mirror: an index
//! that under-states what is cached costs a missed hit, one that over-states it sends prompts to
//! an endpoint that must prefill them after all.

use crate::{
    endpoints::{ContractCheck, EndpointInfo, EndpointTable, KvSubscription},
    metrics::{KvErrorLabels, PoolLabels, SignalMetrics},
    router::RouterHandle,
};
use kinference_proxy_signals::{
    KvEventError, KvEventsConfig, ScrapeError, Scraper, Tokenizer, subscribe_kv_events_with,
};
use kinference_routing::EndpointId;
use kinference_routing::KvEvent;
use std::{collections::HashMap, time::Duration};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub mod service;

pub use self::service::{ServiceConfig, Source};

/// How often an endpoint's context window is asked again once known.
const MODELS_INTERVAL: Duration = Duration::from_secs(300);

/// The longest wait before asking again after a failed or windowless answer.
const MODELS_RETRY: Duration = Duration::from_secs(5);

/// How one target reads its endpoints.
#[derive(Clone, Debug)]
pub struct SignalsConfig {
    /// How often each endpoint is scraped when this proxy reads it.
    pub interval: Duration,
    /// The timeout of one scrape.
    pub timeout: Duration,
    /// The control plane's signal service, when there is one.
    pub service: Option<ServiceConfig>,
}

/// Where this proxy streams a pool's engine readings: its shard's addresses when the policy puts
/// the pool on a signal shard (none for a shard the controller does not know: the engines are
/// then read directly), else `default` (`--signals-addr`; empty: no service).
pub fn service_addrs<'a>(e: &'a EndpointInfo, default: &'a [http::Uri]) -> &'a [http::Uri] {
    match &e.signal_shard {
        Some(shard) => &shard.addrs,
        None => default,
    }
}

/// A pool's stream key: its Destination path, engine and the service addresses it streams from
/// (a pool that moves to another shard gets a new stream).
type PoolKey = (String, kinference_proxy_signals::Engine, Vec<http::Uri>);

/// Keeps one scraper per endpoint (and, with a signal service, one stream per pool, at the
/// pool's own shard's addresses) until the returned task is dropped or aborted.
pub fn spawn(
    endpoints: EndpointTable,
    router: RouterHandle,
    metrics: SignalMetrics,
    config: SignalsConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let scraper = Scraper::new(config.timeout);
        let mut rx = endpoints.subscribe();
        let mut tasks: HashMap<EndpointId, (EndpointInfo, Tasks)> = HashMap::new();
        let mut pools: HashMap<PoolKey, service::PoolStream> = HashMap::new();
        // With a service, this target's name in notices, and the task that sends its own, each
        // to the service of its pool's shard.
        let sender = format!("{:016x}", rand::random::<u64>());
        let _notifier = config.service.as_ref().map(|service| {
            let (tap, rx) = tokio::sync::mpsc::channel(service::NOTICE_TAP);
            router.tap_notices(tap);
            Aborting(service::spawn_notifiers(
                service.clone(),
                sender.clone(),
                endpoints.clone(),
                router.clone(),
                metrics.clone(),
                rx,
            ))
        });
        let no_addrs = Vec::new();
        let default_addrs = config.service.as_ref().map_or(&no_addrs, |s| &s.addrs);
        loop {
            let current = rx.borrow_and_update().clone();
            tasks.retain(|id, (info, task)| {
                let keep = current.iter().any(|e| e.id == *id && e == info);
                if !keep {
                    task.abort();
                }
                keep
            });
            let key = |e: &EndpointInfo| -> PoolKey {
                (
                    e.destination.clone(),
                    e.engine,
                    service_addrs(e, default_addrs).to_vec(),
                )
            };
            if let Some(service) = &config.service {
                pools.retain(|k, _| current.iter().any(|e| key(e) == *k));
                for e in current.iter() {
                    let k = key(e);
                    if k.2.is_empty() {
                        // No service for this pool: its endpoints are read directly.
                        continue;
                    }
                    pools.entry(k).or_insert_with_key(|(_, _, addrs)| {
                        // Every endpoint of a pool publishes by the pool's one rule.
                        let kv_events = current
                            .iter()
                            .filter(|o| o.destination == e.destination && o.engine == e.engine)
                            .find_map(|o| o.kv_events.as_ref().map(service::kv_source));
                        service::spawn_pool(service::PoolParams {
                            config: ServiceConfig {
                                addrs: addrs.clone(),
                                ..service.clone()
                            },
                            destination: e.destination.clone(),
                            engine: e.engine,
                            labels: PoolLabels {
                                pool: e.pool.clone(),
                                model: e.model.clone(),
                            },
                            table: endpoints.clone(),
                            router: router.clone(),
                            metrics: metrics.clone(),
                            sender: sender.clone(),
                            kv_events,
                        })
                    });
                }
            }
            for e in current.iter() {
                if tasks.contains_key(&e.id) {
                    continue;
                }
                let reads = Reads {
                    interval: config.interval,
                    service: config.service.as_ref().and_then(|s| {
                        let pool = pools.get(&key(e))?;
                        Some((pool.source.clone(), s.fallback_interval))
                    }),
                };
                let kv_service = reads.service.as_ref().map(|(source, _)| source.clone());
                let task = Tasks {
                    scrape: tokio::spawn(scrape_loop(
                        endpoints.clone(),
                        router.clone(),
                        metrics.clone(),
                        scraper.clone(),
                        e.clone(),
                        reads,
                    )),
                    kv_events: e.kv_events.clone().map(|sub| {
                        tokio::spawn(kv_loop(
                            endpoints.clone(),
                            router.clone(),
                            metrics.clone(),
                            scraper.clone(),
                            e.clone(),
                            sub,
                            kv_service.clone(),
                        ))
                    }),
                };
                tasks.insert(e.id.clone(), (e.clone(), task));
            }
            if rx.changed().await.is_err() {
                for (_, (_, t)) in tasks {
                    t.abort();
                }
                return;
            }
        }
    })
}

/// A task aborted when dropped.
#[derive(Debug)]
struct Aborting(JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The signal tasks of one endpoint.
#[derive(Debug)]
struct Tasks {
    scrape: JoinHandle<()>,
    kv_events: Option<JoinHandle<()>>,
}

/// Dropped with the scrapers' task (a stopped target's), the endpoint's tasks stop too.
impl Drop for Tasks {
    fn drop(&mut self) {
        self.abort();
    }
}

impl Tasks {
    fn abort(&self) {
        self.scrape.abort();
        if let Some(t) = &self.kv_events {
            t.abort();
        }
    }
}

/// Applies one endpoint's KV events until aborted (dropping the receiver stops the subscriber).
/// A pool's `hf:` tokenizer contract is first checked against the endpoint's own tokenizer; an
/// endpoint that tokenizes otherwise is not subscribed to, so its pool's prompts are matched on the
/// approximate index there.
async fn kv_loop(
    table: EndpointTable,
    router: RouterHandle,
    metrics: SignalMetrics,
    scraper: Scraper,
    endpoint: EndpointInfo,
    sub: KvSubscription,
    service: Option<tokio::sync::watch::Receiver<service::Source>>,
) {
    let labels = PoolLabels {
        pool: endpoint.pool.clone(),
        model: endpoint.model.clone(),
    };
    if let Some(Tokenizer::Hf(contract)) = &sub.tokenizer {
        let check = check_contract(&scraper, &endpoint, contract).await;
        if let ContractCheck::Mismatch(why) = &check {
            tracing::warn!(
                endpoint = %endpoint.id,
                tokenizer = contract.name(),
                %why,
                "the pool's tokenizer does not tokenize as the engine does: its KV events are not used"
            );
        }
        let mismatch = matches!(check, ContractCheck::Mismatch(_));
        table.record_contract(&endpoint.id, check);
        if mismatch {
            return;
        }
    }
    let mut service = service;
    let mut took_over = false;
    loop {
        // While the signal service streams the pool's prefix changes, it subscribes for this
        // proxy: stand down until it is away.
        if let Some(source) = service.as_mut() {
            let gone = source
                .wait_for(|s| *s != service::Source::Service)
                .await
                .is_err();
            if gone {
                // The pool's stream is gone (the pool left the policy): subscribe alone.
                service = None;
            }
            if took_over {
                // What the mirror holds came from the service; events missed between the two
                // would over-state it.
                router.apply_kv_events(&endpoint.id, &[KvEvent::AllBlocksCleared]);
            }
        }
        took_over = true;
        let mut rx = subscribe_kv_events_with(KvEventsConfig::new(
            sub.publisher.clone(),
            sub.topic.clone(),
        ));
        tracing::debug!(endpoint = %endpoint.id, publisher = %sub.publisher, "subscribing to KV events");
        loop {
            // `Err(true)`: the service is back (stand down); `Err(false)`: its stream is gone (go
            // on alone).
            let item = match service.as_mut() {
                Some(source) => tokio::select! {
                    item = rx.recv() => Ok(item),
                    back = source.wait_for(|s| *s == service::Source::Service) => Err(back.is_ok()),
                },
                None => Ok(rx.recv().await),
            };
            let item = match item {
                Ok(Some(item)) => item,
                // The subscriber stopped (it never does while its receiver lives).
                Ok(None) => return,
                Err(false) => {
                    service = None;
                    continue;
                }
                Err(true) => {
                    tracing::debug!(endpoint = %endpoint.id, "KV events through the signal service");
                    break;
                }
            };
            apply_kv_item(&table, &router, &metrics, &endpoint, &labels, item);
        }
    }
}

/// One item of an endpoint's own KV-event subscription.
fn apply_kv_item(
    table: &EndpointTable,
    router: &RouterHandle,
    metrics: &SignalMetrics,
    endpoint: &EndpointInfo,
    labels: &PoolLabels,
    item: Result<Vec<KvEvent>, KvEventError>,
) {
    match item {
        Ok(events) => {
            metrics.kv_event_batches.get_or_create(labels).inc();
            if router.apply_kv_events(&endpoint.id, &events) {
                table.record_kv_batch(&endpoint.id, &events, router.now());
            }
        }
        Err(error) => {
            metrics
                .kv_event_errors
                .get_or_create(&KvErrorLabels {
                    pool: labels.pool.clone(),
                    model: labels.model.clone(),
                    reason: kv_error_reason(&error).into(),
                })
                .inc();
            tracing::debug!(endpoint = %endpoint.id, %error, "KV event stream");
            // Lost events make the mirror inexact: it is cleared (under-stating the overlap
            // until new events arrive is safe; over-stating it is not).
            let lost = error.events_lost();
            if lost {
                router.apply_kv_events(&endpoint.id, &[KvEvent::AllBlocksCleared]);
            }
            table.record_kv_error(&endpoint.id, error.to_string(), lost);
        }
    }
}

/// Prompts whose ids the engine and the contract must agree on: a chat (template, special tokens)
/// and a completion (added special tokens).
const PROBE_CHAT: [(&str, &str); 2] = [
    ("system", "You are a helpful assistant."),
    ("user", "Hello! What is 2 + 2? Answer in one word, please."),
];
const PROBE_COMPLETION: &str = "The quick brown fox jumps over the lazy dog.";
/// How long an endpoint that does not answer yet is asked again, before its events are used
/// unchecked.
const CONTRACT_PATIENCE: Duration = Duration::from_secs(120);

/// Asks the endpoint's `POST /tokenize` for the probe prompts' ids and compares them with the
/// contract's.
async fn check_contract(
    scraper: &Scraper,
    endpoint: &EndpointInfo,
    contract: &kinference_proxy_signals::tokenizer::hf::HfContract,
) -> ContractCheck {
    let Ok(url) = format!("http://{}/tokenize", endpoint.addr).parse::<http::Uri>() else {
        return ContractCheck::Unchecked("no /tokenize URL".into());
    };
    let chat = serde_json::json!({
        "model": endpoint.served_name,
        "messages": PROBE_CHAT
            .iter()
            .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
            .collect::<Vec<_>>(),
    });
    let completion = serde_json::json!({"model": endpoint.served_name, "prompt": PROBE_COMPLETION});
    let started = Instant::now();
    for (what, request, ours) in [
        ("chat", chat, contract.chat_tokens(&PROBE_CHAT)),
        (
            "completion",
            completion,
            contract.completion_tokens(PROBE_COMPLETION),
        ),
    ] {
        let ours = match ours {
            Ok(ids) => ids,
            Err(e) => return ContractCheck::Mismatch(format!("{what} probe: {e}")),
        };
        let theirs = loop {
            match scraper.tokenize(&url, &request).await {
                Ok(ids) => break ids,
                Err(e @ ScrapeError::Status { .. }) => {
                    return ContractCheck::Unchecked(e.to_string());
                }
                Err(e) if started.elapsed() >= CONTRACT_PATIENCE => {
                    return ContractCheck::Unchecked(e.to_string());
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        if theirs != ours {
            let at = theirs
                .iter()
                .zip(&ours)
                .position(|(a, b)| a != b)
                .unwrap_or(theirs.len().min(ours.len()));
            return ContractCheck::Mismatch(format!(
                "{what} probe: the engine gave {} ids and the contract {}, first differing at {at}",
                theirs.len(),
                ours.len()
            ));
        }
    }
    ContractCheck::Verified
}

fn kv_error_reason(e: &KvEventError) -> &'static str {
    match e {
        KvEventError::Connect { .. } => "connect",
        KvEventError::Recv { .. } => "recv",
        KvEventError::SequenceGap { .. } => "sequence_gap",
        KvEventError::Decode { .. } => "decode",
    }
}

/// When an endpoint's scraper reads its metrics.
#[derive(Clone, Debug)]
struct Reads {
    interval: Duration,
    /// With a signal service: its pool's source, and how often to read while it is not the
    /// service.
    service: Option<(tokio::sync::watch::Receiver<Source>, Duration)>,
}

async fn scrape_loop(
    table: EndpointTable,
    router: RouterHandle,
    metrics: SignalMetrics,
    scraper: Scraper,
    endpoint: EndpointInfo,
    reads: Reads,
) {
    let interval = reads.interval;
    // With a signal service, direct reads happen only while its stream is down, at most once per
    // fallback interval.
    let mut next_direct = Instant::now();
    let (Ok(url), Ok(load_url)) = (
        format!("http://{}/metrics", endpoint.addr).parse::<http::Uri>(),
        format!("http://{}/load", endpoint.addr).parse::<http::Uri>(),
    ) else {
        return;
    };
    // vLLM's `GET /load` is polled with every scrape until the endpoint says it has no such route.
    let mut poll_load = true;
    // Its context window (`GET /v1/models`), asked until it answers and again every
    // `MODELS_INTERVAL` (a restarted engine may serve another length); not again after a 404.
    let models_url = format!("http://{}/v1/models", endpoint.addr)
        .parse::<http::Uri>()
        .ok();
    let mut models_due = Some(Instant::now());
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let started = Instant::now();
        if let (Some(url), Some(due)) = (&models_url, models_due)
            && started >= due
        {
            models_due = match scraper.max_model_len(url).await {
                Ok(Some(n)) => {
                    table.record_context_window(&endpoint.id, n);
                    Some(started + MODELS_INTERVAL)
                }
                Ok(None) => Some(started + MODELS_RETRY),
                Err(ScrapeError::Status { status, .. })
                    if status == http::StatusCode::NOT_FOUND =>
                {
                    None
                }
                Err(error) => {
                    tracing::debug!(endpoint = %endpoint.id, %error, "GET /v1/models failed");
                    Some(started + interval.min(MODELS_RETRY))
                }
            };
        }
        if let Some((source, fallback_interval)) = &reads.service {
            if service::from_service(source) || started < next_direct {
                continue;
            }
            next_direct = started + *fallback_interval;
        }
        let sent = Instant::now();
        let (scraped, load) = if poll_load {
            let (m, l) = tokio::join!(
                scraper.scrape_engine(&url, endpoint.engine),
                scraper.server_load(&load_url)
            );
            (m, Some(l))
        } else {
            (scraper.scrape_engine(&url, endpoint.engine).await, None)
        };
        let server_load = match load {
            Some(Ok(n)) => Some(n),
            Some(Err(ScrapeError::Status { status, .. }))
                if status == http::StatusCode::NOT_FOUND =>
            {
                tracing::debug!(endpoint = %endpoint.id, "no GET /load: routing on the scheduler's gauges alone");
                poll_load = false;
                None
            }
            Some(Err(error)) => {
                tracing::debug!(endpoint = %endpoint.id, %error, "GET /load failed");
                None
            }
            None => None,
        };
        match scraped {
            Ok(m) => {
                // Stamped with when the scrape was sent: the values are at least that old.
                let mut scrape = m.to_scrape();
                scrape.server_load = server_load;
                let at = router.clock().time_of(sent);
                router.observe_scrape(&endpoint.id, &scrape, at);
            }
            Err(error) => {
                metrics
                    .scrape_errors
                    .get_or_create(&PoolLabels {
                        pool: endpoint.pool.clone(),
                        model: endpoint.model.clone(),
                    })
                    .inc();
                tracing::debug!(endpoint = %endpoint.id, %error, "scrape failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool on a signal shard streams from that shard's addresses, as the policy names them; a
    /// pool on the default shard from `--signals-addr`; a pool on a shard the controller does not
    /// know from nowhere (its engines are read directly), never from the default shard's service.
    #[test]
    fn each_pool_streams_from_its_own_shards_addresses() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        let default = [uri("http://controller:8092")];
        let glm = info("127.0.0.1:1".parse().unwrap());
        assert_eq!(service_addrs(&glm, &default), default);
        assert!(service_addrs(&glm, &[]).is_empty());

        // From the wire: the policy's backend names the shard and its addresses.
        let mut proto = kinference_proxy_discovery::testing::example_proto();
        let backend = proto.models[0].backend.as_mut().unwrap();
        backend.signals_shard = "a".into();
        backend.signals_addrs = vec!["http://signals-a:8092".into(), "http://a2:8092".into()];
        let backend = proto.models[1].backend.as_mut().unwrap();
        backend.signals_shard = "z".into();
        let policy = kinference_proxy_discovery::convert::policy(&proto);
        let (table, router) = (EndpointTable::default(), RouterHandle::default());
        let by_backend = policy
            .models
            .iter()
            .enumerate()
            .map(|(i, m)| {
                (
                    m.destination_path.clone(),
                    vec![kinference_proxy_discovery::Endpoint {
                        addr: std::net::SocketAddr::from(([127, 0, 0, 1], 9000 + i as u16)),
                        labels: Default::default(),
                    }],
                )
            })
            .collect();
        table.sync(
            &policy,
            &kinference_proxy_discovery::Endpoints { by_backend },
            &router,
        );
        let of = |port: u16| {
            table
                .info(&EndpointId::from(format!("127.0.0.1:{port}")))
                .unwrap()
        };
        let (on_a, on_z) = (of(9000), of(9001));
        assert_eq!(on_a.signal_shard.as_ref().unwrap().name, "a");
        assert_eq!(
            service_addrs(&on_a, &default),
            [uri("http://signals-a:8092"), uri("http://a2:8092")]
        );
        assert_eq!(on_z.signal_shard.as_ref().unwrap().name, "z");
        assert!(service_addrs(&on_z, &default).is_empty());
    }

    /// Serves `body` at `GET /metrics` of a loopback listener (404 elsewhere), as a plain HTTP/1.1
    /// server.
    async fn serve(body: &'static str) -> std::net::SocketAddr {
        serve_at("GET /metrics", body.to_string()).await
    }

    /// Serves `body` to requests whose head starts with `route` (404 to others).
    async fn serve_at(route: &'static str, body: String) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]);
                    let rsp = if head.starts_with(route) {
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    } else {
                        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_string()
                    };
                    let _ = s.write_all(rsp.as_bytes()).await;
                });
            }
        });
        addr
    }

    /// A pool annotated `kinference.io/engine: sglang` is scraped with SGLang's names over a real
    /// socket: the router sees the exposition's running and queued requests and KV usage.
    #[tokio::test]
    async fn an_sglang_pool_is_scraped_with_sglangs_metric_names() {
        let addr = serve(include_str!("../signals/tests/fixtures/sglang/metrics.txt")).await;
        let mut p = kinference_proxy_discovery::convert::policy(
            &kinference_proxy_discovery::testing::example_proto(),
        );
        for m in &mut p.models {
            m.engine = "sglang".into();
        }
        let table = EndpointTable::default();
        let router = RouterHandle::default();
        let mut by_backend = std::collections::BTreeMap::new();
        by_backend.insert(
            p.models[0].destination_path.clone(),
            vec![kinference_proxy_discovery::Endpoint {
                addr,
                labels: Default::default(),
            }],
        );
        table.sync(
            &p,
            &kinference_proxy_discovery::Endpoints { by_backend },
            &router,
        );
        let task = spawn(
            table.clone(),
            router.clone(),
            crate::metrics::Metrics::new().signals,
            SignalsConfig {
                interval: Duration::from_millis(20),
                timeout: Duration::from_secs(1),
                service: None,
            },
        );
        let id = EndpointId::from(addr.to_string());
        let seen = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let s = router.read(|r, _| {
                    r.signals(&id).map(|s| {
                        (
                            s.num_requests_running.map(|o| o.value),
                            s.num_requests_waiting.map(|o| o.value),
                            s.kv_cache_usage.map(|o| o.value),
                        )
                    })
                });
                if let Some((Some(running), Some(waiting), Some(kv))) = s {
                    return (running, waiting, kv);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the SGLang endpoint is scraped");
        task.abort();
        assert_eq!(seen, (12, 5, 0.31));
    }

    fn info(addr: std::net::SocketAddr) -> EndpointInfo {
        EndpointInfo {
            id: EndpointId::from(addr.to_string()),
            addr,
            model: "glm-5.3".into(),
            served_name: "tiny".into(),
            pool: "glm-5.3".into(),
            destination: "glm-5.3.default.inferencepool.kinference.io".into(),
            kv_events: None,
            engine: kinference_proxy_signals::Engine::Vllm,
            signal_shard: None,
        }
    }

    /// A pool's `hf:` contract is held to the engine's own `POST /tokenize`: the same ids verify
    /// it, other ids are a mismatch (its events are then not used), and an engine without the
    /// route leaves it unchecked.
    #[tokio::test]
    async fn the_tokenizer_contract_is_checked_against_the_engines_tokenize() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/signals/tests/fixtures/vllm-0.32.0/tiny-model"
        );
        let Ok(Tokenizer::Hf(contract)) = Tokenizer::load(&format!("hf:{dir}")) else {
            panic!("the tiny model's tokenizer loads");
        };
        let scraper = Scraper::new(Duration::from_secs(2));
        let chat = contract.chat_tokens(&PROBE_CHAT).unwrap();
        let completion = contract.completion_tokens(PROBE_COMPLETION).unwrap();
        assert_ne!(chat, completion);
        // One server answers every /tokenize with the chat ids: the chat probe agrees, the
        // completion probe does not.
        let addr = serve_at(
            "POST /tokenize",
            serde_json::json!({"tokens": chat}).to_string(),
        )
        .await;
        let check = check_contract(&scraper, &info(addr), &contract).await;
        let ContractCheck::Mismatch(why) = &check else {
            panic!("{check:?}");
        };
        assert!(why.starts_with("completion probe"), "{why}");
        // A server that tokenizes as the contract does verifies it.
        let both = serde_json::json!({"chat": chat, "completion": completion});
        let addr = serve_tokenize(both).await;
        assert_eq!(
            check_contract(&scraper, &info(addr), &contract).await,
            ContractCheck::Verified
        );
        // An engine without the route (SGLang, an older vLLM): unchecked, with the reason.
        let addr = serve("").await;
        let check = check_contract(&scraper, &info(addr), &contract).await;
        assert!(
            matches!(&check, ContractCheck::Unchecked(why) if why.contains("404")),
            "{check:?}"
        );
    }

    /// `POST /tokenize` answered with `ids["chat"]` for a request with `messages`, else
    /// `ids["completion"]`.
    async fn serve_tokenize(ids: serde_json::Value) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let ids = ids.clone();
                tokio::spawn(async move {
                    let mut req = Vec::new();
                    let mut buf = vec![0u8; 4096];
                    // Head and body: read until the body's declared length has arrived.
                    loop {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        req.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&req);
                        let Some(split) = text.find("\r\n\r\n") else {
                            if n == 0 {
                                return;
                            }
                            continue;
                        };
                        let len = text[..split]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if req.len() >= split + 4 + len || n == 0 {
                            break;
                        }
                    }
                    let text = String::from_utf8_lossy(&req);
                    let kind = if text.contains("\"messages\"") {
                        "chat"
                    } else {
                        "completion"
                    };
                    let body = serde_json::json!({"tokens": ids[kind]}).to_string();
                    let rsp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(rsp.as_bytes()).await;
                });
            }
        });
        addr
    }
}
