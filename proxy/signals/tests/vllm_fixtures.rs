//! The proxy's readers of vLLM's formats against what real vLLM 0.32.0 sent, recorded by
//! `scripts/record_vllm_fixtures.py` into `tests/fixtures/vllm-0.32.0` (its README names the
//! flags): the `/metrics` expositions, the KV-event frames a ZMQ SUB socket received, and the
//! `/load` and `/v1/models` answers. No vLLM is started here.
//!
//! Two recordings: `default` (the recipe's flags, `prefix_caching_hash_algo` sha256, no
//! `--enable-prompt-tokens-details`) and `cbor-details` (sha256_cbor, prompt-token details, and a
//! small engine, `--max-num-seqs 2` and 20 blocks, that queues and evicts).

use bytes::Bytes;
use kinference_proxy_signals::{
    KvEventError, KvEventsConfig, Scraper, VllmMetrics,
    kv_events::decode_batch,
    parse_vllm_metrics, subscribe_kv_events_with,
    tokenizer::{
        PromptRef, Tokenizer,
        vllm_hash::{BlockDigest, ExtraKeys, Sha256Cbor},
    },
};
use kinference_routing::KvEvent;
use serde_json::Value;
use std::{
    collections::{BTreeSet, HashMap},
    net::SocketAddr,
    time::Duration,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zeromq::{Socket, SocketSend, ZmqMessage};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vllm-0.32.0");
const RECORDINGS: [&str; 2] = ["default", "cbor-details"];
const EXPOSITIONS: [&str; 3] = ["before", "during", "after"];
const BLOCK: usize = 128;

fn read(recording: &str, file: &str) -> String {
    let path = format!("{DIR}/{recording}/{file}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn exchanges(recording: &str) -> Vec<Value> {
    serde_json::from_str(&read(recording, "exchanges.json")).unwrap()
}

fn exchange<'a>(exchanges: &'a [Value], name: &str) -> &'a Value {
    exchanges
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no exchange {name}"))
}

/// The JSON body of an exchange.
fn body<'a>(exchanges: &'a [Value], name: &str) -> &'a Value {
    &exchange(exchanges, name)["response"]["json"]
}

/// The usage of a response: the body's, or a stream's last chunk before `[DONE]`.
fn usage(e: &Value) -> Option<&Value> {
    let r = &e["response"];
    if let Some(sse) = r["sse"].as_array() {
        return sse.iter().rev().find_map(|c| c.get("usage"));
    }
    r["json"].get("usage")
}

/// One recorded KV-event message.
struct Message {
    step: String,
    seq: u64,
    frames: Vec<Vec<u8>>,
    summary: Value,
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "{s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn messages(recording: &str) -> Vec<Message> {
    read(recording, "kv-events.jsonl")
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            Message {
                step: v["step"].as_str().unwrap().to_string(),
                seq: v["seq"].as_u64().expect("a 3-frame message has a seq"),
                frames: v["frames_hex"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| unhex(f.as_str().unwrap()))
                    .collect(),
                summary: v["summary"].clone(),
            }
        })
        .collect()
}

/// A hash as the recorder's own decoder wrote it: `int:N` (vLLM publishes integers by default).
fn recorded_hash(v: &Value) -> u64 {
    let s = v.as_str().unwrap();
    s.strip_prefix("int:")
        .unwrap_or_else(|| panic!("an integer hash: {s}"))
        .parse()
        .unwrap()
}

/// The first sample of `name` in the text, read naively (for the parser to agree with).
fn first_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no {name}"))
        .parse()
        .unwrap()
}

/// The `num_gpu_blocks` each recording ran with.
fn gpu_blocks(recording: &str) -> u32 {
    match recording {
        "default" => 8192,
        _ => 20,
    }
}

#[test]
fn every_recorded_exposition_yields_every_signal_the_proxy_reads() {
    for rec in RECORDINGS {
        for at in EXPOSITIONS {
            let text = read(rec, &format!("metrics-{at}.txt"));
            let m = parse_vllm_metrics(&text).unwrap_or_else(|e| panic!("{rec} {at}: {e}"));
            let ctx = format!("{rec}/metrics-{at}.txt");
            let VllmMetrics {
                num_requests_running,
                num_requests_waiting,
                num_requests_waiting_by_reason,
                kv_cache_usage,
                prefix_cache_queries_tokens,
                prefix_cache_hits_tokens,
                prompt_tokens,
                generation_tokens,
                num_preemptions,
                block_size,
                num_gpu_blocks,
                running_lora_adapters,
                max_lora,
            } = &m;
            for (got, name) in [
                (num_requests_running, "vllm:num_requests_running"),
                (num_requests_waiting, "vllm:num_requests_waiting"),
                (kv_cache_usage, "vllm:kv_cache_usage_perc"),
                (
                    prefix_cache_queries_tokens,
                    "vllm:prefix_cache_queries_total",
                ),
                (prefix_cache_hits_tokens, "vllm:prefix_cache_hits_total"),
                (prompt_tokens, "vllm:prompt_tokens_total"),
                (generation_tokens, "vllm:generation_tokens_total"),
                (num_preemptions, "vllm:num_preemptions_total"),
            ] {
                assert_eq!(*got, Some(first_value(&text, name)), "{ctx}: {name}");
            }
            assert_eq!(*block_size, Some(128), "{ctx}: CPU vLLM's block size");
            assert_eq!(*num_gpu_blocks, Some(gpu_blocks(rec)), "{ctx}");
            // The new family: one sample per reason, adding up to the waiting queue.
            let reasons: Vec<&str> = num_requests_waiting_by_reason
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(reasons, ["capacity", "deferred"], "{ctx}");
            assert_eq!(
                Some(num_requests_waiting_by_reason.values().sum::<f64>()),
                *num_requests_waiting,
                "{ctx}"
            );
            // No LoRA: vLLM 0.32 has no `vllm:lora_requests_info` without `--enable-lora`.
            assert!(
                running_lora_adapters.is_empty() && max_lora.is_none(),
                "{ctx}"
            );
        }
    }
}

#[test]
fn the_full_exposition_is_read_whole_though_most_of_it_is_skipped() {
    let text = read("default", "metrics-after.txt");
    // What the parser must step over: comments, `_created` gauges, histogram buckets, other
    // families (http_, process_, python_) and vLLM's sixty-odd families the router ignores.
    assert!(text.contains("_created{"));
    assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\""));
    assert!(text.contains("\nprocess_cpu_seconds_total "));
    let families: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert!(families.len() > 80, "{}", families.len());
    parse_vllm_metrics(&text).unwrap();
    // The same with CRLF line ends, and cut at every line (a truncated scrape is still Prometheus).
    parse_vllm_metrics(&text.replace('\n', "\r\n")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for n in (0..lines.len()).step_by(37) {
        let _ = parse_vllm_metrics(&lines[..n].join("\n"));
    }
}

#[test]
fn cache_config_info_reports_block_size_blocks_and_hash_algorithm() {
    for (rec, algo) in [("default", "sha256"), ("cbor-details", "sha256_cbor")] {
        let text = read(rec, "metrics-after.txt");
        let info = text
            .lines()
            .find(|l| l.starts_with("vllm:cache_config_info{"))
            .unwrap();
        assert!(info.contains("block_size=\"128\""), "{info}");
        assert!(info.contains(&format!("prefix_caching_hash_algo=\"{algo}\"")));
        assert!(info.contains(&format!("num_gpu_blocks=\"{}\"", gpu_blocks(rec))));
        assert!(info.ends_with("} 1.0"), "{info}");
    }
}

#[test]
fn a_burst_on_a_small_engine_shows_running_and_waiting_by_reason() {
    let m = parse_vllm_metrics(&read("cbor-details", "metrics-during.txt")).unwrap();
    assert_eq!(m.num_requests_running, Some(2.0), "--max-num-seqs 2");
    let waiting = m.num_requests_waiting.unwrap();
    assert!(waiting >= 1.0, "the rest of the burst waits: {waiting}");
    assert_eq!(m.num_requests_waiting_by_reason["capacity"], waiting);
    assert_eq!(m.num_requests_waiting_by_reason["deferred"], 0.0);
    let m = parse_vllm_metrics(&read("default", "metrics-during.txt")).unwrap();
    assert!(m.num_requests_running.unwrap() >= 1.0);
}

/// With `--enable-prompt-tokens-details` vLLM reports `cached_tokens` in each usage; without it,
/// `prompt_tokens_details` is null (non-streaming) or absent (streaming). The engine's counter
/// `vllm:prefix_cache_hits_total` rises by the same tokens either way.
#[test]
fn cached_tokens_are_in_the_usage_only_with_prompt_tokens_details_but_always_in_the_counters() {
    let mut cached_by_recording = Vec::new();
    for rec in RECORDINGS {
        let ex = exchanges(rec);
        let mut cached = 0.0;
        let mut usages = 0;
        for e in &ex {
            let Some(u) = usage(e) else { continue };
            usages += 1;
            let details = u.get("prompt_tokens_details");
            if rec == "default" {
                assert!(details.is_none_or(Value::is_null), "{}: {u}", e["name"]);
            } else {
                let c = &details.unwrap_or_else(|| panic!("{}: {u}", e["name"]))["cached_tokens"];
                cached += c.as_f64().unwrap();
            }
        }
        assert!(usages >= 12, "{rec}: {usages}");
        let before = parse_vllm_metrics(&read(rec, "metrics-before.txt")).unwrap();
        let after = parse_vllm_metrics(&read(rec, "metrics-after.txt")).unwrap();
        let hits =
            after.prefix_cache_hits_tokens.unwrap() - before.prefix_cache_hits_tokens.unwrap();
        if rec == "cbor-details" {
            assert_eq!(hits, cached, "the counter agrees with the usages");
        }
        cached_by_recording.push(hits);
    }
    // The same script hits the cache as much with and without the usage detail.
    assert_eq!(cached_by_recording[0], cached_by_recording[1]);
    let ex = exchanges("cbor-details");
    let hit = |name| {
        usage(exchange(&ex, name)).unwrap()["prompt_tokens_details"]["cached_tokens"].clone()
    };
    assert_eq!(hit("shared-prefix-1"), 0);
    assert_eq!(hit("shared-prefix-2"), 2 * BLOCK, "two full blocks of 128");
    assert_eq!(hit("shared-prefix-3"), 2 * BLOCK);
    assert_eq!(hit("shared-chat-2"), 2 * BLOCK);
}

#[test]
fn errors_for_an_unknown_model_and_an_over_long_prompt() {
    for rec in RECORDINGS {
        let ex = exchanges(rec);
        for (name, status, kind, param) in [
            ("unknown-model", 404, "NotFoundError", "model"),
            ("unknown-model-completion", 404, "NotFoundError", "model"),
            ("over-long-prompt", 400, "BadRequestError", "input_tokens"),
            ("over-long-max-tokens", 400, "BadRequestError", "max_tokens"),
        ] {
            let e = exchange(&ex, name);
            assert_eq!(e["status"], status, "{rec} {name}");
            let err = &e["response"]["json"]["error"];
            assert_eq!(err["type"], kind, "{rec} {name}: {err}");
            assert_eq!(err["param"], param, "{rec} {name}: {err}");
            assert_eq!(err["code"], status, "{rec} {name}: {err}");
            assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }
}

/// Every recorded message decodes, and to what the recorder's own decoder (msgspec, in Python)
/// saw: the same events, hashes, parents, block sizes and token counts.
#[test]
fn recorded_kv_frames_decode_to_what_vllm_sent() {
    for rec in RECORDINGS {
        let msgs = messages(rec);
        assert!(!msgs.is_empty(), "{rec}");
        for (i, m) in msgs.iter().enumerate() {
            let ctx = format!("{rec} seq {} ({})", m.seq, m.step);
            assert_eq!(m.frames.len(), 3, "{ctx}: [topic, seq, payload]");
            assert_eq!(m.frames[0], b"kv", "{ctx}: the configured topic");
            assert_eq!(
                m.frames[1],
                m.seq.to_be_bytes(),
                "{ctx}: 8-byte big-endian seq"
            );
            assert_eq!(m.seq, i as u64, "{ctx}: numbered from 0 without a gap");
            let events = decode_batch(&m.frames[2]).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            let want = m.summary["events"].as_array().unwrap();
            assert_eq!(events.len(), want.len(), "{ctx}");
            for (got, want) in events.iter().zip(want) {
                assert_eq!(want["form"], "map", "{ctx}: vLLM 0.32 sends events as maps");
                match (got, want["type"].as_str().unwrap()) {
                    (
                        KvEvent::BlockStored {
                            block_hashes,
                            parent_block_hash,
                            token_ids,
                            block_size,
                        },
                        "BlockStored",
                    ) => {
                        let hashes: Vec<u64> = want["block_hashes"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(recorded_hash)
                            .collect();
                        assert_eq!(*block_hashes, hashes, "{ctx}");
                        let parent = (!want["parent_block_hash"].is_null())
                            .then(|| recorded_hash(&want["parent_block_hash"]));
                        assert_eq!(*parent_block_hash, parent, "{ctx}");
                        assert_eq!(*block_size, 128, "{ctx}");
                        assert_eq!(token_ids.len(), block_hashes.len() * BLOCK, "{ctx}");
                        assert_eq!(token_ids.len() as u64, want["token_count"], "{ctx}");
                        let head: Vec<u64> = token_ids[..8].iter().map(|&t| t.into()).collect();
                        assert_eq!(serde_json::json!(head), want["token_ids_head"], "{ctx}");
                        assert_eq!(want["medium"], "GPU", "{ctx}");
                    }
                    (KvEvent::BlockRemoved { block_hashes }, "BlockRemoved") => {
                        let hashes: Vec<u64> = want["block_hashes"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(recorded_hash)
                            .collect();
                        assert_eq!(*block_hashes, hashes, "{ctx}");
                    }
                    (KvEvent::AllBlocksCleared, "AllBlocksCleared") => {}
                    (got, want) => panic!("{ctx}: decoded {got:?}, vLLM sent {want}"),
                }
            }
        }
    }
}

/// All stored events of a recording, in order.
fn stored(recording: &str) -> Vec<(Vec<u64>, Option<u64>, Vec<u32>)> {
    messages(recording)
        .iter()
        .flat_map(|m| decode_batch(&m.frames[2]).unwrap())
        .filter_map(|e| match e {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                ..
            } => Some((block_hashes, parent_block_hash, token_ids)),
            _ => None,
        })
        .collect()
}

/// The repeated prompt: its full blocks are stored once, with the very token ids `/tokenize`
/// gives, and a prompt extending it chains its next block to the last shared one.
#[test]
fn a_prompts_full_blocks_are_stored_with_its_tokens_and_chained() {
    for rec in RECORDINGS {
        let ex = exchanges(rec);
        let tokens: Vec<u32> = body(&ex, "tokenize-shared")["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
            .collect();
        let prompt_tokens = usage(exchange(&ex, "shared-prefix-1")).unwrap()["prompt_tokens"]
            .as_u64()
            .unwrap();
        assert_eq!(tokens.len() as u64, prompt_tokens, "{rec}");
        let full = tokens.len() / BLOCK;
        assert_eq!(
            full, 2,
            "{rec}: the shared prompt spans two full blocks and a part"
        );
        let stored = stored(rec);
        let first: Vec<_> = stored
            .iter()
            .filter(|(_, parent, ids)| parent.is_none() && ids[..] == tokens[..full * BLOCK])
            .collect();
        assert_eq!(first.len(), 1, "{rec}: stored once, though sent twice");
        let shared = &first[0].0;
        assert_eq!(shared.len(), full, "{rec}: one hash per full block");
        // shared-prefix-3 (the prompt and more) adds one block after the shared two.
        let next: Vec<_> = stored
            .iter()
            .filter(|(_, parent, _)| *parent == shared.last().copied())
            .collect();
        assert_eq!(next.len(), 1, "{rec}");
        assert_eq!(next[0].0.len(), 1, "{rec}");
        // Every parent named is a block stored before.
        let mut seen = BTreeSet::new();
        for (hashes, parent, _) in &stored {
            if let Some(p) = parent {
                assert!(seen.contains(p), "{rec}: parent {p} stored earlier");
            }
            seen.extend(hashes.iter().copied());
        }
    }
}

/// Under KV pressure (20 blocks) vLLM evicts blocks it stored before, and a prefix-cache reset is
/// one `AllBlocksCleared`.
#[test]
fn evictions_remove_stored_blocks_and_a_reset_clears_all() {
    let msgs = messages("cbor-details");
    let mut cached = BTreeSet::new();
    let mut removed = 0;
    let mut cleared = 0;
    for m in &msgs {
        for e in decode_batch(&m.frames[2]).unwrap() {
            match e {
                KvEvent::BlockStored { block_hashes, .. } => cached.extend(block_hashes),
                KvEvent::BlockRemoved { block_hashes } => {
                    for h in block_hashes {
                        assert!(cached.remove(&h), "removed {h}, which was not cached");
                        removed += 1;
                    }
                }
                KvEvent::AllBlocksCleared => {
                    cleared += 1;
                    cached.clear();
                }
            }
        }
        // Never more cached than the 19 usable blocks (vLLM keeps one as its null block).
        assert!(
            cached.len() <= 19,
            "{} cached at seq {}",
            cached.len(),
            m.seq
        );
    }
    assert!(removed > 0, "the small cache evicted");
    assert_eq!(cleared, 1);
    let last = messages("cbor-details").pop().unwrap();
    assert_eq!(
        decode_batch(&last.frames[2]).unwrap(),
        [KvEvent::AllBlocksCleared]
    );
}

type Rx = tokio::sync::mpsc::Receiver<Result<Vec<KvEvent>, KvEventError>>;

/// The next item within `ms` milliseconds (a retry cadence, not a speed assertion).
async fn next(rx: &mut Rx, ms: u64) -> Option<Result<Vec<KvEvent>, KvEventError>> {
    tokio::time::timeout(Duration::from_millis(ms), rx.recv())
        .await
        .ok()
        .flatten()
}

/// The subscriber itself, over a real ZMQ socket, fed the recorded frames byte for byte.
#[tokio::test]
async fn the_subscriber_reads_the_recorded_frames_over_zmq() {
    let msgs = messages("cbor-details");
    let message = |m: &Message| {
        ZmqMessage::try_from(
            m.frames
                .iter()
                .map(|f| Bytes::from(f.clone()))
                .collect::<Vec<_>>(),
        )
        .unwrap()
    };
    let mut publisher = zeromq::PubSocket::new();
    let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    let mut config = KvEventsConfig::new(endpoint.to_string(), "kv");
    config.idle_reconnect = Duration::from_secs(60);
    let mut rx = subscribe_kv_events_with(config);
    // PUB drops what it sends before the subscription arrives: send the first message until it is
    // received, then drain its repeats (each one a gap back to 0).
    let first = decode_batch(&msgs[0].frames[2]).unwrap();
    let mut got_first = false;
    for _ in 0..200 {
        publisher.send(message(&msgs[0])).await.unwrap();
        if let Some(item) = next(&mut rx, 50).await {
            assert_eq!(item.unwrap(), first);
            got_first = true;
            break;
        }
    }
    assert!(got_first, "the subscriber never received a message");
    while let Some(item) = next(&mut rx, 300).await {
        match item {
            Err(KvEventError::SequenceGap {
                expected: 1,
                received: 0,
            }) => {}
            Ok(batch) => assert_eq!(batch, first),
            Err(e) => panic!("{e}"),
        }
    }
    for m in &msgs[1..] {
        publisher.send(message(m)).await.unwrap();
        let item = next(&mut rx, 10_000).await.expect("a batch");
        assert_eq!(
            item.unwrap_or_else(|e| panic!("seq {}: {e}", m.seq)),
            decode_batch(&m.frames[2]).unwrap()
        );
    }
}

/// Serves `(path, content type, body)` answers over HTTP/1.1 on loopback.
async fn canned(routes: Vec<(&'static str, &'static str, String)>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut io, _)) = listener.accept().await {
            let routes = routes.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match io.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split(' ').nth(1).unwrap_or_default();
                let answer = match routes.iter().find(|(p, ..)| *p == path) {
                    Some((_, ctype, body)) => format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n\
                         connection: close\r\n\r\n{body}",
                        body.len()
                    ),
                    None => {
                        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            .to_string()
                    }
                };
                let _ = io.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// `GET /load`, `GET /v1/models` and `/metrics` as vLLM answered them, through the scraper.
#[tokio::test]
async fn the_scraper_reads_vllms_load_models_and_metrics_answers() {
    for rec in RECORDINGS {
        let ex = exchanges(rec);
        let json = |name: &str| {
            let e = exchange(&ex, name);
            assert_eq!(e["content_type"], "application/json", "{rec} {name}");
            e["response"]["json"].to_string()
        };
        assert_eq!(
            body(&ex, "tokenize-prompt")
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["count", "max_model_len", "token_strs", "tokens"],
            "{rec}: /tokenize"
        );
        let busy = body(&ex, "load-busy")["server_load"].as_u64().unwrap();
        assert!(busy >= 1, "{rec}: requests held during the burst");
        let addr = canned(vec![
            ("/load", "application/json", json("load-idle")),
            ("/load-busy", "application/json", json("load-busy")),
            ("/v1/models", "application/json", json("models")),
            (
                "/metrics",
                "text/plain; version=0.0.4; charset=utf-8",
                read(rec, "metrics-after.txt"),
            ),
        ])
        .await;
        let scraper = Scraper::new(Duration::from_secs(10));
        let url = |p: &str| format!("http://{addr}{p}").parse::<http::Uri>().unwrap();
        assert_eq!(scraper.server_load(&url("/load")).await.unwrap(), 0);
        assert_eq!(
            u64::from(scraper.server_load(&url("/load-busy")).await.unwrap()),
            busy
        );
        assert_eq!(
            scraper.max_model_len(&url("/v1/models")).await.unwrap(),
            Some(2048)
        );
        let m = scraper.scrape(&url("/metrics")).await.unwrap();
        assert_eq!(m.block_size, Some(128));
        assert_eq!(m.num_gpu_blocks, Some(gpu_blocks(rec)));
    }
}

/// The recorder recomputed every published block hash from the event's own token ids, outside
/// vLLM (`sha256` of a pickle, or of canonical CBOR, of `(parent digest, block token ids, extra
/// keys)` from `H("vllm-none-hash")`, folded to the digest's last 8 bytes): each recording matches
/// its algorithm and not the other. This pins what a router must implement to compute vLLM's
/// hashes itself (sha256_cbor: no Python pickle involved).
#[test]
fn the_recorder_reproduced_every_published_hash_with_the_configured_algorithm() {
    for (rec, algo, other) in [
        ("default", "sha256", "sha256_cbor"),
        ("cbor-details", "sha256_cbor", "sha256"),
    ] {
        let mut stored = 0;
        for m in messages(rec) {
            for e in m.summary["events"].as_array().unwrap() {
                if e["type"] == "BlockStored" {
                    stored += 1;
                    assert_eq!(e["recomputed_by"][algo], true, "{rec} seq {}", m.seq);
                    assert_eq!(e["recomputed_by"][other], false, "{rec} seq {}", m.seq);
                }
            }
        }
        assert!(stored >= 5, "{rec}: {stored}");
    }
}

/// The proxy's own `sha256_cbor` (`tokenizer::vllm_hash`) recomputes every hash vLLM published
/// in the `cbor-details` recording, byte for byte, from the events' own token ids and parents: a
/// chain continues from the parent's full digest, computed from an earlier event. The same code
/// finds none of the `default` recording's (pickle) hashes.
#[test]
fn sha256_cbor_recomputes_every_published_block_hash() {
    let h = Sha256Cbor::default();
    let none = ExtraKeys::default();
    for (rec, matches) in [("cbor-details", true), ("default", false)] {
        let mut digests: HashMap<u64, BlockDigest> = HashMap::new();
        let (mut blocks, mut equal) = (0, 0);
        for (block_hashes, parent, token_ids) in stored(rec) {
            let mut parent = match parent {
                None => Some(h.none_hash()),
                Some(p) => digests.get(&p).copied(),
            };
            for (i, &published) in block_hashes.iter().enumerate() {
                let Some(p) = parent else { break };
                let digest = h.hash_block(
                    Some(&p),
                    &token_ids[i * BLOCK..(i + 1) * BLOCK],
                    &none,
                    false,
                );
                blocks += 1;
                if digest.external() == published {
                    equal += 1;
                    digests.insert(published, digest);
                    parent = Some(digest);
                } else {
                    parent = None;
                }
            }
        }
        if matches {
            assert!(blocks >= 10, "{rec}: {blocks} blocks");
            assert_eq!(equal, blocks, "{rec}: every published hash recomputed");
        } else {
            assert!(blocks >= 1, "{rec}");
            assert_eq!(equal, 0, "{rec}: pickle hashes are another space");
        }
    }
    // A prompt hashed from its `/tokenize` ids, as a router would, names the very blocks vLLM
    // stored for it.
    let ex = exchanges("cbor-details");
    let tokens: Vec<u32> = body(&ex, "tokenize-shared")["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
        .collect();
    let ours = h.block_hashes(&tokens, BLOCK as u32, &none);
    assert_eq!(ours.len(), 2);
    assert!(
        stored("cbor-details")
            .iter()
            .any(|(hashes, parent, _)| parent.is_none() && *hashes == ours),
        "{ours:?}"
    );
}

/// The request's token ids as a `/tokenize` exchange recorded them.
fn tokenized(ex: &[Value], name: &str) -> Vec<u32> {
    body(ex, name)["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
        .collect()
}

/// A recorded request as the proxy parses it: chat turns or a completion prompt.
enum Prompt {
    Chat(Vec<(String, String)>),
    Completion(String),
}

fn prompt_of(e: &Value) -> Prompt {
    let r = &e["request"];
    match r["messages"].as_array() {
        Some(m) => Prompt::Chat(
            m.iter()
                .map(|t| {
                    let s = |k: &str| t[k].as_str().unwrap().to_string();
                    (s("role"), s("content"))
                })
                .collect(),
        ),
        None => Prompt::Completion(r["prompt"].as_str().unwrap().to_string()),
    }
}

fn tokens_with(t: &Tokenizer, p: &Prompt) -> Vec<u32> {
    match p {
        Prompt::Chat(turns) => {
            let turns: Vec<(&str, &str)> = turns.iter().map(|(r, c)| (&**r, &**c)).collect();
            t.tokens(PromptRef::Chat(&turns)).unwrap()
        }
        Prompt::Completion(text) => t.tokens(PromptRef::Completion(text)).unwrap(),
    }
}

/// The `hf:` contract on the tiny model's own `tokenizer.json` and chat template (copied into
/// the fixtures beside the recordings, from the model directory `make_tiny_model.py` wrote): from
/// the prompt text alone it computes the ids vLLM's `/tokenize` answered, the very block hashes
/// vLLM published for each request, and so the cached tokens vLLM then reported.
#[test]
fn the_models_own_tokenizer_and_template_give_vllms_tokens_and_block_hashes_from_text() {
    let t = Tokenizer::load(&format!("hf:{DIR}/tiny-model")).unwrap();
    let ex = exchanges("cbor-details");
    // `/tokenize`, chat (template rendered) and completion (as is).
    for name in ["tokenize-chat", "tokenize-prompt"] {
        let e = exchange(&ex, name);
        assert_eq!(
            tokens_with(&t, &prompt_of(e)),
            tokenized(&ex, name),
            "{name}"
        );
    }
    // Replay the chat requests (recorded whole; the long completion prompts are abbreviated in the
    // recording, and their `/tokenize` ids are checked above) in order against the stored blocks:
    // each request's leading blocks already stored are the cached tokens vLLM reported, and its
    // other full blocks are what it stored next.
    let stored_hashes: Vec<u64> = stored("cbor-details")
        .into_iter()
        .flat_map(|(h, _, _)| h)
        .collect();
    let mut held: BTreeSet<u64> = BTreeSet::new();
    let mut checked = 0;
    for name in ["chat", "shared-chat-1", "shared-chat-2", "shared-chat-3"] {
        let e = exchange(&ex, name);
        let tokens = tokens_with(&t, &prompt_of(e));
        let u = usage(e).unwrap();
        assert_eq!(
            tokens.len() as u64,
            u["prompt_tokens"].as_u64().unwrap(),
            "{name}"
        );
        let hashes = t.block_hashes(&tokens, BLOCK as u32);
        let hit = hashes.iter().take_while(|h| held.contains(h)).count();
        assert_eq!(
            (hit * BLOCK) as u64,
            u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
            "{name}"
        );
        for h in &hashes {
            assert!(stored_hashes.contains(h), "{name}: {h} was never stored");
            held.insert(*h);
            checked += 1;
        }
    }
    assert!(checked >= 6, "{checked}");
}
