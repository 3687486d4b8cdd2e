//! Policy and endpoint discovery from the controller over gRPC.
//!
//! One tonic channel carries Kinference's `InferencePolicies.Watch` for the target and one stock
//! `Destination.Get` per backend the policy names. Streams reconnect with exponential backoff; the
//! last good policy and endpoints are kept while the controller is away.

use kinference_proxy_api::{InferencePoliciesClient, inference as api};
use linkerd2_proxy_api::destination::{
    self as dst, destination_client::DestinationClient, update::Update as DstUpdate,
};
use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};
use tokio::{sync::watch, task::JoinHandle};
use tonic::transport::{Channel, Endpoint as TonicEndpoint};

pub struct DiscoveryConfig {
    pub controller: http::Uri,
    pub target: String,
    pub workload: String,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

pub struct Discovery {
    pub inference: watch::Receiver<Option<Arc<api::InferencePolicy>>>,
    pub endpoints: watch::Receiver<Arc<Endpoints>>,
    pub connected: watch::Receiver<bool>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("connected", &*self.connected.borrow())
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Endpoints {
    pub by_backend: BTreeMap<String, Vec<Endpoint>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub labels: BTreeMap<String, String>,
}

struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
        }
    }
    fn reset(&mut self) {
        self.next = self.min;
    }
    async fn wait(&mut self) {
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(self.max);
    }
}

/// Starts the discovery tasks.
pub fn spawn(config: DiscoveryConfig) -> Discovery {
    let channel = TonicEndpoint::from(config.controller.clone())
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy();
    let (policy_tx, policy_rx) = watch::channel(None);
    let (endpoints_tx, endpoints_rx) = watch::channel(Arc::new(Endpoints::default()));
    let (connected_tx, connected_rx) = watch::channel(false);
    let connected_tx = Arc::new(connected_tx);
    tokio::spawn(watch_policy(
        channel.clone(),
        config.target.clone(),
        config.workload.clone(),
        Backoff::new(config.backoff_min, config.backoff_max),
        policy_tx,
        connected_tx,
    ));
    tokio::spawn(watch_endpoints(
        channel,
        policy_rx.clone(),
        endpoints_tx,
        (config.backoff_min, config.backoff_max),
    ));
    Discovery {
        inference: policy_rx,
        endpoints: endpoints_rx,
        connected: connected_rx,
    }
}

async fn watch_policy(
    channel: Channel,
    target: String,
    workload: String,
    mut backoff: Backoff,
    tx: watch::Sender<Option<Arc<api::InferencePolicy>>>,
    connected: Arc<watch::Sender<bool>>,
) {
    let mut client = InferencePoliciesClient::new(channel);
    loop {
        let req = api::InferenceTarget {
            source_workload: workload.clone(),
            target: Some(api::inference_target::Target::Authority(target.clone())),
        };
        match client.watch(req).await {
            Ok(rsp) => {
                let mut stream = rsp.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(policy)) => {
                            backoff.reset();
                            connected.send_replace(true);
                            tracing::info!(revision = %policy.revision, models = policy.models.len(), "inference policy");
                            tx.send_replace(Some(Arc::new(policy)));
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::warn!(%status, "inference policy stream failed");
                            break;
                        }
                    }
                }
            }
            Err(status) => tracing::warn!(%status, "cannot watch the inference policy"),
        }
        connected.send_replace(false);
        backoff.wait().await;
    }
}

type Shared = Arc<parking_lot::Mutex<BTreeMap<String, Vec<Endpoint>>>>;

async fn watch_endpoints(
    channel: Channel,
    mut policy: watch::Receiver<Option<Arc<api::InferencePolicy>>>,
    tx: watch::Sender<Arc<Endpoints>>,
    backoff: (Duration, Duration),
) {
    let shared: Shared = Arc::default();
    let tx = Arc::new(tx);
    let mut tasks: HashMap<String, JoinHandle<()>> = HashMap::new();
    loop {
        let paths: Vec<String> = policy
            .borrow_and_update()
            .as_ref()
            .map(|p| {
                p.models
                    .iter()
                    .filter_map(|m| m.backend.as_ref())
                    .map(|b| b.destination_path.clone())
                    .filter(|p| !p.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        // A policy with no models (the controller says there is none) keeps nothing to watch; but
        // while there is no policy at all yet, nothing is dropped either.
        if policy.borrow().is_some() {
            tasks.retain(|path, task| {
                let keep = paths.contains(path);
                if !keep {
                    task.abort();
                    shared.lock().remove(path);
                }
                keep
            });
            for path in paths {
                tasks.entry(path.clone()).or_insert_with(|| {
                    tokio::spawn(watch_backend(
                        DestinationClient::new(channel.clone()),
                        path,
                        shared.clone(),
                        tx.clone(),
                        Backoff::new(backoff.0, backoff.1),
                    ))
                });
            }
            publish(&shared, &tx);
        }
        if policy.changed().await.is_err() {
            return;
        }
    }
}

fn publish(shared: &Shared, tx: &watch::Sender<Arc<Endpoints>>) {
    let by_backend = shared.lock().clone();
    tx.send_if_modified(|cur| {
        if cur.by_backend == by_backend {
            return false;
        }
        *cur = Arc::new(Endpoints { by_backend });
        true
    });
}

async fn watch_backend(
    mut client: DestinationClient<Channel>,
    path: String,
    shared: Shared,
    tx: Arc<watch::Sender<Arc<Endpoints>>>,
    mut backoff: Backoff,
) {
    loop {
        let req = dst::GetDestination {
            scheme: "k8s".into(),
            path: path.clone(),
            context_token: String::new(),
        };
        match client.get(req).await {
            Ok(rsp) => {
                let mut stream = rsp.into_inner();
                // The first message of a stream is the full set: it replaces what was kept.
                let mut first = true;
                loop {
                    let update = match stream.message().await {
                        Ok(Some(u)) => u,
                        Ok(None) => break,
                        Err(status) => {
                            tracing::warn!(%status, %path, "destination stream failed");
                            break;
                        }
                    };
                    backoff.reset();
                    {
                        let mut map = shared.lock();
                        let set = map.entry(path.clone()).or_default();
                        if first {
                            set.clear();
                            first = false;
                        }
                        apply(set, update);
                    }
                    publish(&shared, &tx);
                }
            }
            Err(status) => tracing::warn!(%status, %path, "cannot get destination"),
        }
        backoff.wait().await;
    }
}

fn apply(set: &mut Vec<Endpoint>, update: dst::Update) {
    match update.update {
        Some(DstUpdate::Add(add)) => {
            for a in add.addrs {
                let Some(addr) = a.addr.and_then(|t| SocketAddr::try_from(t).ok()) else {
                    continue;
                };
                let mut labels: BTreeMap<String, String> =
                    add.metric_labels.clone().into_iter().collect();
                labels.extend(a.metric_labels);
                set.retain(|e| e.addr != addr);
                set.push(Endpoint { addr, labels });
            }
            set.sort_by_key(|e| e.addr);
        }
        Some(DstUpdate::Remove(rm)) => {
            for t in rm.addrs {
                if let Ok(addr) = SocketAddr::try_from(t) {
                    set.retain(|e| e.addr != addr);
                }
            }
        }
        Some(DstUpdate::NoEndpoints(_)) => set.clear(),
        None => {}
    }
}
