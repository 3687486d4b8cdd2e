//! The simulator held to real vLLM 0.32.0's formats, as recorded by
//! `scripts/record_vllm_fixtures.py` into `proxy/signals/tests/fixtures/vllm-0.32.0`: the
//! `/metrics` exposition's names, label names, label order, types and buckets, and the KV-event
//! batch and event shapes. What the simulator leaves out on purpose is listed here, with why.

use std::collections::{BTreeMap, BTreeSet};

use kinference_sim::KvEvent;
use kinference_vllm_sim::{driver::KvBatch, kv_events::encode_batch};
use rmpv::Value;

use crate::support::*;

const RECORDED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../proxy/signals/tests/fixtures/vllm-0.32.0"
);

fn recorded(file: &str) -> String {
    let path = format!("{RECORDED}/{file}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `vllm:` families of real vLLM 0.32.0 that the simulator does not expose: none is read by the
/// proxy, the Inference Extension's scrapers or the dashboard, and each would need a model of
/// something the engine does not simulate (multimodal inputs, KV offloading and transfer, request
/// parameters, FLOP and byte estimates, sleep mode) or is a per-request distribution no router
/// uses.
const NOT_SIMULATED: &[&str] = &[
    "vllm:admission_rejections",
    "vllm:engine_sleep_state",
    "vllm:estimated_flops_per_gpu",
    "vllm:estimated_read_bytes_per_gpu",
    "vllm:estimated_write_bytes_per_gpu",
    "vllm:external_prefix_cache_hits",
    "vllm:external_prefix_cache_queries",
    "vllm:iteration_tokens_total",
    "vllm:mm_cache_hits",
    "vllm:mm_cache_queries",
    "vllm:prompt_tokens_by_source",
    "vllm:prompt_tokens_cached",
    "vllm:prompt_tokens_cached_by_source",
    "vllm:request_decode_time_seconds",
    "vllm:request_generation_tokens",
    "vllm:request_inference_time_seconds",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_num_preemptions",
    "vllm:request_params_max_tokens",
    "vllm:request_params_n",
    "vllm:request_prefill_kv_computed_tokens",
    "vllm:request_prefill_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_queue_time_seconds",
    "vllm:request_success",
    "vllm:request_time_per_output_token_seconds",
];

/// Families the simulator exposes where vLLM 0.32.0 (as recorded) does not.
const SIMULATOR_ONLY: &[&str] = &[
    // vLLM exposes it only with `--enable-lora`; the simulator always serves adapters and reports
    // its `max_lora` (the recording ran without LoRA).
    "vllm:lora_requests_info",
];

/// One sample line: its name and labels in written order.
struct Line {
    name: String,
    labels: Vec<(String, String)>,
}

fn parse_line(line: &str) -> Line {
    let end = line.find(['{', ' ']).unwrap();
    let name = line[..end].to_string();
    let mut labels = Vec::new();
    if line[end..].starts_with('{') {
        let mut rest = &line[end + 1..];
        while !rest.starts_with('}') {
            let eq = rest.find('=').unwrap();
            let key = rest[..eq].to_string();
            rest = &rest[eq + 2..]; // past `="`
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let close = loop {
                match chars.next().unwrap() {
                    (_, '\\') => value.push(chars.next().unwrap().1),
                    (i, '"') => break i,
                    (_, c) => value.push(c),
                }
            };
            labels.push((key, value));
            rest = rest[close + 1..].trim_start_matches(',');
        }
    }
    Line { name, labels }
}

/// What an exposition says, independent of values: per family (its `# TYPE` name), its type; per
/// sample name, the label names; per histogram, its `le` bounds.
#[derive(Default)]
struct Shape {
    types: BTreeMap<String, String>,
    label_names: BTreeMap<String, BTreeSet<String>>,
    buckets: BTreeMap<String, Vec<String>>,
    unsorted: Vec<String>,
}

fn shape(text: &str) -> Shape {
    let mut s = Shape::default();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').unwrap();
            s.types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let l = parse_line(line);
        let names: Vec<&str> = l.labels.iter().map(|(k, _)| k.as_str()).collect();
        if !names.is_sorted() {
            s.unsorted.push(line.to_string());
        }
        if let Some(family) = l.name.strip_suffix("_bucket") {
            let le = l.labels.iter().find(|(k, _)| k == "le").unwrap().1.clone();
            let bounds = s.buckets.entry(family.to_string()).or_default();
            if !bounds.contains(&le) {
                bounds.push(le);
            }
        }
        s.label_names
            .entry(l.name)
            .or_default()
            .extend(names.iter().map(|n| n.to_string()));
    }
    s
}

/// A `# TYPE` line's family: a counter's name without `_total`; a `_created` gauge belongs to
/// its counter or histogram (`None`).
fn family<'a>(name: &'a str, kind: &str) -> Option<&'a str> {
    match kind {
        "counter" => Some(name.strip_suffix("_total").unwrap_or(name)),
        "gauge" if name.ends_with("_created") => None,
        _ => Some(name),
    }
}

#[tokio::test]
async fn metrics_have_vllm_0_32s_names_labels_types_and_buckets() {
    let replica = start(small_config()).await;
    let base = replica.url();
    let sim_text = bounded(20, async {
        let (status, body) = post_json(
            &format!("{base}/v1/chat/completions"),
            &chat_body("hello", 4, false),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        client()
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    })
    .await;
    replica.shutdown().await;
    let real = shape(&recorded("default/metrics-after.txt"));
    let sim = shape(&sim_text);

    // Labels in sorted order, as vLLM writes them.
    assert!(real.unsorted.is_empty(), "{:?}", real.unsorted);
    assert!(sim.unsorted.is_empty(), "{:?}", sim.unsorted);

    // The same `vllm:` families, but for those listed (both ways).
    let families = |s: &Shape| -> BTreeSet<String> {
        s.types
            .iter()
            .filter(|(n, _)| n.starts_with("vllm:"))
            .filter_map(|(n, k)| family(n, k))
            .map(str::to_string)
            .collect()
    };
    let (real_families, sim_families) = (families(&real), families(&sim));
    let missing: Vec<&str> = real_families
        .difference(&sim_families)
        .map(String::as_str)
        .collect();
    assert_eq!(
        missing, NOT_SIMULATED,
        "vLLM's families the simulator lacks"
    );
    let extra: Vec<&str> = sim_families
        .difference(&real_families)
        .map(String::as_str)
        .collect();
    assert_eq!(extra, SIMULATOR_ONLY, "the simulator's families vLLM lacks");

    // Each shared family: the same `# TYPE` lines, and each sample the same label names.
    for (name, kind) in &sim.types {
        if SIMULATOR_ONLY.iter().any(|f| name.starts_with(f)) {
            continue;
        }
        assert_eq!(real.types.get(name), Some(kind), "# TYPE {name}");
    }
    for (name, labels) in &sim.label_names {
        if SIMULATOR_ONLY.iter().any(|f| name.starts_with(f)) {
            continue;
        }
        assert_eq!(real.label_names.get(name), Some(labels), "labels of {name}");
    }
    // Every sample name vLLM writes for a shared family, the simulator writes too.
    for name in real.label_names.keys() {
        let shared = sim_families.iter().any(|f| {
            name.strip_prefix(f.as_str()).is_some_and(|suffix| {
                ["", "_total", "_created", "_bucket", "_count", "_sum"].contains(&suffix)
            })
        });
        if shared && name.starts_with("vllm:") {
            assert!(
                sim.label_names.contains_key(name),
                "the simulator lacks {name}"
            );
        }
    }
    // The histograms' buckets.
    for (name, bounds) in &sim.buckets {
        assert_eq!(real.buckets.get(name), Some(bounds), "buckets of {name}");
    }
    assert_eq!(sim.buckets.len(), 3);
}

/// `kind` of a msgpack value, for comparing shapes: `nil`, `int`, `float`, `str`, `[kind]`.
fn kind(v: &Value) -> String {
    match v {
        Value::Nil => "nil".into(),
        Value::Integer(_) => "int".into(),
        Value::F32(_) | Value::F64(_) => "float".into(),
        Value::String(_) => "str".into(),
        Value::Array(items) => format!("[{}]", items.first().map_or("".into(), kind)),
        Value::Map(_) => "map".into(),
        other => format!("{other:?}"),
    }
}

/// Per event type, its keys in order and each field's kind (a field that was `nil` in one event
/// and set in another is kept set).
type EventShapes = BTreeMap<String, Vec<(String, String)>>;

fn event_shapes(batches: &[Value]) -> EventShapes {
    let mut out = EventShapes::new();
    for b in batches {
        for e in b.as_array().unwrap()[1].as_array().unwrap() {
            let fields: Vec<(String, String)> = e
                .as_map()
                .unwrap_or_else(|| panic!("an event is a map: {e}"))
                .iter()
                .map(|(k, v)| (k.as_str().unwrap().to_string(), kind(v)))
                .collect();
            assert_eq!(fields[0].0, "type", "{e}");
            let tag = e.as_map().unwrap()[0].1.as_str().unwrap().to_string();
            let entry = out.entry(tag).or_insert_with(|| fields.clone());
            assert_eq!(
                entry.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                fields.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                "one key list per event type"
            );
            for (have, new) in entry.iter_mut().zip(&fields) {
                if have.1 == "nil" || have.1 == "[]" {
                    have.1 = new.1.clone();
                }
            }
        }
    }
    out
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The recorded payloads of both recordings, decoded.
fn recorded_batches() -> Vec<Value> {
    ["default", "cbor-details"]
        .iter()
        .flat_map(|rec| {
            recorded(&format!("{rec}/kv-events.jsonl"))
                .lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    let payload = unhex(v["frames_hex"][2].as_str().unwrap());
                    rmpv::decode::read_value(&mut &payload[..]).unwrap()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn kv_event_batches_and_events_have_vllm_0_32s_shape() {
    let real = recorded_batches();
    // The batch: `[ts, [event, ...], data_parallel_rank]`.
    for b in &real {
        let items = b.as_array().unwrap();
        assert_eq!(items.len(), 3, "{b}");
        assert_eq!(kind(&items[0]), "float", "ts: {b}");
        assert_eq!(items[2].as_u64(), Some(0), "rank 0");
    }
    let sim = encode_batch(&KvBatch {
        ts_unix_s: 1_796_190_000.5,
        events: vec![
            KvEvent::BlockStored {
                block_hashes: vec![1, u64::MAX],
                parent_block_hash: Some(7),
                token_ids: (0..256).collect(),
                block_size: 128,
                lora_id: None,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![1],
            },
            KvEvent::AllBlocksCleared,
        ],
        lora_names: vec![],
    });
    let sim = rmpv::decode::read_value(&mut &sim[..]).unwrap();
    let sim_items = sim.as_array().unwrap();
    assert_eq!(
        sim_items.iter().map(kind).collect::<Vec<_>>(),
        real[0]
            .as_array()
            .unwrap()
            .iter()
            .map(kind)
            .collect::<Vec<_>>()
    );

    let real_shapes = event_shapes(&real);
    let sim_shapes = event_shapes(std::slice::from_ref(&sim));
    // The recordings hold all three event types.
    assert_eq!(
        real_shapes.keys().collect::<Vec<_>>(),
        ["AllBlocksCleared", "BlockRemoved", "BlockStored"]
    );
    assert_eq!(sim_shapes, real_shapes);
}

/// A live replica's frames: `[topic, 8-byte big-endian seq, payload]`, as recorded.
#[tokio::test]
async fn kv_event_frames_have_vllm_0_32s_shape() {
    use zeromq::{Socket, SocketRecv};
    let line = recorded("default/kv-events.jsonl");
    let first: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    let real: Vec<Vec<u8>> = first["frames_hex"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| unhex(f.as_str().unwrap()))
        .collect();
    assert_eq!(real.len(), 3);
    assert_eq!(real[1].len(), 8);
    bounded(30, async {
        let mut sub = zeromq::SubSocket::new();
        let endpoint = sub.bind("tcp://127.0.0.1:0").await.unwrap();
        sub.subscribe("").await.unwrap();
        let mut config = small_config();
        config.kv_events = Some(kinference_vllm_sim::KvEventsConfig {
            endpoint: endpoint.to_string(),
            topic: "kv".into(),
        });
        let replica = start(config).await;
        let base = replica.url();
        let frames = loop {
            reset_and_step(&base).await;
            if let Ok(msg) =
                tokio::time::timeout(std::time::Duration::from_millis(200), sub.recv()).await
            {
                break msg.unwrap().into_vec();
            }
        };
        assert_eq!(frames.len(), real.len());
        assert_eq!(frames[0], real[0], "topic `kv`");
        assert_eq!(frames[1].len(), 8);
        let batch = rmpv::decode::read_value(&mut &frames[2][..]).unwrap();
        assert_eq!(
            batch.as_array().unwrap()[1],
            Value::Array(vec![Value::Map(vec![(
                "type".into(),
                "AllBlocksCleared".into()
            )])])
        );
        replica.shutdown().await;
    })
    .await;
}

/// The keys of the usage of a recorded exchange (a response's, or a stream's usage chunk's), with
/// those of its `prompt_tokens_details` when it is an object.
fn usage_keys(usage: &serde_json::Value) -> (BTreeSet<String>, Option<BTreeSet<String>>) {
    let keys = usage.as_object().unwrap().keys().cloned().collect();
    let details = usage["prompt_tokens_details"]
        .as_object()
        .map(|d| d.keys().cloned().collect());
    (keys, details)
}

fn recorded_usage(recording: &str, name: &str) -> serde_json::Value {
    let exchanges: Vec<serde_json::Value> =
        serde_json::from_str(&recorded(&format!("{recording}/exchanges.json"))).unwrap();
    let e = exchanges.iter().find(|e| e["name"] == name).unwrap();
    match e["response"]["sse"].as_array() {
        Some(chunks) => chunks
            .iter()
            .rev()
            .find_map(|c| c.get("usage"))
            .unwrap()
            .clone(),
        None => e["response"]["json"]["usage"].clone(),
    }
}

/// Usage as vLLM 0.32 writes it without `--enable-prompt-tokens-details` (the simulator's
/// `prompt_tokens_details: false`) and with it (the simulator's default). With it, vLLM's details
/// also carry `created_cache_tokens` and, in a response, `multimodal_tokens`; the simulator's
/// carry `cached_tokens` only, the one the proxy reads.
#[tokio::test]
async fn usage_has_vllm_0_32s_keys_with_and_without_prompt_tokens_details() {
    for (details, recording) in [(false, "default"), (true, "cbor-details")] {
        let mut config = small_config();
        config.prompt_tokens_details = details;
        let replica = start(config).await;
        let base = replica.url();
        let url = format!("{base}/v1/chat/completions");
        let (plain, streamed) = bounded(20, async {
            let (status, plain) = post_json(&url, &chat_body("hello there", 4, false)).await;
            assert_eq!(status, 200, "{plain}");
            let (status, streamed) = post_json(&url, &chat_body("hello there", 4, true)).await;
            assert_eq!(status, 200, "{streamed}");
            let data = sse_data(streamed.as_str().unwrap());
            let chunk: serde_json::Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
            (plain["usage"].clone(), chunk["usage"].clone())
        })
        .await;
        replica.shutdown().await;
        for (sim, name) in [(plain, "chat"), (streamed, "chat-stream")] {
            let real = recorded_usage(recording, name);
            let (sim_keys, sim_details) = usage_keys(&sim);
            let (real_keys, real_details) = usage_keys(&real);
            assert_eq!(sim_keys, real_keys, "{recording} {name}: {sim} vs {real}");
            match (sim_details, real_details) {
                (None, None) => {
                    assert_eq!(sim["prompt_tokens_details"], real["prompt_tokens_details"]);
                }
                (Some(sim_d), Some(real_d)) => {
                    assert!(sim_d.contains("cached_tokens"), "{sim}");
                    assert!(
                        sim_d.is_subset(&real_d),
                        "{recording} {name}: {sim} vs {real}"
                    );
                }
                _ => panic!("{recording} {name}: {sim} vs {real}"),
            }
        }
    }
}
