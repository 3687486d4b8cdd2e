//! An in-process vLLM simulator replica and a small HTTP client to send it prompts.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use kinference_vllm_sim::{KvEventsConfig, Replica, ReplicaConfig, serve};

/// A fast replica of the smallest profile, publishing KV events on `kv_endpoint` when given.
pub async fn replica(kv_endpoint: Option<String>) -> Replica {
    let mut config = ReplicaConfig::from_profile_name("qwen-3.6-27b").unwrap();
    config.time_scale = 200.0;
    config.kv_events = kv_endpoint.map(|endpoint| KvEventsConfig {
        endpoint,
        topic: "kv@sim".into(),
    });
    // A previous replica's publisher may still hold the KV port for a moment after shutdown.
    let mut attempts = 0;
    loop {
        match serve(config.clone(), "127.0.0.1:0".parse().unwrap()).await {
            Ok(replica) => return replica,
            Err(_) if attempts < 100 => {
                attempts += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("replica did not start: {e}"),
        }
    }
}

/// Sends a completion of `tokens` (one output token) and waits for the answer.
pub async fn complete(replica: &Replica, tokens: &[u32]) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = serde_json::json!({
        "model": replica.config().model,
        "prompt": tokens,
        "max_tokens": 1,
    });
    let req = http::Request::post(format!("{}/v1/completions", replica.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let rsp = client.request(req).await.unwrap();
    let status = rsp.status();
    let body = rsp.into_body().collect().await.unwrap().to_bytes();
    assert!(status.is_success(), "{status}: {body:?}");
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
