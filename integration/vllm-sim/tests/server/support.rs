//! Helpers shared by the server tests: a small, fast replica and HTTP helpers.

use std::{future::Future, net::SocketAddr, time::Duration};

use kinference_sim::{EngineConfig, Profile};
use kinference_vllm_sim::{Replica, ReplicaConfig, serve};
use serde_json::{Value, json};

pub const MODEL: &str = "qwen-3.6-27b";

/// A small engine (so tests are fast and blocks are few) at 20x real time.
pub fn small_config() -> ReplicaConfig {
    let profile = Profile::named(MODEL).expect("profile exists");
    let mut config = ReplicaConfig::from_profile(&profile);
    config.engine = EngineConfig {
        block_size: 16,
        num_gpu_blocks: 512,
        max_num_seqs: 8,
        max_num_batched_tokens: 1024,
        max_model_len: 2048,
        enable_prefix_caching: true,
    };
    config.time_scale = 20.0;
    config.default_max_tokens = 16;
    config.lora_modules = vec!["sql-lora".into()];
    config
}

pub async fn start(config: ReplicaConfig) -> Replica {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    serve(config, addr).await.expect("replica starts")
}

/// Fails the test if `f` takes longer than `secs` seconds.
pub async fn bounded<T>(secs: u64, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test step timed out")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

pub fn chat_body(content: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// POSTs JSON and returns the status and the JSON body.
pub async fn post_json(url: &str, body: &Value) -> (u16, Value) {
    let resp = client().post(url).json(body).send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

pub async fn get_json(url: &str) -> Value {
    client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The `data:` payloads of an SSE body, in order (`[DONE]` included as a string).
pub fn sse_data(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "SSE body ends with a blank line");
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without data: {e:?}"))
                .to_string()
        })
        .collect()
}

/// Asserts an OpenAI error body with `code` equal to the status.
pub fn assert_error(status: u16, body: &Value, expected: u16) {
    assert_eq!(status, expected, "body: {body}");
    let err = &body["error"];
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(err["type"].is_string(), "{body}");
    assert!(err.get("param").is_some(), "{body}");
    assert_eq!(err["code"], expected, "{body}");
}

/// Polls `/sim/state` until `pred` holds (bounded by the caller's timeout).
pub async fn wait_state(base: &str, pred: impl Fn(&Value) -> bool) -> Value {
    loop {
        let state = get_json(&format!("{base}/sim/state")).await;
        if pred(&state) {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The prompt tokens the server makes of a one-message chat.
pub async fn chat_tokens(base: &str, content: &str) -> Vec<u32> {
    let (status, body) = post_json(
        &format!("{base}/tokenize"),
        &json!({"model": MODEL, "messages": [{"role": "user", "content": content}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// A long, deterministic text of about `words` words.
pub fn long_text(words: usize, salt: &str) -> String {
    (0..words)
        .map(|i| format!("{salt}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Resets the prefix cache, then runs one engine step (a request too short to fill a block), so
/// that the `AllBlocksCleared` goes out: as in vLLM 0.32, it leaves with the next step's events.
/// Tests call it until the event arrives, since a PUB socket drops what it sends before the
/// subscription reaches it.
pub async fn reset_and_step(base: &str) {
    let resp = client()
        .post(format!("{base}/reset_prefix_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (status, body) = post_json(
        &format!("{base}/v1/completions"),
        &json!({"model": MODEL, "prompt": [7, 8, 9], "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}
