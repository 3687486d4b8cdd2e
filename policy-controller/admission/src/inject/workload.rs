//! The workload a pod belongs to, from what the API server sends at CREATE: its owner
//! references and labels. The proxy's tenant is `namespace/workload`, so that every replica
//! of a Deployment is one tenant whatever its ReplicaSet or pod name.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};

/// A pod's workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub namespace: String,
    /// `Deployment`, `ReplicaSet`, `Job`, `StatefulSet`, `DaemonSet`, another owner's kind,
    /// or `Pod` for a pod without an owner.
    pub kind: String,
    pub name: String,
    /// The object events about the injection are attached to: the pod's controlling owner
    /// (the pod itself does not exist yet when it is admitted), or the pod.
    pub regarding: ObjectReference,
}

impl Workload {
    /// `namespace/name`: what the proxy reports as the tenant.
    pub fn tenant(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The pod's name, or its `generateName` prefix followed by `*` when the API server has not
/// named it yet.
pub fn pod_name(pod: &Pod) -> String {
    match (&pod.metadata.name, &pod.metadata.generate_name) {
        (Some(name), _) if !name.is_empty() => name.clone(),
        (_, Some(prefix)) => format!("{prefix}*"),
        _ => "<unnamed>".to_string(),
    }
}

/// The workload of `pod` in `namespace`.
pub fn workload(pod: &Pod, namespace: &str) -> Workload {
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let owner = owners
        .iter()
        .find(|o| o.controller == Some(true))
        .or_else(|| owners.first());
    let Some(owner) = owner else {
        let name = match (&pod.metadata.name, &pod.metadata.generate_name) {
            (Some(name), _) if !name.is_empty() => name.clone(),
            (_, Some(prefix)) => prefix.trim_end_matches('-').to_string(),
            _ => String::new(),
        };
        return Workload {
            namespace: namespace.to_string(),
            kind: "Pod".into(),
            name: name.clone(),
            regarding: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                namespace: Some(namespace.to_string()),
                name: Some(name),
                uid: pod.metadata.uid.clone(),
                ..Default::default()
            },
        };
    };
    let regarding = ObjectReference {
        api_version: Some(owner.api_version.clone()),
        kind: Some(owner.kind.clone()),
        namespace: Some(namespace.to_string()),
        name: Some(owner.name.clone()),
        uid: Some(owner.uid.clone()),
        ..Default::default()
    };
    let (kind, name) = match owner.kind.as_str() {
        // A Deployment names its ReplicaSets `<deployment>-<pod-template-hash>` and labels
        // their pods with that hash.
        "ReplicaSet" => {
            let hash = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("pod-template-hash"));
            match hash.and_then(|h| owner.name.strip_suffix(&format!("-{h}"))) {
                Some(deployment) if !deployment.is_empty() => {
                    ("Deployment".to_string(), deployment.to_string())
                }
                _ => ("ReplicaSet".to_string(), owner.name.clone()),
            }
        }
        kind => (kind.to_string(), owner.name.clone()),
    };
    Workload {
        namespace: namespace.to_string(),
        kind,
        name,
        regarding,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn owner(kind: &str, name: &str) -> serde_json::Value {
        json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "u1",
                "controller": true, "blockOwnerDeletion": true}])
    }

    #[test]
    fn a_replicaset_pod_belongs_to_its_deployment() {
        let p = pod(json!({"metadata": {
            "generateName": "web-7d4b9c8f6d-",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d"},
            "ownerReferences": owner("ReplicaSet", "web-7d4b9c8f6d"),
        }}));
        let w = workload(&p, "apps");
        assert_eq!((w.kind.as_str(), w.name.as_str()), ("Deployment", "web"));
        assert_eq!(w.tenant(), "apps/web");
        assert_eq!(w.regarding.kind.as_deref(), Some("ReplicaSet"));
        assert_eq!(w.regarding.name.as_deref(), Some("web-7d4b9c8f6d"));
        assert_eq!(pod_name(&p), "web-7d4b9c8f6d-*");
    }

    #[test]
    fn a_bare_replicaset_keeps_its_name() {
        let p = pod(json!({"metadata": {
            "labels": {"app": "web"},
            "ownerReferences": owner("ReplicaSet", "web-abc"),
        }}));
        let w = workload(&p, "apps");
        assert_eq!(
            (w.kind.as_str(), w.name.as_str()),
            ("ReplicaSet", "web-abc")
        );
    }

    #[test]
    fn jobs_statefulsets_daemonsets_and_bare_pods() {
        for kind in ["Job", "StatefulSet", "DaemonSet"] {
            let p = pod(json!({"metadata": {"name": "x-0", "ownerReferences": owner(kind, "x")}}));
            let w = workload(&p, "ns");
            assert_eq!((w.kind.as_str(), w.name.as_str()), (kind, "x"));
        }
        let p = pod(json!({"metadata": {"name": "debug"}}));
        let w = workload(&p, "ns");
        assert_eq!((w.kind.as_str(), w.tenant().as_str()), ("Pod", "ns/debug"));
        assert_eq!(w.regarding.name.as_deref(), Some("debug"));
        let p = pod(json!({"metadata": {"generateName": "scratch-"}}));
        assert_eq!(workload(&p, "ns").name, "scratch");
    }
}
