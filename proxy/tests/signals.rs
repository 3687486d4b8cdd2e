//! The proxy's signals over real processes: vLLM KV events from simulated replicas feeding the
//! precise prefix index, first-token feedback from non-stream responses, and vLLM's `GET /load`
//! (the replicas run with `--enable-server-load-tracking`) counting another client's stream, the
//! proxy's own stream timing the engine step in progress, and a long prompt of its own dated by
//! its schedule in the next decisions.
//!
//! Two `vllm-sim` replicas of glm-5.3 publish KV events on their serving port + 1; the
//! controller serves the example policy with the glm-5.3 InferencePool annotated
//! `kinference.io/kv-events-port: "+1"` and `kinference.io/kv-events-tokenizer: kinference-sim`;
//! the proxy binary subscribes per endpoint. Binaries come from the Cargo target directory, as in
//! `e2e.rs`. Every wait is a bounded poll for a condition.

#[path = "support/client.rs"]
mod client;

use client::{ProxyClient, served_by};
use kinference_local::{
    Controller, Program, Proxy, manifests,
    poll::wait_until,
    process::Proc,
    stack::{spawn_controller, spawn_proxy},
    workspace_root,
};
use kinference_proxy_signals::{PromptRef, Tokenizer};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    net::{SocketAddr, TcpListener},
    path::Path,
    time::Duration,
};

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
const MODEL: &str = "glm-5.3";

/// A free port `p` whose `p + 1` is free too (the simulator's KV-event port).
fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let a = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = a.local_addr().unwrap().port();
        if p < u16::MAX && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
    panic!("no pair of free ports");
}

struct Sim {
    addr: SocketAddr,
    _proc: Proc,
}

fn spawn_sim() -> Sim {
    let port = free_port_pair();
    let mut cmd = Program::vllm_sim().command().unwrap();
    cmd.args(["serve", "--profile", MODEL, "--port", &port.to_string()])
        .args(["--kv-events-endpoint", &format!("tcp://*:{}", port + 1)])
        .arg("--enable-server-load-tracking");
    let (proc, line) =
        Proc::spawn(MODEL, cmd, "listening on ", Duration::from_secs(60), true).unwrap();
    assert!(line.contains(&format!(":{port}")), "{line}");
    Sim {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        _proc: proc,
    }
}

/// Adds the KV-event annotations to the glm-5.3 pool of the rewritten manifests.
fn annotate_pool(dir: &Path) {
    let path = dir.join("inferencepools.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = String::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut v: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
        if v.is_null() {
            continue;
        }
        if v["metadata"]["name"] == MODEL {
            let mut a = serde_yaml::Mapping::new();
            a.insert("kinference.io/kv-events-port".into(), "+1".into());
            a.insert(
                "kinference.io/kv-events-tokenizer".into(),
                "kinference-sim".into(),
            );
            v["metadata"]["annotations"] = serde_yaml::Value::Mapping(a);
        }
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&v).unwrap());
    }
    assert!(out.contains("kv-events-port"), "{out}");
    std::fs::write(&path, out).unwrap();
}

/// Makes the example rule match on the keyword tag `translation=true` (deterministic, unlike the
/// complexity model's scores), so the rule counter has something to count.
fn translation_rule(doc: &mut serde_yaml::Value) {
    if let Some(rules) = doc["spec"]["rules"].as_sequence_mut() {
        for rule in rules {
            rule["match"]["tags"] = serde_yaml::from_str(
                "[{name: translation, values: [\"true\"], minConfidence: 0.0}]",
            )
            .unwrap();
        }
    }
}

struct Env {
    client: ProxyClient,
    sims: Vec<Sim>,
    _proxy: Proxy,
    _controller: Controller,
    _manifests: tempfile::TempDir,
}

async fn start() -> Env {
    let (sims, manifests, controller, proxy) = tokio::task::spawn_blocking(|| {
        let sims = vec![spawn_sim(), spawn_sim()];
        let ports = BTreeMap::from([(
            MODEL.to_string(),
            sims.iter().map(|s| s.addr.port()).collect::<Vec<_>>(),
        )]);
        let manifests = tempfile::tempdir().unwrap();
        manifests::write_manifests(
            &workspace_root().join("examples"),
            manifests.path(),
            &ports,
            &translation_rule,
        )
        .unwrap();
        annotate_pool(manifests.path());
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let controller =
            spawn_controller(&Program::controller(), manifests.path(), any, any, true).unwrap();
        let proxy = spawn_proxy(&Program::Path(PROXY.into()), controller.grpc, &[], true).unwrap();
        (sims, manifests, controller, proxy)
    })
    .await
    .unwrap();
    Env {
        client: ProxyClient::of(&proxy),
        sims,
        _proxy: proxy,
        _controller: controller,
        _manifests: manifests,
    }
}

/// The proxy under test: `env.decision(..)`, `env.base`.
impl std::ops::Deref for Env {
    type Target = ProxyClient;
    fn deref(&self) -> &ProxyClient {
        &self.client
    }
}

impl Env {
    /// A non-stream chat request through the proxy: (served endpoint, body).
    async fn chat(&self, content: &str, id: &str) -> (String, Value) {
        let rsp = self.post_chat(&chat_body(content, 2, false), id).await;
        assert_eq!(rsp.status(), 200);
        (served_by(&rsp), rsp.json().await.unwrap())
    }
}

/// A chat completion request for the pool's model: one user message.
fn chat_body(content: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

fn chosen(record: &Value) -> &Value {
    let d = &record["decision"];
    &d["candidates"][d["chosen"].as_u64().expect("a chosen candidate") as usize]
}

/// The decision record's candidate for `endpoint`.
fn candidate<'a>(record: &'a Value, endpoint: &str) -> &'a Value {
    record["decision"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["endpoint"] == endpoint)
        .unwrap_or_else(|| panic!("{endpoint} is not a candidate: {record}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_events_feed_the_precise_index_and_non_stream_answers_feed_the_predictor() {
    let env = start().await;
    let ids: Vec<String> = env.sims.iter().map(|s| s.addr.to_string()).collect();

    // Both endpoints discovered with their publishers, and fresh signals.
    for (id, sim) in ids.iter().zip(&env.sims) {
        wait_until(
            "the endpoint with its KV-event publisher and fresh signals",
            Duration::from_secs(30),
            || async {
                let e = env.endpoint(id).await;
                (e["ready"] == true && !e["signals"]["num_requests_waiting"].is_null())
                    .then_some(())?;
                let kv = &e["kv_events"];
                assert_eq!(
                    kv["publisher"],
                    format!("tcp://127.0.0.1:{}", sim.addr.port() + 1)
                );
                assert_eq!(kv["tokenizer"], "kinference-sim");
                Some(())
            },
        )
        .await;
    }
    // A subscriber joins a publisher some time after connecting: until a batch has arrived from
    // each, warm-up requests straight to the replica (bypassing the proxy) make the replica
    // publish.
    for (n, (id, sim)) in ids.iter().zip(&env.sims).enumerate() {
        wait_until(
            "a KV-event batch from each replica",
            Duration::from_secs(30),
            || async {
                let e = env.endpoint(id).await;
                if e["kv_events"]["batches"].as_u64().unwrap_or(0) > 0 {
                    return Some(());
                }
                let _ = env
                    .http
                    .post(format!("http://{}/v1/completions", sim.addr))
                    .json(&json!({
                        "model": MODEL,
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
    for id in &ids {
        let e = env.endpoint(id).await;
        assert_eq!(e["estimated_first_tokens"], 0, "{e}");
        assert!(e["ttft_peak_ewma_s"].is_null(), "{e}");
    }

    // A long prompt, non-stream, through the proxy.
    let prompt = format!(
        "{}\nQuestion: which clause governs renewals?",
        "Here is the shared contract under review, clause by clause. ".repeat(120)
    );
    let t = Tokenizer::KinferenceSim;
    let turns = [("user", prompt.as_str())];
    let prompt_blocks = t
        .block_hashes(&t.tokens(PromptRef::Chat(&turns)).unwrap(), 16)
        .len() as u64;
    assert!(prompt_blocks > 50, "{prompt_blocks}");
    let (holder, body) = env.chat(&prompt, "kv-0").await;
    assert!(ids.contains(&holder), "{holder}");
    let usage_prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        usage_prompt / 16,
        prompt_blocks,
        "the proxy hashes as many blocks as the server fills"
    );

    // The holder's events arrive: its precise index holds at least the prompt's blocks.
    let e = env.wait_for_blocks_held(&holder, prompt_blocks).await;
    assert_eq!(e["kv_events"]["precise"], true, "{e}");

    // The non-stream answer fed the predictor: an estimated first token, and a TTFT peak-EWMA on
    // an endpoint that never served a stream.
    assert_eq!(e["estimated_first_tokens"], 1, "{e}");
    assert!(e["ttft_peak_ewma_s"].as_f64().unwrap() > 0.0, "{e}");

    // The repeat goes to the holder, and its decision shows the precise overlap.
    let (served, _) = env.chat(&prompt, "kv-1").await;
    assert_eq!(served, holder);
    let record = env.decision("kv-1").await;
    let w = chosen(&record);
    assert_eq!(w["endpoint"], holder.as_str(), "{record}");
    assert_eq!(w["prediction"]["prefix_source"], "precise", "{record}");
    // The pool's tokenizer counted the prompt as the server did, and every full block is held.
    assert_eq!(
        record["decision"]["prompt_tokens"].as_u64(),
        Some(usage_prompt),
        "{record}"
    );
    let cached = w["prediction"]["cached_tokens"].as_u64().unwrap();
    assert_eq!(
        cached,
        (prompt_blocks * 16).min(usage_prompt - 1),
        "{record}"
    );
    let other = record["decision"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["endpoint"] != holder.as_str())
        .expect("the other replica is a candidate");
    assert_eq!(other["prediction"]["prefix_source"], "precise", "{record}");
    assert_eq!(other["prediction"]["cached_tokens"], 0, "{record}");
    assert!(
        other["prediction"]["predicted_ttft_s"].as_f64().unwrap()
            > w["prediction"]["predicted_ttft_s"].as_f64().unwrap(),
        "{record}"
    );

    // A few short prompts, some of which the example policy's rule may match: the rule counter
    // equals the matched rules of the decision records, by the model each decision chose.
    for (n, p) in [
        "Say hello.",
        "What is the capital of France?",
        "Translate 'good morning' into Spanish.",
    ]
    .iter()
    .enumerate()
    {
        env.chat(p, &format!("rule-{n}")).await;
    }
    let records = env.admin_json("/debug/decisions").await;
    let mut want: BTreeMap<(String, String), f64> = BTreeMap::new();
    for r in records.as_array().unwrap() {
        let model = chosen(r)["model"].as_str().unwrap().to_string();
        for t in r["rule_trace"].as_array().unwrap() {
            if t["matched"] == true {
                *want
                    .entry((t["rule"].as_str().unwrap().to_string(), model.clone()))
                    .or_default() += 1.0;
            }
        }
    }
    let metrics = env.metrics_text().await;
    let mut got: BTreeMap<(String, String), f64> = BTreeMap::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("kinference_proxy_rule_decisions_total{"))
    {
        let label = |k: &str| {
            line.split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap()
                .to_string()
        };
        let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        *got.entry((label("rule"), label("served_model")))
            .or_default() += v;
    }
    assert_eq!(
        want.get(&("low-complexity-may-use-qwen".to_string(), MODEL.to_string())),
        Some(&1.0),
        "only the translation prompt matches: {records}"
    );
    assert_eq!(got, want, "{records}");

    // The proxy counted the batches it applied.
    let metrics = env.metrics_text().await;
    assert!(
        metrics
            .contains(r#"kinference_proxy_kv_event_batches_total{pool="glm-5.3",model="glm-5.3"}"#),
        "{metrics}"
    );

    // Another client's stream, sent straight to one replica (as another proxy would): the
    // proxy's poll of vLLM's `GET /load` sees it, and the next decision's prediction for that
    // endpoint carries it.
    let busy = &ids[0];
    let mut stream = env
        .http
        .post(format!("http://{busy}/v1/chat/completions"))
        .json(&chat_body("a long answer, please", 2_000, true))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert!(stream.chunk().await.unwrap().is_some());
    wait_until(
        "the proxy's GET /load poll counts the other client's stream",
        Duration::from_secs(20),
        || async {
            let e = env.endpoint(busy).await;
            (e["signals"]["server_load"]["value"] == 1).then_some(())
        },
    )
    .await;
    env.chat("Say hello again.", "load-0").await;
    let record = env.decision("load-0").await;
    let load = &candidate(&record, busy)["prediction"]["server_load"];
    assert_eq!(load["value"], 1.0, "{record}");
    assert_eq!(load["used"], true, "{record}");
    drop(stream);

    // A stream of this proxy's own: each token it relays ends an engine step of its endpoint,
    // so the next decision times the step in progress there (less than a 12 ms decode step ago
    // plus scheduling noise, never the half-step guess used without a stream).
    let mut own = env
        .post_chat(
            &chat_body("stream a long answer", 2_000, true),
            "own-stream",
        )
        .await;
    assert_eq!(own.status(), 200);
    let streaming_on = served_by(&own);
    for _ in 0..3 {
        assert!(own.chunk().await.unwrap().is_some());
    }
    env.chat("And hello once more.", "phase-0").await;
    let record = env.decision("phase-0").await;
    let elapsed = candidate(&record, &streaming_on)["prediction"]["step_elapsed_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("no step timing: {record}"));
    assert!((0.0..1.0).contains(&elapsed), "{record}");
    drop(own);

    wait_until(
        "the stream leaves the replica's load once cut",
        Duration::from_secs(20),
        || async {
            let e = env.endpoint(busy).await;
            (e["signals"]["server_load"]["value"] == 0).then_some(())
        },
    )
    .await;

    // A long prompt of this proxy's own (about 70,000 tokens, seconds of prefill on glm-5.3)
    // before its first token: the next decisions date it by the schedule predicted when it was
    // sent (the endpoint has been prefilling it since), while the undated reading the selection
    // ranks by still counts all of it.
    let long: String = (0..40_000).map(|i| format!("w{i} ")).collect();
    let long_request = {
        let client = env.client.clone();
        tokio::spawn(async move {
            let body = chat_body(&long, 1, false);
            client.post_chat(&body, "long-0").await.status()
        })
    };
    let long_on = wait_until(
        "the proxy dispatches the long prompt",
        Duration::from_secs(20),
        || async {
            let records = env.admin_json("/debug/decisions?request_id=long-0").await;
            let record = records.get(0)?;
            chosen(record)["endpoint"].as_str().map(str::to_string)
        },
    )
    .await;
    let mut n = 0;
    let dated = wait_until(
        "a decision dates the long prompt's prefill by its schedule",
        Duration::from_secs(20),
        || {
            n += 1;
            let id = format!("dated-{n}");
            let (env, long_on) = (&env, &long_on);
            async move {
                env.chat("Hello while the long prompt is prefilled.", &id)
                    .await;
                let record = env.decision(&id).await;
                let p = candidate(&record, long_on)["prediction"].clone();
                let own = p["own_queued_prefill_tokens"].as_f64()?;
                let left = p["own_queued_left_tokens"].as_f64()?;
                (p["own_awaiting_first_token"] == 1 && left < own).then_some(p)
            }
        },
    )
    .await;
    let own = dated["own_queued_prefill_tokens"].as_f64().unwrap();
    assert!(own > 50_000.0, "{dated}");
    let undated = dated["undated"]["queued_prefill_tokens"].as_f64().unwrap();
    assert!(undated >= own, "{dated}");
    let predicted = dated["predicted_ttft_s"].as_f64().unwrap();
    let ranked = dated["undated"]["predicted_ttft_s"].as_f64().unwrap();
    assert!(ranked > predicted, "{dated}");
    // The replicas' `vllm:generation_tokens_total` tells their publications apart: the
    // prediction knows how old the state its scrapes read is.
    let published = dated["published_age_s"].as_f64();
    assert!(published.is_some_and(|a| a >= 0.0), "{dated}");
    // Nothing is lost: the long prompt is answered.
    assert_eq!(long_request.await.unwrap(), 200);
}
