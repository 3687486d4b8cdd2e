//! One target's endpoints: what discovery reported for the policy's pools, as the proxy dials them.
//!
//! Discovery reports addresses per backend; the policy says which model each backend serves and
//! whether its endpoints publish vLLM KV events. [`EndpointTable::sync`] joins the two whenever
//! either changes, keeps the router's endpoint set in step, and publishes the list the signals
//! tasks follow. The retry layer reads an endpoint's address and served name from here; the
//! route layer reads the pools' tokenizer contracts, so prompts are hashed before the router's
//! lock is taken.
//!
//! Lock order: the table's, then the router's (in [`EndpointTable::sync`]); nothing takes the
//! table's while holding the router's.

use crate::router::RouterHandle;
use kinference_decision::Policy;
use kinference_proxy_discovery::Endpoints;
use kinference_proxy_signals::{Engine, Tokenizer};
use kinference_routing::{EndpointId, EndpointMeta, KvEvent, ModelName, Time};
use parking_lot::RwLock;
use std::{collections::HashMap, net::SocketAddr, sync::Arc};

/// An endpoint as the proxy knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointInfo {
    pub id: EndpointId,
    pub addr: SocketAddr,
    /// The policy model it serves.
    pub model: String,
    pub served_name: String,
    pub pool: String,
    /// Its pool's Destination path (`<pool>.<namespace>.inferencepool.kinference.io`), what the
    /// signal service is asked for.
    pub destination: String,
    /// Where the endpoint publishes KV events, when its pool does.
    pub kv_events: Option<KvSubscription>,
    /// The model server it runs, whose metrics the scraper reads.
    pub engine: Engine,
    /// The signal shard its pool is on, when the policy puts it on one (else the default shard:
    /// `--signals-addr`).
    pub signal_shard: Option<SignalShard>,
}

/// Where a sharded pool's engine readings are streamed (docs/signals.md, "Sharding").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignalShard {
    pub name: String,
    /// The shard's signal-service addresses, tried in turn; empty when the controller does not
    /// know the shard (the pool's engines are then read directly).
    pub addrs: Vec<http::Uri>,
}

/// One endpoint's KV-event publisher.
#[derive(Clone, Debug, PartialEq)]
pub struct KvSubscription {
    /// `tcp://IP:PORT`.
    pub publisher: String,
    /// The pool's rule for it (what the signal service is told, to subscribe in the proxy's
    /// stead).
    pub port: kinference_decision::policy::KvEventsPort,
    pub topic: String,
    /// The pool's tokenizer contract, when the proxy knows it (else events are mirrored but
    /// prompts are not matched against them).
    pub tokenizer: Option<Tokenizer>,
}

/// What this proxy has heard from one endpoint's KV events (for `/debug/endpoints`).
#[derive(Clone, Debug, Default)]
pub struct KvState {
    pub batches: u64,
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    /// Stored minus removed since the last clear: what the precise index holds when no event was
    /// lost (it is also capped at the endpoint's block count).
    pub blocks_held: u64,
    pub clears: u64,
    pub last_batch_at: Option<Time>,
    pub errors: u64,
    pub last_error: Option<String>,
    /// Whether the pool's tokenizer contract tokenizes as this endpoint does (`hf:` contracts,
    /// asked of its `POST /tokenize` before subscribing).
    pub contract: Option<ContractCheck>,
}

/// What an endpoint's `POST /tokenize` said of the pool's tokenizer contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContractCheck {
    /// The engine gave the contract's ids for every probe prompt.
    Verified,
    /// It gave others: the endpoint's events are not used (its prompts would never match).
    Mismatch(String),
    /// It could not be asked (no such route, or no answer): the events are used unchecked.
    Unchecked(String),
}

impl ContractCheck {
    /// `verified`, `mismatch: WHY` or `unchecked: WHY`, for `/debug/endpoints`.
    pub fn describe(&self) -> String {
        match self {
            Self::Verified => "verified".into(),
            Self::Mismatch(why) => format!("mismatch: {why}"),
            Self::Unchecked(why) => format!("unchecked: {why}"),
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    endpoints: HashMap<EndpointId, EndpointInfo>,
    /// The policy's models whose pool discovery has not answered for yet (an answered pool may
    /// be empty): until it has, the proxy is not ready.
    awaiting: Vec<String>,
    kv: HashMap<EndpointId, KvState>,
    /// The tokenizer contract of each model whose pool publishes KV events.
    tokenizers: Arc<HashMap<ModelName, Tokenizer>>,
    /// Each endpoint's context window (`max_model_len` from its `GET /v1/models`), once known.
    context_windows: HashMap<EndpointId, u32>,
    /// Where each pool's readings come from now, by Destination path, with a signal service.
    signal_sources: HashMap<String, crate::signals::Source>,
}

/// A shared handle on one target's endpoint table.
#[derive(Clone, Debug)]
pub struct EndpointTable {
    inner: Arc<RwLock<Table>>,
    /// Publishes the endpoint set when it changes (the signals tasks follow it).
    tx: Arc<tokio::sync::watch::Sender<Arc<Vec<EndpointInfo>>>>,
}

impl Default for EndpointTable {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            tx: Arc::new(tokio::sync::watch::channel(Arc::new(Vec::new())).0),
        }
    }
}

impl EndpointTable {
    /// Follows the endpoint set.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Arc<Vec<EndpointInfo>>> {
        self.tx.subscribe()
    }

    /// Applies a policy and the endpoints of its backends to the table and the router: settings,
    /// priors, the endpoint set.
    pub fn sync(&self, policy: &Policy, endpoints: &Endpoints, router: &RouterHandle) {
        let restarted = router.apply_policy(policy);
        let mut t = self.inner.write();
        if restarted {
            // A fresh router knows no endpoint: every one is added again.
            t.endpoints.clear();
            t.kv.clear();
        }
        t.awaiting = policy
            .models
            .iter()
            .filter(|m| !endpoints.by_backend.contains_key(&m.destination_path))
            .map(|m| m.name.clone())
            .collect();
        let desired = desired(policy, endpoints);
        let removed: Vec<EndpointId> = t
            .endpoints
            .keys()
            .filter(|id| !desired.contains_key(*id))
            .cloned()
            .collect();
        for id in &removed {
            t.endpoints.remove(id);
            t.kv.remove(id);
            t.context_windows.remove(id);
        }
        let mut upserts = Vec::new();
        for (id, (info, meta)) in desired {
            if t.endpoints.get(&id) == Some(&info) {
                continue;
            }
            if t.endpoints.get(&id).map(|e| &e.kv_events) != Some(&info.kv_events) {
                t.kv.remove(&id);
            }
            let fresh = !t.endpoints.contains_key(&id);
            upserts.push((meta, fresh));
            t.endpoints.insert(id, info);
        }
        router.reconcile(&removed, upserts);
        let mut list: Vec<EndpointInfo> = t.endpoints.values().cloned().collect();
        list.sort_by(|a, b| a.id.cmp(&b.id));
        let tokenizers: HashMap<ModelName, Tokenizer> = policy
            .models
            .iter()
            .filter_map(|m| {
                let tok = Tokenizer::from_name(&m.kv_events.as_ref()?.tokenizer)?;
                Some((ModelName::from(m.name.as_str()), tok))
            })
            .collect();
        if *t.tokenizers != tokenizers {
            t.tokenizers = Arc::new(tokenizers);
        }
        drop(t);
        self.tx.send_if_modified(|cur| {
            if **cur == list {
                return false;
            }
            *cur = Arc::new(list);
            true
        });
    }

    /// The policy's models whose endpoints discovery has not reported yet (empty pools that it
    /// has reported are not awaited: one empty pool must not keep the proxy unready).
    pub fn awaiting(&self) -> Vec<String> {
        self.inner.read().awaiting.clone()
    }

    pub fn info(&self, id: &EndpointId) -> Option<EndpointInfo> {
        self.inner.read().endpoints.get(id).cloned()
    }

    /// Every endpoint, in id order.
    pub fn list(&self) -> Vec<EndpointInfo> {
        self.tx.borrow().as_ref().clone()
    }

    /// The tokenizer contract of each model whose pool publishes KV events.
    pub fn tokenizers(&self) -> Arc<HashMap<ModelName, Tokenizer>> {
        self.inner.read().tokenizers.clone()
    }

    /// Counts a batch of `id`'s KV events applied at `now`.
    pub fn record_kv_batch(&self, id: &EndpointId, events: &[KvEvent], now: Time) {
        let mut t = self.inner.write();
        if !t.endpoints.contains_key(id) {
            return;
        }
        let st = t.kv.entry(id.clone()).or_default();
        st.batches += 1;
        st.last_batch_at = Some(now);
        for e in events {
            match e {
                KvEvent::BlockStored { block_hashes, .. } => {
                    st.blocks_stored += block_hashes.len() as u64;
                    st.blocks_held += block_hashes.len() as u64;
                }
                KvEvent::BlockRemoved { block_hashes } => {
                    st.blocks_removed += block_hashes.len() as u64;
                    st.blocks_held = st.blocks_held.saturating_sub(block_hashes.len() as u64);
                }
                KvEvent::AllBlocksCleared => {
                    st.clears += 1;
                    st.blocks_held = 0;
                }
            }
        }
    }

    /// Counts a failure on `id`'s KV-event stream; `cleared`: the mirror was cleared for it.
    pub fn record_kv_error(&self, id: &EndpointId, error: String, cleared: bool) {
        let mut t = self.inner.write();
        if !t.endpoints.contains_key(id) {
            return;
        }
        let st = t.kv.entry(id.clone()).or_default();
        st.errors += 1;
        if cleared {
            st.clears += 1;
            st.blocks_held = 0;
        }
        st.last_error = Some(error);
    }

    /// Records where the pool at `destination` reads its engines now.
    pub fn record_signal_source(&self, destination: &str, source: crate::signals::Source) {
        self.inner
            .write()
            .signal_sources
            .insert(destination.to_string(), source);
    }

    /// Where the pool at `destination` reads its engines: `None` without a signal service (each
    /// endpoint is scraped by this proxy).
    pub fn signal_source(&self, destination: &str) -> Option<crate::signals::Source> {
        self.inner.read().signal_sources.get(destination).cloned()
    }

    /// Records what `id`'s engine said of its pool's tokenizer contract.
    pub fn record_contract(&self, id: &EndpointId, check: ContractCheck) {
        let mut t = self.inner.write();
        if t.endpoints.contains_key(id) {
            t.kv.entry(id.clone()).or_default().contract = Some(check);
        }
    }

    /// Records `id`'s context window in tokens.
    pub fn record_context_window(&self, id: &EndpointId, tokens: u32) {
        let mut t = self.inner.write();
        if t.endpoints.contains_key(id) {
            t.context_windows.insert(id.clone(), tokens);
        }
    }

    /// `id`'s context window, once its engine has said it.
    pub fn context_window_of(&self, id: &EndpointId) -> Option<u32> {
        self.inner.read().context_windows.get(id).copied()
    }

    /// The largest prompt-plus-completion any endpoint of `models` accepts, when every one of
    /// them has said its context window; `None` while any is unknown (or there is no endpoint),
    /// so that nothing is refused on a guess.
    pub fn context_window<'a>(&self, models: impl IntoIterator<Item = &'a str>) -> Option<u32> {
        let t = self.inner.read();
        let models: Vec<&str> = models.into_iter().collect();
        let mut largest = None;
        for e in t
            .endpoints
            .values()
            .filter(|e| models.contains(&e.model.as_str()))
        {
            let w = *t.context_windows.get(&e.id)?;
            largest = largest.max(Some(w));
        }
        largest
    }

    /// What this proxy has heard from `id`'s KV events.
    pub fn kv_state(&self, id: &EndpointId) -> KvState {
        self.inner.read().kv.get(id).cloned().unwrap_or_default()
    }
}

/// The model's engine: vLLM unless its pool names another (and vLLM, with a warning, for a name
/// the proxy cannot read: the scrape then fails visibly rather than reading the wrong names).
fn engine_of(m: &kinference_decision::policy::Model) -> Engine {
    if m.engine.is_empty() {
        return Engine::Vllm;
    }
    Engine::parse(&m.engine).unwrap_or_else(|| {
        tracing::warn!(model = %m.name, engine = %m.engine, "unknown engine: reading vLLM's metric names");
        Engine::Vllm
    })
}

/// The endpoints the policy's pools have, first model of an address wins.
fn desired(
    policy: &Policy,
    endpoints: &Endpoints,
) -> HashMap<EndpointId, (EndpointInfo, EndpointMeta)> {
    let mut desired = HashMap::new();
    for m in &policy.models {
        for ep in endpoints
            .by_backend
            .get(&m.destination_path)
            .into_iter()
            .flatten()
        {
            let id = EndpointId::from(ep.addr.to_string());
            if desired.contains_key(&id) {
                continue;
            }
            let mut meta = EndpointMeta::new(id.clone(), m.name.as_str());
            meta.pool = Arc::from(m.pool.as_str());
            let kv_events = m.kv_events.as_ref().and_then(|k| {
                Some(KvSubscription {
                    publisher: k.publisher(ep.addr)?,
                    port: k.port,
                    topic: k.topic.clone(),
                    tokenizer: Tokenizer::from_name(&k.tokenizer),
                })
            });
            // The precise index answers only where prompts can be hashed as the pool does.
            meta.kv_events = kv_events.as_ref().is_some_and(|k| k.tokenizer.is_some());
            meta.lora_adapters = ep
                .labels
                .get("lora_adapters")
                .map(|l| {
                    l.split(',')
                        .filter(|s| !s.is_empty())
                        .map(Arc::from)
                        .collect()
                })
                .unwrap_or_default();
            let info = EndpointInfo {
                id: id.clone(),
                addr: ep.addr,
                model: m.name.clone(),
                served_name: m.served_name.clone(),
                pool: m.pool.clone(),
                destination: m.destination_path.clone(),
                kv_events,
                engine: engine_of(m),
                signal_shard: policy
                    .signals
                    .get(&m.destination_path)
                    .map(|s| SignalShard {
                        name: s.shard.clone(),
                        addrs: s.addrs.iter().filter_map(|a| a.parse().ok()).collect(),
                    }),
            };
            desired.insert(id, (info, meta));
        }
    }
    desired
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_decision::{KvEvents, KvEventsPort};
    use kinference_proxy_discovery::{Endpoint, convert, testing::example_proto};
    use std::collections::BTreeMap;

    pub(crate) fn endpoints(ports: &[(&str, u16)]) -> Endpoints {
        let mut by_backend: BTreeMap<String, Vec<Endpoint>> = BTreeMap::new();
        for (model, port) in ports {
            by_backend
                .entry(format!("{model}.default.inferencepool.kinference.io"))
                .or_default()
                .push(Endpoint {
                    addr: SocketAddr::from(([127, 0, 0, 1], *port)),
                    labels: BTreeMap::new(),
                });
        }
        Endpoints { by_backend }
    }

    fn policy() -> Policy {
        convert::policy(&example_proto())
    }

    #[tokio::test]
    async fn sync_adds_and_removes_endpoints_per_backend() {
        let (t, r) = (EndpointTable::default(), RouterHandle::default());
        let p = policy();
        t.sync(
            &p,
            &endpoints(&[("glm-5.3", 1), ("glm-5.3", 2), ("qwen-3.6-27b", 3)]),
            &r,
        );
        let rx = t.subscribe();
        assert_eq!(rx.borrow().len(), 3);
        assert_eq!(
            t.info(&EndpointId::from("127.0.0.1:3")).map(|e| e.model),
            Some("qwen-3.6-27b".to_string())
        );
        // The router knows them too, ready until a connection fails.
        let id = EndpointId::from("127.0.0.1:3");
        assert!(r.read(|router, _| router.signals(&id).is_some()));
        t.sync(&p, &endpoints(&[("glm-5.3", 1)]), &r);
        assert_eq!(rx.borrow().len(), 1);
        assert!(t.info(&id).is_none());
        assert!(r.read(|router, _| router.signals(&id).is_none()));
    }

    #[tokio::test]
    async fn models_whose_pool_discovery_has_not_answered_are_awaited() {
        let (t, r) = (EndpointTable::default(), RouterHandle::default());
        let p = policy();
        assert!(t.awaiting().is_empty(), "nothing awaited before a policy");
        t.sync(&p, &endpoints(&[("glm-5.3", 1)]), &r);
        assert_eq!(t.awaiting(), vec!["qwen-3.6-27b".to_string()]);
        // An answered but empty pool is not awaited.
        let mut answered = endpoints(&[("glm-5.3", 1)]);
        let qwen = p.models.iter().find(|m| m.name == "qwen-3.6-27b").unwrap();
        answered
            .by_backend
            .insert(qwen.destination_path.clone(), Vec::new());
        t.sync(&p, &answered, &r);
        assert!(t.awaiting().is_empty());
    }

    fn kv_policy(tokenizer: &str) -> Policy {
        let mut p = policy();
        for m in &mut p.models {
            m.kv_events = Some(KvEvents {
                port: KvEventsPort::Offset(1000),
                topic: String::new(),
                tokenizer: tokenizer.into(),
            });
        }
        p
    }

    #[tokio::test]
    async fn a_pool_with_kv_events_subscribes_each_endpoint_with_its_tokenizer() {
        let (t, r) = (EndpointTable::default(), RouterHandle::default());
        t.sync(
            &kv_policy("kinference-sim"),
            &endpoints(&[("glm-5.3", 1), ("glm-5.3", 2)]),
            &r,
        );
        let sub = t
            .info(&EndpointId::from("127.0.0.1:2"))
            .unwrap()
            .kv_events
            .unwrap();
        assert_eq!(sub.publisher, "tcp://127.0.0.1:1002");
        assert_eq!(sub.tokenizer, Some(Tokenizer::KinferenceSim));
        assert_eq!(
            t.tokenizers().get(&ModelName::from("glm-5.3")),
            Some(&Tokenizer::KinferenceSim)
        );
    }

    #[tokio::test]
    async fn each_endpoint_is_read_as_its_pools_engine() {
        let (t, r) = (EndpointTable::default(), RouterHandle::default());
        let mut p = policy();
        for m in &mut p.models {
            m.engine = match m.name.as_str() {
                "glm-5.3" => "sglang".into(),
                _ => "tgi".into(),
            };
        }
        t.sync(&p, &endpoints(&[("glm-5.3", 1), ("qwen-3.6-27b", 3)]), &r);
        let engine = |port: u16| {
            t.info(&EndpointId::from(format!("127.0.0.1:{port}")))
                .unwrap()
                .engine
        };
        assert_eq!(engine(1), Engine::Sglang);
        // An engine the proxy cannot read is read as vLLM, with a warning.
        assert_eq!(engine(3), Engine::Vllm);
        t.sync(&policy(), &endpoints(&[("glm-5.3", 1)]), &r);
        assert_eq!(engine(1), Engine::Vllm, "no engine named: vLLM");
    }

    #[tokio::test]
    async fn an_unknown_tokenizer_subscribes_but_leaves_the_approximate_index() {
        let (t, r) = (EndpointTable::default(), RouterHandle::default());
        t.sync(
            &kv_policy("Qwen/Qwen3-8B"),
            &endpoints(&[("glm-5.3", 1)]),
            &r,
        );
        let info = t.info(&EndpointId::from("127.0.0.1:1")).unwrap();
        assert_eq!(info.kv_events.unwrap().tokenizer, None);
        assert!(t.tokenizers().is_empty());
    }
}
