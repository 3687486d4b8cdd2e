//! Objects as the API server holds them, a controller started against the double, and
//! a clock tests move by hand.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kinference_k8s_api_double::ApiServer;
use kinference_policy_core::{DiscoverInferencePolicy, InferencePolicyState, ParentTarget};
use kinference_policy_k8s_index::{Index, SharedIndex};
use kinference_policy_k8s_watch::{Backoff, Clock, Config, LeaseConfig};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::{sync::Arc, time::Duration};

pub const NS: &str = "default";
pub const POLICY_API: &str = "policy.kinference.io/v1alpha1";
pub const POOL_API: &str = "inference.networking.k8s.io/v1";
pub const ROUTE_API: &str = "gateway.networking.k8s.io/v1";
/// Every wait in these tests is bounded by this.
pub const WAIT: Duration = Duration::from_secs(5);

pub fn service(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterIP": "10.0.0.10", "ports": [{"name": "http", "port": 8000}]},
    })
}

pub fn route(name: &str, service: &str, pools: &[&str]) -> Value {
    let backends: Vec<Value> = pools
        .iter()
        .map(
            |p| json!({"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": p}),
        )
        .collect();
    json!({
        "apiVersion": ROUTE_API, "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": service, "port": 8000}],
            "rules": [{"backendRefs": backends}],
        },
    })
}

pub fn pool(name: &str) -> Value {
    json!({
        "apiVersion": POOL_API, "kind": "InferencePool",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm", "kinference.io/model": name}},
            "targetPorts": [{"number": 8001}],
        },
    })
}

/// A policy on route `llm` serving one model from pool `pool`, with `prefill` tokens/s.
pub fn policy(name: &str, model: &str, pool: &str, prefill: f64) -> Value {
    json!({
        "apiVersion": POLICY_API, "kind": "InferencePolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "targetRef": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llm"},
            "models": [{
                "name": model,
                "poolRef": {"name": pool},
                "prior": {"prefillTokensPerSecond": prefill, "timePerOutputTokenMs": 30},
            }],
        },
    })
}

/// Service `llm`, route `llm` to pool `glm-5.3`, the pool.
pub fn base(server: &ApiServer) {
    server.put(service("llm"));
    server.put(route("llm", "llm", &["glm-5.3"]));
    server.put(pool("glm-5.3"));
}

pub fn llm_target() -> ParentTarget {
    ParentTarget {
        namespace: NS.into(),
        name: "llm".into(),
        port: 8000,
    }
}

/// Waits until the index's inference policy for service `llm` satisfies `f`.
pub async fn wait_policy(
    index: &SharedIndex,
    what: &str,
    f: impl FnMut(&InferencePolicyState) -> bool,
) -> InferencePolicyState {
    let mut rx = index
        .watch_inference_policy(&llm_target())
        .expect("a receiver");
    let result = tokio::time::timeout(WAIT, async {
        rx.wait_for(f).await.expect("index alive").clone()
    })
    .await;
    match result {
        Ok(state) => state,
        Err(_) => panic!("timed out waiting for {what}: {:?}", *rx.borrow()),
    }
}

/// The served models' names and prefill priors.
pub fn models(state: &InferencePolicyState) -> Vec<(String, f64)> {
    state
        .policy()
        .map(|p| {
            p.models
                .iter()
                .map(|m| (m.name.clone(), m.prior.prefill_tokens_per_second))
                .collect()
        })
        .unwrap_or_default()
}

#[derive(Debug)]
pub struct ManualClock(Mutex<Timestamp>);

impl ManualClock {
    pub fn new() -> Arc<Self> {
        Arc::new(Self(Mutex::new(
            Timestamp::from_second(1_780_000_000).expect("time"),
        )))
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock();
        *now = now
            .checked_add(SignedDuration::try_from(by).expect("duration"))
            .expect("time");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock()
    }
}

/// Test settings: fast retries, a 15s lease on the given clock.
pub fn config(identity: &str, clock: Arc<ManualClock>) -> Config {
    let mut lease = LeaseConfig::new(NS, "kinference-policy-controller", identity);
    lease.retry_period = Duration::from_millis(20);
    Config {
        lease,
        backoff: Backoff {
            min: Duration::from_millis(10),
            max: Duration::from_millis(100),
        },
        clock,
        guards: Arc::default(),
        rollouts: Arc::default(),
    }
}

/// A controller's Kubernetes source, running until dropped.
#[derive(Debug)]
pub struct Controller {
    pub index: SharedIndex,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Controller {
    pub fn start(server: &ApiServer, identity: &str, clock: Arc<ManualClock>) -> Self {
        let index = Index::shared();
        let client = server.client(identity);
        let config = config(identity, clock);
        let task = tokio::spawn({
            let index = index.clone();
            async move {
                let res = kinference_policy_k8s_watch::run(client, index, config).await;
                panic!("the source stopped: {res:?}");
            }
        });
        Self { index, task }
    }
}
