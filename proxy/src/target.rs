//! One target's live state: the policy it enforces, its router and its endpoints.
//!
//! A target is the Service the application calls (the configured default one, or the original
//! destination of a redirected connection). Discovery feeds it: each policy message is converted
//! to the domain model at the discovery edge and its classifiers compiled, once per revision,
//! then published on a `watch` channel the layers read without locking anything shared; each
//! endpoint set is joined with the policy in the [`EndpointTable`], which keeps the router's
//! endpoints in step. [`Target`] is the bundle of handles the stack and the admin views are
//! built from; each layer takes only the handles it needs.

use crate::{classify, endpoints::EndpointTable, metrics::DiscoveryMetrics, router::RouterHandle};
use kinference_classify::Compiled;
use kinference_decision::Policy;
use kinference_proxy_discovery::{self as discovery, convert};
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tokio::sync::watch;

/// The policy a target enforces, with its compiled classifiers and the message it came from.
#[derive(Debug)]
pub struct ActivePolicy {
    pub policy: Arc<Policy>,
    pub classifiers: Arc<Compiled>,
    /// The controller's message, kept to tell a new one from a resend.
    pub proto: Arc<discovery::InferencePolicy>,
    /// The policy a rollout's cohort is decided under (`Policy::cohort`), when one runs.
    pub cohort: Option<Arc<Policy>>,
    /// Why the message's rollout was dropped, when it was.
    pub rollout_error: Option<convert::RolloutError>,
}

/// The target's current policy, `None` until the first arrives.
pub type PolicyWatch = watch::Receiver<Option<Arc<ActivePolicy>>>;

/// The handles of one target.
#[derive(Clone, Debug)]
pub struct Target {
    /// The target's name in decision records and admin views: the default target's authority,
    /// or a redirected connection's original destination.
    pub name: Arc<str>,
    pub policy: PolicyWatch,
    pub router: RouterHandle,
    pub endpoints: EndpointTable,
    /// Whether every discovery stream to the controller is up (the last good policy is kept
    /// while it is not).
    pub connected: Arc<AtomicBool>,
    /// The policy messages discovery refused, and the one the current policy is kept over.
    pub refusals: Arc<Mutex<discovery::Refusals>>,
    /// What the judges have said of the policy's guarded rules.
    pub guard_book: crate::guard::Book,
    /// Requests held for their class's TTFT objective.
    pub admission: crate::admission::Admission,
    /// Each tenant's token budget window.
    pub budgets: crate::budget::Budgets,
    /// The same, as reported to the controller.
    pub guard_reports: Arc<watch::Sender<Arc<discovery::GuardMeasurements>>>,
    /// What the arms of the policy's rollout measured and the reporter has not yet sent.
    pub rollout_ledger: Arc<discovery::RolloutLedger>,
}

impl Target {
    /// The current policy, if one has arrived.
    pub fn policy(&self) -> Option<Arc<ActivePolicy>> {
        self.policy.borrow().clone()
    }

    /// Ready to route: a policy, and discovery has reported the pool of each of its models.
    pub fn readiness(&self) -> Result<(), String> {
        if self.policy().is_none() {
            return Err("no inference policy yet".into());
        }
        let awaiting = self.endpoints.awaiting();
        if awaiting.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "no endpoints reported yet for {}",
                awaiting.join(", ")
            ))
        }
    }

    /// Waits until the target can route (as `/ready` requires), or `limit` has passed.
    pub async fn ready(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while !(self.policy().is_some() && self.endpoints.awaiting().is_empty())
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The sending side of a target's state, driven by [`sync`].
#[derive(Debug)]
pub struct Feed {
    policy: watch::Sender<Option<Arc<ActivePolicy>>>,
    classifiers: classify::Cache,
}

/// A target with no policy yet, and the feed that fills it.
pub fn new(name: &str, router: RouterHandle) -> (Target, Feed) {
    let (tx, rx) = watch::channel(None);
    let target = Target {
        name: Arc::from(name),
        policy: rx,
        router,
        endpoints: EndpointTable::default(),
        connected: Arc::new(AtomicBool::new(false)),
        refusals: Arc::default(),
        guard_book: Arc::default(),
        admission: Default::default(),
        budgets: Default::default(),
        guard_reports: Arc::new(watch::channel(Arc::default()).0),
        rollout_ledger: Arc::new(discovery::RolloutLedger::new(&crate::metrics::TTFT_BUCKETS)),
    };
    let feed = Feed {
        policy: tx,
        classifiers: classify::Cache::default(),
    };
    (target, feed)
}

impl Feed {
    /// Converts and publishes a policy message, unless it is the one already active.
    pub fn apply(&self, proto: Arc<discovery::InferencePolicy>) -> Arc<ActivePolicy> {
        if let Some(cur) = self.policy.borrow().as_ref()
            && Arc::ptr_eq(&cur.proto, &proto)
        {
            return cur.clone();
        }
        let policy = Arc::new(convert::policy(&proto));
        let classifiers = self.classifiers.get(&policy.revision, || {
            convert::classifiers(&proto.classifiers)
        });
        let rollout_error = proto
            .rollout
            .as_ref()
            .and_then(|r| convert::rollout(r).err());
        let active = Arc::new(ActivePolicy {
            cohort: policy.cohort().map(Arc::new),
            policy,
            classifiers,
            proto,
            rollout_error,
        });
        self.policy.send_replace(Some(active.clone()));
        active
    }
}

/// Keeps the target in step with discovery: every new policy or endpoint set is applied, until
/// discovery ends. A policy whose rollout was dropped is counted once.
pub async fn sync(
    target: Target,
    feed: Feed,
    mut d: discovery::Discovery,
    rollout: crate::metrics::RolloutMetrics,
) {
    let mut last: Option<Arc<ActivePolicy>> = None;
    loop {
        let proto = d.inference.borrow_and_update().clone();
        let endpoints = d.endpoints.borrow_and_update().clone();
        if let Some(proto) = proto {
            let active = feed.apply(proto);
            if let Some(e) = active.rollout_error
                && !last.as_ref().is_some_and(|l| Arc::ptr_eq(l, &active))
            {
                rollout
                    .rejections
                    .get_or_create(&crate::metrics::RejectionLabels {
                        reason: e.reason().to_string(),
                    })
                    .inc();
            }
            last = Some(active.clone());
            target
                .endpoints
                .sync(&active.policy, &endpoints, &target.router);
        }
        tokio::select! {
            r = d.inference.changed() => if r.is_err() { return },
            r = d.endpoints.changed() => if r.is_err() { return },
        }
    }
}

/// Mirrors discovery's connection state into the target (for `/debug/discovery`).
pub async fn follow_connected(target: Target, mut connected: watch::Receiver<bool>) {
    loop {
        let up = *connected.borrow_and_update();
        target.connected.store(up, Ordering::Relaxed);
        if connected.changed().await.is_err() {
            return;
        }
    }
}

/// Mirrors discovery's refusals into the target (for `/debug/targets`) and counts each new one.
pub async fn follow_refusals(
    target: Target,
    mut refusals: watch::Receiver<discovery::Refusals>,
    metrics: DiscoveryMetrics,
) {
    loop {
        let now = refusals.borrow_and_update().clone();
        {
            let mut seen = target.refusals.lock().unwrap_or_else(|e| e.into_inner());
            for (reason, total) in &now.total {
                let before = seen.total.get(reason).copied().unwrap_or(0);
                if *total > before {
                    metrics
                        .policy_rejections
                        .get_or_create(&crate::metrics::RejectionLabels {
                            reason: (*reason).to_string(),
                        })
                        .inc_by(total - before);
                }
            }
            *seen = now;
        }
        if refusals.changed().await.is_err() {
            return;
        }
    }
}
