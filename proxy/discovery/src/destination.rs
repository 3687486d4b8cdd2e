//! One `Destination.Get` stream per backend the policies name, folded into [`Endpoints`].
//!
//! The manager recomputes the set of paths on every policy change, starting a watch for each new
//! path and stopping (and forgetting) each removed one. A watch keeps its backend's last published
//! endpoints while its stream is down; a new stream starts from an empty set and publishes only
//! once its first update has arrived (with any updates already queued behind it), so endpoints
//! never flap to empty on reconnect.

use crate::{
    DiscoveryConfig, Endpoint, Endpoints,
    backends::{inference_backends, outbound_backends},
    backoff::Backoff,
    health::{Health, Stream},
};
use futures::FutureExt;
use kinference_proxy_api::inference::InferencePolicy;
use linkerd2_proxy_api::{
    destination::{GetDestination, Update, destination_client::DestinationClient, update},
    outbound::OutboundPolicy,
};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    sync::Arc,
};
use tokio::{sync::watch, task::JoinHandle};
use tonic::{Code, Status, transport::Channel};

/// The Destination scheme linkerd's proxy sends.
const SCHEME: &str = "k8s";

/// Aborts the watch when dropped.
#[derive(Debug)]
struct Watch(JoinHandle<()>);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps one Destination watch per backend named by the current policies. Returns (stopping every
/// watch) when nobody receives endpoints any more.
pub(crate) async fn manage(
    channel: Channel,
    config: Arc<DiscoveryConfig>,
    mut inference: watch::Receiver<Option<Arc<InferencePolicy>>>,
    mut outbound: watch::Receiver<Option<Arc<OutboundPolicy>>>,
    endpoints: watch::Sender<Arc<Endpoints>>,
    health: Health,
) {
    let endpoints = Arc::new(endpoints);
    let context_token = context_token(&config.workload);
    let mut watches: BTreeMap<String, Watch> = BTreeMap::new();
    loop {
        let mut wanted = BTreeSet::new();
        if let Some(p) = inference.borrow_and_update().as_deref() {
            wanted.extend(inference_backends(p));
        }
        if let Some(p) = outbound.borrow_and_update().as_deref() {
            wanted.extend(outbound_backends(p));
        }
        let removed: Vec<String> = watches
            .keys()
            .filter(|p| !wanted.contains(*p))
            .cloned()
            .collect();
        for path in removed {
            watches.remove(&path);
            health.remove(&Stream::Destination(path.clone()));
            endpoints.send_if_modified(|eps| {
                if !eps.by_backend.contains_key(&path) {
                    return false;
                }
                Arc::make_mut(eps).by_backend.remove(&path);
                true
            });
            tracing::debug!(%path, "stopped watching backend");
        }
        for path in wanted {
            if watches.contains_key(&path) {
                continue;
            }
            tracing::debug!(%path, "watching backend");
            health.set(Stream::Destination(path.clone()), true);
            let task = tokio::spawn(watch_backend(
                channel.clone(),
                path.clone(),
                context_token.clone(),
                Backoff::new(config.backoff_min, config.backoff_max),
                endpoints.clone(),
                health.clone(),
            ));
            watches.insert(path, Watch(task));
        }
        tokio::select! {
            res = inference.changed() => if res.is_err() { return },
            res = outbound.changed() => if res.is_err() { return },
            () = endpoints.closed() => return,
        }
    }
}

/// Linkerd's context token: the caller's namespace, as JSON.
fn context_token(workload: &str) -> String {
    let ns = workload.split_once('/').map_or("", |(ns, _)| ns);
    format!("{{\"ns\":\"{}\"}}", ns.replace(['"', '\\'], ""))
}

async fn watch_backend(
    channel: Channel,
    path: String,
    context_token: String,
    mut backoff: Backoff,
    endpoints: Arc<watch::Sender<Arc<Endpoints>>>,
    health: Health,
) {
    let key = Stream::Destination(path.clone());
    loop {
        let status = follow(
            &channel,
            &path,
            &context_token,
            &endpoints,
            &health,
            &mut backoff,
        )
        .await;
        match status.code() {
            // The controller answered: this path has no endpoints it can serve (an unknown pool,
            // or a Service path the controller does not resolve). That is a fact, not an outage.
            Code::NotFound | Code::InvalidArgument => {
                publish(&endpoints, &path, Vec::new());
                health.set(key.clone(), true);
            }
            _ => health.set(key.clone(), false),
        }
        let delay = backoff.next_delay();
        tracing::info!(%path, code = ?status.code(), message = status.message(), retry_in_ms = delay.as_millis() as u64, "destination stream failed; keeping the last endpoints");
        tokio::time::sleep(delay).await;
    }
}

/// Follows one stream until it fails; returns why.
async fn follow(
    channel: &Channel,
    path: &str,
    context_token: &str,
    endpoints: &watch::Sender<Arc<Endpoints>>,
    health: &Health,
    backoff: &mut Backoff,
) -> Status {
    let mut client = DestinationClient::new(channel.clone());
    let req = GetDestination {
        scheme: SCHEME.into(),
        path: path.to_string(),
        context_token: context_token.to_string(),
    };
    let mut stream = match client.get(req).await {
        Ok(rsp) => rsp.into_inner(),
        Err(status) => return status,
    };
    // A fresh stream starts from nothing; the server's first updates rebuild the set.
    let mut set: BTreeMap<SocketAddr, BTreeMap<String, String>> = BTreeMap::new();
    loop {
        let update = match stream.message().await {
            Ok(Some(update)) => update,
            Ok(None) => return Status::unavailable("the controller ended the stream"),
            Err(status) => return status,
        };
        apply(&mut set, update);
        // Fold whatever is already queued before publishing, so one burst is one change.
        let mut failed = None;
        while let Some(next) = stream.message().now_or_never() {
            match next {
                Ok(Some(update)) => apply(&mut set, update),
                Ok(None) => {
                    failed = Some(Status::unavailable("the controller ended the stream"));
                    break;
                }
                Err(status) => {
                    failed = Some(status);
                    break;
                }
            }
        }
        let list = set
            .iter()
            .map(|(addr, labels)| Endpoint {
                addr: *addr,
                labels: labels.clone(),
            })
            .collect();
        publish(endpoints, path, list);
        health.set(Stream::Destination(path.to_string()), true);
        backoff.reset();
        if let Some(status) = failed {
            return status;
        }
    }
}

fn publish(endpoints: &watch::Sender<Arc<Endpoints>>, path: &str, list: Vec<Endpoint>) {
    endpoints.send_if_modified(|eps| {
        if eps.by_backend.get(path) == Some(&list) {
            return false;
        }
        Arc::make_mut(eps).by_backend.insert(path.to_string(), list);
        true
    });
}

/// Applies one update: `add` inserts or replaces addresses (set labels under address labels),
/// `remove` drops them, `no_endpoints` empties the set.
fn apply(set: &mut BTreeMap<SocketAddr, BTreeMap<String, String>>, update: Update) {
    match update.update {
        Some(update::Update::Add(add)) => {
            for wa in add.addrs {
                let Some(addr) = wa.addr.and_then(|a| SocketAddr::try_from(a).ok()) else {
                    tracing::debug!("skipping an endpoint without a valid address");
                    continue;
                };
                let mut labels: BTreeMap<String, String> = add
                    .metric_labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                labels.extend(wa.metric_labels);
                set.insert(addr, labels);
            }
        }
        Some(update::Update::Remove(remove)) => {
            for a in remove.addrs {
                if let Ok(addr) = SocketAddr::try_from(a) {
                    set.remove(&addr);
                }
            }
        }
        Some(update::Update::NoEndpoints(_)) => set.clear(),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkerd2_proxy_api::destination::{AddrSet, NoEndpoints, WeightedAddr, WeightedAddrSet};
    use std::collections::HashMap;

    fn add(addrs: &[(&str, &str)], set_labels: &[(&str, &str)]) -> Update {
        Update {
            update: Some(update::Update::Add(WeightedAddrSet {
                addrs: addrs
                    .iter()
                    .map(|(a, pod)| WeightedAddr {
                        addr: Some(a.parse::<SocketAddr>().unwrap().into()),
                        weight: 10_000,
                        metric_labels: HashMap::from([("pod".into(), pod.to_string())]),
                        ..Default::default()
                    })
                    .collect(),
                metric_labels: set_labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            })),
        }
    }

    #[test]
    fn updates_fold_into_a_set_with_merged_labels() {
        let mut set = BTreeMap::new();
        apply(
            &mut set,
            add(
                &[("10.0.0.1:8000", "a"), ("10.0.0.2:8000", "b")],
                &[("namespace", "default"), ("pod", "set-level")],
            ),
        );
        assert_eq!(set.len(), 2);
        let a = &set[&"10.0.0.1:8000".parse().unwrap()];
        assert_eq!(a["pod"], "a", "address labels win over set labels");
        assert_eq!(a["namespace"], "default");

        apply(
            &mut set,
            Update {
                update: Some(update::Update::Remove(AddrSet {
                    addrs: vec!["10.0.0.1:8000".parse::<SocketAddr>().unwrap().into()],
                })),
            },
        );
        assert_eq!(
            set.keys().collect::<Vec<_>>(),
            [&"10.0.0.2:8000".parse::<SocketAddr>().unwrap()]
        );

        apply(
            &mut set,
            Update {
                update: Some(update::Update::NoEndpoints(NoEndpoints { exists: true })),
            },
        );
        assert!(set.is_empty());
    }

    #[test]
    fn context_token_carries_the_namespace() {
        assert_eq!(context_token("apps/web"), r#"{"ns":"apps"}"#);
        assert_eq!(context_token("web"), r#"{"ns":""}"#);
    }
}
