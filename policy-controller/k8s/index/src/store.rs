//! The resources as last applied, by kind, with the reverse maps that say which targets a change
//! can affect.
//!
//! A module of its own so that dependencies point one way: the translations (`outbound`,
//! `inference`, `endpoints`) read the store, and the index (`index`) owns one and calls them.

use crate::resource::{ResourceKey, ResourceKind};
use gateway_api::apis::standard::httproutes::HttpRoute as HTTPRoute;
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kinference_api::{InferenceClassifier, InferencePolicy, InferencePool};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// `(namespace, name)`.
pub(crate) type NsName = (String, String);

/// The resources, by kind.
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub services: BTreeMap<NsName, Service>,
    pub routes: BTreeMap<NsName, HTTPRoute>,
    pub pools: BTreeMap<NsName, InferencePool>,
    pub slices: BTreeMap<NsName, EndpointSlice>,
    pub pods: BTreeMap<NsName, Pod>,
    pub policies: BTreeMap<NsName, InferencePolicy>,
    pub classifiers: BTreeMap<NsName, InferenceClassifier>,
    /// The routes whose parentRefs name each Service.
    pub routes_by_parent: HashMap<NsName, BTreeSet<NsName>>,
    /// The InferencePolicies by what their targetRef names.
    pub policies_by_target: HashMap<PolicyTarget, BTreeSet<NsName>>,
    /// The routes whose backendRefs name each InferencePool.
    pub routes_by_pool: HashMap<NsName, BTreeSet<NsName>>,
    /// The InferencePolicies whose models' poolRefs name each InferencePool.
    pub policies_by_pool: HashMap<NsName, BTreeSet<NsName>>,
    /// InferencePools deleted while a policy named them, kept while a parent is served a last
    /// good policy that uses them, so that its models keep their endpoints (`crate::last_good`).
    /// Only endpoints read them: to validation and routes the pools are gone.
    pub retained_pools: BTreeMap<NsName, InferencePool>,
    /// The rollout each policy had rolled back by the controller in this process, by name (the
    /// policy's `status.rollout` says so across restarts, in Kubernetes).
    pub rolled_back: BTreeMap<NsName, String>,
}

impl Store {
    /// Whether the resource is in the store.
    pub fn contains(&self, key: &ResourceKey) -> bool {
        let id = (key.namespace.clone(), key.name.clone());
        match key.kind {
            ResourceKind::Service => self.services.contains_key(&id),
            ResourceKind::HttpRoute => self.routes.contains_key(&id),
            ResourceKind::InferencePool => self.pools.contains_key(&id),
            ResourceKind::EndpointSlice => self.slices.contains_key(&id),
            ResourceKind::Pod => self.pods.contains_key(&id),
            ResourceKind::InferencePolicy => self.policies.contains_key(&id),
            ResourceKind::InferenceClassifier => self.classifiers.contains_key(&id),
        }
    }

    /// Whether the controller rolled back `policy`'s declared rollout: in this process, or as its
    /// status records.
    pub fn rolled_back(&self, id: &NsName, policy: &InferencePolicy) -> bool {
        let Some(rollout) = &policy.spec.rollout else {
            return false;
        };
        self.rolled_back.get(id) == Some(&rollout.name)
            || policy
                .status
                .as_ref()
                .and_then(|s| s.rollout.as_ref())
                .is_some_and(|s| {
                    s.name == rollout.name
                        && s.phase == kinference_api::policy::RolloutPhase::RolledBack
                })
    }

    /// The pool whose endpoints `id` names: the pool, or the last version of a deleted one that a
    /// last good policy still uses.
    pub fn endpoints_pool(&self, id: &NsName) -> Option<&InferencePool> {
        self.pools.get(id).or_else(|| self.retained_pools.get(id))
    }
}

/// What an InferencePolicy's targetRef names: `(namespace, group, kind, name)`, with the
/// core group spelled `""`.
pub(crate) type PolicyTarget = (String, String, String, String);

pub(crate) fn policy_target(namespace: &str, policy: &InferencePolicy) -> PolicyTarget {
    let t = &policy.spec.target_ref;
    let group = if t.group == "core" {
        ""
    } else {
        t.group.as_str()
    };
    (
        namespace.to_string(),
        group.to_string(),
        t.kind.clone(),
        t.name.clone(),
    )
}
