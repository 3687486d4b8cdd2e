//! Cached prompt tokens and cost whether or not the engine reports `prompt_tokens_details`
//! (issue 20), over real processes: the controller on `examples/`, one simulator per model
//! publishing KV events, and the proxy binary.
//!
//! vLLM reports `usage.prompt_tokens_details.cached_tokens` only with
//! `--enable-prompt-tokens-details`; without it (its default) the usage says
//! `"prompt_tokens_details": null`. The proxy then counts the decision's prediction for the
//! endpoint that served (from its precise prefix index, fed by the endpoint's KV events) as the
//! cached tokens, charges them at the cached price, and counts them apart as estimated
//! (`kinference_proxy_cached_prompt_tokens_estimated_total`). The simulator reads as a default
//! vLLM with `--no-prompt-tokens-details`.

#[path = "support/client.rs"]
mod client;

use client::{ProxyClient, served_by};
use kinference_local::{Programs, Stack, StackOptions};
use serde_json::{Value, json};
use std::path::Path;

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
const MODEL: &str = "qwen-3.6-27b";
/// `examples/policy.yaml`'s prices for qwen-3.6-27b, per million tokens.
const PROMPT_PRICE: f64 = 0.20;
const CACHED_PRICE: f64 = 0.05;
const COMPLETION_PRICE: f64 = 0.60;

async fn start(details: bool) -> (Stack, ProxyClient) {
    let opts = StackOptions {
        replicas: vec![("glm-5.3".into(), 1), (MODEL.into(), 1)],
        time_scale: 50.0,
        sim_args: if details {
            vec![]
        } else {
            vec!["--no-prompt-tokens-details".into()]
        },
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
    (stack, client)
}

fn chosen(record: &Value) -> &Value {
    let d = &record["decision"];
    &d["candidates"][d["chosen"].as_u64().expect("a chosen candidate") as usize]
}

/// What one run measured.
#[derive(Debug)]
struct Run {
    /// Per repeated request: (usage's `prompt_tokens_details`, predicted cached tokens).
    requests: Vec<(Value, u64)>,
    cached: f64,
    estimated: f64,
    prompt: f64,
    completion: f64,
    cost: f64,
}

/// Sends a long prompt, waits for its blocks to reach the precise index, then repeats it with
/// other questions, non-stream and streamed with `include_usage`.
async fn run(details: bool) -> Run {
    let (_stack, client) = start(details).await;
    let prefix = "You are a careful assistant. Here is the shared context document. ".repeat(40);
    let body = |n: usize, stream: bool| {
        let mut b = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": format!("{prefix}\nQuestion {n}: summarise it.")}],
            "max_tokens": 2,
        });
        if stream {
            b["stream"] = json!(true);
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    let rsp = client.post_chat(&body(0, false), "cached-0").await;
    assert_eq!(rsp.status(), 200);
    let holder = served_by(&rsp);
    let first: Value = rsp.json().await.unwrap();
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    client
        .wait_for_blocks_held(&holder, prompt_tokens / 16)
        .await;
    let mut requests = Vec::new();
    for n in 1..=4 {
        let id = format!("cached-{n}");
        let stream = n % 2 == 0;
        let rsp = client.post_chat(&body(n, stream), &id).await;
        assert_eq!(rsp.status(), 200);
        assert_eq!(served_by(&rsp), holder, "{id}: back to the prefix");
        let usage = if stream {
            let text = rsp.text().await.unwrap();
            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
            text.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .find_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
                .expect("a usage chunk")
        } else {
            rsp.json::<Value>().await.unwrap()["usage"].clone()
        };
        let record = client.decision(&id).await;
        let w = chosen(&record);
        assert_eq!(w["prediction"]["prefix_source"], "precise", "{record}");
        let predicted = w["prediction"]["cached_tokens"].as_u64().unwrap();
        let details = usage
            .get("prompt_tokens_details")
            .cloned()
            .unwrap_or(Value::Null);
        requests.push((details, predicted));
    }
    let total = |name: &'static str| {
        let client = &client;
        async move {
            client
                .metric(name, &[&format!("served_model=\"{MODEL}\"")])
                .await
        }
    };
    Run {
        requests,
        cached: total("kinference_proxy_cached_prompt_tokens_total").await,
        estimated: total("kinference_proxy_cached_prompt_tokens_estimated_total").await,
        prompt: total("kinference_proxy_prompt_tokens_total").await,
        completion: total("kinference_proxy_completion_tokens_total").await,
        cost: total("kinference_proxy_cost_usd_total").await,
    }
}

fn cost(prompt: f64, cached: f64, completion: f64) -> f64 {
    ((prompt - cached) * PROMPT_PRICE + cached * CACHED_PRICE + completion * COMPLETION_PRICE) / 1e6
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 + 1e-9 * b.abs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_tokens_and_cost_are_predicted_when_the_usage_has_no_details() {
    let off = run(false).await;
    eprintln!("without details: {off:?}");
    // As vLLM without --enable-prompt-tokens-details: no figure in any usage.
    assert!(off.requests.iter().all(|(d, _)| d.is_null()), "{off:?}");
    let predicted: u64 = off.requests.iter().map(|(_, p)| p).sum();
    assert!(
        off.requests.iter().all(|&(_, p)| p >= 16 * 10),
        "each repeat is predicted to hit the shared prefix: {off:?}"
    );
    // Counted as cached, all of it as estimated, and charged at the cached price.
    assert_eq!(off.cached, predicted as f64, "{off:?}");
    assert_eq!(off.estimated, off.cached, "{off:?}");
    assert!(
        close(off.cost, cost(off.prompt, off.cached, off.completion)),
        "{off:?}"
    );
    let uncached = cost(off.prompt, 0.0, off.completion);
    assert!(off.cost < 0.9 * uncached, "{} against {uncached}", off.cost);

    let on = run(true).await;
    eprintln!("with details: {on:?}");
    // The engine's own figure wins, nothing is estimated, and it is what the index predicted.
    let reported: u64 = on
        .requests
        .iter()
        .map(|(d, _)| d["cached_tokens"].as_u64().expect("cached_tokens"))
        .sum();
    assert_eq!(on.cached, reported as f64, "{on:?}");
    assert_eq!(on.estimated, 0.0, "{on:?}");
    for (d, p) in &on.requests {
        assert_eq!(d["cached_tokens"].as_u64(), Some(*p), "{on:?}");
    }
    assert!(
        close(on.cost, cost(on.prompt, on.cached, on.completion)),
        "{on:?}"
    );
    // The same script charges the same with or without the engine's report.
    assert_eq!(off.cached, on.cached);
    assert!(close(off.cost, on.cost), "{} against {}", off.cost, on.cost);
}
