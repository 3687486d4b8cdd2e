//! An InferenceClassifier's exemplars and external tags, from the resource a user writes to the
//! `InferencePolicy` message a proxy receives: the manifests of `examples/` with the tags of
//! `examples/classifiers/support.yaml` added, through the index and the gRPC server's conversion.

use kinference_policy_core::{ParentTarget, inference::InferencePolicyState};
use kinference_policy_k8s_index::{Index, Resource};
use kinference_proxy_api::inference::{
    self as api,
    classifier::{exemplars::Embedding, tag::Kind},
};
use serde::Deserialize;
use std::path::{Path, PathBuf};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn docs(path: &Path) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The example scenario, with `patch` applied to its classifier's tags (the support example's
/// tags appended first).
fn served(patch: impl Fn(&mut Vec<serde_yaml::Value>)) -> InferencePolicyState {
    let support = docs(&examples().join("classifiers/support.yaml")).remove(0);
    let mut index = Index::default();
    let mut files: Vec<_> = std::fs::read_dir(examples())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        for mut doc in docs(&file) {
            if doc["kind"] == "InferenceClassifier" {
                let tags = doc["spec"]["tags"].as_sequence_mut().unwrap();
                tags.extend(
                    support["spec"]["tags"]
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .cloned(),
                );
                patch(tags);
            }
            if let Some(r) = Resource::from_yaml(doc, "default").unwrap() {
                index.apply(r);
            }
        }
    }
    index.inference_policy(&ParentTarget {
        namespace: "default".into(),
        name: "llm".into(),
        port: 8000,
    })
}

fn proto(state: &InferencePolicyState) -> api::InferencePolicy {
    kinference_policy_grpc::inference::to_proto(state)
}

fn kind<'a>(p: &'a api::InferencePolicy, name: &str) -> &'a Kind {
    let tag = p.classifiers[0]
        .tags
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("tag {name} is sent"));
    tag.kind.as_ref().expect("a kind")
}

#[test]
fn exemplars_tags_reach_the_proxy() {
    let p = proto(&served(|_| {}));
    assert_eq!(p.status.as_ref().unwrap().kind(), api::status::Kind::Served);
    let Kind::Exemplars(e) = kind(&p, "topic") else {
        panic!("exemplars")
    };
    assert_eq!((e.k, e.min_similarity), (3, 0.2));
    assert_eq!(e.embedding(), Embedding::Static);
    let values: Vec<_> = e.values.iter().map(|v| v.value.as_str()).collect();
    assert_eq!(values, ["billing", "outage"]);
    assert_eq!(
        e.values[0].examples[0],
        "I was charged twice on my invoice this month"
    );
    assert_eq!(e.values[1].examples.len(), 3);
    let Kind::Exemplars(m) = kind(&p, "topic-paraphrase") else {
        panic!("exemplars")
    };
    assert_eq!(m.embedding(), Embedding::Minilm);
    // Defaults written out: k 3.
    assert_eq!((m.k, m.min_similarity), (3, 0.3));
}

#[test]
fn external_tags_reach_the_proxy() {
    let p = proto(&served(|_| {}));
    let Kind::External(e) = kind(&p, "domain") else {
        panic!("external")
    };
    assert_eq!(
        e.url,
        "http://domain-classifier.ml.svc.cluster.local:8000/classify"
    );
    assert_eq!(
        e.timeout.map(|d| (d.seconds, d.nanos)),
        Some((0, 30_000_000)),
        "30ms as a protobuf Duration"
    );
    assert_eq!(e.values, ["legal", "medical", "general"]);
    assert_eq!(e.fallback_value, "general");
    assert_eq!(e.fallback_confidence, 0.3);
}

#[test]
fn an_invalid_external_tag_keeps_the_policy_off_the_wire_with_its_message() {
    let state = served(|tags| {
        let domain = tags.iter_mut().find(|t| t["name"] == "domain").unwrap();
        domain["external"]["fallback"] = "other".into();
    });
    let p = proto(&state);
    let status = p.status.as_ref().unwrap();
    assert_eq!(status.kind(), api::status::Kind::Invalid);
    assert!(p.classifiers.is_empty() && p.models.is_empty());
    assert!(
        status.message.contains(
            "InferenceClassifier default/llm: spec.tags[6].external.fallback: fallback \"other\" \
             is not one of the declared values (legal, medical, general)"
        ),
        "{}",
        status.message
    );
}
