//! Bad input and injected faults: each gets its documented status and OpenAI error JSON, a client
//! that goes away frees its engine request, and nothing hangs.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use crate::support::*;

#[tokio::test]
async fn bad_requests_get_their_status_and_error_json() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let chat = format!("{base}/v1/chat/completions");
        let c = client();

        // Malformed JSON.
        let resp = c
            .post(&chat)
            .header("content-type", "application/json")
            .body("{\"model\": ")
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        assert_error(status, &resp.json().await.unwrap(), 400);

        // Missing field, wrong type, zero max_tokens, batched prompts.
        for body in [
            json!({"model": MODEL}),
            json!({"model": MODEL, "messages": "hi"}),
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}),
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
            json!({"model": MODEL, "messages": []}),
        ] {
            let (status, err) = post_json(&chat, &body).await;
            assert_error(status, &err, 400);
        }
        let (status, err) = post_json(
            &format!("{base}/v1/completions"),
            &json!({"model": MODEL, "prompt": ["a", "b"]}),
        )
        .await;
        assert_error(status, &err, 400);

        // Unknown model.
        let mut body = chat_body("x", 2, false);
        body["model"] = json!("gpt-nope");
        let (status, err) = post_json(&chat, &body).await;
        assert_error(status, &err, 404);
        assert_eq!(err["error"]["message"], "The model `gpt-nope` does not exist.");

        // Unknown path, wrong method.
        let resp = c.get(format!("{base}/v1/nope")).send().await.unwrap();
        let status = resp.status().as_u16();
        assert_error(status, &resp.json().await.unwrap(), 404);
        let resp = c.get(&chat).send().await.unwrap();
        assert_eq!(resp.headers()["allow"], "POST");
        let status = resp.status().as_u16();
        assert_error(status, &resp.json().await.unwrap(), 405);

        // Longer than the context window (2048): 413 with vLLM's message.
        let (status, err) = post_json(
            &format!("{base}/v1/completions"),
            &json!({"model": MODEL, "prompt": vec![5; 2000], "max_tokens": 100}),
        )
        .await;
        assert_error(status, &err, 413);
        assert_eq!(
            err["error"]["message"],
            "This model's maximum context length is 2048 tokens. However, you requested 2100 \
             tokens (2000 in the messages, 100 in the completion). Please reduce the length of \
             the messages or completion."
        );
        // Nothing was left in the engine by the refusals.
        let state = get_json(&format!("{base}/sim/state")).await;
        assert_eq!(state["inflight_requests"], 0);
        assert_eq!(state["prompt_tokens"], 0);
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn forced_faults_by_header() {
    let mut config = small_config();
    config.faults.stall_max_s = 2.0; // 0.1 s of wall time at 20x
    let replica = start(config).await;
    let base = replica.url();
    bounded(20, async {
        let chat = format!("{base}/v1/chat/completions");
        let c = client();
        let send = |fault: &'static str| {
            c.post(&chat)
                .header("x-sim-fault", fault)
                .json(&chat_body("fault me", 4, false))
                .send()
        };
        for (fault, expected) in [("status=503", 503), ("status=429", 429), ("stall", 503)] {
            let resp = send(fault).await.unwrap();
            let status = resp.status().as_u16();
            assert_error(status, &resp.json().await.unwrap(), expected);
        }
        let resp = send("nonsense").await.unwrap();
        let status = resp.status().as_u16();
        assert_error(status, &resp.json().await.unwrap(), 400);

        // A latency spike still answers in full.
        let resp = send("spike=0.5").await.unwrap();
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["usage"]["completion_tokens"], 4);

        // A whole answer cut after 2 tokens: no response at all.
        assert!(send("disconnect=2").await.is_err());

        // A stream cut after 2 tokens: the role chunk and 2 token chunks, then an error.
        let resp = c
            .post(&chat)
            .header("x-sim-fault", "disconnect=2")
            .json(&chat_body("fault me", 8, true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut stream = resp.bytes_stream();
        let mut received = Vec::new();
        let mut failed = false;
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => received.extend_from_slice(&bytes),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(failed, "the stream ends in an error, not [DONE]");
        let text = String::from_utf8(received).unwrap();
        assert_eq!(text.matches("data: ").count(), 3, "{text}");
        assert!(!text.contains("[DONE]"));

        // Every cut request was aborted in the engine.
        let state = wait_state(&base, |s| {
            s["inflight_requests"] == 0 && s["num_requests_running"] == 0
        })
        .await;
        assert_eq!(state["num_requests_waiting"], 0);
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn faults_change_at_run_time() {
    let replica = start(small_config()).await;
    let base = replica.url();
    bounded(20, async {
        let faults = format!("{base}/sim/faults");
        let chat = format!("{base}/v1/chat/completions");

        let (status, _) = post_json(&faults, &json!({"fixed_status": 429})).await;
        assert_eq!(status, 200);
        let (status, err) = post_json(&chat, &chat_body("x", 2, false)).await;
        assert_error(status, &err, 429);

        let (status, _) = post_json(&faults, &json!({"error_rates": {"503": 1.0}})).await;
        assert_eq!(status, 200);
        assert_eq!(get_json(&faults).await["error_rates"]["503"], 1.0);
        let (status, err) = post_json(&chat, &chat_body("x", 2, false)).await;
        assert_error(status, &err, 503);

        // Invalid configurations are refused and change nothing.
        let (status, err) = post_json(&faults, &json!({"error_rates": {"503": 2.0}})).await;
        assert_error(status, &err, 400);
        let (status, err) = post_json(&faults, &json!({"bogus": true})).await;
        assert_error(status, &err, 400);
        assert_eq!(get_json(&faults).await["error_rates"]["503"], 1.0);

        // /metrics unavailable, then hanging (bounded by stall_max_s: 2 virtual s = 0.1 s).
        let (status, _) = post_json(&faults, &json!({"metrics": "unavailable"})).await;
        assert_eq!(status, 200);
        let resp = client()
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 503);
        let (status, _) = post_json(&faults, &json!({"metrics": "hang", "stall_max_s": 2.0})).await;
        assert_eq!(status, 200);
        let resp = client()
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 503);
        let body: Value = resp.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains("hung"));

        // A client that gives up on a hanging /metrics gets a timeout, not an answer.
        let (status, _) =
            post_json(&faults, &json!({"metrics": "hang", "stall_max_s": 600.0})).await;
        assert_eq!(status, 200);
        let quick = reqwest::Client::builder()
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let err = quick
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap_err();
        assert!(err.is_timeout());

        // Back to normal.
        let (status, _) = post_json(&faults, &json!({})).await;
        assert_eq!(status, 200);
        let (status, body) = post_json(&chat, &chat_body("x", 2, false)).await;
        assert_eq!(status, 200, "{body}");
        let resp = client()
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn seeded_error_rate_hits_about_its_rate() {
    let mut config = small_config();
    config.faults.error_rates = [(503, 0.5)].into();
    config.seed = 42;
    let replica = start(config).await;
    let base = replica.url();
    bounded(30, async {
        let chat = format!("{base}/v1/chat/completions");
        let mut failures = 0;
        for _ in 0..40 {
            let (status, body) = post_json(&chat, &chat_body("x", 1, false)).await;
            match status {
                200 => {}
                503 => {
                    assert_error(status, &body, 503);
                    failures += 1;
                }
                other => panic!("unexpected status {other}: {body}"),
            }
        }
        // Binomial(40, 0.5): P(outside 8..=32) < 1e-4.
        assert!((8..=32).contains(&failures), "{failures} failures of 40");
    })
    .await;
    replica.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_mid_stream_frees_the_engine_request() {
    let mut config = small_config();
    config.time_scale = 1.0; // slow enough that the stream is still going when we leave
    let replica = start(config).await;
    let base = replica.url();
    bounded(20, async {
        let resp = client()
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat_body("a long answer please", 1500, true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut stream = resp.bytes_stream();
        let mut seen = String::new();
        while seen.matches("data: ").count() < 3 {
            let chunk = stream.next().await.unwrap().unwrap();
            seen.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        let during = get_json(&format!("{base}/sim/state")).await;
        assert_eq!(during["num_requests_running"], 1, "{during}");
        assert_eq!(during["inflight_requests"], 1);
        let usage_during = during["kv_cache_usage"].as_f64().unwrap();
        assert!(usage_during > 0.0);
        drop(stream);

        let after = wait_state(&base, |s| {
            s["num_requests_running"] == 0 && s["inflight_requests"] == 0
        })
        .await;
        assert_eq!(after["kv_cache_usage"], 0.0, "blocks freed: {after}");
        assert_eq!(after["requests_finished"], 0, "aborted, not finished");
    })
    .await;
    replica.shutdown().await;
}
