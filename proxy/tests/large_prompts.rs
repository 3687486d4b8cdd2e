//! Prompt-sized work is bounded (issue 19, D7), over real processes: the controller on
//! `examples/`, one glm-5.3 and one qwen-3.6-27b simulator serving a 200,000-token context
//! window, and the proxy binary.
//!
//! - The proxy learns each endpoint's context window from its `GET /v1/models`
//!   (`max_model_len`, as vLLM reports it) and shows it in `/debug/endpoints`.
//! - A prompt that cannot fit any candidate's window is refused with OpenAI's
//!   `context_length_exceeded` before it is classified, hashed or sent: no decision is recorded
//!   and no engine sees it. Before, a 13.9 MB prompt spent 13 s of CPU on a worker before the
//!   engine refused it.
//! - A large prompt that fits (above the proxy's 256 KiB threshold, so parsed, classified,
//!   hashed and decided on the blocking pool) is served as any other, with its decision
//!   recorded, and small requests are answered while several are in flight.
//!
//! What the blocking pool buys in latency is measured by `scripts/bench_large_prompts.sh`
//! (docs/benchmarks/large-prompts.md), never asserted here.

#[path = "support/client.rs"]
mod client;

use client::ProxyClient;
use kinference_local::{Programs, Stack, StackOptions, poll::wait_until};
use serde_json::{Value, json};
use std::{path::Path, time::Duration};

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
const WINDOW: u64 = 200_000;

async fn start() -> (Stack, ProxyClient) {
    let opts = StackOptions {
        replicas: vec![("glm-5.3".into(), 1), ("qwen-3.6-27b".into(), 1)],
        time_scale: 50.0,
        kv_events: false,
        sim_args: vec!["--max-model-len".into(), WINDOW.to_string()],
        ..StackOptions::default()
    };
    let stack = tokio::task::spawn_blocking(move || {
        Stack::start(&Programs::with_proxy(Path::new(PROXY)), &opts, &|_| {})
    })
    .await
    .unwrap()
    .expect("the local stack starts");
    let client = ProxyClient::of(&stack.proxy);
    client.wait_ready().await;
    wait_until(
        "every endpoint's context window is known",
        Duration::from_secs(60),
        || async {
            let eps = client.endpoints().await;
            (eps.len() == 2
                && eps
                    .iter()
                    .all(|e| e["context_window_tokens"].as_u64() == Some(WINDOW)))
            .then_some(())
        },
    )
    .await;
    (stack, client)
}

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({
        "model": "glm-5.3",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    })
}

/// The decisions the proxy has made (`kinference_proxy_decisions_total`, every label).
async fn decisions(client: &ProxyClient) -> f64 {
    client.metric("kinference_proxy_decisions_total", &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_beyond_every_context_window_is_refused_before_it_is_hashed() {
    let (_stack, client) = start().await;
    // One request decided, so that the counter exists.
    let rsp = client.post_chat(&chat("What is 2+2?", 2), "fits").await;
    assert_eq!(rsp.status(), 200);
    let before = decisions(&client).await;
    assert!(before >= 1.0);
    // 2 MB: at least 250,000 tokens at 8 bytes a token, past the 200,000-token window.
    let huge = "lorem ipsum dolor sit amet ".repeat(2_000_000 / 27 + 1);
    let rsp = client.post_chat(&chat(&huge, 16), "too-long-1").await;
    assert_eq!(rsp.status(), 400);
    let body: Value = rsp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    assert_eq!(body["error"]["param"], "messages", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("200000 tokens"), "{message}");
    // Refused before the decision: nothing decided, recorded or sent.
    let records = client
        .admin_json("/debug/decisions?request_id=too-long-1")
        .await;
    assert_eq!(records.as_array().map(Vec::len), Some(0), "{records}");
    assert_eq!(decisions(&client).await, before);
    // max_tokens counts against the window too: a prompt that fits alone does not with it.
    let fits_alone = "x".repeat(8 * 150_000);
    let rsp = client
        .post_chat(&chat(&fits_alone, 60_000), "too-long-2")
        .await;
    assert_eq!(rsp.status(), 400);
    let body: Value = rsp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    assert_eq!(decisions(&client).await, before);
    // Refusals are counted like any other error.
    assert!(
        client
            .metric("kinference_proxy_errors_total", &["status=\"400\""])
            .await
            >= 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_prompt_that_fits_is_served_while_small_requests_are_answered() {
    let (_stack, client) = start().await;
    // 400 KB of varied text: above the 256 KiB threshold, about 100,000 tokens.
    let large: String = (0..40_000)
        .map(|i| format!("item {i} "))
        .collect::<String>()
        .chars()
        .take(400_000)
        .collect();
    let mut inflight = Vec::new();
    for i in 0..3 {
        let client = client.clone();
        let body = chat(&format!("{i} {large}"), 2);
        inflight.push(tokio::spawn(async move {
            let rsp = client.post_chat(&body, &format!("large-{i}")).await;
            (rsp.status().as_u16(), rsp.text().await.unwrap_or_default())
        }));
    }
    // Small requests meanwhile are answered (their latency is the benchmark's business).
    for i in 0..5 {
        let rsp = client
            .post_chat(&chat("What is 2+2?", 2), &format!("small-{i}"))
            .await;
        assert_eq!(rsp.status(), 200);
    }
    for (i, h) in inflight.into_iter().enumerate() {
        let (status, text) = h.await.unwrap();
        assert_eq!(status, 200, "{text}");
        let d = client.decision(&format!("large-{i}")).await;
        assert!(
            d["decision"]["candidates"]
                .as_array()
                .is_some_and(|c| !c.is_empty()),
            "{d}"
        );
    }
}
