//! Status conditions: the controller tells the people who wrote a resource what it made
//! of it.
//!
//! An InferencePolicy gets `Accepted` and `ResolvedRefs` with the validation message the
//! admission webhook would give; an InferencePool gets a `status.parents` entry per
//! Service whose routes send to it, naming Kinference's controller; an HTTPRoute whose
//! backendRefs name InferencePools gets `Accepted` and `ResolvedRefs` per Service
//! parent. Entries written by other controllers are kept.
//!
//! Only the leader writes ([`crate::lease`]). Desired status is computed from the objects
//! as watched and written only when it differs from what the object carries, so the
//! writer's own patches (which come back as watch events) do not loop, and a new leader
//! rewrites nothing that is already right.

mod compute;

use crate::lease::Clock;
use kinference_api::{InferencePolicy, InferencePool};
use kinference_policy_core::{
    guard::{GuardCondition, GuardReports},
    rollout::judge::{Outcome, Phase, Rollouts},
};
use kinference_policy_k8s_index::{Resource, ResourceKey, ResourceKind, SharedIndex};
use kube::{
    Api, Client, Resource as _,
    api::{Patch, PatchParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use parking_lot::Mutex;
use serde_json::Value;
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};
use tokio::sync::{Notify, watch};

pub use self::compute::{Desired, desired_statuses};

/// The `controllerName` Kinference writes in `status.parents`.
pub const CONTROLLER_NAME: &str = "policy.kinference.io/policy-controller";

/// The objects that status depends on, as last watched, and a signal when they change.
#[derive(Debug, Default)]
pub struct Inputs {
    objects: Mutex<BTreeMap<ResourceKey, Resource>>,
    changed: Notify,
}

fn wanted(kind: ResourceKind) -> bool {
    !matches!(kind, ResourceKind::Pod | ResourceKind::EndpointSlice)
}

impl Inputs {
    pub(crate) fn apply(&self, res: Resource) {
        if wanted(res.kind()) {
            self.objects.lock().insert(res.key(), res);
            self.changed.notify_one();
        }
    }

    pub(crate) fn delete(&self, key: &ResourceKey) {
        if wanted(key.kind) && self.objects.lock().remove(key).is_some() {
            self.changed.notify_one();
        }
    }

    pub(crate) fn replace(&self, gone: &[ResourceKey], listed: Vec<Resource>) {
        let mut objects = self.objects.lock();
        for key in gone {
            objects.remove(key);
        }
        for res in listed.into_iter().filter(|r| wanted(r.kind())) {
            objects.insert(res.key(), res);
        }
        drop(objects);
        self.changed.notify_one();
    }

    /// A copy of the objects, for computing status without holding the lock.
    pub fn snapshot(&self) -> BTreeMap<ResourceKey, Resource> {
        self.objects.lock().clone()
    }
}

/// Writes status while this replica leads.
pub struct StatusWriter {
    client: Client,
    index: SharedIndex,
    inputs: Arc<Inputs>,
    clock: Arc<dyn Clock>,
    /// What was last written per object, with the resourceVersion it was written over:
    /// until a newer version of the object is watched, the same status is not rewritten.
    written: HashMap<ResourceKey, (Option<String>, Value)>,
    /// How long to wait before retrying a failed write.
    pub retry: Duration,
    /// The proxies' quality-guard reports, merged into each policy's `QualityGuard` condition.
    guards: Arc<GuardReports>,
    /// Each policy's `QualityGuard` condition status as last written, to publish an Event when
    /// it changes.
    guard_states: HashMap<ResourceKey, &'static str>,
    /// The rollout loop's outcomes, written as each policy's `status.rollout` and `Rollout`
    /// condition.
    rollouts: Arc<Rollouts>,
    /// Rollbacks this replica wrote while another led, by policy and rollout name.
    rollbacks_written: std::collections::HashSet<(ResourceKey, String)>,
    events: Recorder,
}

impl std::fmt::Debug for StatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter")
            .field("written", &self.written.len())
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl StatusWriter {
    pub fn new(
        client: Client,
        index: SharedIndex,
        inputs: Arc<Inputs>,
        clock: Arc<dyn Clock>,
        guards: Arc<GuardReports>,
    ) -> Self {
        Self::with_rollouts(client, index, inputs, clock, guards, Arc::default())
    }

    /// As [`StatusWriter::new`], writing the rollout loop's outcomes too.
    pub fn with_rollouts(
        client: Client,
        index: SharedIndex,
        inputs: Arc<Inputs>,
        clock: Arc<dyn Clock>,
        guards: Arc<GuardReports>,
        rollouts: Arc<Rollouts>,
    ) -> Self {
        let events = Recorder::new(
            client.clone(),
            Reporter {
                controller: CONTROLLER_NAME.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Self {
            client,
            index,
            inputs,
            clock,
            written: HashMap::new(),
            retry: Duration::from_secs(1),
            guards,
            guard_states: HashMap::new(),
            rollouts,
            rollbacks_written: Default::default(),
            events,
        }
    }

    /// Writes status whenever inputs change while `leader` is true, until dropped.
    pub async fn run(mut self, mut leader: watch::Receiver<bool>) {
        loop {
            let leads = *leader.borrow_and_update();
            let failed = if leads {
                !self.reconcile(&leader).await
            } else {
                // Another replica may write meanwhile: trust nothing remembered.
                self.written.clear();
                // This replica's own rollbacks must hold whoever leads.
                !self.write_rollbacks().await
            };
            tokio::select! {
                _ = self.inputs.changed.notified() => {}
                _ = self.guards.changed.notified() => {}
                _ = self.rollouts.changed.notified() => {}
                res = leader.changed() => if res.is_err() { return },
                _ = tokio::time::sleep(self.retry), if failed => {}
            }
        }
    }

    /// Writes every status that differs. Returns false when a write failed.
    async fn reconcile(&mut self, leader: &watch::Receiver<bool>) -> bool {
        let index_errors = self.index.read().policy_errors().clone();
        let objects = self.inputs.snapshot();
        self.written.retain(|k, _| objects.contains_key(k));
        let guards: BTreeMap<(String, String), GuardCondition> = objects
            .keys()
            .filter(|k| k.kind == ResourceKind::InferencePolicy)
            .filter_map(|k| {
                let id = (k.namespace.clone(), k.name.clone());
                Some((id.clone(), self.guards.condition(&id)?))
            })
            .collect();
        let rollouts = self.rollouts.published();
        let desired = desired_statuses(
            &objects,
            &index_errors,
            &guards,
            &rollouts,
            self.clock.now(),
        );
        let mut ok = true;
        for d in desired {
            if let Some((rv, status)) = self.written.get(&d.key)
                && *rv == d.resource_version
                && *status == d.comparable
            {
                continue;
            }
            if !*leader.borrow() {
                return true;
            }
            match self.patch(&d).await {
                Ok(()) => {
                    tracing::info!(resource = %d.key, "status written");
                    if d.key.kind == ResourceKind::InferencePolicy {
                        let id = (d.key.namespace.clone(), d.key.name.clone());
                        self.guard_event(&d.key, &objects, guards.get(&id)).await;
                        self.rollout_event(&d.key, &objects, &d.patch).await;
                    }
                    self.written
                        .insert(d.key.clone(), (d.resource_version.clone(), d.comparable));
                }
                Err(error) => {
                    ok = false;
                    tracing::warn!(resource = %d.key, %error, "writing status failed");
                }
            }
        }
        ok
    }

    /// Publishes an Event on the policy when its `QualityGuard` condition changes status: a
    /// Warning when a rule is suspended, Normal when the guards are back within tolerance.
    async fn guard_event(
        &mut self,
        key: &ResourceKey,
        objects: &BTreeMap<ResourceKey, Resource>,
        guard: Option<&GuardCondition>,
    ) {
        let Some(g) = guard else {
            self.guard_states.remove(key);
            return;
        };
        let before = self.guard_states.insert(key.clone(), g.status);
        if before == Some(g.status) || g.status == "Unknown" {
            return;
        }
        if before.is_none() && g.status == "True" {
            return;
        }
        let Some(Resource::InferencePolicy(p)) = objects.get(key) else {
            return;
        };
        let warning = g.status == "False";
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: if warning {
                "QualityGuardSuspended"
            } else {
                "QualityGuardWithinTolerance"
            }
            .into(),
            note: Some(g.message.chars().take(1000).collect()),
            action: "Route".into(),
            secondary: None,
        };
        let regarding = p.object_ref(&());
        if let Err(error) = self.events.publish(&ev, &regarding).await {
            tracing::warn!(resource = %key, %error, "publishing a quality-guard event failed");
        } else if warning {
            tracing::warn!(resource = %key, message = %g.message, "a quality guard suspended a rule");
        }
    }

    /// Publishes an Event on the policy when its `status.rollout` phase changes to RolledBack
    /// (a Warning naming the threshold, the estimate, the interval and the limit), Promoted or
    /// Aborted. The phase before is the object's, so a rewrite of the same phase, by this
    /// replica or a new leader, publishes nothing.
    async fn rollout_event(
        &self,
        key: &ResourceKey,
        objects: &BTreeMap<ResourceKey, Resource>,
        patch: &Value,
    ) {
        let Some(Resource::InferencePolicy(p)) = objects.get(key) else {
            return;
        };
        let Ok(Some(next)) = serde_json::from_value::<Option<kinference_api::policy::RolloutStatus>>(
            patch["status"]["rollout"].clone(),
        ) else {
            return;
        };
        let before = p.status.as_ref().and_then(|s| s.rollout.as_ref());
        if before.is_some_and(|b| b.name == next.name && b.phase == next.phase) {
            return;
        }
        self.publish_rollout_event(key, p, &next).await;
    }

    async fn publish_rollout_event(
        &self,
        key: &ResourceKey,
        p: &InferencePolicy,
        next: &kinference_api::policy::RolloutStatus,
    ) {
        use kinference_api::policy::RolloutPhase;
        let (type_, reason) = match next.phase {
            RolloutPhase::RolledBack => (EventType::Warning, "RolloutRolledBack"),
            RolloutPhase::Promoted => (EventType::Normal, "RolloutPromoted"),
            RolloutPhase::Aborted => (EventType::Normal, "RolloutAborted"),
            RolloutPhase::Running => return,
        };
        let note = format!(
            "rollout {}: {}",
            next.name,
            next.message.as_deref().unwrap_or(next.phase.as_str())
        );
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Rollout".into(),
            secondary: None,
        };
        if let Err(error) = self.events.publish(&ev, &p.object_ref(&())).await {
            tracing::warn!(resource = %key, %error, "publishing a rollout event failed");
        } else if next.phase == RolloutPhase::RolledBack {
            tracing::warn!(resource = %key, rollout = %next.name, message = ?next.message, "a rollout was rolled back");
        }
    }

    /// While another replica leads: writes `status.rollout` of each rollout this replica rolled
    /// back that the object does not record yet (only that field, so the leader's conditions
    /// stay; the leader reads the rollback back and adds the condition). Returns false when a
    /// write failed.
    async fn write_rollbacks(&mut self) -> bool {
        let objects = self.inputs.snapshot();
        let mut ok = true;
        let outcomes: Vec<((String, String), Outcome)> = self
            .rollouts
            .published()
            .into_iter()
            .filter(|(_, o)| o.phase == Phase::RolledBack)
            .collect();
        for ((ns, name), o) in outcomes {
            let key = ResourceKey {
                kind: ResourceKind::InferencePolicy,
                namespace: ns.clone(),
                name: name.clone(),
            };
            let Some(Resource::InferencePolicy(p)) = objects.get(&key) else {
                continue;
            };
            let recorded = p
                .status
                .as_ref()
                .and_then(|s| s.rollout.as_ref())
                .is_some_and(|s| {
                    s.name == o.name && s.phase == kinference_api::policy::RolloutPhase::RolledBack
                });
            let done = (key.clone(), o.name.clone());
            if recorded || self.rollbacks_written.contains(&done) {
                continue;
            }
            let status = kinference_policy_k8s_index::rollout::status_of(&o);
            let patch = serde_json::json!({ "status": { "rollout": status } });
            let res = Api::<InferencePolicy>::namespaced(self.client.clone(), &ns)
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            match res {
                Ok(_) => {
                    tracing::info!(resource = %key, rollout = %o.name, "rollback written while another replica leads");
                    self.publish_rollout_event(&key, p, &status).await;
                    self.rollbacks_written.insert(done);
                }
                Err(error) => {
                    ok = false;
                    tracing::warn!(resource = %key, %error, "writing a rollback failed");
                }
            }
        }
        ok
    }

    async fn patch(&self, d: &Desired) -> Result<(), kube::Error> {
        let ns = &d.key.namespace;
        let name = &d.key.name;
        let params = PatchParams::default();
        let patch = Patch::Merge(&d.patch);
        let client = self.client.clone();
        match d.key.kind {
            ResourceKind::InferencePolicy => {
                Api::<InferencePolicy>::namespaced(client, ns)
                    .patch_status(name, &params, &patch)
                    .await?;
            }
            ResourceKind::InferencePool => {
                Api::<InferencePool>::namespaced(client, ns)
                    .patch_status(name, &params, &patch)
                    .await?;
            }
            ResourceKind::HttpRoute => {
                Api::<gateway_api::apis::standard::httproutes::HttpRoute>::namespaced(client, ns)
                    .patch_status(name, &params, &patch)
                    .await?;
            }
            _ => {}
        }
        Ok(())
    }
}
