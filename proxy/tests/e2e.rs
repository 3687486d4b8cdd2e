//! End-to-end tests over real processes on loopback: the policy controller on a copy of
//! `examples/` rewritten to the simulators' ports, simulated vLLM replicas (`vllm-sim`), and the
//! proxy binary, driven by a Rust HTTP client (and the OpenAI Python SDK in `openai_sdk.rs`).
//!
//! The stack is the one `kinference-local` runs: the replicas publish vLLM KV events and the pools
//! are annotated for them, so the proxy routes on its precise prefix index.
//!
//! The controller and simulator binaries come from the Cargo target directory and are built with
//! `cargo build` first when missing (see `kinference_local::program`). Every wait is a bounded poll
//! for a condition, never a sleep that hopes.

#[path = "support/client.rs"]
mod client;

use client::ProxyClient;
use kinference_local::{Programs, Stack, StackOptions, poll::wait_until};
use kinference_proxy_signals::{PromptRef, Tokenizer};
use serde_json::{Value, json};
use std::{ops::Deref, path::Path, time::Duration};

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");

/// A short prompt, for tests where its tags do not matter.
const HI: &str = "Hi! What is 2+2?";

/// Low-complexity prompts: the first the running classifier tags complexity=low (confidence >= 0.5)
/// is used, so the tests follow the classifier's model as it is retrained.
const LOW_CANDIDATES: &[&str] = &[
    "Translate 'good morning' into Spanish.",
    "Hi! What is 2+2?",
    "What is the capital of France?",
    "Say hello.",
];
/// Prompts the example policy should keep on glm-5.3 (not complexity=low with confidence 0.5).
const HIGH_CANDIDATES: &[&str] = &[
    "Design a distributed consensus protocol tolerant to Byzantine faults for a geo-replicated \
     database; derive its message complexity, prove safety and liveness under partial synchrony, and \
     compare it with PBFT and HotStuff in latency and throughput.",
    "Let f: R -> R satisfy f(x+y) = f(x) + f(y) for all real x, y. Prove that every measurable \
     solution is linear, then construct a non-linear solution from a Hamel basis, and explain \
     precisely where the axiom of choice is used. Finally, generalise the result to Banach spaces \
     and discuss which steps fail without completeness.",
    "Implement a lock-free multi-producer multi-consumer queue in Rust with atomics:\n\n```rust\n\
     pub struct Queue<T> { head: AtomicPtr<Node<T>>, tail: AtomicPtr<Node<T>> }\n```\n\n\
     Explain the memory ordering of every load, store and compare-exchange, prove linearizability, \
     analyse the ABA problem and hazard-pointer reclamation, and write loom tests for each race.",
    "Compute \\int_0^\\infty \\frac{\\sin^3 x}{x^3} dx step by step: justify every interchange of \
     limit and integral with the dominated convergence theorem, evaluate the resulting series in \
     closed form, verify the value numerically to six decimal places, and prove the error bound of \
     your quadrature.",
];

struct Env {
    stack: Stack,
    client: ProxyClient,
}

/// The stack's proxy is the one the tests talk to: `env.decision(..)`, `env.base`.
impl Deref for Env {
    type Target = ProxyClient;
    fn deref(&self) -> &ProxyClient {
        &self.client
    }
}

async fn start(opts: StackOptions, patch: fn(&mut serde_yaml::Value)) -> Env {
    let stack = tokio::task::spawn_blocking(move || {
        Stack::start(&Programs::with_proxy(Path::new(PROXY)), &opts, &patch)
    })
    .await
    .unwrap()
    .expect("the local stack starts");
    let env = Env {
        client: ProxyClient::of(&stack.proxy),
        stack,
    };
    let n = env.stack.sims.len();
    wait_until(
        "every endpoint discovered with fresh signals",
        Duration::from_secs(30),
        || async {
            let eps = env.endpoints().await;
            let ready = eps
                .iter()
                .filter(|e| e["ready"] == true && !e["signals"]["num_requests_waiting"].is_null())
                .count();
            (ready == n).then_some(())
        },
    )
    .await;
    env.wait_for_kv_events().await;
    env
}

struct Rsp {
    status: u16,
    headers: reqwest::header::HeaderMap,
    text: String,
}

impl Rsp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
    /// The SSE `data:` payloads.
    fn events(&self) -> Vec<String> {
        self.text
            .split("\n\n")
            .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

impl Env {
    async fn post(&self, path: &str, body: &Value, request_id: Option<&str>) -> Rsp {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(id) = request_id {
            req = req.header("x-request-id", id);
        }
        let rsp = req.send().await.expect("the proxy answers");
        Rsp {
            status: rsp.status().as_u16(),
            headers: rsp.headers().clone(),
            text: rsp.text().await.unwrap_or_default(),
        }
    }

    async fn chat(
        &self,
        model: &str,
        content: &str,
        max_tokens: u32,
        stream: bool,
        id: &str,
    ) -> Rsp {
        let body = json!({
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": stream,
        });
        self.post("/v1/chat/completions", &body, Some(id)).await
    }

    /// Waits until a KV-event batch from every replica has reached the proxy. A ZMQ subscriber
    /// joins its publisher some time after connecting and misses what was published before, so
    /// until a batch has arrived from a replica, a one-token request straight to it (bypassing
    /// the proxy) makes it publish again.
    async fn wait_for_kv_events(&self) {
        for (n, sim) in self.stack.sims.iter().enumerate() {
            let port = sim
                .kv_events_port
                .expect("the stack's replicas publish KV events");
            let id = sim.addr.to_string();
            wait_until(
                "a KV-event batch from each replica",
                Duration::from_secs(30),
                || async {
                    let e = self.endpoint(&id).await;
                    let kv = &e["kv_events"];
                    assert_eq!(kv["publisher"], format!("tcp://127.0.0.1:{port}"), "{e}");
                    assert_eq!(kv["precise"], true, "{e}");
                    if kv["batches"].as_u64().unwrap_or(0) > 0 {
                        return Some(());
                    }
                    let _ = self
                        .http
                        .post(format!("http://{id}/v1/completions"))
                        .json(&json!({
                            "model": sim.model,
                            // At least one full block: only full blocks are stored and published.
                            "prompt": format!("warm-up {n} {}", "some words to fill a block ".repeat(8)),
                            "max_tokens": 1,
                        }))
                        .send()
                        .await;
                    None
                },
            )
            .await;
        }
    }

    fn sims_of(&self, model: &str) -> Vec<String> {
        self.stack
            .sims
            .iter()
            .filter(|s| s.model == model)
            .map(|s| s.addr.to_string())
            .collect()
    }

    /// Sets a simulator's faults (`POST /sim/faults`).
    async fn faults(&self, sim: &str, faults: Value) {
        let rsp = self
            .http
            .post(format!("http://{sim}/sim/faults"))
            .json(&faults)
            .send()
            .await
            .unwrap();
        assert!(rsp.status().is_success(), "{}", rsp.text().await.unwrap());
    }

    /// Sends `n` long requests straight to a simulator (bypassing the proxy) to load it.
    fn load_directly(&self, sim: &str, model: &str, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
        (0..n)
            .map(|i| {
                let http = self.http.clone();
                let url = format!("http://{sim}/v1/completions");
                let prompt = format!("{i} {}", "load generating text ".repeat(1500));
                let model = model.to_string();
                tokio::spawn(async move {
                    let _ = http
                        .post(url)
                        .json(&json!({"model": model, "prompt": prompt, "max_tokens": 400}))
                        .send()
                        .await;
                })
            })
            .collect()
    }
}

impl Env {
    /// The first of `candidates` that the policy, with the running classifier, allows `models` for.
    async fn pick(&self, candidates: &[&'static str], models: Value) -> &'static str {
        let mut seen = Vec::new();
        for prompt in candidates {
            let v = self.classify("glm-5.3", prompt).await;
            if v["candidates"]["models"] == models {
                return prompt;
            }
            seen.push(v["explanation"]["tags"].clone());
        }
        panic!(
            "the classifier gives none of the candidate prompts candidate models {models}: {seen:?}"
        )
    }

    async fn low(&self) -> &'static str {
        self.pick(LOW_CANDIDATES, json!(["glm-5.3", "qwen-3.6-27b"]))
            .await
    }

    async fn high(&self) -> &'static str {
        self.pick(HIGH_CANDIDATES, json!(["glm-5.3"])).await
    }
}

fn chosen(decision: &Value) -> &Value {
    let d = &decision["decision"];
    &d["candidates"][d["chosen"].as_u64().expect("a chosen candidate") as usize]
}

fn opts(time_scale: f64) -> StackOptions {
    StackOptions {
        time_scale,
        ..StackOptions::default()
    }
}

fn no_patch(_: &mut serde_yaml::Value) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_requests_stream_non_stream_and_every_error() {
    let env = start(
        StackOptions {
            proxy_args: vec!["--body-limit-bytes".into(), "8192".into()],
            ..opts(10.0)
        },
        no_patch,
    )
    .await;

    // /v1/models from policy: models, then aliases.
    let models: Value = env
        .http
        .get(format!("{}/v1/models", env.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["glm-5.3", "qwen-3.6-27b", "default"]);

    // Non-stream chat: the request id is kept, usage reported, the policy keeps it on glm-5.3.
    let r = env
        .chat("qwen-3.6-27b", HI, 4, false, "e2e-nonstream-1")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("x-request-id"), "e2e-nonstream-1");
    let v = r.json();
    assert_eq!(v["model"], "qwen-3.6-27b");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    let d = env.decision("e2e-nonstream-1").await;
    // No rule adds a model to requests for qwen-3.6-27b.
    assert_eq!(d["candidate_models"], json!(["qwen-3.6-27b"]));
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1);
    assert!(
        env.sims_of("qwen-3.6-27b")
            .contains(&r.header("x-kinference-endpoint").to_string())
    );

    // Streaming completion through the alias: `model` rewritten to the served name.
    let body = json!({"model": "default", "prompt": HI, "max_tokens": 5, "stream": true,
                      "stream_options": {"include_usage": true}});
    let r = env.post("/v1/completions", &body, None).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.header("content-type").starts_with("text/event-stream"));
    assert_eq!(r.header("x-request-id").len(), 32, "a request id is made");
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    // The completion prompt is classified on its own: either model may serve it, named as served.
    let served = if env
        .sims_of("glm-5.3")
        .contains(&r.header("x-kinference-endpoint").to_string())
    {
        "glm-5.3"
    } else {
        "qwen-3.6-27b"
    };
    assert!(chunks.iter().all(|c| c["model"] == served), "{chunks:?}");
    let usage = chunks
        .iter()
        .find(|c| !c["usage"].is_null())
        .expect("a usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    // The proxy saw the stream's first token and its usage.
    let ttft = env
        .metric(
            "kinference_proxy_ttft_seconds_count",
            &["requested_model=\"glm-5.3\""],
        )
        .await;
    assert!(ttft >= 1.0, "TTFT observed: {ttft}");
    let completion = env
        .metric("kinference_proxy_completion_tokens_total", &[])
        .await;
    assert_eq!(completion, 9.0, "4 + 5 completion tokens");

    // HTTP/2 cleartext on the same port.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let rsp = h2
        .post(format!("{}/v1/chat/completions", env.base))
        .json(&json!({"model": "qwen-3.6-27b", "messages": [{"role": "user", "content": HI}], "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(rsp.version(), reqwest::Version::HTTP_2);
    assert_eq!(rsp.status(), 200);

    // Every bad input gets its OpenAI error.
    let raw = |path: &str, ct: &str, body: String| {
        let http = env.http.clone();
        let url = format!("{}{path}", env.base);
        let ct = ct.to_string();
        async move {
            let rsp = http
                .post(url)
                .header("content-type", ct)
                .body(body)
                .send()
                .await
                .unwrap();
            let status = rsp.status().as_u16();
            let v: Value = rsp.json().await.unwrap();
            (status, v)
        }
    };
    let (s, v) = raw("/v1/chat/completions", "application/json", "{".into()).await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    let (s, v) = raw(
        "/v1/chat/completions",
        "application/json",
        r#"{"model":"glm-5.3"}"#.into(),
    )
    .await;
    assert_eq!((s, v["error"]["param"].as_str()), (400, Some("messages")));
    let (s, v) = raw(
        "/v1/chat/completions",
        "application/json",
        json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).to_string(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    let (s, v) = raw("/v1/chat/completions", "text/plain", "hello".into()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (415, Some("unsupported_media_type"))
    );
    let big =
        json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "x".repeat(9000)}]});
    let (s, v) = raw("/v1/chat/completions", "application/json", big.to_string()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (413, Some("request_too_large"))
    );
    let rsp = env
        .http
        .get(format!("{}/v1/chat/completions", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(rsp.status(), 405);
    let v: Value = rsp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "method_not_allowed");
    let rsp = env
        .http
        .get(format!("{}/nope", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(rsp.status(), 404);
    for status in ["400", "404", "405", "413", "415"] {
        let n = env
            .metric(
                "kinference_proxy_errors_total",
                &[&format!("status=\"{status}\"")],
            )
            .await;
        assert!(n >= 1.0, "errors with status {status} counted: {n}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_complexity_goes_to_qwen_when_faster_high_complexity_never() {
    // The shipped examples as they are: the classifier's family rule and the example rule's
    // confidence floor decide which everyday prompts may go to qwen-3.6-27b.
    let env = start(opts(5.0), no_patch).await;
    // Prompts the running classifier and the example policy treat as low and high complexity.
    let (low, high) = (env.low().await, env.high().await);
    for (prompt, models) in [
        (low, json!(["glm-5.3", "qwen-3.6-27b"])),
        (high, json!(["glm-5.3"])),
    ] {
        let v = env.classify("glm-5.3", prompt).await;
        assert_eq!(v["candidates"]["models"], models, "{v}");
    }

    // Load glm-5.3 through the proxy with long high-complexity prompts (they must stay on glm).
    let long_high = format!(
        "{high} {}",
        "Consider every failure case in detail. ".repeat(600)
    );
    let mut load = Vec::new();
    for i in 0..12 {
        let http = env.http.clone();
        let url = format!("{}/v1/chat/completions", env.base);
        let body = json!({"model": "glm-5.3", "messages": [{"role": "user", "content": format!("{i} {long_high}")}], "max_tokens": 300});
        load.push(tokio::spawn(async move {
            let rsp = http.post(url).json(&body).send().await.unwrap();
            let status = rsp.status().as_u16();
            let v: Value = rsp.json().await.unwrap_or_default();
            (status, v["model"].as_str().unwrap_or("").to_string())
        }));
    }
    // The proxy counts its own in-flight prefill at once: wait until glm shows it.
    wait_until(
        "glm-5.3 endpoints carry the load",
        Duration::from_secs(20),
        || async {
            let eps = env.endpoints().await;
            let busy = eps
                .iter()
                .filter(|e| {
                    e["model"] == "glm-5.3" && e["own_pending_requests"].as_u64().unwrap_or(0) >= 3
                })
                .count();
            (busy == 2).then_some(())
        },
    )
    .await;

    let r = env.chat("glm-5.3", low, 2, true, "e2e-low-1").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let d = env.decision("e2e-low-1").await;
    let winner = chosen(&d);
    assert_eq!(winner["model"], "qwen-3.6-27b", "{d}");
    let best_glm = d["decision"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["model"] == "glm-5.3")
        .map(|c| c["prediction"]["predicted_ttft_s"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert!(
        winner["prediction"]["predicted_ttft_s"].as_f64().unwrap() < best_glm,
        "{d}"
    );
    // Served by qwen, with `model` rewritten for it.
    let first: Value = serde_json::from_str(&r.events()[0]).unwrap();
    assert_eq!(first["model"], "qwen-3.6-27b");
    assert!(
        env.sims_of("qwen-3.6-27b")
            .contains(&r.header("x-kinference-endpoint").to_string())
    );

    // A high-complexity prompt never goes to qwen, however loaded glm is.
    for i in 0..3 {
        let id = format!("e2e-high-{i}");
        let r = env.chat("glm-5.3", high, 2, false, &id).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.json()["model"], "glm-5.3");
        let d = env.decision(&id).await;
        assert_eq!(d["candidate_models"], json!(["glm-5.3"]));
        assert!(
            d["decision"]["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["model"] == "glm-5.3")
        );
    }
    for l in load {
        let (status, model) = l.await.unwrap();
        assert_eq!((status, model.as_str()), (200, "glm-5.3"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompt_returns_to_its_prefix_unless_another_is_faster_and_saturation_is_avoided() {
    let env = start(opts(5.0), no_patch).await;
    let prefix = "You are a careful assistant. Here is the shared context document. ".repeat(150);
    let ask = |n: usize| format!("{prefix}\nQuestion {n}: summarise it.");
    let r = env
        .chat("qwen-3.6-27b", &ask(0), 2, true, "e2e-prefix-0")
        .await;
    assert_eq!(r.status, 200);
    let holder = r.header("x-kinference-endpoint").to_string();
    let other = env
        .sims_of("qwen-3.6-27b")
        .into_iter()
        .find(|s| *s != holder)
        .unwrap();
    // The holder's KV events reach the proxy: its precise index holds the shared prefix's blocks
    // (the pool's tokenizer contract counts them as the replica fills them).
    let t = Tokenizer::KinferenceSim;
    let turns = [("user", prefix.as_str())];
    let prefix_blocks = t
        .block_hashes(&t.tokens(PromptRef::Chat(&turns)).unwrap(), 16)
        .len() as u64;
    assert!(prefix_blocks > 60, "{prefix_blocks}");
    let e = env.wait_for_blocks_held(&holder, prefix_blocks).await;
    assert_eq!(e["kv_events"]["precise"], true, "{e}");
    assert_eq!(e["kv_events"]["tokenizer"], "kinference-sim", "{e}");
    for n in 1..4 {
        let id = format!("e2e-prefix-{n}");
        let r = env.chat("qwen-3.6-27b", &ask(n), 2, true, &id).await;
        assert_eq!(r.status, 200);
        let d = env.decision(&id).await;
        let w = chosen(&d);
        assert_eq!(w["endpoint"], holder.as_str(), "{d}");
        // The repeat's overlap comes from the holder's KV events, and covers the prefix; every
        // endpoint (each has sent a batch) is scored on its precise index.
        assert_eq!(w["prediction"]["prefix_source"], "precise", "{d}");
        assert!(
            d["decision"]["candidates"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["prediction"]["prefix_source"] == "precise"),
            "{d}"
        );
        assert!(
            w["prediction"]["cached_tokens"].as_u64().unwrap() >= (prefix_blocks - 1) * 16,
            "{d}"
        );
        assert_eq!(r.header("x-kinference-endpoint"), holder);
    }

    // Saturate the prefix holder directly: its queue, scraped, makes the other endpoint faster.
    // A queue deep enough that waiting behind it costs more than the other endpoint's prefill of
    // the whole prompt plus the cost the routing core charges for duplicating the prefix there
    // (about 0.1 s of wait a queued request here, against about 2 s: at 12 queued the holder
    // still wins on a loaded machine).
    let load = env.load_directly(&holder, "qwen-3.6-27b", 64);
    wait_until(
        "the holder reports a deep queue",
        Duration::from_secs(20),
        || async {
            let eps = env.endpoints().await;
            eps.iter()
                .find(|e| e["endpoint"] == holder.as_str())
                .and_then(|e| e["signals"]["num_requests_waiting"]["value"].as_u64())
                .filter(|w| *w >= 30)
        },
    )
    .await;
    for n in 4..8 {
        let id = format!("e2e-prefix-{n}");
        let r = env.chat("qwen-3.6-27b", &ask(n), 2, true, &id).await;
        assert_eq!(r.status, 200);
        let d = env.decision(&id).await;
        let w = chosen(&d);
        assert_eq!(
            w["endpoint"],
            other.as_str(),
            "the saturated holder is avoided: {d}"
        );
        let cands = d["decision"]["candidates"].as_array().unwrap();
        let h = cands
            .iter()
            .find(|c| c["endpoint"] == holder.as_str())
            .unwrap();
        assert!(
            h["prediction"]["cached_tokens"].as_u64().unwrap() > 0,
            "the holder still holds it"
        );
        assert!(
            h["prediction"]["predicted_ttft_s"].as_f64().unwrap()
                > w["prediction"]["predicted_ttft_s"].as_f64().unwrap()
        );
    }
    for l in load {
        l.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_killed_under_load_costs_no_hung_request() {
    let mut env = start(opts(5.0), no_patch).await;
    let mut reqs = Vec::new();
    for i in 0..16 {
        let http = env.http.clone();
        let url = format!("{}/v1/chat/completions", env.base);
        let body = json!({"model": "qwen-3.6-27b", "stream": i % 2 == 0, "max_tokens": 200,
                          "messages": [{"role": "user", "content": format!("{i} {}", "tell me a story ".repeat(200))}]});
        reqs.push(tokio::spawn(async move {
            let rsp = http.post(url).json(&body).send().await.unwrap();
            let status = rsp.status().as_u16();
            let text = rsp.text().await.unwrap_or_default();
            (status, text)
        }));
    }
    wait_until(
        "qwen endpoints are busy",
        Duration::from_secs(20),
        || async {
            let pending: u64 = env
                .endpoints()
                .await
                .iter()
                .filter(|e| e["model"] == "qwen-3.6-27b")
                .filter_map(|e| e["own_pending_requests"].as_u64())
                .sum();
            (pending >= 8).then_some(())
        },
    )
    .await;
    let victim = env
        .stack
        .sims
        .iter()
        .position(|s| s.model == "qwen-3.6-27b")
        .unwrap();
    let victim_addr = env.stack.sims[victim].addr.to_string();
    env.stack.sims[victim].proc.kill();
    // Every request is answered, none hangs: completed, or ended with an error status/event.
    let answered = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(reqs))
        .await
        .expect("no request hangs");
    let mut ok = 0;
    for r in answered {
        let (status, text) = r.unwrap();
        if status == 200 && !text.contains("\"error\"") {
            ok += 1;
        } else {
            assert!(
                status >= 400 || text.contains("upstream_stream_failed"),
                "{status} {text}"
            );
        }
    }
    assert!(ok >= 1, "requests to the surviving endpoint complete");
    // New requests go to the survivor (a refused connection is retried on the next-best).
    for i in 0..4 {
        let id = format!("e2e-after-kill-{i}");
        let r = env.chat("qwen-3.6-27b", HI, 2, false, &id).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_ne!(r.header("x-kinference-endpoint"), victim_addr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restart_loses_no_request() {
    let mut env = start(opts(10.0), no_patch).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let http = env.http.clone();
    let url = format!("{}/v1/chat/completions", env.base);
    let client = tokio::spawn(async move {
        let mut statuses = Vec::new();
        while !*stop_rx.borrow() {
            let rsp = http
                .post(&url)
                .json(&json!({"model": "glm-5.3", "max_tokens": 2, "messages": [{"role": "user", "content": HI}]}))
                .send()
                .await;
            statuses.push(rsp.map(|r| r.status().as_u16()).unwrap_or(0));
        }
        statuses
    });
    // Down for two seconds, then back on the same address.
    tokio::task::block_in_place(|| env.stack.restart_controller(Duration::from_secs(2)))
        .expect("the controller restarts on its address");
    // Requests keep flowing after it is back.
    let before = env.metric("kinference_proxy_requests_total", &[]).await;
    wait_until(
        "requests served after the restart",
        Duration::from_secs(20),
        || async {
            (env.metric("kinference_proxy_requests_total", &[]).await >= before + 5.0).then_some(())
        },
    )
    .await;
    stop_tx.send_replace(true);
    let statuses = client.await.unwrap();
    assert!(statuses.len() >= 5, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every request served: {statuses:?}"
    );
}

fn fail_close(doc: &mut serde_yaml::Value) {
    doc["spec"]["balancer"]["failureMode"] = "FailClose".into();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_metrics_trigger_the_counted_fallback() {
    let env = start(opts(10.0), no_patch).await;
    for sim in env.stack.sims.iter().map(|s| s.addr.to_string()) {
        env.faults(&sim, json!({"metrics": "unavailable"})).await;
    }
    // The freshness budget of examples/policy.yaml is 500ms.
    wait_until(
        "glm signals older than the budget",
        Duration::from_secs(20),
        || async {
            let eps = env.endpoints().await;
            eps.iter()
                .filter(|e| e["model"] == "glm-5.3")
                .all(|e| {
                    e["signals"]["num_requests_waiting"]["age_s"]
                        .as_f64()
                        .unwrap_or(0.0)
                        > 0.6
                })
                .then_some(())
        },
    )
    .await;
    let r = env.chat("glm-5.3", HI, 2, false, "e2e-stale-open").await;
    assert_eq!(r.status, 200, "FailOpen routes anyway: {}", r.text);
    let d = env.decision("e2e-stale-open").await;
    assert_eq!(d["decision"]["reason"]["kind"], "fallback_stale_signals");
    assert!(chosen(&d)["p2c"].is_object(), "chosen by power-of-two: {d}");
    let n = env
        .metric(
            "kinference_proxy_fallbacks_total",
            &["reason=\"stale_signals\"", "failure_mode=\"fail_open\""],
        )
        .await;
    assert_eq!(n, 1.0);
    assert!(
        env.metric(
            "kinference_proxy_stale_signals_total",
            &["model=\"glm-5.3\""]
        )
        .await
            >= 2.0
    );

    // The same policy with FailClose (the controller reloads its directory): refused with 503.
    let dir = env.stack.manifests.path().to_path_buf();
    let mut patched = Vec::new();
    let text = std::fs::read_to_string(dir.join("policy.yaml")).unwrap();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut v: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
        if v.is_null() {
            continue;
        }
        fail_close(&mut v);
        patched.push(serde_yaml::to_string(&v).unwrap());
    }
    std::fs::write(dir.join("policy.yaml"), patched.join("---\n")).unwrap();
    let r = wait_until("FailClose applies", Duration::from_secs(20), || async {
        let r = env.chat("glm-5.3", HI, 2, false, "e2e-stale-close").await;
        (r.status == 503).then_some(r)
    })
    .await;
    assert_eq!(r.json()["error"]["code"], "no_endpoint");
    let n = env
        .metric(
            "kinference_proxy_fallbacks_total",
            &["reason=\"stale_signals\"", "failure_mode=\"fail_close\""],
        )
        .await;
    assert!(n >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_before_the_first_byte_are_retried_and_mid_stream_failures_end_with_an_error_event()
{
    let env = start(opts(10.0), no_patch).await;
    let qwen = env.sims_of("qwen-3.6-27b");
    env.faults(&qwen[0], json!({"fixed_status": 503})).await;
    let mut retried = 0;
    for i in 0..12 {
        let id = format!("e2e-retry-{i}");
        let r = env.chat("qwen-3.6-27b", HI, 2, false, &id).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert_eq!(r.header("x-kinference-endpoint"), qwen[1]);
        let d = env.decision(&id).await;
        let attempts: Vec<&str> = d["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        if attempts.len() == 2 {
            assert_eq!(attempts, vec![qwen[0].as_str(), qwen[1].as_str()]);
            retried += 1;
        } else {
            assert_eq!(attempts, vec![qwen[1].as_str()]);
        }
    }
    assert!(
        retried >= 1,
        "the failing endpoint was tried first at least once in 12 ties"
    );
    let n = env
        .metric("kinference_proxy_retries_total", &["reason=\"status_5xx\""])
        .await;
    assert_eq!(n, f64::from(retried));

    // A stream cut after 3 tokens ends with an SSE error event.
    env.faults(&qwen[0], json!({})).await;
    for sim in &qwen {
        env.faults(
            sim,
            json!({"disconnect_after_tokens": 3, "disconnect_rate": 1.0}),
        )
        .await;
    }
    let r = env.chat("qwen-3.6-27b", HI, 50, true, "e2e-cut").await;
    assert_eq!(r.status, 200);
    let events = r.events();
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(
        last["error"]["code"], "upstream_stream_failed",
        "{events:?}"
    );
    assert!(!events.iter().any(|e| e == "[DONE]"));
    let n = env
        .metric("kinference_proxy_errors_total", &["status=\"stream\""])
        .await;
    assert_eq!(n, 1.0);
}
