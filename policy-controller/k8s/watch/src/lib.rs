//! The policy controller's Kubernetes source: watches the cluster into the index, and
//! writes what the controller made of each resource back as status.
//!
//! Watchers ([`watch`]) feed the same [`kinference_policy_k8s_index::Index`] the local
//! manifest directory feeds, so the gRPC server cannot tell the sources apart. Every
//! replica watches and serves; only the replica holding the Lease ([`lease`]) writes
//! status ([`status`]).

pub mod lease;
pub mod status;
pub mod watch;

pub use self::{
    lease::{Clock, LeaseConfig, LeaseElector, SystemClock},
    status::{CONTROLLER_NAME, Inputs, StatusWriter},
    watch::{Backoff, InitialSync, Sink},
};

use gateway_api::apis::standard::httproutes::HttpRoute;
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kinference_api::{InferenceClassifier, InferencePolicy, InferencePool};
use kinference_policy_k8s_index::{ResourceKind, SharedIndex};
use kube::{Api, Client};
use std::sync::Arc;

/// How the Kubernetes source runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub lease: LeaseConfig,
    pub backoff: Backoff,
    pub clock: Arc<dyn Clock>,
    /// The proxies' quality-guard reports (the gRPC server fills it), written into status.
    pub guards: Arc<kinference_policy_core::guard::GuardReports>,
    /// The rollout loop's outcomes, written into status.
    pub rollouts: Arc<kinference_policy_core::rollout::judge::Rollouts>,
}

impl Config {
    /// Production settings: client-go's lease timings, the reflector's backoff, the
    /// system clock.
    pub fn new(lease: LeaseConfig) -> Self {
        Self {
            lease,
            backoff: Backoff::default(),
            clock: Arc::new(SystemClock),
            guards: Arc::default(),
            rollouts: Arc::default(),
        }
    }
}

/// Why the source stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the {0} task ended")]
    TaskEnded(&'static str),
    #[error("the {task} task failed: {source}")]
    TaskFailed {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// The kinds [`run`] watches.
pub const WATCHED_KINDS: [ResourceKind; 7] = [
    ResourceKind::Service,
    ResourceKind::HttpRoute,
    ResourceKind::InferencePool,
    ResourceKind::EndpointSlice,
    ResourceKind::Pod,
    ResourceKind::InferencePolicy,
    ResourceKind::InferenceClassifier,
];

/// Watches every kind the index uses in all namespaces, elects a leader and writes
/// status while leading. Runs until a task ends, which it should not; the caller treats
/// that as fatal.
pub async fn run(client: Client, index: SharedIndex, config: Config) -> Result<(), Error> {
    let (synced, _) = tokio::sync::watch::channel(false);
    run_with_sync(client, index, config, synced).await
}

/// As [`run`], and turns `synced` true once every kind has been listed once, so the
/// controller can report ready only when it serves the cluster's state.
pub async fn run_with_sync(
    client: Client,
    index: SharedIndex,
    config: Config,
    synced: tokio::sync::watch::Sender<bool>,
) -> Result<(), Error> {
    let inputs = Arc::new(Inputs::default());
    let sync = Arc::new(InitialSync::new(WATCHED_KINDS, synced));
    let sink = Sink::new(index.clone(), inputs.clone()).with_initial_sync(sync);
    let backoff = config.backoff;
    let mut tasks = tokio::task::JoinSet::new();
    macro_rules! watch {
        ($ty:ty, $name:literal) => {{
            let api = Api::<$ty>::all(client.clone());
            let sink = sink.clone();
            tasks.spawn(async move {
                watch::watch_kind(api, sink, backoff).await;
                $name
            });
        }};
    }
    watch!(Service, "Service watch");
    watch!(HttpRoute, "HTTPRoute watch");
    watch!(InferencePool, "InferencePool watch");
    watch!(EndpointSlice, "EndpointSlice watch");
    watch!(Pod, "Pod watch");
    watch!(InferencePolicy, "InferencePolicy watch");
    watch!(InferenceClassifier, "InferenceClassifier watch");

    let elector = LeaseElector::new(client.clone(), config.lease, config.clock.clone());
    let leader = elector.subscribe();
    tasks.spawn(async move {
        elector.run().await;
        "leader election"
    });
    let writer = StatusWriter::with_rollouts(
        client,
        index,
        inputs,
        config.clock,
        config.guards,
        config.rollouts,
    );
    tasks.spawn(async move {
        writer.run(leader).await;
        "status writer"
    });

    match tasks.join_next().await {
        Some(Ok(task)) => Err(Error::TaskEnded(task)),
        Some(Err(source)) => Err(Error::TaskFailed {
            task: "source",
            source,
        }),
        None => Err(Error::TaskEnded("source")),
    }
}
