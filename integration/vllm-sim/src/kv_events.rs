//! vLLM KV-cache events on a ZMQ PUB socket, byte for byte as vLLM 0.32 publishes them.
//!
//! The proxy's precise prefix-cache mode (and the Inference Extension's KV-cache-aware scorer)
//! subscribes to each replica's KV events to know which blocks it holds. vLLM's
//! `ZmqEventPublisher` sends one multipart message per engine step that had events: the topic, an
//! 8-byte big-endian sequence number (from 0), and a msgpack `KVEventBatch`. The batch is an
//! `array_like` msgspec struct, `[ts, [event, ...], data_parallel_rank]`; the events are tagged
//! structs that are *not* `array_like` in vLLM 0.32, so each is a map whose `type` key names it,
//! with its fields in declaration order and those still at their default omitted
//! (`omit_defaults`):
//!
//! - `{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
//!   "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"}`
//! - `{"type": "BlockRemoved", "block_hashes", "medium", "group_idx"}`
//! - `{"type": "AllBlocksCleared"}`
//!
//! as recorded from real vLLM 0.32.0 (`proxy/signals/tests/fixtures/vllm-0.32.0`, checked by
//! `tests/server/recorded.rs`). `extra_keys` has one entry per block: `None`, or the LoRA
//! adapter's name for a block computed under one. Endpoints follow vLLM's convention: an address
//! with `*` or `::` is bound, anything else is connected to.

use bytes::Bytes;
use kinference_sim::KvEvent;
use rmpv::Value;
use tokio::sync::mpsc;
use zeromq::{Socket, SocketSend, ZmqMessage};

use crate::driver::KvBatch;

/// vLLM's `MEDIUM_GPU`.
pub const MEDIUM_GPU: &str = "GPU";

/// Where KV events go (`--kv-events-endpoint`, `--kv-events-topic`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    pub endpoint: String,
    pub topic: String,
}

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    #[error("KV events endpoint {endpoint}: {source}")]
    Socket {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
}

/// vLLM's `kv_cache_spec_kind` of a full-attention KV-cache group (the simulator's only kind).
pub const FULL_ATTENTION: &str = "full_attention";

/// A map-form msgspec struct: `{"type": tag, field: value, ...}` in declaration order.
fn tagged(tag: &str, fields: Vec<(&str, Value)>) -> Value {
    let mut entries = Vec::with_capacity(fields.len() + 1);
    entries.push((Value::from("type"), Value::from(tag)));
    entries.extend(fields.into_iter().map(|(k, v)| (Value::from(k), v)));
    Value::Map(entries)
}

fn hash_array(hashes: &[u64]) -> Value {
    Value::Array(hashes.iter().map(|&h| Value::from(h)).collect())
}

/// The msgpack value of one event.
pub fn event_value(event: &KvEvent, lora_name: impl Fn(u32) -> Option<String>) -> Value {
    match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
        } => {
            let lora = lora_id.and_then(&lora_name);
            let extra_key = lora
                .as_ref()
                .map_or(Value::Nil, |l| Value::Array(vec![Value::from(l.as_str())]));
            tagged(
                "BlockStored",
                vec![
                    ("block_hashes", hash_array(block_hashes)),
                    (
                        "parent_block_hash",
                        parent_block_hash.map_or(Value::Nil, Value::from),
                    ),
                    (
                        "token_ids",
                        Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
                    ),
                    ("block_size", Value::from(*block_size)),
                    ("lora_id", lora_id.map_or(Value::Nil, Value::from)),
                    ("medium", Value::from(MEDIUM_GPU)),
                    ("lora_name", lora.map_or(Value::Nil, Value::from)),
                    (
                        "extra_keys",
                        Value::Array(vec![extra_key; block_hashes.len()]),
                    ),
                    ("group_idx", Value::from(0u32)),
                    ("kv_cache_spec_kind", Value::from(FULL_ATTENTION)),
                ],
            )
        }
        KvEvent::BlockRemoved { block_hashes } => tagged(
            "BlockRemoved",
            vec![
                ("block_hashes", hash_array(block_hashes)),
                ("medium", Value::from(MEDIUM_GPU)),
                ("group_idx", Value::from(0u32)),
            ],
        ),
        KvEvent::AllBlocksCleared => tagged("AllBlocksCleared", Vec::new()),
    }
}

/// The msgpack payload of one `KVEventBatch`.
pub fn encode_batch(batch: &KvBatch) -> Vec<u8> {
    let lora_name = |id: u32| batch.lora_name(id).map(str::to_string);
    let value = Value::Array(vec![
        Value::F64(batch.ts_unix_s),
        Value::Array(
            batch
                .events
                .iter()
                .map(|e| event_value(e, lora_name))
                .collect(),
        ),
        // data_parallel_rank: the publisher stamps its rank (0 here).
        Value::from(0u32),
    ]);
    let mut out = Vec::with_capacity(256);
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &value);
    out
}

/// `bind_host` as a ZMQ TCP endpoint writes it (IPv6 in brackets).
fn zmq_host(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// Opens the PUB socket and spawns the task that publishes each batch sent on the returned
/// channel, numbering them from 0. An endpoint with `*` binds `bind_host` (vLLM's `*` binds every
/// address; the simulator's default is loopback).
pub async fn start(
    config: &KvEventsConfig,
    bind_host: std::net::IpAddr,
) -> Result<(mpsc::UnboundedSender<KvBatch>, tokio::task::JoinHandle<()>), KvEventsError> {
    let mut socket = zeromq::PubSocket::new();
    let endpoint = config.endpoint.clone();
    let err = |source| KvEventsError::Socket {
        endpoint: endpoint.clone(),
        source,
    };
    if endpoint.contains('*') || endpoint.contains("::") || endpoint.starts_with("ipc://") {
        socket
            .bind(&endpoint.replace('*', &zmq_host(bind_host)))
            .await
            .map_err(err)?;
    } else {
        socket.connect(&endpoint).await.map_err(err)?;
    }
    let topic = Bytes::from(config.topic.clone().into_bytes());
    let (tx, mut rx) = mpsc::unbounded_channel::<KvBatch>();
    let task = tokio::spawn(async move {
        let mut seq: u64 = 0;
        while let Some(batch) = rx.recv().await {
            let payload = encode_batch(&batch);
            let frames = vec![
                topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                Bytes::from(payload),
            ];
            let Ok(message) = ZmqMessage::try_from(frames) else {
                continue;
            };
            if let Err(error) = socket.send(message).await {
                tracing::warn!(%error, seq, "KV event batch not published");
            }
            seq += 1;
        }
    });
    Ok((tx, task))
}
