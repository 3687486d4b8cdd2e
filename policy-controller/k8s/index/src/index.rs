//! The index: the resources as last applied, and a publisher per watched target.
//!
//! Each change recomputes only the targets it can affect (a route's parents, a
//! namespace's pools or policies) and publishes a new value only when it differs, so a
//! watching proxy hears about real changes and nothing else. Reverse maps keep that
//! true for InferencePools and InferenceClassifiers, which many routes and policies
//! name: a pool's routes and the policies whose models use it, and the policy each
//! watched parent selected. A parent whose policy's newest version, or a resource it
//! depends on, is rejected is served its last good policy (`crate::last_good`).

pub use crate::inference::PolicyValidation;
use crate::{
    endpoints,
    inference::{self, Selected},
    last_good::LastGood,
    outbound,
    resource::{Resource, ResourceKey, ResourceKind},
    store::{NsName, PolicyTarget, Store, policy_target},
};
use gateway_api::apis::standard::httproutes::HttpRoute as HTTPRoute;
use kinference_api::InferencePolicy;
use kinference_policy_core::{
    DiscoverEndpoints, DiscoverInferencePolicy, DiscoverOutboundPolicy, InferencePolicyState,
    OutboundPolicy, ParentTarget, PoolEndpoints, PoolRef,
    inference::Rejection,
    rollout::{
        judge::{Declared, RolloutIndex},
        window::RolloutKey,
    },
};
use parking_lot::RwLock;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    sync::Arc,
};
use tokio::sync::watch;

/// Counts for the controller's metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexSizes {
    pub resources: BTreeMap<ResourceKind, usize>,
    pub outbound_targets: usize,
    pub inference_targets: usize,
    pub pool_targets: usize,
    /// Service ports watched through `Destination.Get`.
    pub service_targets: usize,
    pub invalid_policies: usize,
    /// Watched parents served a last good policy (its newest version, or a resource it
    /// depends on, is rejected).
    pub last_good_parents: usize,
    /// Rejected resource versions since the index was made, by kind and reason.
    pub rejections: BTreeMap<(ResourceKind, String), u64>,
}

#[derive(Debug, Default)]
pub struct Index {
    store: Store,
    // Ordered so the publishers of one Service (or one namespace's pools) are a range,
    // and a change touches only the publishers it can affect.
    outbound: BTreeMap<ParentTarget, watch::Sender<OutboundPolicy>>,
    inference: BTreeMap<ParentTarget, watch::Sender<InferencePolicyState>>,
    endpoints: BTreeMap<PoolRef, watch::Sender<PoolEndpoints>>,
    /// Publishers of Service ports' endpoints (Destination paths that are Services).
    service_endpoints: BTreeMap<ParentTarget, watch::Sender<PoolEndpoints>>,
    /// The InferencePolicy each watched inference target selected, and the reverse.
    selected_policy: HashMap<ParentTarget, NsName>,
    targets_by_policy: HashMap<NsName, BTreeSet<ParentTarget>>,
    /// Validation errors of InferencePolicies (and the classifiers they use), for status.
    policy_errors: BTreeMap<NsName, String>,
    /// Each parent's last good policy, and the rejections that make parents use it.
    last_good: LastGood,
}

/// The index shared by sources and the gRPC server.
#[derive(Clone, Debug, Default)]
pub struct SharedIndex(Arc<RwLock<Index>>);

/// Which publishers a change can affect.
#[derive(Debug, Default)]
struct Affected {
    /// Services whose outbound and inference policies may change.
    parents: BTreeSet<NsName>,
    /// Services whose inference policy (only) may change.
    inference_parents: BTreeSet<NsName>,
    /// Namespaces whose policies' validity may change (a pool or classifier appeared or
    /// went): watched parents that selected one of their policies are recomputed...
    policy_namespaces: BTreeSet<String>,
    /// ...if the policy names this pool, is invalid, or `policy_namespaces_all` is set.
    pools_changed: BTreeSet<NsName>,
    policy_namespaces_all: bool,
    pool_namespaces: BTreeSet<String>,
    /// Namespaces whose Service ports' endpoints may change.
    service_namespaces: BTreeSet<String>,
    /// Inference targets to recompute (a rejection of what they select changed).
    targets: BTreeSet<ParentTarget>,
}

/// The InferencePools a route's backendRefs name.
fn route_pools(route: &HTTPRoute) -> BTreeSet<NsName> {
    let ns = route.metadata.namespace.as_deref().unwrap_or_default();
    route
        .spec
        .rules
        .iter()
        .flatten()
        .flat_map(|r| r.backend_refs.iter().flatten())
        .filter(|b| {
            b.group.as_deref() == Some(kinference_api::pool::GROUP)
                && b.kind.as_deref() == Some(kinference_api::pool::KIND)
        })
        .map(|b| {
            (
                b.namespace.as_deref().unwrap_or(ns).to_string(),
                b.name.clone(),
            )
        })
        .collect()
}

/// The InferencePools a policy's models name (always in the policy's namespace).
fn policy_pools(ns: &str, policy: &InferencePolicy) -> BTreeSet<NsName> {
    policy
        .spec
        .models
        .iter()
        .map(|m| (ns.to_string(), m.pool_ref.name.clone()))
        .collect()
}

fn insert_rev(map: &mut HashMap<NsName, BTreeSet<NsName>>, key: NsName, id: &NsName) {
    map.entry(key).or_default().insert(id.clone());
}

fn remove_rev(map: &mut HashMap<NsName, BTreeSet<NsName>>, key: &NsName, id: &NsName) {
    if let Some(set) = map.get_mut(key) {
        set.remove(id);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

impl Store {
    fn index_policy(&mut self, id: &NsName, policy: &InferencePolicy, affected: &mut Affected) {
        let target = policy_target(&id.0, policy);
        self.affect_policy_target(&target, affected);
        self.policies_by_target
            .entry(target)
            .or_default()
            .insert(id.clone());
        for pool in policy_pools(&id.0, policy) {
            insert_rev(&mut self.policies_by_pool, pool, id);
        }
    }

    fn unindex_policy(&mut self, id: &NsName, policy: &InferencePolicy, affected: &mut Affected) {
        let target = policy_target(&id.0, policy);
        self.affect_policy_target(&target, affected);
        if let Some(set) = self.policies_by_target.get_mut(&target) {
            set.remove(id);
            if set.is_empty() {
                self.policies_by_target.remove(&target);
            }
        }
        for pool in policy_pools(&id.0, policy) {
            remove_rev(&mut self.policies_by_pool, &pool, id);
        }
    }

    fn index_route(&mut self, id: &NsName, route: &HTTPRoute) {
        for pool in route_pools(route) {
            insert_rev(&mut self.routes_by_pool, pool, id);
        }
    }

    fn unindex_route(&mut self, id: &NsName, route: &HTTPRoute) {
        for pool in route_pools(route) {
            remove_rev(&mut self.routes_by_pool, &pool, id);
        }
    }

    /// Marks what a pool's appearing or going can change: the backends of the routes
    /// that name it (and the pool-targeted policies they reach), and the validity of
    /// the policies in its namespace.
    fn affect_pool_existence(&self, id: &NsName, affected: &mut Affected) {
        for route in self.routes_by_pool.get(id).into_iter().flatten() {
            if let Some(r) = self.routes.get(route) {
                affected.parents.extend(outbound::route_parents(r));
            }
        }
        affected.policy_namespaces.insert(id.0.clone());
        affected.pools_changed.insert(id.clone());
    }

    /// Marks the parents whose inference policy a policy with this target may decide.
    fn affect_policy_target(&self, target: &PolicyTarget, affected: &mut Affected) {
        let (ns, group, kind, name) = target;
        match (group.as_str(), kind.as_str()) {
            ("", "Service") => {
                affected
                    .inference_parents
                    .insert((ns.clone(), name.clone()));
            }
            ("gateway.networking.k8s.io", "HTTPRoute") => {
                if let Some(route) = self.routes.get(&(ns.clone(), name.clone())) {
                    affected
                        .inference_parents
                        .extend(outbound::route_parents(route));
                }
            }
            (kinference_api::pool::GROUP, kinference_api::pool::KIND) => {
                let pool = (ns.clone(), name.clone());
                for route in self.routes_by_pool.get(&pool).into_iter().flatten() {
                    if let Some(r) = self.routes.get(route) {
                        affected
                            .inference_parents
                            .extend(outbound::route_parents(r));
                    }
                }
            }
            // No parent selects a policy with another target kind.
            _ => {}
        }
    }
}

impl Index {
    pub fn shared() -> SharedIndex {
        SharedIndex::default()
    }

    /// Adds or replaces a resource and publishes what changed.
    pub fn apply(&mut self, resource: Resource) {
        let key = resource.key();
        let id = (key.namespace.clone(), key.name.clone());
        let mut affected = Affected::default();
        let s = &mut self.store;
        match resource {
            Resource::Service(r) => {
                affected.parents.insert(id.clone());
                affected.service_namespaces.insert(key.namespace);
                s.services.insert(id, *r);
            }
            Resource::HttpRoute(r) => {
                let new_parents = outbound::route_parents(&r);
                if let Some(old) = s.routes.remove(&id) {
                    affected.parents.extend(outbound::route_parents(&old));
                    s.unindex_route(&id, &old);
                }
                s.index_route(&id, &r);
                for p in affected.parents.iter() {
                    if let Some(set) = s.routes_by_parent.get_mut(p) {
                        set.remove(&id);
                    }
                }
                for p in &new_parents {
                    s.routes_by_parent
                        .entry(p.clone())
                        .or_default()
                        .insert(id.clone());
                }
                affected.parents.extend(new_parents);
                s.routes.insert(id, *r);
            }
            Resource::InferencePool(r) => {
                // Routes and policies use a pool's name, not its spec: only its
                // appearing changes them. Its endpoints follow its spec.
                match s.pools.get(&id) {
                    None => s.affect_pool_existence(&id, &mut affected),
                    // Its KV-event and engine annotations travel in the policies that name it.
                    Some(old) if inference::pool_settings(old) != inference::pool_settings(&r) => {
                        affected.policy_namespaces.insert(key.namespace.clone());
                        affected.pools_changed.insert(id.clone());
                    }
                    Some(_) => {}
                }
                affected.pool_namespaces.insert(key.namespace);
                s.retained_pools.remove(&id);
                s.pools.insert(id, *r);
            }
            Resource::EndpointSlice(r) => {
                affected.pool_namespaces.insert(key.namespace.clone());
                affected.service_namespaces.insert(key.namespace);
                s.slices.insert(id, *r);
            }
            Resource::Pod(r) => {
                affected.pool_namespaces.insert(key.namespace.clone());
                affected.service_namespaces.insert(key.namespace);
                s.pods.insert(id, *r);
            }
            Resource::InferencePolicy(r) => {
                if let Some(old) = s.policies.remove(&id) {
                    s.unindex_policy(&id, &old, &mut affected);
                }
                // A rollout with a new name (or none) starts fresh.
                let declared = r.spec.rollout.as_ref().map(|ro| &ro.name);
                if s.rolled_back.get(&id).is_some_and(|n| Some(n) != declared) {
                    s.rolled_back.remove(&id);
                }
                s.index_policy(&id, &r, &mut affected);
                s.policies.insert(id, *r);
            }
            Resource::InferenceClassifier(r) => {
                // Only policies of the classifier's namespace can name it.
                affected.policy_namespaces.insert(key.namespace);
                affected.policy_namespaces_all = true;
                s.classifiers.insert(id, *r);
            }
        }
        self.publish(affected);
    }

    /// Removes a resource (if present) and publishes what changed.
    pub fn delete(&mut self, key: &ResourceKey) {
        let id = (key.namespace.clone(), key.name.clone());
        let mut affected = Affected::default();
        let s = &mut self.store;
        let removed = match key.kind {
            ResourceKind::Service => {
                affected.parents.insert(id.clone());
                affected.service_namespaces.insert(key.namespace.clone());
                s.services.remove(&id).is_some()
            }
            ResourceKind::HttpRoute => match s.routes.remove(&id) {
                Some(old) => {
                    s.unindex_route(&id, &old);
                    for p in outbound::route_parents(&old) {
                        if let Some(set) = s.routes_by_parent.get_mut(&p) {
                            set.remove(&id);
                            if set.is_empty() {
                                s.routes_by_parent.remove(&p);
                            }
                        }
                        affected.parents.insert(p);
                    }
                    true
                }
                None => false,
            },
            ResourceKind::InferencePool => match s.pools.remove(&id) {
                Some(pool) => {
                    // A policy still names it: its last good version may need its endpoints.
                    if s.policies_by_pool.contains_key(&id) {
                        s.retained_pools.insert(id.clone(), pool);
                    }
                    s.affect_pool_existence(&id, &mut affected);
                    affected.pool_namespaces.insert(key.namespace.clone());
                    true
                }
                None => false,
            },
            ResourceKind::EndpointSlice => {
                affected.pool_namespaces.insert(key.namespace.clone());
                affected.service_namespaces.insert(key.namespace.clone());
                s.slices.remove(&id).is_some()
            }
            ResourceKind::Pod => {
                affected.pool_namespaces.insert(key.namespace.clone());
                affected.service_namespaces.insert(key.namespace.clone());
                s.pods.remove(&id).is_some()
            }
            ResourceKind::InferencePolicy => match s.policies.remove(&id) {
                Some(old) => {
                    s.unindex_policy(&id, &old, &mut affected);
                    s.rolled_back.remove(&id);
                    // Deleting a policy is deliberate: none of its versions is served again.
                    self.last_good.forget_policy(&id);
                    true
                }
                None => false,
            },
            ResourceKind::InferenceClassifier => {
                affected.policy_namespaces.insert(key.namespace.clone());
                affected.policy_namespaces_all = true;
                s.classifiers.remove(&id).is_some()
            }
        };
        if removed {
            self.publish(affected);
        }
    }

    /// The keys of every resource in the index.
    pub fn keys(&self) -> BTreeSet<ResourceKey> {
        let s = &self.store;
        let mut keys = BTreeSet::new();
        let mut add = |kind, ids: &mut dyn Iterator<Item = &NsName>| {
            for (namespace, name) in ids {
                keys.insert(ResourceKey {
                    kind,
                    namespace: namespace.clone(),
                    name: name.clone(),
                });
            }
        };
        add(ResourceKind::Service, &mut s.services.keys());
        add(ResourceKind::HttpRoute, &mut s.routes.keys());
        add(ResourceKind::InferencePool, &mut s.pools.keys());
        add(ResourceKind::EndpointSlice, &mut s.slices.keys());
        add(ResourceKind::Pod, &mut s.pods.keys());
        add(ResourceKind::InferencePolicy, &mut s.policies.keys());
        add(ResourceKind::InferenceClassifier, &mut s.classifiers.keys());
        keys
    }

    pub fn sizes(&self) -> IndexSizes {
        let s = &self.store;
        IndexSizes {
            resources: BTreeMap::from([
                (ResourceKind::Service, s.services.len()),
                (ResourceKind::HttpRoute, s.routes.len()),
                (ResourceKind::InferencePool, s.pools.len()),
                (ResourceKind::EndpointSlice, s.slices.len()),
                (ResourceKind::Pod, s.pods.len()),
                (ResourceKind::InferencePolicy, s.policies.len()),
                (ResourceKind::InferenceClassifier, s.classifiers.len()),
            ]),
            outbound_targets: self.outbound.len(),
            inference_targets: self.inference.len(),
            pool_targets: self.endpoints.len(),
            service_targets: self.service_endpoints.len(),
            invalid_policies: self.policy_errors.len(),
            last_good_parents: self.last_good.holding(),
            rejections: self.last_good.totals().clone(),
        }
    }

    /// Replaces what the source could not read: each resource whose newest version it rejected
    /// (a document that does not parse), with why. The source keeps the resource's last good
    /// version applied; the parents whose policy depends on it are told they are served a last
    /// good version. The manifest source calls this after every reload.
    pub fn set_source_rejections(&mut self, rejections: BTreeMap<ResourceKey, Rejection>) {
        let changed = self.last_good.set_source(rejections);
        if changed.is_empty() {
            return;
        }
        let mut affected = Affected::default();
        for key in changed {
            let id = (key.namespace.clone(), key.name.clone());
            match key.kind {
                ResourceKind::InferencePolicy => {
                    let parents = self.targets_by_policy.get(&id).into_iter().flatten();
                    affected.targets.extend(parents.cloned());
                }
                ResourceKind::InferenceClassifier => {
                    affected.policy_namespaces.insert(key.namespace);
                    affected.policy_namespaces_all = true;
                }
                ResourceKind::InferencePool => {
                    affected.policy_namespaces.insert(key.namespace);
                    affected.pools_changed.insert(id);
                }
                // Policies do not depend on these directly.
                _ => {}
            }
        }
        self.publish(affected);
    }

    /// Stops serving `key`'s rollout (the controller crossed one of its thresholds): the
    /// policy's parents are served it without the rollout from now on, and a rollout of that
    /// name is not served again while the policy declares it.
    pub fn roll_back(&mut self, key: &RolloutKey) {
        let id = key.policy_key();
        let declares = self
            .store
            .policies
            .get(&id)
            .and_then(|p| p.spec.rollout.as_ref())
            .is_some_and(|r| r.name == key.rollout);
        if !declares || self.store.rolled_back.get(&id) == Some(&key.rollout) {
            return;
        }
        self.store
            .rolled_back
            .insert(id.clone(), key.rollout.clone());
        let mut affected = Affected::default();
        let parents = self.targets_by_policy.get(&id).into_iter().flatten();
        affected.targets.extend(parents.cloned());
        self.publish(affected);
    }

    /// Every rollout a valid InferencePolicy declares, for the controller's rollout loop: its
    /// declared state, whether the controller rolled it back, what the policy's status records
    /// of it and its thresholds.
    pub fn declared_rollouts(&self) -> Vec<Declared> {
        let s = &self.store;
        s.policies
            .iter()
            .filter_map(|(id, p)| {
                let r = p.spec.rollout.as_ref()?;
                if !inference::validations_of(s, id, p).is_valid() {
                    return None;
                }
                let persisted = p
                    .status
                    .as_ref()
                    .and_then(|st| st.rollout.as_ref())
                    .filter(|st| st.name == r.name)
                    .map(crate::rollout::outcome_of);
                Some(Declared {
                    key: RolloutKey::new(&id.0, &id.1, &r.name),
                    state: crate::rollout::declared_state(r.state),
                    rolled_back: s.rolled_back(id, p),
                    persisted,
                    thresholds: crate::rollout::thresholds(r),
                })
            })
            .collect()
    }

    /// Every rejection standing now, by the rejected resource: validations of the policies
    /// watched parents select (and of their classifiers), and what the sources could not read.
    pub fn rejections(&self) -> BTreeMap<ResourceKey, Rejection> {
        self.last_good.rejections()
    }

    /// The InferencePolicies that some watched parent selects but is served a last good
    /// version of (or of whose dependencies), with the revision it is served, by
    /// `(namespace, name)`. The Kubernetes source writes these into status conditions.
    pub fn last_good_policies(&self) -> BTreeMap<NsName, String> {
        self.last_good.held_by_policy(&self.selected_policy)
    }

    /// The validation errors of every InferencePolicy that a watched target selected and
    /// that is not served, by `(namespace, name)`. The Kubernetes source writes these
    /// into status conditions.
    pub fn policy_errors(&self) -> &BTreeMap<NsName, String> {
        &self.policy_errors
    }

    pub fn outbound_policy(&self, target: &ParentTarget) -> OutboundPolicy {
        outbound::policy(&self.store, target)
    }

    /// What a proxy that starts watching `target` now would be served.
    pub fn inference_policy(&self, target: &ParentTarget) -> InferencePolicyState {
        let (computed, selected) = inference::policy(&self.store, target);
        self.last_good.state(target, computed, selected.as_ref())
    }

    pub fn pool_endpoints(&self, pool: &PoolRef) -> PoolEndpoints {
        endpoints::pool_endpoints(&self.store, pool)
    }

    pub fn service_endpoints(&self, service: &ParentTarget) -> PoolEndpoints {
        endpoints::service_endpoints(&self.store, service)
    }

    /// Every InferencePolicy's validation against the resources in the index, whether
    /// or not a watched parent selects it, by `(namespace, name)`. The status writer
    /// reports these. Computed on call: the index keeps only the errors of policies
    /// it serves, so that a pool or classifier change does not revalidate every policy.
    pub fn policy_validations(&self) -> BTreeMap<NsName, PolicyValidation> {
        inference::validations(&self.store)
    }

    /// Recomputes the inference targets that selected a policy of a changed namespace
    /// (see [`Affected::policy_namespaces`]).
    fn policy_namespace_targets(&self, affected: &Affected) -> BTreeSet<ParentTarget> {
        let mut targets = BTreeSet::new();
        for (id, selected) in &self.targets_by_policy {
            if !affected.policy_namespaces.contains(&id.0) {
                continue;
            }
            let names_changed_pool = || {
                affected.pools_changed.iter().any(|pool| {
                    self.store
                        .policies_by_pool
                        .get(pool)
                        .is_some_and(|p| p.contains(id))
                })
            };
            if affected.policy_namespaces_all
                || self.policy_errors.contains_key(id)
                || names_changed_pool()
            {
                targets.extend(selected.iter().cloned());
            }
        }
        targets
    }

    fn publish(&mut self, affected: Affected) {
        let store = &self.store;
        let service_range = |(ns, name): &NsName| {
            let lo = ParentTarget {
                namespace: ns.clone(),
                name: name.clone(),
                port: 0,
            };
            let hi = ParentTarget {
                port: u16::MAX,
                ..lo.clone()
            };
            lo..=hi
        };

        let mut unwatched = Vec::new();
        let mut update_outbound = |target: &ParentTarget, tx: &watch::Sender<OutboundPolicy>| {
            if tx.receiver_count() == 0 {
                unwatched.push(target.clone());
                return;
            }
            let next = outbound::policy(store, target);
            tx.send_if_modified(|cur| replace_if_changed(cur, next));
        };
        for parent in &affected.parents {
            for (t, tx) in self.outbound.range(service_range(parent)) {
                update_outbound(t, tx);
            }
        }
        for t in unwatched.drain(..) {
            self.outbound.remove(&t);
        }

        let by_namespace = if affected.policy_namespaces.is_empty() {
            BTreeSet::new()
        } else {
            self.policy_namespace_targets(&affected)
        };
        let store = &self.store;
        let policy_errors = &mut self.policy_errors;
        let last_good = &mut self.last_good;
        let mut selections = Vec::new();
        let mut update_inference =
            |target: &ParentTarget, tx: &watch::Sender<InferencePolicyState>| {
                if tx.receiver_count() == 0 {
                    unwatched.push(target.clone());
                    return;
                }
                let (next, selected) = resolve(store, policy_errors, last_good, target);
                selections.push((target.clone(), selected.map(|s| s.id)));
                tx.send_if_modified(|cur| replace_if_changed(cur, next));
            };
        let mut done = BTreeSet::new();
        for parent in affected.parents.union(&affected.inference_parents) {
            for (t, tx) in self.inference.range(service_range(parent)) {
                done.insert(t);
                update_inference(t, tx);
            }
        }
        for t in by_namespace.iter().chain(&affected.targets) {
            if done.insert(t)
                && let Some(tx) = self.inference.get(t)
            {
                update_inference(t, tx);
            }
        }
        for (t, policy) in selections {
            select(
                &mut self.selected_policy,
                &mut self.targets_by_policy,
                t,
                policy,
            );
        }
        for t in unwatched.drain(..) {
            self.inference.remove(&t);
            self.last_good.unwatched(&t);
            select(
                &mut self.selected_policy,
                &mut self.targets_by_policy,
                t,
                None,
            );
        }
        // Forget errors of policies that no longer exist.
        self.policy_errors
            .retain(|id, _| self.store.policies.contains_key(id));
        self.last_good.retain_existing(&self.store);
        // Deleted pools are kept only while a last good policy uses them.
        let mut pool_namespaces = affected.pool_namespaces;
        let in_use = self.last_good.pools_in_use();
        let s = &mut self.store;
        s.retained_pools.retain(|id, _| {
            let keep = in_use.contains(id);
            if !keep {
                pool_namespaces.insert(id.0.clone());
            }
            keep
        });
        let store = &self.store;

        let mut unwatched_pools = Vec::new();
        for ns in &pool_namespaces {
            let from = PoolRef::new(ns, "");
            for (pool, tx) in self.endpoints.range(from..) {
                if pool.namespace != *ns {
                    break;
                }
                if tx.receiver_count() == 0 {
                    unwatched_pools.push(pool.clone());
                    continue;
                }
                let next = endpoints::pool_endpoints(store, pool);
                tx.send_if_modified(|cur| replace_if_changed(cur, next));
            }
        }
        for p in unwatched_pools {
            self.endpoints.remove(&p);
        }

        let mut unwatched_services = Vec::new();
        for ns in &affected.service_namespaces {
            let from = ParentTarget {
                namespace: ns.clone(),
                name: String::new(),
                port: 0,
            };
            for (svc, tx) in self.service_endpoints.range(from..) {
                if svc.namespace != *ns {
                    break;
                }
                if tx.receiver_count() == 0 {
                    unwatched_services.push(svc.clone());
                    continue;
                }
                let next = endpoints::service_endpoints(store, svc);
                tx.send_if_modified(|cur| replace_if_changed(cur, next));
            }
        }
        for s in unwatched_services {
            self.service_endpoints.remove(&s);
        }
    }
}

/// Records which policy `target` selected.
fn select(
    selected_policy: &mut HashMap<ParentTarget, NsName>,
    targets_by_policy: &mut HashMap<NsName, BTreeSet<ParentTarget>>,
    target: ParentTarget,
    policy: Option<NsName>,
) {
    if selected_policy.get(&target) == policy.as_ref() {
        return;
    }
    if let Some(old) = selected_policy.remove(&target)
        && let Some(set) = targets_by_policy.get_mut(&old)
    {
        set.remove(&target);
        if set.is_empty() {
            targets_by_policy.remove(&old);
        }
    }
    if let Some(policy) = policy {
        targets_by_policy
            .entry(policy.clone())
            .or_default()
            .insert(target.clone());
        selected_policy.insert(target, policy);
    }
}

/// What `target` is served now, with its last good policy considered, and the policy it
/// selects; records the selected policy's validation error for status.
fn resolve(
    store: &Store,
    errors: &mut BTreeMap<NsName, String>,
    last_good: &mut LastGood,
    target: &ParentTarget,
) -> (InferencePolicyState, Option<Selected>) {
    let (computed, selected) = inference::policy(store, target);
    if let Some(sel) = &selected {
        match &sel.rejection {
            Some(r) => {
                errors.insert(sel.id.clone(), r.message.clone());
            }
            None => {
                errors.remove(&sel.id);
            }
        }
    }
    let state = last_good.state(target, computed, selected.as_ref());
    last_good.record(target, &state, selected.as_ref());
    (state, selected)
}

fn replace_if_changed<T: PartialEq>(cur: &mut T, next: T) -> bool {
    if *cur == next {
        return false;
    }
    *cur = next;
    true
}

impl SharedIndex {
    pub fn read(&self) -> parking_lot::RwLockReadGuard<'_, Index> {
        self.0.read()
    }

    pub fn write(&self) -> parking_lot::RwLockWriteGuard<'_, Index> {
        self.0.write()
    }
}

impl DiscoverOutboundPolicy for SharedIndex {
    fn watch_outbound_policy(
        &self,
        target: &ParentTarget,
    ) -> Option<watch::Receiver<OutboundPolicy>> {
        if let Some(tx) = self.0.read().outbound.get(target) {
            return Some(tx.subscribe());
        }
        let mut index = self.0.write();
        let index = &mut *index;
        let store = &index.store;
        let tx = index
            .outbound
            .entry(target.clone())
            .or_insert_with(|| watch::Sender::new(outbound::policy(store, target)));
        Some(tx.subscribe())
    }

    fn lookup_ip(&self, ip: IpAddr, port: u16) -> Option<ParentTarget> {
        outbound::lookup_ip(&self.0.read().store, ip, port)
    }
}

impl DiscoverInferencePolicy for SharedIndex {
    fn watch_inference_policy(
        &self,
        target: &ParentTarget,
    ) -> Option<watch::Receiver<InferencePolicyState>> {
        if let Some(tx) = self.0.read().inference.get(target) {
            return Some(tx.subscribe());
        }
        let mut index = self.0.write();
        let index = &mut *index;
        if let Some(tx) = index.inference.get(target) {
            return Some(tx.subscribe());
        }
        let (state, selected) = resolve(
            &index.store,
            &mut index.policy_errors,
            &mut index.last_good,
            target,
        );
        let policy = selected.map(|s| s.id);
        let tx = watch::Sender::new(state);
        let rx = tx.subscribe();
        index.inference.insert(target.clone(), tx);
        select(
            &mut index.selected_policy,
            &mut index.targets_by_policy,
            target.clone(),
            policy,
        );
        Some(rx)
    }
}

impl RolloutIndex for SharedIndex {
    fn declared(&self) -> Vec<Declared> {
        self.0.read().declared_rollouts()
    }

    fn roll_back(&self, key: &RolloutKey) {
        self.0.write().roll_back(key);
    }
}

impl DiscoverEndpoints for SharedIndex {
    fn watch_endpoints(&self, pool: &PoolRef) -> Option<watch::Receiver<PoolEndpoints>> {
        if let Some(tx) = self.0.read().endpoints.get(pool) {
            return Some(tx.subscribe());
        }
        let mut index = self.0.write();
        let index = &mut *index;
        let store = &index.store;
        let tx = index
            .endpoints
            .entry(pool.clone())
            .or_insert_with(|| watch::Sender::new(endpoints::pool_endpoints(store, pool)));
        Some(tx.subscribe())
    }

    fn watch_service_endpoints(
        &self,
        service: &ParentTarget,
    ) -> Option<watch::Receiver<PoolEndpoints>> {
        if let Some(tx) = self.0.read().service_endpoints.get(service) {
            return Some(tx.subscribe());
        }
        let mut index = self.0.write();
        let index = &mut *index;
        let store = &index.store;
        let tx = index
            .service_endpoints
            .entry(service.clone())
            .or_insert_with(|| watch::Sender::new(endpoints::service_endpoints(store, service)));
        Some(tx.subscribe())
    }
}

#[cfg(test)]
mod tests;
