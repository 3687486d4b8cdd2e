//! One server under test, vLLM or the simulator, as the scenario talks to it: completions with
//! token-id prompts, the gauges and counters of `/metrics`, `POST /reset_prefix_cache`, and its
//! KV events, each block named by the prompt and block index it holds.
//!
//! Block hashes differ between the two (vLLM hashes with `sha256_cbor`, the simulator with
//! xxh3), so events are compared by what a block holds: `A/1` is block 1 (tokens 128..256) of
//! the prompt registered as `A`, `Q/7+` is block 7 of `Q`'s sequence with output tokens in it
//! (the two engines generate different tokens).

use std::{collections::HashMap, time::Duration};

use rmpv::Value;
use serde_json::json;
use tokio::{sync::mpsc, time::Instant};
use zeromq::{Socket, SocketRecv};

/// Tokens per KV block, vLLM's CPU default.
pub const BLOCK: usize = 128;
/// The model name both serve.
pub const MODEL: &str = "tiny";

/// A KV-cache event with vLLM's fields that name blocks.
#[derive(Clone, Debug)]
enum RawEvent {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
    },
    Removed(Vec<u64>),
    Cleared,
}

/// What a completion's usage said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub prompt: u64,
    pub cached: u64,
    pub completion: u64,
}

/// The `/metrics` values the scenario reads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Gauges {
    pub running: u32,
    pub waiting: u32,
    pub preemptions: u64,
    pub queries: u64,
    pub hits: u64,
    /// `generation_tokens_total`: moves with every step.
    pub generated: u64,
}

pub struct Target {
    pub name: &'static str,
    base: String,
    http: reqwest::Client,
    kv: mpsc::UnboundedReceiver<Vec<RawEvent>>,
    /// Registered prompts, in order: a block is named after the first one holding its tokens.
    prompts: Vec<(String, Vec<u32>)>,
    /// Block hash → (name, block index, holds output tokens).
    names: HashMap<u64, (String, usize, bool)>,
}

/// How the subscriber reaches the publisher.
pub enum KvSocket {
    /// Connect to a publisher that binds (vLLM's `tcp://*:PORT`).
    Connect(String),
    /// A socket already bound and subscribed, which the publisher connects to.
    Bound(zeromq::SubSocket),
}

impl Target {
    pub async fn new(name: &'static str, base: String, kv: KvSocket) -> Self {
        let mut sub = match kv {
            KvSocket::Connect(endpoint) => {
                let mut sub = zeromq::SubSocket::new();
                sub.connect(&endpoint)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: connecting to {endpoint}: {e}"));
                sub.subscribe("").await.unwrap();
                sub
            }
            KvSocket::Bound(sub) => sub,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(msg) = sub.recv().await {
                let frames = msg.into_vec();
                assert_eq!(frames.len(), 3, "[topic, seq, payload]");
                if tx.send(decode(&frames[2])).is_err() {
                    break;
                }
            }
        });
        Self {
            name,
            base,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            kv: rx,
            prompts: Vec::new(),
            names: HashMap::new(),
        }
    }

    /// A client for requests sent in the background.
    pub fn client(&self) -> Client {
        Client {
            base: self.base.clone(),
            http: self.http.clone(),
        }
    }

    /// Registers `tokens` as prompt `name`, so its blocks are named after it.
    pub fn register(&mut self, name: &str, tokens: &[u32]) {
        self.prompts.push((name.to_string(), tokens.to_vec()));
    }

    pub async fn complete(&self, prompt: &[u32], max_tokens: u32) -> Usage {
        self.client().complete(prompt, max_tokens).await
    }

    pub async fn gauges(&self) -> Gauges {
        self.client().gauges().await
    }

    /// See [`Client::pause`].
    pub async fn pause(&self) {
        self.client().pause().await;
    }

    pub async fn reset_prefix_cache(&self) {
        self.client().post("/reset_prefix_cache").await;
    }

    /// Resets the prefix cache and waits for its `AllBlocksCleared`, stepping the engine with a
    /// request too short to fill a block (vLLM publishes what a reset queued with the next step's
    /// events) until it arrives: a PUB socket drops what it sends before a subscription reaches
    /// it. Returns how many tries it took.
    pub async fn handshake(&mut self) -> u32 {
        for tries in 1..=100 {
            self.reset_prefix_cache().await;
            self.complete(&[5, 6, 7, 8], 1).await;
            let deadline = Instant::now() + Duration::from_millis(300);
            while let Ok(Some(batch)) = tokio::time::timeout_at(deadline, self.kv.recv()).await {
                if batch.iter().any(|e| matches!(e, RawEvent::Cleared)) {
                    self.drain(Duration::from_millis(200)).await;
                    return tries;
                }
            }
        }
        panic!("{}: no AllBlocksCleared after 100 resets", self.name);
    }

    /// The batches received until none arrived for `quiet`, each event named: `S:A/0,A/1`
    /// (`BlockStored`), `R:A/1` (`BlockRemoved`), `Cleared`.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        while let Ok(Some(batch)) = tokio::time::timeout(quiet, self.kv.recv()).await {
            out.push(batch.into_iter().map(|e| self.name_event(e)).collect());
        }
        out
    }

    fn name_event(&mut self, e: RawEvent) -> String {
        match e {
            RawEvent::Cleared => "Cleared".into(),
            RawEvent::Removed(hashes) => {
                let names: Vec<String> = hashes
                    .iter()
                    .map(|h| match self.names.get(h) {
                        Some(n) => label(n),
                        None => format!("?{h:x}"),
                    })
                    .collect();
                format!("R:{}", names.join(","))
            }
            RawEvent::Stored {
                hashes,
                parent,
                tokens,
            } => {
                let (mut owner, first) = match parent.and_then(|p| self.names.get(&p)) {
                    Some((owner, index, _)) => (Some(owner.clone()), index + 1),
                    None => (None, 0),
                };
                let mut names = Vec::new();
                for (k, h) in hashes.iter().enumerate() {
                    let index = first + k;
                    let block = &tokens[k * BLOCK..((k + 1) * BLOCK).min(tokens.len())];
                    let holder = self.prompts.iter().find(|(_, p)| {
                        p.len() >= (index + 1) * BLOCK
                            && &p[index * BLOCK..(index + 1) * BLOCK] == block
                    });
                    let name = match holder {
                        Some((n, _)) => (n.clone(), index, false),
                        None => (owner.clone().unwrap_or_else(|| "?".into()), index, true),
                    };
                    owner = Some(name.0.clone());
                    names.push(label(&name));
                    self.names.insert(*h, name);
                }
                format!("S:{}", names.join(","))
            }
        }
    }
}

fn label((name, index, output): &(String, usize, bool)) -> String {
    format!("{name}/{index}{}", if *output { "+" } else { "" })
}

/// The HTTP side of a target, cheap to clone into tasks.
#[derive(Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    /// `POST /v1/completions` with a token-id prompt, `max_tokens` tokens exactly (EOS ignored,
    /// greedy), and the usage it reports.
    pub async fn complete(&self, prompt: &[u32], max_tokens: u32) -> Usage {
        let resp = self
            .http
            .post(format!("{}/v1/completions", self.base))
            .json(&json!({
                "model": MODEL,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": true,
            }))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(status, 200, "{}: {body}", self.base);
        let u = &body["usage"];
        let usage = Usage {
            prompt: u["prompt_tokens"].as_u64().unwrap(),
            cached: u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or_else(|| panic!("no cached_tokens in {u}")),
            completion: u["completion_tokens"].as_u64().unwrap(),
        };
        assert_eq!(usage.prompt, prompt.len() as u64, "{body}");
        assert_eq!(usage.completion, u64::from(max_tokens), "{body}");
        usage
    }

    /// `POST /pause?mode=keep&clear_cache=false`: the engine stops after its step in progress,
    /// every request kept where it is; new ones queue. Returns once it has stopped.
    pub async fn pause(&self) {
        self.post("/pause?mode=keep&clear_cache=false").await;
    }

    pub async fn resume(&self) {
        self.post("/resume").await;
    }

    async fn post(&self, path: &str) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        assert_eq!(status, 200, "{}{path}: {body}", self.base);
    }

    /// Resumes the engine and checks `GET /is_paused` says so.
    pub async fn resume_until_running(&self) {
        for _ in 0..100 {
            self.resume().await;
            let body: serde_json::Value = self
                .http
                .get(format!("{}/is_paused", self.base))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if body["is_paused"] == false {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{}: still paused after 100 resumes", self.base);
    }

    /// `GET /load`: completion requests the HTTP server holds, from arrival to response.
    pub async fn load(&self) -> u64 {
        let body: serde_json::Value = self
            .http
            .get(format!("{}/load", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["server_load"].as_u64().unwrap()
    }

    pub async fn gauges(&self) -> Gauges {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let value = |name: &str| -> f64 {
            let prefix = format!("vllm:{name}{{");
            text.lines()
                .find(|l| l.starts_with(&prefix))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{}: no {name} in /metrics", self.base))
        };
        Gauges {
            running: value("num_requests_running") as u32,
            waiting: value("num_requests_waiting") as u32,
            preemptions: value("num_preemptions_total") as u64,
            queries: value("prefix_cache_queries_total") as u64,
            hits: value("prefix_cache_hits_total") as u64,
            generated: value("generation_tokens_total") as u64,
        }
    }
}

/// Decodes one `[ts, [event, ...], data_parallel_rank]` batch, events as maps (vLLM 0.32).
fn decode(payload: &[u8]) -> Vec<RawEvent> {
    let batch = rmpv::decode::read_value(&mut &payload[..]).expect("a msgpack batch");
    let events = batch.as_array().expect("a batch is an array")[1]
        .as_array()
        .expect("events are an array");
    events
        .iter()
        .map(|e| {
            let field = |name: &str| -> &Value {
                e.as_map()
                    .expect("an event is a map")
                    .iter()
                    .find(|(k, _)| k.as_str() == Some(name))
                    .map_or(&Value::Nil, |(_, v)| v)
            };
            let hashes =
                |v: &Value| -> Vec<u64> { v.as_array().unwrap().iter().map(hash).collect() };
            match field("type").as_str() {
                Some("BlockStored") => RawEvent::Stored {
                    hashes: hashes(field("block_hashes")),
                    parent: match field("parent_block_hash") {
                        Value::Nil => None,
                        v => Some(hash(v)),
                    },
                    tokens: field("token_ids")
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|t| t.as_u64().unwrap() as u32)
                        .collect(),
                },
                Some("BlockRemoved") => RawEvent::Removed(hashes(field("block_hashes"))),
                Some("AllBlocksCleared") => RawEvent::Cleared,
                other => panic!("unknown event type {other:?}"),
            }
        })
        .collect()
}

/// A block hash as published: an integer, or a digest whose last 8 bytes are taken.
fn hash(v: &Value) -> u64 {
    match v {
        Value::Integer(i) => i.as_u64().unwrap_or_else(|| i.as_i64().unwrap() as u64),
        Value::Binary(b) => u64::from_be_bytes(b[b.len() - 8..].try_into().unwrap()),
        other => panic!("a block hash is an integer or bytes, not {other}"),
    }
}
