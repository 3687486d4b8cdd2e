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
use kinference_policy_k8s_index::{Resource, ResourceKey, ResourceKind, SharedIndex};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
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
    ) -> Self {
        Self {
            client,
            index,
            inputs,
            clock,
            written: HashMap::new(),
            retry: Duration::from_secs(1),
        }
    }

    /// Writes status whenever inputs change while `leader` is true, until dropped.
    pub async fn run(mut self, mut leader: watch::Receiver<bool>) {
        loop {
            let leads = *leader.borrow_and_update();
            let mut failed = false;
            if leads {
                failed = !self.reconcile(&leader).await;
            } else {
                // Another replica may write meanwhile: trust nothing remembered.
                self.written.clear();
            }
            tokio::select! {
                _ = self.inputs.changed.notified() => {}
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
        let desired = desired_statuses(&objects, &index_errors, self.clock.now());
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
