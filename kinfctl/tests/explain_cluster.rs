//! `kinfctl explain --cluster` against the Kubernetes API server double, preloaded with the
//! manifests of `examples/`: the policy is read from the API (Services, HTTPRoutes,
//! InferencePools, InferencePolicies, InferenceClassifiers), indexed as the controller indexes
//! it, and evaluated with the proxy's code. A change in the cluster changes the answer.
//!
//! The classifier's complexity thresholds are set by the test, so that the tags (and so the
//! candidates) follow from the policy, not from the trained model's calibration.

use std::process::Output;

use kinference_k8s_api_double::ApiServer;
use serde::Deserialize as _;
use serde_json::{Value, json};

const HIGH: &str = "Design a distributed consensus protocol tolerant to Byzantine faults for a \
     geo-replicated database; derive its message complexity, prove safety and liveness under \
     partial synchrony, and compare it with PBFT and HotStuff in latency and throughput.";
const SHORT: &str = "Translate 'good morning' into Spanish.";

/// Runs `kinfctl ARGS` without blocking the runtime that serves the double.
async fn kinfctl(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("kinfctl runs")
}

fn examples() -> Vec<Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = serde_yaml::Value::deserialize(doc).unwrap();
            if !v.is_null() {
                out.push(serde_json::to_value(v).unwrap());
            }
        }
    }
    out
}

/// Sets the example classifier's complexity thresholds in the cluster.
fn set_thresholds(server: &ApiServer, low: f64, high: f64) {
    let mut c = server
        .object(
            "policy.kinference.io/v1alpha1",
            "InferenceClassifier",
            "default",
            "llm",
        )
        .expect("the example classifier is loaded");
    for tag in c["spec"]["tags"].as_array_mut().unwrap() {
        if tag["name"] == "complexity" {
            tag["complexity"] = json!({"thresholds": {"low": low, "high": high}});
        }
    }
    server.put(c);
}

async fn explain(server: &ApiServer, extra: &[&str]) -> Output {
    let url = server.url();
    let mut args = vec!["explain", "--cluster", "--api-server", url.as_str()];
    args.extend_from_slice(extra);
    kinfctl(&args).await
}

async fn explain_json(server: &ApiServer, prompt: &str) -> Value {
    let out = explain(server, &["-m", "glm-5.3", "-o", "json", "-p", prompt]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn tag<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["explanation"]["tags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no {name} tag in {v:#}"))
}

#[tokio::test]
async fn explain_reads_the_declared_policy_from_the_cluster() {
    let server = ApiServer::with_objects(examples()).await;

    // Every prompt scores above 0.05: a long, hard one is tagged high, the rule does not match,
    // and glm-5.3 is the only candidate.
    set_thresholds(&server, 0.01, 0.05);
    let v = explain_json(&server, HIGH).await;
    assert_eq!(v["source"]["policy"], "cluster");
    assert_eq!(v["source"]["target"], "llm.default.svc.cluster.local:8000");
    assert_eq!(tag(&v, "complexity")["value"], "high", "{v:#}");
    assert_eq!(
        v["candidates"]["rule_trace"],
        json!([{"rule": "low-complexity-may-use-qwen", "matched": false}])
    );
    assert_eq!(v["candidates"]["models"], json!(["glm-5.3"]));
    assert!(v["routing"].is_null(), "no predictions without a proxy");

    // The cluster changes: now short prompts are low, the rule matches and qwen may serve.
    set_thresholds(&server, 0.9, 0.95);
    let v = explain_json(&server, SHORT).await;
    let complexity = tag(&v, "complexity");
    assert_eq!(complexity["value"], "low", "{v:#}");
    assert!(complexity["confidence"].as_f64().unwrap() >= 0.5, "{v:#}");
    assert_eq!(tag(&v, "translation")["value"], "true");
    assert_eq!(
        v["candidates"]["rule_trace"],
        json!([{"rule": "low-complexity-may-use-qwen", "matched": true}])
    );
    assert_eq!(
        v["candidates"]["models"],
        json!(["glm-5.3", "qwen-3.6-27b"])
    );

    // The table says what matched, and that predictions need a proxy.
    let out = explain(&server, &["-m", "default", "-p", SHORT]).await;
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Policy    cluster, revision "), "{text}");
    assert!(
        text.contains("  low-complexity-may-use-qwen  yes\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "Candidates  glm-5.3, qwen-3.6-27b (requested glm-5.3, service class Standard)"
        ),
        "{text}"
    );
    assert!(
        text.ends_with(
            "Endpoints\n  live predictions need a proxy: add --proxy <admin URL> (e.g. http://127.0.0.1:4191)\n"
        ),
        "{text}"
    );

    // Without a policy in the cluster: a clear error.
    server.delete(
        "policy.kinference.io/v1alpha1",
        "InferencePolicy",
        "default",
        "llm",
    );
    let out = explain(&server, &["-m", "glm-5.3", "-p", SHORT]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no Service port in the cluster has an InferencePolicy"),
        "{err}"
    );
}
