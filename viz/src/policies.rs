//! The InferencePolicies and InferenceClassifiers in force, with their status conditions.
//!
//! In a cluster they are listed from the Kubernetes API, with the conditions the controller wrote.
//! Locally (no API server) they are read from the manifest directory the controller serves, and
//! their conditions are computed by the controller's own pure status function
//! (`kinference_policy_k8s_watch::status::desired_statuses`), so the page shows exactly what the
//! controller would write.
//!
//! The dashboard polls every two seconds and every poll lists again, so the cluster source never
//! waits long: a list that gets no answer within [`CLUSTER_TIMEOUT`] is reported as an error, and
//! the next poll is the retry.

use kinference_api::{InferenceClassifier, InferencePolicy};
use kinference_policy_k8s_index::{Index, Resource, ResourceKey};
use serde::Serialize;
use serde_json::Value;
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

/// How long one read of the cluster's policies may take before the page reports it.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the policies come from.
#[derive(Clone)]
pub enum Source {
    /// A directory of manifests, as `kinference-policy-controller --manifests` reads.
    Manifests(PathBuf),
    /// The cluster.
    Kubernetes(kube::Client),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Manifests(p) => write!(f, "Manifests({})", p.display()),
            Self::Kubernetes(_) => f.write_str("Kubernetes"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading manifests in {dir}: {source}")]
    Read {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {why}")]
    Manifest { file: String, why: String },
    #[error("listing {kind} from the Kubernetes API: {source}")]
    Kube {
        kind: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("listing policies from the Kubernetes API: no answer within {0:?}")]
    KubeTimeout(Duration),
}

/// One resource as the Policies page shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Entry {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// `Kind/name` of the policy's target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub models: Vec<String>,
    /// `alias -> target`.
    pub aliases: Vec<String>,
    pub rules: Vec<String>,
    /// The classifier's tag names.
    pub tags: Vec<String>,
    /// `Enforce` or `Shadow`, and the failure mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balancer: Option<String>,
    pub conditions: Vec<Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Policies {
    pub source: String,
    pub policies: Vec<Entry>,
    pub classifiers: Vec<Entry>,
}

fn names(v: &Value, field: &str) -> Vec<String> {
    v[field]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn entry(kind: &'static str, v: &Value, conditions: Vec<Value>) -> Entry {
    let spec = &v["spec"];
    let target = spec["targetRef"]["name"]
        .as_str()
        .map(|n| format!("{}/{n}", spec["targetRef"]["kind"].as_str().unwrap_or("")));
    let balancer = spec["balancer"].is_object().then(|| {
        format!(
            "{} {}",
            spec["balancer"]["mode"].as_str().unwrap_or("Enforce"),
            spec["balancer"]["failureMode"].as_str().unwrap_or("")
        )
        .trim()
        .to_string()
    });
    Entry {
        kind,
        namespace: v["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        name: v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        target,
        models: names(spec, "models"),
        aliases: spec["aliases"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        format!(
                            "{} -> {}",
                            x["name"].as_str().unwrap_or_default(),
                            x["target"].as_str().unwrap_or_default()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        rules: names(spec, "rules"),
        tags: names(spec, "tags"),
        balancer: if kind == "InferencePolicy" {
            balancer
        } else {
            None
        },
        conditions,
    }
}

/// Classifiers get no status from the controller; their validation is reported as an
/// `Accepted` condition computed here with the API's own validator, so a broken one shows.
fn classifier_conditions(c: &InferenceClassifier) -> Vec<Value> {
    match kinference_api::validate_classifier(c) {
        Ok(()) => vec![serde_json::json!({
            "type": "Accepted", "status": "True", "reason": "Valid",
            "message": "validated by kinference-viz (the controller writes no classifier status)",
        })],
        Err(e) => vec![serde_json::json!({
            "type": "Accepted", "status": "False", "reason": "Invalid", "message": e.to_string(),
        })],
    }
}

impl Source {
    pub async fn load(&self) -> Result<Policies, Error> {
        match self {
            Self::Manifests(dir) => {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || from_manifests(&dir))
                    .await
                    .unwrap_or_else(|e| {
                        Err(Error::Manifest {
                            file: String::new(),
                            why: e.to_string(),
                        })
                    })
            }
            Self::Kubernetes(client) => tokio::time::timeout(CLUSTER_TIMEOUT, from_cluster(client))
                .await
                .unwrap_or(Err(Error::KubeTimeout(CLUSTER_TIMEOUT))),
        }
    }
}

/// Reads a manifest directory and computes the controller's status for each policy.
pub fn from_manifests(dir: &Path) -> Result<Policies, Error> {
    let read_err = |source| Error::Read {
        dir: dir.display().to_string(),
        source,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e == "yaml" || e == "yml")
        })
        .collect();
    paths.sort();
    let mut objects: BTreeMap<ResourceKey, Resource> = BTreeMap::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).map_err(read_err)?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let manifest = |why: String| Error::Manifest {
                file: path.display().to_string(),
                why,
            };
            let value: serde_yaml::Value =
                serde::Deserialize::deserialize(doc).map_err(|e| manifest(e.to_string()))?;
            if value.is_null() {
                continue;
            }
            if let Some(res) =
                Resource::from_yaml(value, "default").map_err(|e| manifest(e.to_string()))?
            {
                objects.insert(res.key(), res);
            }
        }
    }
    let shared = Index::shared();
    {
        let mut index = shared.write();
        for res in objects.values() {
            index.apply(res.clone());
        }
    }
    let errors = shared.read().policy_errors().clone();
    // Quality-guard and rollout conditions come from the proxies' reports, which only the
    // controller has.
    let statuses = kinference_policy_k8s_watch::status::desired_statuses(
        &objects,
        &errors,
        &BTreeMap::new(),
        &BTreeMap::new(),
        k8s_openapi::jiff::Timestamp::now(),
    );
    let conditions: BTreeMap<&ResourceKey, Vec<Value>> = statuses
        .iter()
        .map(|d| {
            let c = d.patch["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            (&d.key, c)
        })
        .collect();
    let mut out = Policies {
        source: format!("manifests in {}", dir.display()),
        ..Policies::default()
    };
    for (key, res) in &objects {
        match res {
            Resource::InferencePolicy(p) => {
                let v = serde_json::to_value(&**p).unwrap_or_default();
                let c = conditions.get(key).cloned().unwrap_or_default();
                out.policies.push(entry("InferencePolicy", &v, c));
            }
            Resource::InferenceClassifier(c) => {
                let v = serde_json::to_value(&**c).unwrap_or_default();
                out.classifiers
                    .push(entry("InferenceClassifier", &v, classifier_conditions(c)));
            }
            _ => {}
        }
    }
    Ok(out)
}

async fn from_cluster(client: &kube::Client) -> Result<Policies, Error> {
    let lp = kube::api::ListParams::default();
    let policies = kube::Api::<InferencePolicy>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|source| Error::Kube {
            kind: "InferencePolicies",
            source: Box::new(source),
        })?;
    let classifiers = kube::Api::<InferenceClassifier>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|source| Error::Kube {
            kind: "InferenceClassifiers",
            source: Box::new(source),
        })?;
    let mut out = Policies {
        source: "Kubernetes API".into(),
        ..Policies::default()
    };
    for p in &policies {
        let v = serde_json::to_value(p).unwrap_or_default();
        let c = v["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        out.policies.push(entry("InferencePolicy", &v, c));
    }
    for c in &classifiers {
        let v = serde_json::to_value(c).unwrap_or_default();
        out.classifiers
            .push(entry("InferenceClassifier", &v, classifier_conditions(c)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
    }

    #[test]
    fn the_examples_are_accepted_with_their_rules() {
        let p = from_manifests(&examples()).unwrap();
        assert_eq!(p.policies.len(), 1);
        let llm = &p.policies[0];
        assert_eq!(
            (llm.namespace.as_str(), llm.name.as_str()),
            ("default", "llm")
        );
        assert_eq!(llm.target.as_deref(), Some("HTTPRoute/llm"));
        assert_eq!(llm.models, vec!["glm-5.3", "qwen-3.6-27b"]);
        assert_eq!(llm.aliases, vec!["default -> glm-5.3"]);
        assert_eq!(llm.rules, vec!["low-complexity-may-use-qwen"]);
        let status = |t: &str| {
            llm.conditions
                .iter()
                .find(|c| c["type"] == t)
                .map(|c| c["status"].as_str().unwrap_or_default().to_string())
        };
        assert_eq!(
            status("Accepted").as_deref(),
            Some("True"),
            "{:?}",
            llm.conditions
        );
        assert_eq!(status("ResolvedRefs").as_deref(), Some("True"));
        assert_eq!(p.classifiers.len(), 1);
        assert_eq!(
            p.classifiers[0].tags,
            vec!["complexity", "translation", "code", "family"]
        );
    }

    /// An API server that accepts connections and never answers: the read is reported, not
    /// waited for (kube's client has no read timeout of its own).
    #[tokio::test(start_paused = true)]
    async fn an_api_server_that_does_not_answer_is_reported() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let _held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let answer =
            tokio::time::timeout(Duration::from_secs(3600), Source::Kubernetes(client).load())
                .await
                .expect("load returns");
        match answer {
            Err(e @ Error::KubeTimeout(_)) => assert_eq!(
                e.to_string(),
                "listing policies from the Kubernetes API: no answer within 10s"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_missing_pool_shows_as_a_false_condition() {
        let dir = tempfile::tempdir().unwrap();
        for f in [
            "policy.yaml",
            "classifier.yaml",
            "httproute.yaml",
            "service.yaml",
        ] {
            std::fs::copy(examples().join(f), dir.path().join(f)).unwrap();
        }
        // No inferencepools.yaml: the policy's poolRefs do not resolve.
        let p = from_manifests(dir.path()).unwrap();
        let c = &p.policies[0].conditions;
        let resolved = c.iter().find(|c| c["type"] == "ResolvedRefs").unwrap();
        assert_eq!(resolved["status"], "False", "{c:?}");
        assert!(
            resolved["message"].as_str().unwrap().contains("glm-5.3"),
            "{resolved}"
        );
    }
}
