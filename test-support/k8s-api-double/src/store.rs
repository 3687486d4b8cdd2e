//! The objects the double holds, their resourceVersions and event history, and the watchers
//! that event history is sent to. Kept apart from HTTP so the bookkeeping reads on its own.

use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use tokio::sync::mpsc;

/// A resource collection: (`api/v1` or `apis/GROUP/VERSION`, plural).
pub(crate) type Collection = (String, String);
/// (namespace, name); the namespace is empty for cluster-scoped objects.
pub(crate) type NsName = (String, String);

/// Collections whose objects have no namespace.
const CLUSTER_SCOPED: &[&str] = &[
    "namespaces",
    "nodes",
    "persistentvolumes",
    "customresourcedefinitions",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "clusterroles",
    "clusterrolebindings",
    "storageclasses",
    "priorityclasses",
    "apiservices",
    "gatewayclasses",
];

pub(crate) fn is_cluster_scoped(plural: &str) -> bool {
    CLUSTER_SCOPED.contains(&plural)
}

/// The plural resource name of a kind, as the API server names its collection.
pub fn plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    if lower == "endpoints" {
        return lower;
    }
    if lower.ends_with("ss") {
        return format!("{lower}es");
    }
    match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{lower}s"),
    }
}

/// The collection of an object, from its apiVersion and kind.
///
/// # Panics
/// When the object has no apiVersion or kind: a test fixture is wrong.
pub fn collection_of(obj: &Value) -> (String, String) {
    let api_version = obj["apiVersion"].as_str().expect("apiVersion");
    let kind = obj["kind"].as_str().expect("kind");
    let prefix = if api_version.contains('/') {
        format!("apis/{api_version}")
    } else {
        format!("api/{api_version}")
    };
    (prefix, plural(kind))
}

pub(crate) fn id_of(collection: &Collection, obj: &Value) -> NsName {
    let ns = if is_cluster_scoped(&collection.1) {
        String::new()
    } else {
        obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string()
    };
    (
        ns,
        obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let Value::Object(t) = target else { return };
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        p => *target = p.clone(),
    }
}

pub(crate) fn event_line(type_: &str, obj: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": type_, "object": obj})).expect("json");
    line.push(b'\n');
    Bytes::from(line)
}

/// A `metav1.Status` failure body.
pub(crate) fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

#[derive(Debug)]
pub(crate) struct Watcher {
    pub collection: Collection,
    pub namespace: Option<String>,
    pub tx: mpsc::UnboundedSender<Bytes>,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub rv: u64,
    pub objects: BTreeMap<Collection, BTreeMap<NsName, Value>>,
    /// Every event, by collection: (resourceVersion, type, object).
    pub history: BTreeMap<Collection, Vec<(u64, &'static str, Value)>>,
    /// A watch from a resourceVersion below this is answered `410 Gone`.
    pub compacted: HashMap<Collection, u64>,
    pub watchers: Vec<Watcher>,
    pub requests: Vec<crate::Recorded>,
    /// Paths (exact, without query) answered with this status code instead.
    pub failures: BTreeMap<String, u16>,
    /// Generated names handed out so far.
    pub generated: u64,
    /// The tokens TokenReviews authenticate, and whose they are.
    pub tokens: HashMap<String, crate::ServiceAccountToken>,
}

impl State {
    pub fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Stores an object (bumping its resourceVersion) and tells watchers.
    pub fn store(&mut self, mut obj: Value) -> Value {
        let collection = collection_of(&obj);
        if let (true, Some(prefix)) = (
            obj["metadata"]["name"].is_null(),
            obj["metadata"]["generateName"].as_str(),
        ) {
            let name = format!("{prefix}{:05x}", self.generated + 1);
            self.generated += 1;
            obj["metadata"]["name"] = json!(name);
        }
        let id = id_of(&collection, &obj);
        let rv = self.next_rv();
        let previous = self
            .objects
            .get(&collection)
            .and_then(|o| o.get(&id))
            .cloned();
        let meta = &mut obj["metadata"];
        if !is_cluster_scoped(&collection.1) {
            meta["namespace"] = json!(id.0);
        }
        meta["resourceVersion"] = json!(rv.to_string());
        let generation = match &previous {
            Some(p) => {
                let g = p["metadata"]["generation"].as_i64().unwrap_or(1);
                if p["spec"] == obj["spec"] { g } else { g + 1 }
            }
            None => 1,
        };
        obj["metadata"]["generation"] = json!(generation);
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(format!("uid-{}-{}", id.1, rv));
        }
        if obj["metadata"]["creationTimestamp"].is_null() {
            obj["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        let type_ = if previous.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.objects
            .entry(collection.clone())
            .or_default()
            .insert(id, obj.clone());
        self.emit(&collection, rv, type_, &obj);
        obj
    }

    pub fn emit(&mut self, collection: &Collection, rv: u64, type_: &'static str, obj: &Value) {
        self.history
            .entry(collection.clone())
            .or_default()
            .push((rv, type_, obj.clone()));
        let ns = obj["metadata"]["namespace"].as_str().map(str::to_string);
        let line = event_line(type_, obj);
        self.watchers.retain(|w| {
            if w.collection != *collection || (w.namespace.is_some() && w.namespace != ns) {
                return !w.tx.is_closed();
            }
            w.tx.send(line.clone()).is_ok()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_follow_the_api_servers_names() {
        assert_eq!(plural("InferencePolicy"), "inferencepolicies");
        assert_eq!(plural("Endpoints"), "endpoints");
        assert_eq!(plural("EndpointSlice"), "endpointslices");
        assert_eq!(plural("IngressClass"), "ingressclasses");
        assert_eq!(
            plural("MutatingWebhookConfiguration"),
            "mutatingwebhookconfigurations"
        );
    }

    #[test]
    fn cluster_scoped_objects_have_no_namespace() {
        let mut s = State::default();
        let crd = s.store(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "things.example.io"},
        }));
        assert!(crd["metadata"].get("namespace").is_none());
        let pod = s.store(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "web-"}}),
        );
        assert_eq!(pod["metadata"]["namespace"], "default");
        assert_eq!(pod["metadata"]["name"], "web-00001");
        assert_eq!(pod["metadata"]["resourceVersion"], "2");
    }
}
