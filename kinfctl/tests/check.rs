//! `kinfctl check` as a user runs it: the real binary against the Kubernetes API server
//! double, preloaded with exactly what `kinfctl install` prints (CRDs, control plane) plus
//! what a running cluster adds (a ready controller, its Service's endpoints, injected pods).
//! A healthy system passes every check; each failure mode is then introduced on its own and
//! must be reported with its line and a non-zero exit.

use std::process::Output;

use kinference_k8s_api_double::ApiServer;
use serde::Deserialize as _;
use serde_json::{Value, json};

const NS: &str = "kinference";
const CONTROLLER: &str = "kinference-policy-controller";
const INJECTED_BY: &str = "kinference.io/injected-by";

/// Runs `kinfctl ARGS` without blocking the runtime that serves the double.
async fn kinfctl(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("kinfctl runs")
}

fn documents(output: &Output) -> Vec<Value> {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout.clone()).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .map(|v| serde_json::to_value(v).unwrap())
        .collect()
}

fn injected_pod(name: &str, ready: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "apps",
                     "annotations": {INJECTED_BY: "kinference-proxy-injector/0.1.0"}},
        "spec": {
            "initContainers": [{"name": "kinference-proxy-init", "image": "i"},
                               {"name": "kinference-proxy", "image": "p", "restartPolicy": "Always"}],
            "containers": [{"name": "app", "image": "a"}],
        },
        "status": {
            "initContainerStatuses": [
                {"name": "kinference-proxy-init", "ready": false, "restartCount": 0, "image": "i", "imageID": ""},
                {"name": "kinference-proxy", "ready": ready, "restartCount": 0, "image": "p", "imageID": ""},
            ],
            "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "a", "imageID": ""}],
        },
    })
}

/// A cluster after `kinfctl install --crds` and `kinfctl install`, with the controller up.
async fn healthy() -> ApiServer {
    let crds = kinfctl(&["install", "--crds", "--set", "upstream.inferencePool=true"]).await;
    let control_plane = kinfctl(&["install", "--namespace", NS]).await;
    let mut objects = documents(&crds);
    objects.extend(documents(&control_plane));
    assert!(objects.len() > 10, "{} objects", objects.len());
    let server = ApiServer::with_objects(objects).await;
    server.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    let mut deployment = server
        .object("apps/v1", "Deployment", NS, CONTROLLER)
        .expect("install printed the controller");
    deployment["status"] = json!({"replicas": 2, "readyReplicas": 2, "availableReplicas": 2});
    server.put(deployment);
    server.put(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kinference-policy-controller-x1", "namespace": NS,
                     "labels": {"kubernetes.io/service-name": CONTROLLER}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.1.0.7"], "conditions": {"ready": true}},
                      {"addresses": ["10.1.0.8"], "conditions": {"ready": true}}],
        "ports": [{"name": "grpc", "port": 8090}, {"name": "webhook", "port": 9443}],
    }));
    server.put(injected_pod("web-1", true));
    server.put(injected_pod("web-2", true));
    server.put(json!({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": "plain", "namespace": "apps"},
                      "spec": {"containers": [{"name": "app", "image": "a"}]}}));
    server
}

struct Checked {
    ok: bool,
    lines: Vec<String>,
    stderr: String,
}

async fn check(server: &ApiServer, extra: &[&str]) -> Checked {
    let url = server.url();
    let mut args = vec!["check", "--api-server", url.as_str()];
    args.extend_from_slice(extra);
    let output = kinfctl(&args).await;
    Checked {
        ok: output.status.success(),
        lines: String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect(),
        stderr: String::from_utf8_lossy(&output.stderr).into(),
    }
}

/// Checks, and requires a failure reported with `line` and every other check passing.
async fn fails_with(server: &ApiServer, line: &str) {
    let c = check(server, &[]).await;
    assert!(!c.ok, "{:#?}", c.lines);
    assert!(
        c.lines.iter().any(|l| l == line),
        "{line:?} not in {:#?}",
        c.lines
    );
    let failed: Vec<_> = c.lines.iter().filter(|l| l.starts_with('×')).collect();
    assert_eq!(failed, [line], "{:#?}", c.lines);
    assert!(c.stderr.contains("1 check(s) failed"), "{}", c.stderr);
}

const HEALTHY: &[&str] = &[
    "√ can reach the Kubernetes API",
    "√ Kubernetes 1.34 runs native sidecars (1.30 or later)",
    "√ CRD inferencepolicies.policy.kinference.io is installed and current",
    "√ CRD inferenceclassifiers.policy.kinference.io is installed and current",
    "√ CRD inferencepools.inference.networking.k8s.io serves v1",
    "√ the policy controller is ready (2/2 replicas)",
    "√ the validating webhook kinference-kinference-policy-validator is configured",
    "√ the proxy injector webhook kinference-kinference-proxy-injector is configured",
    "√ the webhooks' Service kinference/kinference-policy-controller has 2 ready endpoint(s)",
    "√ the injector's proxy configuration is valid (proxy ghcr.io/kinference/proxy:0.1.0)",
    "√ 2 of 2 injected proxies are connected",
    "",
    "Status check results are √",
];

#[tokio::test]
async fn a_healthy_installation_passes_every_check() {
    let server = healthy().await;
    let c = check(&server, &[]).await;
    assert!(c.ok, "{:#?}\n{}", c.lines, c.stderr);
    assert_eq!(c.lines, HEALTHY);
    // The same through a kubeconfig file.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    let output = kinfctl(&["check", "--kubeconfig", kubeconfig.to_str().unwrap()]).await;
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .collect::<Vec<_>>(),
        HEALTHY
    );
}

#[tokio::test]
async fn the_proxy_config_install_prints_is_what_the_injector_reads() {
    let server = healthy().await;
    let cm = server
        .object("v1", "ConfigMap", NS, "kinference-proxy-config")
        .unwrap();
    let text = cm["data"]["config.json"].as_str().unwrap();
    let config = kinference_policy_admission::ProxyConfig::from_json(text).unwrap();
    // The injector's own tests use this fixture; it must not drift from the install.
    let fixture = include_str!("../../policy-controller/admission/tests/fixtures/config.json");
    assert_eq!(text, fixture.trim_end());
    assert_eq!(config.ports.outbound, 4140);
}

#[tokio::test]
async fn missing_and_outdated_crds_are_reported_with_the_fix() {
    let server = healthy().await;
    server.delete(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "",
        "inferencepolicies.policy.kinference.io",
    );
    fails_with(
        &server,
        "× CRD inferencepolicies.policy.kinference.io is missing (run kinfctl install --crds | kubectl apply -f -)",
    )
    .await;

    let server = healthy().await;
    let name = "inferenceclassifiers.policy.kinference.io";
    let mut crd = server
        .object(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "",
            name,
        )
        .unwrap();
    // An older schema: one property fewer.
    let props =
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .as_object_mut()
            .unwrap();
    let first = props.keys().next().unwrap().clone();
    props.remove(&first);
    server.put(crd);
    fails_with(
        &server,
        "× CRD inferenceclassifiers.policy.kinference.io is out of date (run kinfctl install --crds | kubectl apply -f -)",
    )
    .await;
}

#[tokio::test]
async fn a_controller_without_ready_replicas_fails() {
    let server = healthy().await;
    let mut d = server
        .object("apps/v1", "Deployment", NS, CONTROLLER)
        .unwrap();
    d["status"] = json!({"replicas": 2, "unavailableReplicas": 2});
    server.put(d);
    fails_with(
        &server,
        "× the policy controller has no ready replica (0/2; see kubectl -n kinference describe deployment kinference-policy-controller)",
    )
    .await;
    server.delete("apps/v1", "Deployment", NS, CONTROLLER);
    fails_with(
        &server,
        "× the policy controller Deployment kinference/kinference-policy-controller is missing (run kinfctl install | kubectl apply -f -)",
    )
    .await;
}

#[tokio::test]
async fn webhooks_without_a_ca_bundle_or_endpoints_fail() {
    let server = healthy().await;
    let api = "admissionregistration.k8s.io/v1";
    let mut m = server
        .object(
            api,
            "MutatingWebhookConfiguration",
            "",
            "kinference-kinference-proxy-injector",
        )
        .unwrap();
    m["webhooks"][0]["clientConfig"]["caBundle"] = json!("");
    server.put(m);
    fails_with(
        &server,
        "× webhook proxy-injector.kinference.io has no caBundle (run kinfctl install | kubectl apply -f -)",
    )
    .await;

    let server = healthy().await;
    server.delete(
        api,
        "ValidatingWebhookConfiguration",
        "",
        "kinference-kinference-policy-validator",
    );
    fails_with(
        &server,
        "× ValidatingWebhookConfiguration kinference-kinference-policy-validator is missing (run kinfctl install | kubectl apply -f -)",
    )
    .await;

    let server = healthy().await;
    let mut slice = server
        .object(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            NS,
            "kinference-policy-controller-x1",
        )
        .unwrap();
    slice["endpoints"] = json!([{"addresses": ["10.1.0.7"], "conditions": {"ready": false}}]);
    server.put(slice);
    fails_with(
        &server,
        "× the webhooks' Service kinference/kinference-policy-controller has no ready endpoints: the API server cannot reach the webhooks",
    )
    .await;
}

#[tokio::test]
async fn an_invalid_proxy_config_and_unready_proxies_fail() {
    let server = healthy().await;
    let mut cm = server
        .object("v1", "ConfigMap", NS, "kinference-proxy-config")
        .unwrap();
    cm["data"]["config.json"] = json!(r#"{"image": "p"}"#);
    server.put(cm);
    let c = check(&server, &[]).await;
    assert!(!c.ok);
    let line = c
        .lines
        .iter()
        .find(|l| l.starts_with('×'))
        .expect("a failure");
    assert!(
        line.starts_with("× ConfigMap kinference/kinference-proxy-config has an invalid config.json: missing field"),
        "{line}"
    );

    let server = healthy().await;
    server.put(injected_pod("web-2", false));
    fails_with(
        &server,
        "× 1 of 2 injected proxies are not connected: apps/web-2",
    )
    .await;
}

#[tokio::test]
async fn an_unreachable_api_stops_the_check() {
    // A port nothing listens on: bind one, then free it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{addr}");
    let output = kinfctl(&["check", "--api-server", &url]).await;
    assert!(!output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(
        lines[0].starts_with("× cannot reach the Kubernetes API: "),
        "{lines:#?}"
    );
    assert_eq!(lines[2], "Status check results are ×");
}

#[tokio::test]
async fn pre_checks_the_version_and_namespace() {
    let server = ApiServer::start().await;
    let c = check(&server, &["--pre"]).await;
    assert!(!c.ok);
    assert_eq!(
        c.lines[..3],
        [
            "√ can reach the Kubernetes API",
            "√ Kubernetes 1.34 runs native sidecars (1.30 or later)",
            "× namespace kinference does not exist (run kubectl create namespace kinference)",
        ]
    );
    server.put(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    let c = check(&server, &["--pre"]).await;
    assert!(c.ok, "{:#?}", c.lines);
    assert_eq!(c.lines[2], "√ namespace kinference exists");

    server.set_version(json!({"major": "1", "minor": "29", "gitVersion": "v1.29.9",
        "gitCommit": "", "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "", "platform": ""}));
    let c = check(&server, &["--pre"]).await;
    assert!(!c.ok);
    assert_eq!(
        c.lines[1],
        "× Kubernetes 1.29 is too old: the proxy is a native sidecar, which needs 1.30 or later"
    );
}
