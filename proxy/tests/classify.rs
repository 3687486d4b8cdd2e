//! Declared classifier tags end to end over real processes on loopback: the controller on a copy
//! of `examples/`, simulated vLLM replicas and the proxy binary (the stack `e2e.rs` starts), with
//! the copied classifier and policy rewritten while the stack runs (the controller watches its
//! manifest directory).
//!
//! - an exemplars tag drives a policy rule: its value shows on `/debug/classify`, in the
//!   candidates, and in the request's decision record;
//! - an external classifier on a loopback HTTP server that holds its answer: requests are still
//!   answered, with the declared fallback value, while the classifier has not answered; once it
//!   answers promptly, its value is used.
//!
//! No assertion depends on timing: "answered within budget" is shown causally, by the proxy
//! answering while the classifier server still holds every answer.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
#[path = "support/client.rs"]
mod client;

use client::ProxyClient;
use kinference_local::{Programs, Stack, StackOptions, poll::wait_until};
use serde_json::{Value, json};
use std::{
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::sync::Notify;

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");

/// The model every request here asks for.
const MODEL: &str = "glm-5.3";

const BILLING: &str = "I think I was charged twice on my last invoice, can I get a refund?";
const OUTAGE: &str = "Requests to the API are timing out and returning 503 errors";

struct Env {
    stack: Stack,
    client: ProxyClient,
}

/// The stack's proxy is the one the tests talk to: `env.decision(..)`, `env.base`.
impl std::ops::Deref for Env {
    type Target = ProxyClient;
    fn deref(&self) -> &ProxyClient {
        &self.client
    }
}

async fn start() -> Env {
    let opts = StackOptions {
        replicas: vec![("glm-5.3".into(), 1), ("qwen-3.6-27b".into(), 1)],
        time_scale: 0.2,
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
        stack,
    };
    env.wait_ready().await;
    env
}

impl Env {
    /// Rewrites the copied manifest `file` (every document of `kind` through `f`), atomically.
    fn rewrite(&self, file: &str, kind: &str, f: impl Fn(&mut serde_yaml::Value)) {
        let path = self.stack.manifests.path().join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut out = String::new();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut doc = <serde_yaml::Value as serde::Deserialize>::deserialize(doc).unwrap();
            if doc.is_null() {
                continue;
            }
            if doc["kind"] == kind {
                f(&mut doc);
            }
            out.push_str("---\n");
            out.push_str(&serde_yaml::to_string(&doc).unwrap());
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, out).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    /// Adds tags to the classifier the example policy names.
    fn add_tags(&self, tags: Value) {
        let tags: serde_yaml::Value = serde_json::from_value(tags).unwrap();
        self.rewrite("classifier.yaml", "InferenceClassifier", |doc| {
            doc["spec"]["tags"]
                .as_sequence_mut()
                .unwrap()
                .extend(tags.as_sequence().unwrap().iter().cloned());
        });
    }

    /// The explanation of tag `name` for `content`, once the proxy computes it.
    async fn wait_for_tag(&self, name: &str, content: &str) -> Value {
        wait_until(
            &format!("the proxy computes tag {name}"),
            Duration::from_secs(30),
            || async {
                let v = self.classify(MODEL, content).await;
                tag(&v, name).cloned()
            },
        )
        .await
    }

    /// Sends a chat request; returns the status and the answer.
    async fn chat(&self, content: &str, id: &str) -> (u16, Value) {
        let body = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 4,
        });
        let rsp = self.post_chat(&body, id).await;
        let status = rsp.status().as_u16();
        (status, rsp.json().await.unwrap_or_default())
    }
}

/// The explanation of tag `name` in a `/debug/classify` answer.
fn tag<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v["explanation"]["tags"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == name)
}

/// The (value, confidence) of tag `name` in a decision record.
fn recorded(decision: &Value, name: &str) -> Option<(String, f64)> {
    decision["tags"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == name)
        .map(|t| {
            (
                t["value"].as_str().unwrap().to_string(),
                t["confidence"].as_f64().unwrap(),
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exemplar_tag_drives_a_policy_rule() {
    let env = start().await;
    env.add_tags(json!([{
        "name": "topic",
        "exemplars": {"k": 3, "minSimilarity": 0.2, "values": [
            {"value": "billing", "examples": [
                "I was charged twice on my invoice this month",
                "How do I update the credit card used for billing?",
                "Request a refund for the last invoice",
            ]},
            {"value": "outage", "examples": [
                "The service is down and returns 503 errors",
                "Our dashboard has been unreachable since this morning",
                "API requests are timing out in eu-west",
            ]},
        ]},
    }]));
    let t = env.wait_for_tag("topic", BILLING).await;
    assert_eq!(t["value"], "billing", "{t}");
    assert_eq!(t["source"]["kind"], "exemplars", "{t}");
    assert!(t["confidence"].as_f64().unwrap() > 0.0, "{t}");
    let v = env.classify(MODEL, OUTAGE).await;
    assert_eq!(tag(&v, "topic").unwrap()["value"], "outage", "{v}");
    // The only rule: billing prompts may also go to qwen-3.6-27b.
    env.rewrite("policy.yaml", "InferencePolicy", |doc| {
        let rule = json!({
            "name": "billing-may-use-qwen",
            "match": {"models": ["glm-5.3", "default"], "tags": [{"name": "topic", "values": ["billing"]}]},
            "action": {"addModels": ["qwen-3.6-27b"]},
        });
        doc["spec"]["rules"] = serde_json::from_value(json!([rule])).unwrap();
    });
    let v = wait_until(
        "the policy with the topic rule is served",
        Duration::from_secs(30),
        || async {
            let v = env.classify(MODEL, BILLING).await;
            (v["candidates"]["models"] == json!(["glm-5.3", "qwen-3.6-27b"])).then_some(v)
        },
    )
    .await;
    assert_eq!(tag(&v, "topic").unwrap()["value"], "billing");
    let v = env.classify(MODEL, OUTAGE).await;
    assert_eq!(v["candidates"]["models"], json!(["glm-5.3"]), "{v}");

    // Requests through the proxy: the tag and the rule's effect are in the decision records.
    let (status, _) = env.chat(BILLING, "billing-1").await;
    assert_eq!(status, 200);
    let d = env.decision("billing-1").await;
    assert_eq!(
        recorded(&d, "topic").map(|t| t.0),
        Some("billing".into()),
        "{d}"
    );
    assert_eq!(
        d["candidate_models"],
        json!(["glm-5.3", "qwen-3.6-27b"]),
        "{d}"
    );
    let (status, _) = env.chat(OUTAGE, "outage-1").await;
    assert_eq!(status, 200);
    let d = env.decision("outage-1").await;
    assert_eq!(
        recorded(&d, "topic").map(|t| t.0),
        Some("outage".into()),
        "{d}"
    );
    assert_eq!(d["candidate_models"], json!(["glm-5.3"]), "{d}");
    let trace = |d: &Value| d["rule_trace"][0]["matched"].clone();
    assert_eq!(trace(&d), false, "{d}");
    assert_eq!(trace(&env.decision("billing-1").await), true);
}

/// A loopback classifier that answers `{"value": "legal", "confidence": 0.9}`, holding every
/// answer until released while `hold` is set.
struct SlowClassifier {
    addr: SocketAddr,
    hold: Arc<AtomicBool>,
    release: Arc<Notify>,
    received: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
}

async fn slow_classifier() -> SlowClassifier {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = SlowClassifier {
        addr: listener.local_addr().unwrap(),
        hold: Arc::new(AtomicBool::new(true)),
        release: Arc::new(Notify::new()),
        received: Arc::default(),
        answered: Arc::default(),
    };
    let (hold, release, received, answered) = (
        c.hold.clone(),
        c.release.clone(),
        c.received.clone(),
        c.answered.clone(),
    );
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (hold, release, received, answered) = (
                hold.clone(),
                release.clone(),
                received.clone(),
                answered.clone(),
            );
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (hold, release, received, answered) = (
                        hold.clone(),
                        release.clone(),
                        received.clone(),
                        answered.clone(),
                    );
                    async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let asked: Value = serde_json::from_slice(&body).unwrap();
                        assert_eq!(asked["tag"], "domain");
                        received.fetch_add(1, Ordering::SeqCst);
                        if hold.load(Ordering::SeqCst) {
                            release.notified().await;
                        }
                        answered.fetch_add(1, Ordering::SeqCst);
                        let answer = json!({"value": "legal", "confidence": 0.9}).to_string();
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(answer))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_external_classifier_never_holds_a_request() {
    let classifier = slow_classifier().await;
    let env = start().await;
    env.add_tags(json!([{
        "name": "domain",
        "external": {
            "url": format!("http://{}/classify", classifier.addr),
            "timeout": "200ms",
            "values": ["legal", "general"],
            "fallback": "general",
            "fallbackConfidence": 0.3,
        },
    }]));

    // While the classifier holds its answers, every tag is the declared fallback.
    let t = env
        .wait_for_tag("domain", "Summarise the attached contract.")
        .await;
    assert_eq!(t["value"], "general", "{t}");
    assert!(
        (t["confidence"].as_f64().unwrap() - 0.3).abs() < 1e-6,
        "{t}"
    );
    assert_eq!(
        t["source"],
        json!({"kind": "external-fallback", "detail": "timeout"}),
        "{t}"
    );
    let (status, answer) = env.chat("Summarise the attached contract.", "late-1").await;
    assert_eq!(status, 200, "{answer}");
    // The proxy asked, and answered the request while the classifier still held every answer.
    assert!(classifier.received.load(Ordering::SeqCst) >= 2);
    assert_eq!(classifier.answered.load(Ordering::SeqCst), 0);
    let d = env.decision("late-1").await;
    let (value, confidence) = recorded(&d, "domain").unwrap();
    assert_eq!(value, "general", "{d}");
    assert!((confidence - 0.3).abs() < 1e-6, "{d}");

    // Once the classifier answers promptly, its value is used.
    classifier.hold.store(false, Ordering::SeqCst);
    classifier.release.notify_waiters();
    let (status, _) = env
        .chat("Summarise the attached contract.", "prompt-1")
        .await;
    assert_eq!(status, 200);
    let d = env.decision("prompt-1").await;
    let (value, confidence) = recorded(&d, "domain").unwrap();
    assert_eq!(value, "legal", "{d}");
    assert!((confidence - 0.9).abs() < 1e-6, "{d}");
    let v = env
        .classify(MODEL, "Summarise the attached contract.")
        .await;
    assert_eq!(
        tag(&v, "domain").unwrap()["source"],
        json!({"kind": "external"}),
        "{v}"
    );
}
