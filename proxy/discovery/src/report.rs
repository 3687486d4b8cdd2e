//! Quality-guard reports to the controller (`InferencePolicies.ReportGuards`).
//!
//! The proxy's guards measure its own sampled requests; the controller merges every proxy's
//! measurements into the policy's `QualityGuard` status condition and events. A report is the
//! target's whole current measurement, so a lost one costs nothing: it is sent when the
//! measurements change (at most once a second) and every 30 s while there are any, and a failed
//! call is retried on the next change or heartbeat.

use crate::DiscoveryConfig;
use kinference_proxy_api::{
    InferencePoliciesClient,
    inference::{GuardReport, GuardStatus},
};
use std::{sync::Arc, time::Duration};
use tokio::sync::watch;
use tonic::transport::Channel;

/// What a target's guards have measured, under its policy's revision.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GuardMeasurements {
    pub revision: String,
    pub guards: Vec<GuardStatus>,
}

const HEARTBEAT: Duration = Duration::from_secs(30);
const MIN_INTERVAL: Duration = Duration::from_secs(1);

pub(crate) async fn run(
    channel: Channel,
    config: Arc<DiscoveryConfig>,
    mut rx: watch::Receiver<Arc<GuardMeasurements>>,
) {
    let target = crate::policy::inference_target(&config);
    loop {
        let current = rx.borrow_and_update().clone();
        if !current.guards.is_empty() {
            let report = GuardReport {
                target: Some(target.clone()),
                revision: current.revision.clone(),
                guards: current.guards.clone(),
            };
            let mut client = InferencePoliciesClient::new(channel.clone());
            match tokio::time::timeout(Duration::from_secs(5), client.report_guards(report)).await {
                Ok(Ok(_)) => {}
                Ok(Err(status)) => {
                    tracing::debug!(code = ?status.code(), message = status.message(), "the controller refused a guard report");
                }
                Err(_) => tracing::debug!("a guard report timed out"),
            }
        }
        tokio::time::sleep(MIN_INTERVAL).await;
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(HEARTBEAT) => {}
        }
    }
}
