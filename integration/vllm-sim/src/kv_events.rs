//! vLLM KV-cache events on a ZMQ PUB socket, byte for byte as vLLM publishes them.
//!
//! The proxy's precise prefix-cache mode (and the Inference Extension's KV-cache-aware scorer)
//! subscribes to each replica's KV events to know which blocks it holds. vLLM's
//! `ZmqEventPublisher` sends one multipart message per engine step that had events: the topic, an
//! 8-byte big-endian sequence number (from 0), and a msgpack `KVEventBatch`. The msgspec structs
//! are `array_like` with tagged unions, so a batch is `[ts, [event, ...], data_parallel_rank]` and
//! each event is `[tag, field, ...]`:
//!
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//!   lora_name]`
//! - `["BlockRemoved", block_hashes, medium]`
//! - `["AllBlocksCleared"]`
//!
//! (fields with defaults, such as `extra_keys`, are omitted as msgspec's `omit_defaults` does.)
//! Endpoints follow vLLM's convention: an address with `*` or `::` is bound, anything else is
//! connected to.

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

/// The msgpack value of one event.
pub fn event_value(event: &KvEvent, lora_name: impl Fn(u32) -> Option<String>) -> Value {
    match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
        } => Value::Array(vec![
            Value::from("BlockStored"),
            Value::Array(block_hashes.iter().map(|&h| Value::from(h)).collect()),
            parent_block_hash.map_or(Value::Nil, Value::from),
            Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
            Value::from(*block_size),
            lora_id.map_or(Value::Nil, Value::from),
            Value::from(MEDIUM_GPU),
            lora_id.and_then(&lora_name).map_or(Value::Nil, Value::from),
        ]),
        KvEvent::BlockRemoved { block_hashes } => Value::Array(vec![
            Value::from("BlockRemoved"),
            Value::Array(block_hashes.iter().map(|&h| Value::from(h)).collect()),
            Value::from(MEDIUM_GPU),
        ]),
        KvEvent::AllBlocksCleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
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

/// Opens the PUB socket and spawns the task that publishes each batch sent on the returned
/// channel, numbering them from 0.
pub async fn start(
    config: &KvEventsConfig,
) -> Result<(mpsc::UnboundedSender<KvBatch>, tokio::task::JoinHandle<()>), KvEventsError> {
    let mut socket = zeromq::PubSocket::new();
    let endpoint = config.endpoint.clone();
    let err = |source| KvEventsError::Socket {
        endpoint: endpoint.clone(),
        source,
    };
    if endpoint.contains('*') || endpoint.contains("::") || endpoint.starts_with("ipc://") {
        socket
            .bind(&endpoint.replace('*', "0.0.0.0"))
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
