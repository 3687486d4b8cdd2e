//! The Policies page's cluster source, over real sockets: the Kubernetes API server double holds
//! the manifests of `examples/` plus broken resources, the policy controller's own Kubernetes
//! source (watchers, lease, status writer) runs against it and writes each policy's conditions,
//! and the `kinference-viz serve` binary, pointed at the double by a kubeconfig, answers
//! `/api/policies` (the JSON the dashboard's Policies page reads).
//!
//! The conditions viz reports are compared with what the controller wrote to the API and with the
//! API's own validation messages, so a viz that computed, dropped or reordered conditions of its
//! own would fail. A change in the cluster changes the answer (viz lists on every request), and an
//! API that refuses the list is named in the answer's `errors`.

use kinference_k8s_api_double::{ApiServer, is_list};
use kinference_policy_k8s_index::Index;
use kinference_policy_k8s_watch::{Backoff, Config, LeaseConfig, SystemClock};
use serde::Deserialize as _;
use serde_json::{Value, json};
use std::{sync::Arc, time::Duration};
use tokio::io::AsyncBufReadExt;

const NS: &str = "default";
const POLICY_API: &str = "policy.kinference.io/v1alpha1";
const POOL_API: &str = "inference.networking.k8s.io/v1";
/// A bound on every wait, so a broken controller or viz fails the test instead of hanging it.
const WAIT: Duration = Duration::from_secs(60);

/// Every document of the top-level `examples/*.yaml`.
fn examples() -> Vec<Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("yaml"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
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

/// A policy on route `llm` serving `model` from pool `pool`.
fn policy(name: &str, model: &str, pool: &str) -> Value {
    json!({
        "apiVersion": POLICY_API, "kind": "InferencePolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "targetRef": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llm"},
            "models": [{
                "name": model,
                "poolRef": {"name": pool},
                "prior": {"prefillTokensPerSecond": 12000, "timePerOutputTokenMs": 30},
            }],
        },
    })
}

/// A policy whose rule adds a model it never declared.
fn unknown_model_policy() -> Value {
    let mut p = policy("unknown-model", "glm-5.3", "glm-5.3");
    p["spec"]["rules"] = json!([{
        "name": "widen",
        "match": {"models": ["glm-5.3"]},
        "action": {"addModels": ["nope"]},
    }]);
    p
}

/// A classifier whose complexity thresholds are inverted.
fn inverted_classifier() -> Value {
    json!({
        "apiVersion": POLICY_API, "kind": "InferenceClassifier",
        "metadata": {"name": "inverted", "namespace": NS},
        "spec": {"tags": [{"name": "complexity", "complexity": {"thresholds": {"low": 0.9, "high": 0.2}}}]},
    })
}

/// The controller's Kubernetes source (as `kinference-policy-controller` runs it), until dropped.
struct Controller(tokio::task::JoinHandle<()>);

impl Drop for Controller {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Controller {
    fn start(server: &ApiServer) -> Self {
        let mut lease = LeaseConfig::new(NS, "kinference-policy-controller", "controller");
        lease.retry_period = Duration::from_millis(50);
        let config = Config {
            lease,
            backoff: Backoff {
                min: Duration::from_millis(10),
                max: Duration::from_millis(200),
            },
            clock: Arc::new(SystemClock),
            guards: Arc::default(),
            rollouts: Arc::default(),
        };
        let client = server.client("controller");
        Self(tokio::spawn(async move {
            let res = kinference_policy_k8s_watch::run(client, Index::shared(), config).await;
            panic!("the controller's source stopped: {res:?}");
        }))
    }
}

/// `kinference-viz serve` reading policies from the double through a kubeconfig.
struct Viz {
    url: String,
    _child: tokio::process::Child,
    _kubeconfig: tempfile::TempDir,
}

impl Viz {
    async fn start(server: &ApiServer) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("config");
        std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kinference-viz"))
            .args([
                "serve",
                "--listen-addr",
                "127.0.0.1:0",
                "--log-format",
                "plain",
            ])
            // Nothing listens there; the Policies page does not read Prometheus.
            .args(["--prometheus-url", "http://127.0.0.1:9"])
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KINFERENCE_VIZ_MANIFESTS")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("kinference-viz starts");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(addr) = line.strip_prefix("kinference-viz listen=") {
                    return addr.to_string();
                }
            }
            panic!("kinference-viz exited without listening");
        })
        .await
        .expect("kinference-viz prints its address");
        // Keep reading its log, so its writes never meet a closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            url: format!("http://{addr}"),
            _child: child,
            _kubeconfig: dir,
        }
    }

    async fn policies(&self) -> Value {
        let url = format!("{}/api/policies", self.url);
        // Bounded, so a viz that waits on the API (kube's retries) fails here instead of hanging.
        let client = reqwest::Client::builder().timeout(WAIT).build().unwrap();
        let rsp = client.get(&url).send().await.expect(&url);
        assert_eq!(rsp.status(), 200, "{url}");
        rsp.json().await.expect("JSON")
    }
}

/// The conditions the controller has written on a policy, once it has written them for the
/// policy's current generation.
fn written(server: &ApiServer, name: &str) -> Option<Value> {
    let p = server.object(POLICY_API, "InferencePolicy", NS, name)?;
    let conditions = p["status"]["conditions"].as_array()?;
    let generation = &p["metadata"]["generation"];
    (!conditions.is_empty()
        && conditions
            .iter()
            .all(|c| c["observedGeneration"] == *generation))
    .then(|| p["status"]["conditions"].clone())
}

async fn wait_written(server: &ApiServer, names: &[&str]) {
    server
        .wait_for(
            WAIT,
            &format!("the controller's status on {names:?}"),
            |s| names.iter().all(|n| written(s, n).is_some()).then_some(()),
        )
        .await;
}

fn entry<'v>(v: &'v Value, list: &str, name: &str) -> &'v Value {
    v[list]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["namespace"] == NS && e["name"] == name))
        .unwrap_or_else(|| panic!("no {list} entry {NS}/{name} in {v:#}"))
}

fn condition<'v>(entry: &'v Value, type_: &str) -> &'v Value {
    entry["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {entry:#}"))
}

fn names(v: &Value, list: &str) -> Vec<String> {
    v[list]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{}/{}",
                e["namespace"].as_str().unwrap(),
                e["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policies_page_shows_the_clusters_policies_with_the_controllers_conditions() {
    let mut objects = examples();
    objects.push(unknown_model_policy());
    objects.push(policy("missing-pool", "glm-5.3", "missing"));
    objects.push(inverted_classifier());
    let server = ApiServer::with_objects(objects).await;
    let _controller = Controller::start(&server);
    wait_written(&server, &["llm", "unknown-model", "missing-pool"]).await;

    let viz = Viz::start(&server).await;
    let v = viz.policies().await;
    assert_eq!(v["errors"], json!([]), "{v:#}");
    assert_eq!(v["source"], "Kubernetes API");
    assert_eq!(
        names(&v, "policies"),
        [
            "default/llm",
            "default/missing-pool",
            "default/unknown-model"
        ]
    );
    assert_eq!(
        names(&v, "classifiers"),
        ["default/inverted", "default/llm"]
    );

    // Every policy's conditions are exactly those the controller wrote.
    for name in ["llm", "unknown-model", "missing-pool"] {
        assert_eq!(
            entry(&v, "policies", name)["conditions"],
            written(&server, name).unwrap(),
            "{name}"
        );
    }

    // The example: its spec as the page lists it, accepted and resolved.
    let llm = entry(&v, "policies", "llm");
    assert_eq!(llm["kind"], "InferencePolicy");
    assert_eq!(llm["target"], "HTTPRoute/llm");
    assert_eq!(llm["models"], json!(["glm-5.3", "qwen-3.6-27b"]));
    assert_eq!(llm["aliases"], json!(["default -> glm-5.3"]));
    assert_eq!(llm["rules"], json!(["low-complexity-may-use-qwen"]));
    assert_eq!(llm["balancer"], "Enforce FailOpen");
    let accepted = condition(llm, "Accepted");
    assert_eq!(
        (&accepted["status"], &accepted["reason"]),
        (&json!("True"), &json!("Accepted")),
        "{llm:#}"
    );
    assert_eq!(condition(llm, "ResolvedRefs")["status"], "True", "{llm:#}");

    // A rule naming a model the policy does not declare: not accepted, with the API's message.
    let bad: kinference_api::InferencePolicy =
        serde_json::from_value(unknown_model_policy()).unwrap();
    let pools: Vec<kinference_api::InferencePool> = server
        .objects(POOL_API, "InferencePool")
        .into_iter()
        .map(|p| serde_json::from_value(p).unwrap())
        .collect();
    let expected = kinference_api::validate_policy(&bad, &[], &pools)
        .expect_err("the rule names an unknown model")
        .to_string();
    assert!(
        expected.contains("spec.rules[0].action.addModels[0]") && expected.contains("nope"),
        "{expected}"
    );
    let unknown = entry(&v, "policies", "unknown-model");
    let accepted = condition(unknown, "Accepted");
    assert_eq!(accepted["status"], "False", "{unknown:#}");
    assert_eq!(accepted["reason"], "Invalid");
    assert_eq!(accepted["message"], expected.as_str());

    // A pool that does not exist: its references do not resolve, and the message names it.
    let orphan = entry(&v, "policies", "missing-pool");
    let resolved = condition(orphan, "ResolvedRefs");
    assert_eq!(resolved["status"], "False", "{orphan:#}");
    assert_eq!(resolved["reason"], "PoolNotFound");
    assert!(
        resolved["message"]
            .as_str()
            .unwrap()
            .starts_with("spec.models[0].poolRef.name: InferencePool \"missing\" not found"),
        "{resolved}"
    );
    assert_eq!(
        condition(orphan, "Accepted")["status"],
        "False",
        "{orphan:#}"
    );

    // Classifiers: the example's tags, accepted; the inverted thresholds refused, with why.
    let llm_classifier = entry(&v, "classifiers", "llm");
    assert_eq!(llm_classifier["kind"], "InferenceClassifier");
    assert_eq!(
        llm_classifier["tags"],
        json!(["complexity", "translation", "code", "family"])
    );
    assert_eq!(condition(llm_classifier, "Accepted")["status"], "True");
    let inverted = condition(entry(&v, "classifiers", "inverted"), "Accepted");
    assert_eq!(inverted["status"], "False", "{inverted}");
    assert_eq!(inverted["reason"], "Invalid");
    assert!(
        inverted["message"]
            .as_str()
            .unwrap()
            .contains("spec.tags[0].complexity.thresholds: low (0.9) must be less than high (0.2)"),
        "{inverted}"
    );

    // viz only read: its requests (those without the controller's header) are lists of the two kinds.
    let viz_requests: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.client.is_none())
        .collect();
    assert!(!viz_requests.is_empty());
    for r in &viz_requests {
        assert!(
            is_list(r, "inferencepolicies") || is_list(r, "inferenceclassifiers"),
            "viz sent {} {}?{}",
            r.method,
            r.path,
            r.query
        );
    }

    // The cluster changes: the qwen pool is deleted, the controller marks the example
    // unresolved, and the next answer shows it.
    server.delete(POOL_API, "InferencePool", NS, "qwen-3.6-27b");
    server
        .wait_for(WAIT, "llm's ResolvedRefs to turn False", |s| {
            let c = written(s, "llm")?;
            c.as_array()?
                .iter()
                .any(|c| c["type"] == "ResolvedRefs" && c["status"] == "False")
                .then_some(())
        })
        .await;
    let v = viz.policies().await;
    let llm = entry(&v, "policies", "llm");
    assert_eq!(llm["conditions"], written(&server, "llm").unwrap());
    let resolved = condition(llm, "ResolvedRefs");
    assert_eq!(resolved["reason"], "PoolNotFound", "{llm:#}");
    assert!(
        resolved["message"]
            .as_str()
            .unwrap()
            .contains("InferencePool \"qwen-3.6-27b\" not found"),
        "{resolved}"
    );

    // The API refuses the list (503, which kube's client would retry for minutes): the page says
    // so at once instead of showing an empty table.
    server.fail("/apis/policy.kinference.io/v1alpha1/inferencepolicies", 503);
    let v = viz.policies().await;
    assert_eq!(v["policies"], json!([]));
    let errors = v["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{v:#}");
    let error = errors[0].as_str().unwrap();
    assert!(
        error.starts_with("listing InferencePolicies from the Kubernetes API: ")
            && error.contains("failure injected by the test"),
        "{v:#}"
    );
    let refused = server
        .requests()
        .into_iter()
        .filter(|r| r.client.is_none() && is_list(r, "inferencepolicies"))
        .filter(|r| r.path == "/apis/policy.kinference.io/v1alpha1/inferencepolicies")
        .count();
    // Two successful lists before, and the refused one asked once.
    assert_eq!(refused, 3, "viz retried the refused list");
}
