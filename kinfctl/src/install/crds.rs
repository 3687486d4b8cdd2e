//! The CustomResourceDefinitions, from the same Rust types that `kinference-crdgen` writes into the
//! `kinference-crds` chart: Kinference's own always, the upstream InferencePool on request.

use kinference_api::{InferenceClassifier, InferencePolicy, InferencePool};
use kube::CustomResourceExt;

use super::{Error, to_yaml, values::Crds};

pub fn manifests(values: &Crds) -> Result<Vec<String>, Error> {
    let mut crds = vec![InferencePolicy::crd(), InferenceClassifier::crd()];
    if values.upstream.inference_pool {
        crds.push(InferencePool::crd());
    }
    crds.iter()
        .map(|crd| {
            let name = crd.metadata.name.as_deref().unwrap_or("CRD");
            to_yaml(name, crd)
        })
        .collect()
}
