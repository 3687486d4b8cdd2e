//! The proxy's discovery client: what the policy controller says about one target.
//!
//! The proxy must never depend on the controller being up: it keeps the last good inference
//! policy, outbound policy and endpoints when a stream fails, reconnects with jittered exponential
//! backoff, and replaces its state with the server's once a new stream answers. Everything is
//! published on `tokio::sync::watch` channels, so the request path only ever reads a snapshot.
//!
//! One tonic `Channel` (HTTP/2) carries every stream: `InferencePolicies.Watch` and
//! `OutboundPolicies.Watch` for the target, and one `Destination.Get` per backend either policy
//! names, started and stopped as the policies change.

mod backends;
mod backoff;
pub mod convert;
mod destination;
mod health;
mod policy;
pub mod refusal;
mod report;
pub mod rollout;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;

pub use self::backends::{inference_backends, outbound_backends};
pub use self::backoff::Backoff;
pub use self::refusal::{Refusal, Refusals};
pub use self::report::GuardMeasurements;
pub use self::rollout::{ArmOutcome, RolloutLedger};
pub use kinference_proxy_api::inference::InferencePolicy;

use linkerd2_proxy_api::outbound::OutboundPolicy;
use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};
use tokio::sync::watch;

/// Where the controller is and what to ask it.
#[derive(Clone, Debug)]
pub struct DiscoveryConfig {
    /// The controller's gRPC address, e.g. `http://127.0.0.1:8090` (one tonic channel, h2).
    pub controller: http::Uri,
    /// The parent authority the app calls, e.g. `llm.default.svc.cluster.local:80`, or the
    /// `ip:port` it connected to (looked up by address).
    pub target: String,
    /// This sidecar's workload identity (`ns/name`), sent as linkerd's `source_workload`.
    pub workload: String,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

/// The live view of the target, updated by background tasks.
#[derive(Clone, Debug)]
pub struct Discovery {
    /// Kinference's inference policy for the target, `None` until first received.
    pub inference: watch::Receiver<Option<Arc<InferencePolicy>>>,
    /// Linkerd's outbound policy for the target, `None` until first received.
    pub outbound: watch::Receiver<Option<Arc<OutboundPolicy>>>,
    /// Endpoints of every backend the policies name, keyed by Destination path.
    pub endpoints: watch::Receiver<Arc<Endpoints>>,
    /// True while the streams to the controller are up (the last good state is kept when not).
    pub connected: watch::Receiver<bool>,
    /// The inference policy messages refused, and the one the current policy is kept over.
    pub refusals: watch::Receiver<Refusals>,
    channel: tonic::transport::Channel,
    config: Arc<DiscoveryConfig>,
}

impl Discovery {
    /// Reports the target's quality-guard measurements to the controller as they change, until
    /// `measurements`' sender is dropped.
    pub fn report_guards(
        &self,
        measurements: watch::Receiver<Arc<GuardMeasurements>>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(report::run(
            self.channel.clone(),
            self.config.clone(),
            measurements,
        ))
    }
}

impl Discovery {
    /// Reports the arms of the watched policy's rollout to the controller every report interval,
    /// and once more when the rollout leaves the policy (see [`rollout`]), as `proxy`, with the
    /// deltas the request path adds to `ledger`; `on_result` hears what became of each report.
    pub fn report_rollouts(
        &self,
        ledger: Arc<RolloutLedger>,
        proxy: String,
        on_result: rollout::OnResult,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(rollout::run(
            self.channel.clone(),
            self.config.clone(),
            self.inference.clone(),
            ledger,
            proxy,
            on_result,
        ))
    }
}

/// The endpoints of every watched backend. A backend whose Destination stream has answered is
/// present (with an empty list when it has no endpoints); one not yet answered is absent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Endpoints {
    pub by_backend: BTreeMap<String, Vec<Endpoint>>,
}

/// One endpoint with the `metric_labels` the controller put on it (address labels over the
/// set's labels).
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub labels: BTreeMap<String, String>,
}

/// Starts the discovery tasks on the current tokio runtime. They run until every receiver of
/// [`Discovery::endpoints`] is dropped.
pub fn spawn(config: DiscoveryConfig) -> Discovery {
    let channel = tonic::transport::Endpoint::from(config.controller.clone())
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true)
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy();
    let (inference_tx, inference) = watch::channel(None);
    let (outbound_tx, outbound) = watch::channel(None);
    let (endpoints_tx, endpoints) = watch::channel(Arc::new(Endpoints::default()));
    let (refusals_tx, refusals) = watch::channel(Refusals::default());
    let (health, connected) = health::Health::new();
    let config = Arc::new(config);

    tokio::spawn(policy::watch_inference(
        channel.clone(),
        config.clone(),
        inference_tx,
        refusals_tx,
        health.clone(),
    ));
    tokio::spawn(policy::watch_outbound(
        channel.clone(),
        config.clone(),
        outbound_tx,
        health.clone(),
    ));
    tokio::spawn(destination::manage(
        channel.clone(),
        config.clone(),
        inference.clone(),
        outbound.clone(),
        endpoints_tx,
        health,
    ));
    Discovery {
        inference,
        outbound,
        endpoints,
        connected,
        refusals,
        channel,
        config,
    }
}
