//! The entry point the `manifests` fuzz target (`fuzz/`) and this crate's seed-replay test
//! share, so that the short run in the normal test suite exercises exactly what the fuzzer does.
//!
//! Manifests are what users write: the controller's manifest mode reads YAML files from a
//! directory, and the watchers hand the index whatever the API server stored. Any text must read
//! as resources or errors, and any set of resources must index and validate, never panic. Checked
//! beyond that:
//! - a document that reads as a resource is named by [`ResourceKey::of_yaml`] as the resource
//!   names itself (the manifest reader names the resources of unreadable documents that way, so
//!   it must agree);
//! - a policy that passes validation translates (a translation error means validation missed
//!   something);
//! - deleting every resource again leaves the index empty.

use crate::{Index, Resource, ResourceKey};
use kinference_policy_core::ParentTarget;
use serde::Deserialize;

const NAMESPACE: &str = "fuzz";

/// Reads `data` (lossily as UTF-8) as a multi-document manifest file, as the controller's
/// manifest mode does, indexes what it reads and validates it. Panics only when a property fails.
pub fn manifests(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut resources = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let Ok(value) = serde_yaml::Value::deserialize(doc) else {
            // The manifest reader rejects the whole file at the first YAML error.
            break;
        };
        let named = ResourceKey::of_yaml(&value, NAMESPACE);
        if let Ok(Some(res)) = Resource::from_yaml(value, NAMESPACE) {
            assert_eq!(named.as_ref(), Some(&res.key()), "a resource is misnamed");
            resources.push(res);
        }
        if resources.len() >= 64 {
            break;
        }
    }
    let mut index = Index::default();
    let mut keys = Vec::new();
    for res in resources {
        keys.push(res.key());
        index.apply(res);
    }
    for (id, validation) in index.policy_validations() {
        if validation.policy.is_none() && validation.classifier.is_none() {
            assert!(
                validation.translation.is_none(),
                "policy {id:?} validates but does not translate: {:?}",
                validation.translation
            );
        }
    }
    for key in &keys {
        for port in [0, 80, 8000] {
            let target = ParentTarget {
                namespace: key.namespace.clone(),
                name: key.name.clone(),
                port,
            };
            let _ = index.inference_policy(&target);
            let _ = index.outbound_policy(&target);
        }
    }
    let _ = index.sizes();
    let _ = index.rejections();
    for key in &keys {
        index.delete(key);
    }
    assert!(index.keys().is_empty(), "resources left after deleting all");
}

/// The short fuzzing run shared by every fuzzed crate (see its docs).
#[cfg(test)]
#[path = "../../../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::replay;

    /// Every committed input of the `manifests` fuzz target, then 1000 mutants of them.
    #[test]
    fn manifests_seeds_and_mutants() {
        let ran = replay::replay(
            env!("CARGO_MANIFEST_DIR"),
            "manifests",
            1000,
            super::manifests,
        );
        assert!(ran > 1000);
    }
}
