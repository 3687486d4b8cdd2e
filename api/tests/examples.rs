//! Every manifest under examples/ parses into the Rust types without losing a field, validates
//! clean, and forms the scenario of ARCHITECTURE.md: the route sends to the glm-5.3 pool, the
//! policy widens low-complexity prompts to qwen-3.6-27b, and every pool has the loopback
//! endpoints the local mode runs.

use std::{collections::BTreeMap, path::PathBuf};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kinference_api::{
    InferenceClassifier, InferencePolicy, InferencePool, httproute::HttpRoute, validate_classifier,
    validate_policy,
};
use serde::Deserialize;
use serde_json::Value;

#[derive(Default)]
struct Examples {
    services: Vec<Service>,
    routes: Vec<HttpRoute>,
    pools: Vec<InferencePool>,
    slices: Vec<EndpointSlice>,
    classifiers: Vec<InferenceClassifier>,
    policies: Vec<InferencePolicy>,
}

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// Parses `doc` as `T` and checks that re-serializing it keeps every field the file wrote, so a
/// misspelt or misplaced field (which serde would silently drop) fails the test.
fn parse<T: serde::de::DeserializeOwned + serde::Serialize>(file: &str, doc: &Value) -> T {
    let parsed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{file}: does not parse: {e}"));
    let back = serde_json::to_value(&parsed).unwrap();
    assert_subset(file, "", doc, &back);
    parsed
}

fn assert_subset(file: &str, path: &str, written: &Value, parsed: &Value) {
    match (written, parsed) {
        (Value::Object(w), Value::Object(p)) => {
            for (k, v) in w {
                let Some(pv) = p.get(k) else {
                    panic!("{file}: field {path}.{k} was dropped by the Rust types (misspelt?)");
                };
                assert_subset(file, &format!("{path}.{k}"), v, pv);
            }
        }
        (Value::Array(w), Value::Array(p)) => {
            assert_eq!(w.len(), p.len(), "{file}: {path} changed length");
            for (i, (w, p)) in w.iter().zip(p).enumerate() {
                assert_subset(file, &format!("{path}[{i}]"), w, p);
            }
        }
        (Value::Number(w), Value::Number(p)) => {
            assert_eq!(w.as_f64(), p.as_f64(), "{file}: {path} changed");
        }
        (w, p) => assert_eq!(w, p, "{file}: {path} changed"),
    }
}

fn load() -> Examples {
    let mut examples = Examples::default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .expect("examples/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in examples/");
    for path in files {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let yaml = serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{file}: not YAML: {e}"));
            let doc: Value = serde_json::to_value(&yaml).unwrap();
            let kind = (doc["apiVersion"].as_str(), doc["kind"].as_str());
            match kind {
                (Some("v1"), Some("Service")) => examples.services.push(parse(&file, &doc)),
                (Some("gateway.networking.k8s.io/v1"), Some("HTTPRoute")) => {
                    examples.routes.push(parse(&file, &doc))
                }
                (Some("inference.networking.k8s.io/v1"), Some("InferencePool")) => {
                    examples.pools.push(parse(&file, &doc))
                }
                (Some("discovery.k8s.io/v1"), Some("EndpointSlice")) => {
                    examples.slices.push(parse(&file, &doc))
                }
                (Some("policy.kinference.io/v1alpha1"), Some("InferenceClassifier")) => {
                    examples.classifiers.push(parse(&file, &doc))
                }
                (Some("policy.kinference.io/v1alpha1"), Some("InferencePolicy")) => {
                    examples.policies.push(parse(&file, &doc))
                }
                other => panic!("{file}: unexpected resource {other:?}"),
            }
        }
    }
    examples
}

fn name<K: kube::Resource>(obj: &K) -> &str {
    obj.meta().name.as_deref().unwrap_or_default()
}

#[test]
fn every_example_parses_and_validates_clean() {
    let examples = load();
    assert_eq!(examples.services.len(), 1);
    assert_eq!(examples.routes.len(), 1);
    assert_eq!(examples.pools.len(), 2);
    assert_eq!(examples.slices.len(), 4);
    assert_eq!(examples.classifiers.len(), 1);
    assert_eq!(examples.policies.len(), 1);

    for classifier in &examples.classifiers {
        if let Err(e) = validate_classifier(classifier) {
            panic!("classifier {}: {e}", name(classifier));
        }
    }
    for policy in &examples.policies {
        if let Err(e) = validate_policy(policy, &examples.classifiers, &examples.pools) {
            panic!("policy {}: {e}", name(policy));
        }
    }
}

#[test]
fn the_policy_is_the_scenario() {
    let examples = load();
    let policy = &examples.policies[0].spec;

    // The policy targets the route, which exists and is the llm Service's.
    assert_eq!(policy.target_ref.kind, "HTTPRoute");
    let route = examples
        .routes
        .iter()
        .find(|r| name(*r) == policy.target_ref.name)
        .expect("the policy's target route exists");
    let parent = &route.spec.parent_refs.as_ref().unwrap()[0];
    assert_eq!(parent.kind.as_deref(), Some("Service"));
    assert_eq!(name(&examples.services[0]), parent.name);

    // The route sends everything to the glm-5.3 pool.
    let backends: Vec<_> = route.spec.rules.as_ref().unwrap()[0]
        .backend_refs
        .as_ref()
        .unwrap()
        .iter()
        .map(|b| (b.group.as_deref(), b.kind.as_deref(), b.name.as_str()))
        .collect();
    assert_eq!(
        backends,
        [(
            Some("inference.networking.k8s.io"),
            Some("InferencePool"),
            "glm-5.3"
        )]
    );

    // The models and the one rule: complexity=low adds qwen-3.6-27b to glm-5.3.
    let models: Vec<_> = policy.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(models, ["glm-5.3", "qwen-3.6-27b"]);
    assert_eq!(
        policy.resolve("default").map(|m| m.name.as_str()),
        Some("glm-5.3")
    );
    assert_eq!(policy.rules.len(), 1);
    let rule = &policy.rules[0];
    assert_eq!(rule.r#match.tags[0].name, "complexity");
    assert_eq!(rule.r#match.tags[0].values, ["low"]);
    assert_eq!(rule.action.add_models, ["qwen-3.6-27b"]);
    assert!(
        rule.r#match
            .models
            .iter()
            .all(|m| policy.resolve(m).unwrap().name == "glm-5.3")
    );

    // The balancer's settings parse to their documented values.
    assert_eq!(policy.balancer.freshness_budget().unwrap().as_millis(), 500);
    assert_eq!(policy.balancer.tie_window().unwrap().as_millis(), 20);
}

#[test]
fn every_pool_has_its_loopback_replicas() {
    let examples = load();
    let expected: BTreeMap<&str, Vec<(String, i32)>> = [
        (
            "glm-5.3",
            vec![("127.0.0.1".into(), 8001), ("127.0.0.1".into(), 8002)],
        ),
        (
            "qwen-3.6-27b",
            vec![("127.0.0.1".into(), 8003), ("127.0.0.1".into(), 8004)],
        ),
    ]
    .into();
    for pool in &examples.pools {
        let ports: Vec<i32> = pool.spec.target_port_numbers().collect();
        let mut endpoints = Vec::new();
        for slice in &examples.slices {
            let labels = slice.metadata.labels.clone().unwrap_or_default();
            if !pool.spec.selector.matches(&labels) {
                continue;
            }
            for port in slice.ports.iter().flatten().filter_map(|p| p.port) {
                assert!(
                    ports.contains(&port),
                    "slice {} is selected by pool {} but port {port} is not a target port",
                    name(slice),
                    name(pool)
                );
                for endpoint in slice.endpoints.iter().flatten() {
                    for address in &endpoint.addresses {
                        endpoints.push((address.clone(), port));
                    }
                }
            }
        }
        endpoints.sort();
        assert_eq!(
            endpoints,
            expected[name(pool)],
            "endpoints of pool {}",
            name(pool)
        );
    }
}
