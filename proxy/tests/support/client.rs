//! A client of a proxy under test: its OpenAI listener (`base`) and its admin listener, whose
//! debug endpoints every end-to-end test reads the same way. Shared by the test crates that start
//! a proxy binary (`#[path = "support/client.rs"] mod client;`); each uses part of it.
#![allow(dead_code)]

use kinference_local::{Proxy, poll::wait_until};
use serde_json::{Value, json};
use std::time::Duration;

/// The endpoint that served a response (`x-kinference-endpoint`; empty without one).
pub fn served_by(rsp: &reqwest::Response) -> String {
    rsp.headers()
        .get("x-kinference-endpoint")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[derive(Clone)]
pub struct ProxyClient {
    pub http: reqwest::Client,
    /// `http://` and the OpenAI listener's address.
    pub base: String,
    /// `http://` and the admin listener's address.
    pub admin: String,
}

/// Starts the local stack around the proxy binary `proxy` with `opts` and waits until the proxy
/// is ready: the stack (everything stops when it is dropped) and a client of its proxy.
pub async fn start_stack(
    proxy: &'static str,
    opts: kinference_local::StackOptions,
) -> (kinference_local::Stack, ProxyClient) {
    let stack = tokio::task::spawn_blocking(move || {
        kinference_local::Stack::start(
            &kinference_local::Programs::with_proxy(std::path::Path::new(proxy)),
            &opts,
            &|_| {},
        )
    })
    .await
    .unwrap()
    .expect("the local stack starts");
    let client = ProxyClient::of(&stack.proxy);
    client.wait_ready().await;
    (stack, client)
}

impl ProxyClient {
    /// A client of `proxy`, each request bounded by a minute (a request that hangs fails the
    /// test rather than the run).
    pub fn of(proxy: &Proxy) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("a reqwest client"),
            base: format!("http://{}", proxy.listen),
            admin: format!("http://{}", proxy.admin),
        }
    }

    /// Waits until the admin listener says the proxy is ready.
    pub async fn wait_ready(&self) {
        wait_until("the proxy is ready", Duration::from_secs(30), || async {
            let rsp = self.http.get(format!("{}/ready", self.admin)).send().await;
            rsp.ok().filter(|r| r.status().is_success()).map(|_| ())
        })
        .await;
    }

    /// `GET` of an admin path, as JSON.
    pub async fn admin_json(&self, path: &str) -> Value {
        let rsp = self
            .http
            .get(format!("{}{path}", self.admin))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        rsp.json()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"))
    }

    /// `/debug/endpoints`: every endpoint the proxy knows, with its signals.
    pub async fn endpoints(&self) -> Vec<Value> {
        self.admin_json("/debug/endpoints").await["endpoints"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The endpoint `id` of `/debug/endpoints`, or `Null` while the proxy does not know it.
    pub async fn endpoint(&self, id: &str) -> Value {
        self.endpoints()
            .await
            .into_iter()
            .find(|e| e["endpoint"] == id)
            .unwrap_or(Value::Null)
    }

    /// Waits until the endpoint's precise prefix index (fed by its vLLM KV events) holds at least
    /// `blocks` blocks; returns the endpoint's record then.
    pub async fn wait_for_blocks_held(&self, endpoint: &str, blocks: u64) -> Value {
        wait_until(
            &format!("{endpoint}'s precise index holds {blocks} blocks"),
            Duration::from_secs(20),
            || async {
                let e = self.endpoint(endpoint).await;
                (e["kv_events"]["blocks_held"].as_u64().unwrap_or(0) >= blocks).then_some(e)
            },
        )
        .await
    }

    /// Sends `body` to `/v1/chat/completions` with `x-request-id: request_id`.
    pub async fn post_chat(&self, body: &Value, request_id: &str) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/chat/completions", self.base))
            .header("x-request-id", request_id)
            .json(body)
            .send()
            .await
            .expect("the proxy answers")
    }

    /// The admin listener's Prometheus exposition.
    pub async fn metrics_text(&self) -> String {
        let rsp = self
            .http
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
        rsp.text().await.expect("GET /metrics: a body")
    }

    /// The sum of the samples of metric `name` whose labels contain every one of `labels`.
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics_text()
            .await
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| labels.iter().all(|s| l.contains(s)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// `POST /debug/classify` of one user message `content` asking for `model`: its tags and
    /// the candidate models the policy allows for it.
    pub async fn classify(&self, model: &str, content: &str) -> Value {
        let body = json!({"model": model, "messages": [{"role": "user", "content": content}]});
        let rsp = self
            .http
            .post(format!("{}/debug/classify", self.admin))
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST /debug/classify: {e}"));
        rsp.json()
            .await
            .unwrap_or_else(|e| panic!("POST /debug/classify: not JSON: {e}"))
    }

    /// The decision record of the request sent with `x-request-id: request_id`.
    pub async fn decision(&self, request_id: &str) -> Value {
        self.admin_json(&format!("/debug/decisions?request_id={request_id}"))
            .await
            .get(0)
            .cloned()
            .unwrap_or_else(|| panic!("no decision record for {request_id}"))
    }
}
