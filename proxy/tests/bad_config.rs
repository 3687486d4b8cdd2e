//! Bad configuration over real processes (issue 19, D4): the controller on a copy of `examples/`,
//! one glm-5.3 and one qwen-3.6-27b simulator, and the proxy binary; each test breaks the copied
//! manifests the way an operator would, and checks that the last good policy keeps serving.
//!
//! A bad regex in the InferenceClassifier, an alias cycle, a rule naming an undeclared model, a
//! schema error, a deleted pool file and a truncated manifest are each rejected by the controller,
//! which keeps serving the last valid version: requests still succeed, the controller counts the
//! rejection (`kinference_policy_rejected_resources_total{kind,reason}`, the gauge
//! `kinference_policy_index_last_good_parents`) and logs it at WARN, the proxy's `/debug/targets`
//! says the controller serves a last good version, and fixing the file brings the new version. A
//! deleted InferencePolicy is not a fault for the controller (it stops serving the policy), and a
//! restarted controller has no last good version of a policy that is invalid when it starts: in
//! both the proxy keeps its working policy itself, counts the refused message
//! (`kinference_proxy_policy_rejections_total{reason}`) and shows it.
//!
//! Every wait is a bounded poll for a condition. Before the controller and proxy kept their last
//! good policy, each test failed at its first request after the break: the proxy answered 404.

#[path = "support/client.rs"]
mod client;

use client::ProxyClient;
use kinference_local::{Programs, Stack, StackOptions, poll::wait_until};
use serde_json::{Value, json};
use std::{path::Path, time::Duration};

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");

/// How long the controller may take to reload a change and the proxy to hear of it.
const RELOAD: Duration = Duration::from_secs(20);

struct Env {
    stack: Stack,
    client: ProxyClient,
    /// The controller's admin URL.
    controller: String,
    _logs: tempfile::TempDir,
}

async fn start() -> Env {
    let logs = tempfile::tempdir().unwrap();
    let opts = StackOptions {
        replicas: vec![("glm-5.3".into(), 1), ("qwen-3.6-27b".into(), 1)],
        time_scale: 10.0,
        kv_events: false,
        log_dir: Some(logs.path().to_path_buf()),
        ..StackOptions::default()
    };
    let stack = tokio::task::spawn_blocking(move || {
        Stack::start(&Programs::with_proxy(Path::new(PROXY)), &opts, &|_| {})
    })
    .await
    .unwrap()
    .expect("the local stack starts");
    let env = Env {
        client: ProxyClient::of(&stack.proxy),
        controller: format!("http://{}", stack.controller.admin),
        stack,
        _logs: logs,
    };
    env.client.wait_ready().await;
    wait_until("both endpoints discovered", RELOAD, || async {
        let eps = env.client.endpoints().await;
        (eps.iter().filter(|e| e["ready"] == true).count() == 2).then_some(())
    })
    .await;
    env.assert_serving("at start").await;
    env
}

/// A path of the copied manifests.
fn manifest(env: &Env, file: &str) -> std::path::PathBuf {
    env.stack.manifests.path().join(file)
}

/// Rewrites the documents of a copied manifest file.
fn edit(env: &Env, file: &str, f: impl FnOnce(&mut Vec<serde_yaml::Value>)) {
    let path = manifest(env, file);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|d: &serde_yaml::Value| !d.is_null())
        .collect();
    f(&mut docs);
    let out: Vec<String> = docs
        .iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect();
    std::fs::write(&path, out.join("---\n")).unwrap();
}

/// The one document of `file`, edited.
fn edit_one(env: &Env, file: &str, f: impl FnOnce(&mut serde_yaml::Value)) {
    edit(env, file, |docs| f(&mut docs[0]));
}

/// `{..}` of a YAML value, for the edits below.
fn yaml(s: &str) -> serde_yaml::Value {
    serde_yaml::from_str(s).unwrap()
}

impl Env {
    async fn get_text(&self, url: &str) -> String {
        self.client
            .http
            .get(url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"))
            .text()
            .await
            .unwrap_or_default()
    }

    /// The sum of the controller's samples of `name` whose labels contain every one of `labels`.
    async fn controller_metric(&self, name: &str, labels: &[&str]) -> f64 {
        sum(
            &self.get_text(&format!("{}/metrics", self.controller)).await,
            name,
            labels,
        )
    }

    async fn proxy_metric(&self, name: &str, labels: &[&str]) -> f64 {
        sum(&self.client.metrics_text().await, name, labels)
    }

    /// The default target in `/debug/targets`.
    async fn target(&self) -> Value {
        self.client.admin_json("/debug/targets").await["default"].clone()
    }

    async fn revision(&self) -> String {
        self.target().await["policy"]["revision"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Sends `model` a short chat completion; the status and the served model.
    async fn ask(&self, model: &str) -> (u16, String) {
        let body = json!({
            "model": model,
            "messages": [{"role": "user", "content": "Hi! What is 2+2?"}],
            "max_tokens": 4,
        });
        let rsp = self
            .client
            .http
            .post(format!("{}/v1/chat/completions", self.client.base))
            .json(&body)
            .send()
            .await
            .expect("the proxy answers");
        let status = rsp.status().as_u16();
        let body: Value = rsp.json().await.unwrap_or_default();
        (
            status,
            body["model"].as_str().unwrap_or_default().to_string(),
        )
    }

    /// Requests for the model and its alias succeed.
    async fn assert_serving(&self, when: &str) {
        for model in ["glm-5.3", "default", "glm-5.3", "default"] {
            let (status, _) = self.ask(model).await;
            assert_eq!(status, 200, "a request for {model} {when}");
        }
    }

    /// Waits until something has come of a change: `evidence` holds, or the proxy's policy is
    /// no longer revision `before` (what a proxy that takes every message shows at once).
    async fn wait_reloaded<F, Fut>(&self, before: &str, what: &str, evidence: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        wait_until(what, RELOAD, || async {
            (evidence().await || self.revision().await != before).then_some(())
        })
        .await;
    }

    /// Waits for the controller to count a rejection of `kind` for `reason`.
    async fn wait_rejected(&self, before: &str, kind: &str, reason: &str) {
        let labels = [format!("kind=\"{kind}\""), format!("reason=\"{reason}\"")];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        let what = format!("the controller rejects the {kind} ({reason})");
        self.wait_reloaded(before, &what, || async {
            self.controller_metric("kinference_policy_rejected_resources_total", &labels)
                .await
                >= 1.0
        })
        .await;
    }

    /// After a break the controller rejected: requests still succeed on the same revision, the
    /// controller counts and logs it, and the proxy's `/debug/targets` says the controller serves
    /// its last good version. `needle` is a piece of the rejection message.
    async fn assert_controller_kept(&self, revision: &str, kind: &str, reason: &str, needle: &str) {
        self.assert_serving("after the break").await;
        assert_eq!(self.revision().await, revision, "the last good revision");
        let labels = [format!("kind=\"{kind}\""), format!("reason=\"{reason}\"")];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        assert!(
            self.controller_metric("kinference_policy_rejected_resources_total", &labels)
                .await
                >= 1.0
        );
        wait_until("the controller's last-good gauge", RELOAD, || async {
            (self
                .controller_metric("kinference_policy_index_last_good_parents", &[])
                .await
                >= 1.0)
                .then_some(())
        })
        .await;
        let warned = warn_lines(&self.stack.log("controller"));
        assert!(
            warned
                .iter()
                .any(|l| l.contains(kind) && l.contains(reason) && l.contains(needle)),
            "a WARN line naming {kind}, {reason} and {needle:?} in {warned:#?}"
        );
        let t = self.target().await;
        assert_eq!(t["last_good"]["kept_by"], "controller", "{t:#}");
        assert!(
            t["last_good"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(needle)),
            "{t:#}"
        );
        assert_eq!(t["ready"], true, "{t:#}");
    }

    /// After the fix: the proxy has a policy that is not `old` (or, when `old` is `None`, the
    /// same one, no longer a last good version), held for no rejection, and requests succeed.
    async fn assert_fixed(&self, old: Option<&str>) {
        wait_until("the fixed policy is served", RELOAD, || async {
            let t = self.target().await;
            let revision = t["policy"]["revision"].as_str().unwrap_or_default();
            let new = match old {
                Some(old) => !revision.is_empty() && revision != old,
                None => !revision.is_empty(),
            };
            (new && t["last_good"].is_null()).then_some(())
        })
        .await;
        wait_until("the controller's last-good gauge is 0", RELOAD, || async {
            (self
                .controller_metric("kinference_policy_index_last_good_parents", &[])
                .await
                == 0.0)
                .then_some(())
        })
        .await;
        self.assert_serving("after the fix").await;
    }
}

/// The sum of the samples of `name` (with or without labels) whose labels contain every one of
/// `labels`.
fn sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|s| l.contains(s)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The WARN lines of a JSON log.
fn warn_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            serde_json::from_str::<Value>(l).is_ok_and(|v| v["level"] == "WARN")
                || l.contains(" WARN ")
        })
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_regex_keeps_the_last_good_policy() {
    let env = start().await;
    let revision = env.revision().await;
    edit_one(&env, "classifier.yaml", |c| {
        c["spec"]["tags"][2]["regex"]["patterns"] = yaml(r#"["(unclosed"]"#);
    });
    env.wait_rejected(&revision, "InferenceClassifier", "invalid")
        .await;
    env.assert_controller_kept(&revision, "InferenceClassifier", "invalid", "regex")
        .await;
    edit_one(&env, "classifier.yaml", |c| {
        c["spec"]["tags"][2]["regex"]["patterns"] = yaml(r#"["```", "\\bdef\\b"]"#);
    });
    env.assert_fixed(Some(&revision)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_cycle_keeps_the_last_good_policy() {
    let env = start().await;
    let revision = env.revision().await;
    edit_one(&env, "policy.yaml", |p| {
        p["spec"]["aliases"] =
            yaml("[{name: default, target: fast}, {name: fast, target: default}]");
    });
    env.wait_rejected(&revision, "InferencePolicy", "invalid")
        .await;
    env.assert_controller_kept(&revision, "InferencePolicy", "invalid", "alias cycle")
        .await;
    // The fix is a new version: `fast` now names qwen-3.6-27b, and serves.
    edit_one(&env, "policy.yaml", |p| {
        p["spec"]["aliases"] =
            yaml("[{name: default, target: glm-5.3}, {name: fast, target: qwen-3.6-27b}]");
    });
    env.assert_fixed(Some(&revision)).await;
    assert_eq!(env.ask("fast").await, (200, "qwen-3.6-27b".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_naming_an_undeclared_model_keeps_the_last_good_policy() {
    let env = start().await;
    let revision = env.revision().await;
    edit_one(&env, "policy.yaml", |p| {
        p["spec"]["rules"][0]["action"]["addModels"] = yaml("[qwen-9]");
    });
    env.wait_rejected(&revision, "InferencePolicy", "not_found")
        .await;
    env.assert_controller_kept(&revision, "InferencePolicy", "not_found", "qwen-9")
        .await;
    edit_one(&env, "policy.yaml", |p| {
        p["spec"]["rules"][0]["action"]["addModels"] = yaml("[qwen-3.6-27b]");
        p["spec"]["rules"][0]["match"]["tags"][0]["minConfidence"] = yaml("0.6");
    });
    env.assert_fixed(Some(&revision)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_error_keeps_the_last_good_policy() {
    let env = start().await;
    let revision = env.revision().await;
    edit_one(&env, "policy.yaml", |p| {
        p["spec"]["models"][0]["prior"]["timePerOutputTokenMs"] = yaml("twelve");
    });
    env.wait_rejected(&revision, "InferencePolicy", "schema")
        .await;
    env.assert_controller_kept(
        &revision,
        "InferencePolicy",
        "schema",
        "timePerOutputTokenMs",
    )
    .await;
    edit_one(&env, "policy.yaml", |p| {
        p["spec"]["models"][0]["prior"]["timePerOutputTokenMs"] = yaml("13");
    });
    env.assert_fixed(Some(&revision)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pool_file_keeps_the_last_good_policy_and_its_endpoints() {
    let env = start().await;
    let revision = env.revision().await;
    let path = manifest(&env, "inferencepools.yaml");
    let pools = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    env.wait_rejected(&revision, "InferencePolicy", "not_found")
        .await;
    env.assert_controller_kept(&revision, "InferencePolicy", "not_found", "poolRef")
        .await;
    // Both models still have their endpoint.
    assert_eq!(
        env.client
            .endpoints()
            .await
            .iter()
            .filter(|e| e["ready"] == true)
            .count(),
        2
    );
    std::fs::write(&path, pools).unwrap();
    env.assert_fixed(None).await;
    assert_eq!(env.revision().await, revision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_manifest_keeps_the_last_good_policy() {
    let env = start().await;
    let revision = env.revision().await;
    let path = manifest(&env, "policy.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    // Cut at a line boundary before the models: the YAML still parses, the document lacks them.
    let cut = text.find("models:").unwrap();
    let cut = text[..cut].rfind('\n').map_or(0, |n| n + 1);
    std::fs::write(&path, &text[..cut]).unwrap();
    env.wait_rejected(&revision, "InferencePolicy", "schema")
        .await;
    env.assert_controller_kept(&revision, "InferencePolicy", "schema", "models")
        .await;
    // Written out in full again, with a change.
    std::fs::write(&path, text.replace("tieWindow: 20ms", "tieWindow: 25ms")).unwrap();
    env.assert_fixed(Some(&revision)).await;
}

impl Env {
    /// After a message the proxy refused itself: requests still succeed on the same revision, the
    /// proxy counts and logs the refusal, and `/debug/targets` says the proxy keeps its policy.
    async fn assert_proxy_kept(&self, revision: &str, reason: &str) {
        self.assert_serving("after the break").await;
        assert_eq!(self.revision().await, revision, "the last good revision");
        let label = format!("reason=\"{reason}\"");
        assert!(
            self.proxy_metric("kinference_proxy_policy_rejections_total", &[&label])
                .await
                >= 1.0
        );
        let warned = warn_lines(&self.stack.log("proxy"));
        assert!(
            warned.iter().any(|l| l.contains(reason)),
            "a WARN line naming {reason} in {warned:#?}"
        );
        let t = self.target().await;
        assert_eq!(t["last_good"]["kept_by"], "proxy", "{t:#}");
        assert_eq!(t["last_good"]["reason"], reason, "{t:#}");
        assert!(t["policy_rejections"].as_u64() >= Some(1), "{t:#}");
        assert_eq!(t["ready"], true, "{t:#}");
    }

    async fn wait_proxy_rejected(&self, before: &str, reason: &str) {
        let label = format!("reason=\"{reason}\"");
        let what = format!("the proxy refuses a policy ({reason})");
        self.wait_reloaded(before, &what, || async {
            self.proxy_metric("kinference_proxy_policy_rejections_total", &[&label])
                .await
                >= 1.0
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_policy_is_removed_by_the_controller_and_kept_by_a_working_proxy() {
    let env = start().await;
    let revision = env.revision().await;
    let path = manifest(&env, "policy.yaml");
    let policy = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    env.wait_proxy_rejected(&revision, "not_found").await;
    env.assert_proxy_kept(&revision, "not_found").await;
    // Deleting is not a fault for the controller: it counts no rejection and holds no last good.
    assert_eq!(
        env.controller_metric("kinference_policy_rejected_resources_total", &[])
            .await,
        0.0
    );
    std::fs::write(&path, policy.replace("tieWindow: 20ms", "tieWindow: 25ms")).unwrap();
    env.assert_fixed(Some(&revision)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restarted_on_an_invalid_policy_leaves_the_proxy_its_policy() {
    let mut env = start().await;
    let revision = env.revision().await;
    edit_one(&env, "policy.yaml", |p| {
        p["spec"]["aliases"] =
            yaml("[{name: default, target: fast}, {name: fast, target: default}]");
    });
    env.wait_rejected(&revision, "InferencePolicy", "invalid")
        .await;
    // A new controller has never seen a valid version: it serves the policy as invalid.
    tokio::task::block_in_place(|| env.stack.restart_controller(Duration::from_millis(200)))
        .expect("the controller restarts on its address");
    env.controller = format!("http://{}", env.stack.controller.admin);
    env.wait_proxy_rejected(&revision, "invalid").await;
    env.assert_proxy_kept(&revision, "invalid").await;
    edit_one(&env, "policy.yaml", |p| {
        p["spec"]["aliases"] = yaml("[{name: default, target: glm-5.3}]");
        p["spec"]["balancer"]["tieWindow"] = yaml("25ms");
    });
    env.assert_fixed(Some(&revision)).await;
}
