//! Last good configuration: what a parent is served while the newest version of its policy, or
//! of a resource the policy depends on, is rejected.
//!
//! A parent that has been served a policy keeps it when the policy it selects becomes invalid
//! (its own problems, its classifier's, a pool or classifier it names gone), and when a source
//! could not read the newest version of the policy, its classifier or one of its pools
//! ([`crate::Index::set_source_rejections`]; the source then keeps the last version it read).
//! What the parent selects is honoured: deleting the InferencePolicy, or retargeting it, gives
//! the parent what it selects now, and deleting a policy forgets every last good version made
//! from it. A parent never served a valid version is reported invalid: there is nothing to fall
//! back to. docs/reliability.md ("Bad configuration") says which disappearances are faults.
//!
//! Each rejected version is counted once, by kind and reason; a validation rejection is logged
//! here at WARN (a source logs its own, with the file it read).

use crate::{
    inference::Selected,
    resource::{ResourceKey, ResourceKind},
    store::{NsName, Store},
};
use kinference_policy_core::{
    InferencePolicy, InferencePolicyState, ParentTarget, inference::Rejection,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Debug, Default)]
pub(crate) struct LastGood {
    /// The policy each parent was last served, kept while its newer versions are rejected. A
    /// parent no proxy watches any more keeps its entry, so that a proxy that reconnects during
    /// a rejection gets it too.
    served: HashMap<ParentTarget, Box<InferencePolicy>>,
    /// The watched parents now served a last good version.
    holding: BTreeSet<ParentTarget>,
    /// The validation rejections of policies watched parents select, as last counted and logged,
    /// by the rejected resource.
    validation: BTreeMap<ResourceKey, Rejection>,
    /// What the sources could not read, by the resource whose newest version it was.
    source: BTreeMap<ResourceKey, Rejection>,
    /// Rejections counted, by kind and reason.
    totals: BTreeMap<(ResourceKind, String), u64>,
}

impl LastGood {
    /// What `target` is served, given the state computed from the resources as they are and the
    /// policy it selects. Reads only: [`LastGood::record`] keeps the books.
    pub(crate) fn state(
        &self,
        target: &ParentTarget,
        computed: InferencePolicyState,
        selected: Option<&Selected>,
    ) -> InferencePolicyState {
        let source_rejection = selected
            .and_then(|s| s.depends_on.iter().find_map(|k| self.source.get(k)))
            .cloned();
        match computed {
            // The index holds the last version its source read of a resource whose newest one
            // it could not: what is served is that last good version.
            InferencePolicyState::Served(policy) => match source_rejection {
                Some(rejected) => InferencePolicyState::LastGood { policy, rejected },
                None => InferencePolicyState::Served(policy),
            },
            InferencePolicyState::Invalid {
                parent,
                source,
                message,
            } => {
                let rejected = selected
                    .and_then(|s| s.rejection.clone())
                    .or(source_rejection);
                match (self.served.get(target), rejected) {
                    (Some(last), Some(rejected)) => InferencePolicyState::LastGood {
                        policy: last.clone(),
                        rejected,
                    },
                    _ => InferencePolicyState::Invalid {
                        parent,
                        source,
                        message,
                    },
                }
            }
            other => other,
        }
    }

    /// Keeps the books on what `target` is now served: its last good policy, whether it holds
    /// one, and the rejection of what it selects (counted and logged when new).
    pub(crate) fn record(
        &mut self,
        target: &ParentTarget,
        state: &InferencePolicyState,
        selected: Option<&Selected>,
    ) {
        match state {
            InferencePolicyState::Served(p) => {
                self.served.insert(target.clone(), p.clone());
                self.holding.remove(target);
            }
            InferencePolicyState::LastGood { policy, .. } => {
                // A source rejection serves what the index holds: that is the last good one.
                self.served.insert(target.clone(), policy.clone());
                self.holding.insert(target.clone());
            }
            InferencePolicyState::Invalid { .. } => {
                self.holding.remove(target);
            }
            InferencePolicyState::NotFound { .. } => {
                self.served.remove(target);
                self.holding.remove(target);
            }
        }
        let Some(selected) = selected else { return };
        match &selected.rejection {
            Some(rejection) => self.note(target, state, rejection),
            // Valid: its and its classifier's earlier rejections are over.
            None => {
                for key in &selected.depends_on {
                    self.validation.remove(key);
                }
            }
        }
    }

    /// Counts and logs a validation rejection the first time it is seen.
    fn note(&mut self, target: &ParentTarget, state: &InferencePolicyState, rejection: &Rejection) {
        let Some(key) = key_of(rejection) else { return };
        if self.validation.get(&key) == Some(rejection) {
            return;
        }
        *self
            .totals
            .entry((key.kind, rejection.reason.clone()))
            .or_default() += 1;
        let kept = state.policy().map(|p| p.revision.as_str());
        let parent = format!("{}/{}:{}", target.namespace, target.name, target.port);
        match kept {
            Some(revision) => tracing::warn!(
                resource = %key,
                reason = %rejection.reason,
                error = %rejection.message,
                %parent,
                revision,
                "rejected a new version; serving the last valid policy"
            ),
            None => tracing::warn!(
                resource = %key,
                reason = %rejection.reason,
                error = %rejection.message,
                %parent,
                "rejected a policy that was never valid; nothing is served"
            ),
        }
        self.validation.insert(key, rejection.clone());
    }

    /// Replaces the sources' rejections; returns the resources whose rejection changed, whose
    /// parents must be recomputed. A new rejection is counted (its source has logged it).
    pub(crate) fn set_source(
        &mut self,
        rejections: BTreeMap<ResourceKey, Rejection>,
    ) -> Vec<ResourceKey> {
        let mut changed: Vec<ResourceKey> = self
            .source
            .keys()
            .filter(|k| !rejections.contains_key(*k))
            .cloned()
            .collect();
        for (key, rejection) in &rejections {
            if self.source.get(key) != Some(rejection) {
                *self
                    .totals
                    .entry((key.kind, rejection.reason.clone()))
                    .or_default() += 1;
                changed.push(key.clone());
            }
        }
        self.source = rejections;
        changed
    }

    /// Forgets the last good versions made from a deleted policy: it is never served again.
    pub(crate) fn forget_policy(&mut self, id: &NsName) {
        self.served
            .retain(|_, p| (p.source.namespace.as_str(), p.source.name.as_str()) != (&id.0, &id.1));
    }

    /// A parent no proxy watches: it is served nothing now (its last good version is kept).
    pub(crate) fn unwatched(&mut self, target: &ParentTarget) {
        self.holding.remove(target);
    }

    /// Forgets the validation rejections of resources no longer in the store.
    pub(crate) fn retain_existing(&mut self, store: &Store) {
        self.validation.retain(|k, _| store.contains(k));
    }

    /// The pools the policies served as last good versions use.
    pub(crate) fn pools_in_use(&self) -> BTreeSet<NsName> {
        self.holding
            .iter()
            .filter_map(|t| self.served.get(t))
            .flat_map(|p| p.models.iter())
            .map(|m| (m.pool.namespace.clone(), m.pool.name.clone()))
            .collect()
    }

    /// The watched parents served a last good version.
    pub(crate) fn holding(&self) -> usize {
        self.holding.len()
    }

    /// Rejections counted since the index was made, by kind and reason.
    pub(crate) fn totals(&self) -> &BTreeMap<(ResourceKind, String), u64> {
        &self.totals
    }

    /// The rejections now standing: validation and sources', by resource.
    pub(crate) fn rejections(&self) -> BTreeMap<ResourceKey, Rejection> {
        let mut all = self.validation.clone();
        all.extend(self.source.iter().map(|(k, r)| (k.clone(), r.clone())));
        all
    }

    /// The policies served to some watched parent as a last good version, by the policy the
    /// parent selects (the rejected one, or the one whose dependency was rejected), with the
    /// rejection and the revision still served.
    pub(crate) fn held_by_policy(
        &self,
        selected: &HashMap<ParentTarget, NsName>,
    ) -> BTreeMap<NsName, String> {
        let mut out = BTreeMap::new();
        for t in &self.holding {
            if let (Some(id), Some(p)) = (selected.get(t), self.served.get(t)) {
                out.entry(id.clone()).or_insert_with(|| p.revision.clone());
            }
        }
        out
    }
}

/// The key of the resource a rejection names.
fn key_of(r: &Rejection) -> Option<ResourceKey> {
    let kind = ResourceKind::ALL
        .into_iter()
        .find(|k| k.as_str() == r.kind)?;
    Some(ResourceKey {
        kind,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
    })
}
