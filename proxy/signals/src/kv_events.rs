//! A subscriber to one vLLM replica's KV-cache events (ZMQ PUB/SUB, msgpack), feeding the
//! routing core's precise prefix index.
//!
//! vLLM's `ZmqEventPublisher` sends one multipart message per engine step with events: the topic,
//! an 8-byte big-endian sequence number, and a msgpack `KVEventBatch`. msgspec encodes the batch
//! `array_like` as `[ts, [event, ...], data_parallel_rank]`. vLLM 0.32 encodes each tagged event
//! as a map, its fields in declaration order and those at their default omitted (recorded from
//! real vLLM 0.32.0 in `tests/fixtures/vllm-0.32.0`, decoded by `tests/vllm_fixtures.rs`):
//!
//! - `{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
//!   "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"}`
//! - `{"type": "BlockRemoved", "block_hashes", "medium", "group_idx"}`
//! - `{"type": "AllBlocksCleared"}`
//!
//! The positional form of `array_like` events (`["BlockStored", block_hashes, parent_block_hash,
//! token_ids, block_size, lora_id, medium, ...]`, `["BlockRemoved", block_hashes, medium]`,
//! `["AllBlocksCleared"]`), with trailing fields omitted as older vLLM did, is accepted too. The
//! fields after `block_size` that the index does not use (`extra_keys`, `group_idx`,
//! `kv_cache_spec_kind`) are ignored. Events of another medium than the GPU (a CPU offload tier)
//! are skipped: the index mirrors the GPU cache. Unknown event tags are skipped so newer vLLM does
//! not break older proxies.
//!
//! Block hashes are 32-byte digests inside vLLM; it publishes them folded to integers by default
//! (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the digest's last eight bytes, big-endian, as in the
//! recorded 0.32.0 frames) and as the digests themselves otherwise. The routing core keys by
//! `u64`, so an integer is taken as its 64-bit two's-complement value and a byte string as its
//! last eight bytes, big-endian: both forms fold to the same key (how the Inference Extension's
//! KV-cache indexer folds them too). A [`kinference_routing::BlockHasher`] must fold the same way.
//!
//! Sequence numbers are checked: a gap (or a restart from 0) means events were lost, and the
//! subscriber yields [`KvEventError::SequenceGap`] before the batch so the caller can clear that
//! endpoint's index. The zeromq crate does not notice a publisher that went away, so the
//! subscriber also reconnects after a period with no messages; the sequence check then reveals
//! anything missed in between.

use bytes::Bytes;
use kinference_routing::KvEvent;
use rmpv::Value;
use std::time::Duration;
use tokio::sync::mpsc;
use zeromq::{Socket, SocketRecv, ZmqMessage};

/// vLLM's `MEDIUM_GPU`.
const MEDIUM_GPU: &str = "GPU";

/// How to subscribe; [`KvEventsConfig::new`] has the defaults [`subscribe_kv_events`] uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The publisher's address, e.g. `tcp://10.0.0.7:5557`.
    pub endpoint: String,
    /// The topic prefix to subscribe to (vLLM's `--kv-events-config` `topic`; empty for all).
    pub topic: String,
    /// Delays between reconnection attempts after an error.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Reconnect after this long without a message (a publisher restart is otherwise invisible).
    pub idle_reconnect: Duration,
    /// Batches (and errors) buffered for a slow consumer before the subscriber waits.
    pub capacity: usize,
}

impl KvEventsConfig {
    pub fn new(endpoint: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            topic: topic.into(),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            idle_reconnect: Duration::from_secs(30),
            capacity: 1024,
        }
    }
}

/// What can go wrong on a KV-event stream. [`KvEventError::events_lost`] says whether the caller
/// must clear the endpoint's precise index.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvEventError {
    /// The socket could not connect or subscribe; the subscriber retries.
    #[error("cannot subscribe to {endpoint}: {message}")]
    Connect { endpoint: String, message: String },
    /// Receiving failed; the subscriber reconnects.
    #[error("receiving from {endpoint} failed: {message}")]
    Recv { endpoint: String, message: String },
    /// Batches between `expected` and `received` were missed (or the publisher restarted).
    #[error("KV event sequence gap: expected {expected}, received {received}")]
    SequenceGap { expected: u64, received: u64 },
    /// A message was not a vLLM KV event batch; its events are lost.
    #[error("undecodable KV event batch {seq:?}: {message}")]
    Decode { seq: Option<u64>, message: String },
}

impl KvEventError {
    /// True when events were lost, so a mirror of the endpoint's cache is no longer exact.
    pub fn events_lost(&self) -> bool {
        matches!(self, Self::SequenceGap { .. } | Self::Decode { .. })
    }
}

/// Subscribes to a vLLM KV-event ZMQ PUB endpoint; yields decoded batches (routing-core events).
/// The subscriber runs until the receiver is dropped.
pub fn subscribe_kv_events(
    endpoint: String,
    topic: String,
) -> mpsc::Receiver<Result<Vec<KvEvent>, KvEventError>> {
    subscribe_kv_events_with(KvEventsConfig::new(endpoint, topic))
}

/// [`subscribe_kv_events`] with explicit settings.
pub fn subscribe_kv_events_with(
    config: KvEventsConfig,
) -> mpsc::Receiver<Result<Vec<KvEvent>, KvEventError>> {
    let (tx, rx) = mpsc::channel(config.capacity.max(1));
    tokio::spawn(run(config, tx));
    rx
}

type Tx = mpsc::Sender<Result<Vec<KvEvent>, KvEventError>>;

async fn run(config: KvEventsConfig, tx: Tx) {
    let mut last_seq: Option<u64> = None;
    let mut step = config.backoff_min.max(Duration::from_millis(1));
    loop {
        // The socket lives in its own task: the zeromq crate panics on some protocol states, and a
        // panic there must become a reconnect, not a dead subscriber.
        let (msg_tx, mut msg_rx) = mpsc::channel::<ZmqMessage>(256);
        let session = tokio::spawn(session(
            config.endpoint.clone(),
            config.topic.clone(),
            msg_tx,
        ));
        let abort = session.abort_handle();
        let ended: Option<KvEventError> = loop {
            let next = tokio::select! {
                next = tokio::time::timeout(config.idle_reconnect, msg_rx.recv()) => next,
                () = tx.closed() => {
                    abort.abort();
                    return;
                }
            };
            match next {
                Ok(Some(message)) => {
                    step = config.backoff_min.max(Duration::from_millis(1));
                    for item in handle(message, &mut last_seq) {
                        if tx.send(item).await.is_err() {
                            abort.abort();
                            return;
                        }
                    }
                }
                // The session ended: its result says why.
                Ok(None) => {
                    break match session.await {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(e),
                        Err(join) => Some(KvEventError::Recv {
                            endpoint: config.endpoint.clone(),
                            message: format!("socket task failed: {join}"),
                        }),
                    };
                }
                // Quiet for a while: reconnect, in case the publisher restarted.
                Err(_) => {
                    abort.abort();
                    tracing::debug!(endpoint = %config.endpoint, "no KV events for a while; reconnecting");
                    break None;
                }
            }
        };
        if let Some(error) = ended {
            tracing::info!(%error, "KV event subscription failed; reconnecting");
            if tx.send(Err(error)).await.is_err() {
                return;
            }
            let jitter = rand::random_range(0.5..=1.0);
            tokio::select! {
                () = tokio::time::sleep(step.mul_f64(jitter)) => {}
                () = tx.closed() => return,
            }
            step = step.saturating_mul(2).min(config.backoff_max.max(step));
        }
    }
}

/// Connects, subscribes and forwards messages until receiving fails.
async fn session(
    endpoint: String,
    topic: String,
    out: mpsc::Sender<ZmqMessage>,
) -> Result<(), KvEventError> {
    let connect_err = |e: zeromq::ZmqError| KvEventError::Connect {
        endpoint: endpoint.clone(),
        message: e.to_string(),
    };
    let mut socket = zeromq::SubSocket::new();
    socket.connect(&endpoint).await.map_err(connect_err)?;
    socket.subscribe(&topic).await.map_err(connect_err)?;
    tracing::debug!(%endpoint, "subscribed to KV events");
    loop {
        let message = socket.recv().await.map_err(|e| KvEventError::Recv {
            endpoint: endpoint.clone(),
            message: e.to_string(),
        })?;
        if out.send(message).await.is_err() {
            return Ok(());
        }
    }
}

/// Checks the sequence and decodes one message: a gap error (if any) then the batch (or its
/// decode error).
fn handle(
    message: ZmqMessage,
    last_seq: &mut Option<u64>,
) -> Vec<Result<Vec<KvEvent>, KvEventError>> {
    let frames: Vec<Bytes> = message.into_vec();
    let mut out = Vec::with_capacity(2);
    let (seq, payload) = match frames.as_slice() {
        [_topic, seq, payload] => (seq, payload),
        // A message without a topic frame (a publisher with an empty topic may send two).
        [seq, payload] if seq.len() == 8 => (seq, payload),
        _ => {
            out.push(Err(KvEventError::Decode {
                seq: None,
                message: format!("expected 3 frames, got {}", frames.len()),
            }));
            return out;
        }
    };
    let Ok(seq_bytes) = <[u8; 8]>::try_from(seq.as_ref()) else {
        out.push(Err(KvEventError::Decode {
            seq: None,
            message: format!("sequence frame has {} bytes, not 8", seq.len()),
        }));
        return out;
    };
    let seq = u64::from_be_bytes(seq_bytes);
    if let Some(last) = *last_seq {
        let expected = last.wrapping_add(1);
        if seq != expected {
            out.push(Err(KvEventError::SequenceGap {
                expected,
                received: seq,
            }));
        }
    }
    *last_seq = Some(seq);
    out.push(
        decode_batch(payload).map_err(|message| KvEventError::Decode {
            seq: Some(seq),
            message,
        }),
    );
    out
}

/// Decodes a msgpack `KVEventBatch` into routing-core events.
pub fn decode_batch(payload: &[u8]) -> Result<Vec<KvEvent>, String> {
    let mut reader = payload;
    let value = rmpv::decode::read_value(&mut reader).map_err(|e| e.to_string())?;
    let events = match &value {
        Value::Array(items) => items.get(1),
        Value::Map(_) => field(&value, "events"),
        _ => None,
    };
    let Some(Value::Array(events)) = events else {
        return Err("a batch must be [ts, [events], rank] or a map with events".into());
    };
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        if let Some(e) = decode_event(event)? {
            out.push(e);
        }
    }
    Ok(out)
}

/// A named field of a map-form struct.
fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    let Value::Map(entries) = v else { return None };
    entries
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

/// One event, or `None` when it is skipped (another medium, an unknown tag).
fn decode_event(v: &Value) -> Result<Option<KvEvent>, String> {
    // Positional (array_like) or named (map) fields, read the same way.
    let tag = match v {
        Value::Array(items) => items
            .first()
            .and_then(Value::as_str)
            .ok_or("an event must start with its tag")?,
        Value::Map(_) => field(v, "type")
            .and_then(Value::as_str)
            .ok_or("an event map must have a type")?,
        _ => return Err("an event must be an array or a map".into()),
    };
    let get = |i: usize, name: &str| -> Option<&Value> {
        match v {
            Value::Array(items) => items.get(i),
            _ => field(v, name),
        }
    };
    let on_gpu = |i, name| match get(i, name) {
        None | Some(Value::Nil) => true,
        Some(m) => m
            .as_str()
            .is_some_and(|m| m.eq_ignore_ascii_case(MEDIUM_GPU)),
    };
    match tag {
        "BlockStored" => {
            if !on_gpu(6, "medium") {
                return Ok(None);
            }
            let block_hashes = hashes(get(1, "block_hashes"))?;
            let parent_block_hash = match get(2, "parent_block_hash") {
                None | Some(Value::Nil) => None,
                Some(h) => Some(hash(h)?),
            };
            let token_ids = match get(3, "token_ids") {
                Some(Value::Array(ids)) => ids
                    .iter()
                    .map(|t| {
                        t.as_u64()
                            .and_then(|t| u32::try_from(t).ok())
                            .ok_or_else(|| "a token id must be a u32".to_string())
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                None | Some(Value::Nil) => Vec::new(),
                Some(_) => return Err("token_ids must be an array".into()),
            };
            let block_size = get(4, "block_size")
                .and_then(Value::as_u64)
                .and_then(|b| u32::try_from(b).ok())
                .ok_or("block_size must be a u32")?;
            Ok(Some(KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
            }))
        }
        "BlockRemoved" => {
            if !on_gpu(2, "medium") {
                return Ok(None);
            }
            Ok(Some(KvEvent::BlockRemoved {
                block_hashes: hashes(get(1, "block_hashes"))?,
            }))
        }
        "AllBlocksCleared" => {
            if !on_gpu(1, "medium") {
                return Ok(None);
            }
            Ok(Some(KvEvent::AllBlocksCleared))
        }
        other => {
            tracing::debug!(tag = other, "skipping an unknown KV event");
            Ok(None)
        }
    }
}

fn hashes(v: Option<&Value>) -> Result<Vec<u64>, String> {
    match v {
        Some(Value::Array(hs)) => hs.iter().map(hash).collect(),
        _ => Err("block_hashes must be an array".into()),
    }
}

/// Folds a vLLM block hash (an integer or a digest) to 64 bits.
pub fn hash(v: &Value) -> Result<u64, String> {
    match v {
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|i| i as u64))
            .ok_or_else(|| "a block hash integer out of range".to_string()),
        Value::Binary(b) => {
            let mut last = [0u8; 8];
            let n = b.len().min(8);
            last[8 - n..].copy_from_slice(&b[b.len() - n..]);
            Ok(u64::from_be_bytes(last))
        }
        _ => Err("a block hash must be an integer or bytes".into()),
    }
}

#[cfg(test)]
mod tests;
