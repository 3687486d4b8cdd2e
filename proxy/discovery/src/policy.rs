//! The two policy watches: Kinference's `InferencePolicies.Watch` and linkerd's
//! `OutboundPolicies.Watch` for the target.
//!
//! Each message is a complete policy, so a reconnected stream needs no history: its first message
//! replaces the last good one, which is kept (never cleared) while the stream is down. An
//! inference policy message that would leave a working target with none is refused
//! ([`crate::refusal`]).

use crate::{
    DiscoveryConfig,
    backoff::Backoff,
    health::{Health, Stream},
    refusal::{self, Refusals},
};
use kinference_proxy_api::{
    InferencePoliciesClient,
    inference::{InferencePolicy, InferenceTarget, SocketAddress, inference_target},
};
use linkerd2_proxy_api::outbound::{
    OutboundPolicy, TrafficSpec, outbound_policies_client::OutboundPoliciesClient, traffic_spec,
};
use std::{future::Future, net::SocketAddr, sync::Arc};
use tokio::sync::watch;
use tonic::{Status, Streaming, transport::Channel};

/// The target as the `InferencePolicies` API names it.
pub(crate) fn inference_target(config: &DiscoveryConfig) -> InferenceTarget {
    InferenceTarget {
        source_workload: config.workload.clone(),
        target: Some(match config.target.parse::<SocketAddr>() {
            Ok(a) => inference_target::Target::Addr(SocketAddress {
                ip: a.ip().to_string(),
                port: u32::from(a.port()),
            }),
            Err(_) => inference_target::Target::Authority(config.target.clone()),
        }),
    }
}

pub(crate) async fn watch_inference(
    channel: Channel,
    config: Arc<DiscoveryConfig>,
    tx: watch::Sender<Option<Arc<InferencePolicy>>>,
    refusals: watch::Sender<Refusals>,
    health: Health,
) {
    let target = inference_target(&config);
    let call = move || {
        let mut client = InferencePoliciesClient::new(channel.clone());
        let target = target.clone();
        async move { Ok(client.watch(target).await?.into_inner()) }
    };
    let admit = move |current: Option<&InferencePolicy>, new: &InferencePolicy| {
        let refused = refusal::judge(current, new);
        if let Some(r) = &refused {
            tracing::warn!(
                reason = r.reason,
                message = %r.message,
                kept_revision = current.map_or("", |c| c.revision.as_str()),
                "refused a policy that would leave the target with no models; keeping the working one"
            );
        }
        refusals.send_if_modified(|rs| {
            if let Some(r) = &refused {
                *rs.total.entry(r.reason).or_default() += 1;
            } else if rs.kept.is_none() {
                return false;
            }
            rs.kept = refused.clone();
            true
        });
        refused.is_none()
    };
    run(
        call,
        &config,
        tx,
        &admit,
        health,
        Stream::Inference,
        "inference",
    )
    .await;
}

pub(crate) async fn watch_outbound(
    channel: Channel,
    config: Arc<DiscoveryConfig>,
    tx: watch::Sender<Option<Arc<OutboundPolicy>>>,
    health: Health,
) {
    let spec = TrafficSpec {
        source_workload: config.workload.clone(),
        // An `ip:port` target (a redirected connection's original destination) is looked up
        // by address, as linkerd's proxies do; anything else is a Service authority.
        target: Some(match config.target.parse::<SocketAddr>() {
            Ok(a) => traffic_spec::Target::Addr(a.into()),
            Err(_) => traffic_spec::Target::Authority(config.target.clone()),
        }),
    };
    let call = move || {
        let mut client = OutboundPoliciesClient::new(channel.clone());
        let spec = spec.clone();
        async move { Ok(client.watch(spec).await?.into_inner()) }
    };
    run(
        call,
        &config,
        tx,
        &|_, _| true,
        health,
        Stream::Outbound,
        "outbound",
    )
    .await;
}

/// Opens the stream, publishes each policy `admit` takes, and on any failure keeps the last one,
/// reports the stream down and retries after a backoff. Returns when nobody receives the policy
/// any more.
async fn run<T, F, Fut>(
    call: F,
    config: &DiscoveryConfig,
    tx: watch::Sender<Option<Arc<T>>>,
    admit: &(dyn Fn(Option<&T>, &T) -> bool + Send + Sync),
    health: Health,
    stream: Stream,
    api: &'static str,
) where
    T: PartialEq + Send + Sync + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Streaming<T>, Status>>,
{
    let mut backoff = Backoff::new(config.backoff_min, config.backoff_max);
    loop {
        let status = tokio::select! {
            status = follow(&call, &tx, admit, &health, &stream, &mut backoff) => status,
            () = tx.closed() => return,
        };
        health.set(stream.clone(), false);
        let delay = backoff.next_delay();
        tracing::info!(api, code = ?status.code(), message = status.message(), retry_in_ms = delay.as_millis() as u64, "policy stream failed; keeping the last policy");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = tx.closed() => return,
        }
    }
}

/// Follows one stream until it fails; returns why.
async fn follow<T, F, Fut>(
    call: &F,
    tx: &watch::Sender<Option<Arc<T>>>,
    admit: &(dyn Fn(Option<&T>, &T) -> bool + Send + Sync),
    health: &Health,
    stream: &Stream,
    backoff: &mut Backoff,
) -> Status
where
    T: PartialEq,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Streaming<T>, Status>>,
{
    let mut messages = match call().await {
        Ok(s) => s,
        Err(status) => return status,
    };
    loop {
        match messages.message().await {
            Ok(Some(policy)) => {
                tx.send_if_modified(|current| {
                    if !admit(current.as_deref(), &policy) || current.as_deref() == Some(&policy) {
                        return false;
                    }
                    *current = Some(Arc::new(policy));
                    true
                });
                health.set(stream.clone(), true);
                backoff.reset();
            }
            Ok(None) => return Status::unavailable("the controller ended the stream"),
            Err(status) => return status,
        }
    }
}
