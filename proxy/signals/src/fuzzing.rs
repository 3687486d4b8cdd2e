//! The entry points the `prometheus` and `kv_events` fuzz targets (`fuzz/`) and this crate's
//! seed-replay test share, so that the short run in the normal test suite exercises exactly what
//! the fuzzer does.
//!
//! Both formats come from engines over the network: a scrape can return anything (a wrong port, a
//! truncated body), and a KV-event publisher's payload is msgpack from another process. Any byte
//! string must read as a value or a typed error, never a panic, and the checked properties are
//! the ones the proxy relies on:
//! - no engine's metrics reader cares whether lines end in `\n` or `\r\n`;
//! - a decoded KV-event batch, encoded again (each event in the positional form; vLLM 0.32 sends
//!   maps, which `tests/vllm_fixtures.rs` decodes from recorded frames), decodes to the same
//!   events: nothing is dropped or folded twice.

use crate::{engine::Engine, kv_events::decode_batch};
use kinference_routing::KvEvent;
use rmpv::Value;

/// Reads `data` (lossily as UTF-8) as a `/metrics` exposition, with LF and with CRLF line ends.
/// Panics only when a property fails.
pub fn prometheus(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let crlf_text = text.replace('\n', "\r\n");
    for engine in Engine::ALL {
        let lf = engine.adapter().parse_metrics(&text);
        let crlf = engine.adapter().parse_metrics(&crlf_text);
        // Debug, not PartialEq: a NaN sample must compare equal to itself here.
        assert_eq!(format!("{lf:?}"), format!("{crlf:?}"), "{engine}");
    }
}

/// Decodes `data` as one KV-event batch; a batch that decodes must survive a re-encoding.
/// Panics only when a property fails.
pub fn kv_events(data: &[u8]) {
    let Ok(events) = decode_batch(data) else {
        return;
    };
    let encoded = encode_batch(&events);
    let again = decode_batch(&encoded).expect("a re-encoded batch decodes");
    assert_eq!(again, events);
}

/// `events` as an array-like `KVEventBatch`, `[ts, [events], dp_rank]`, with positional events.
fn encode_batch(events: &[KvEvent]) -> Vec<u8> {
    let hashes = |hs: &[u64]| Value::Array(hs.iter().map(|&h| Value::from(h)).collect());
    let events = events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
            } => Value::Array(vec![
                Value::from("BlockStored"),
                hashes(block_hashes),
                parent_block_hash.map_or(Value::Nil, Value::from),
                Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
                Value::from(*block_size),
                Value::Nil,
                Value::from("GPU"),
            ]),
            KvEvent::BlockRemoved { block_hashes } => Value::Array(vec![
                Value::from("BlockRemoved"),
                hashes(block_hashes),
                Value::from("GPU"),
            ]),
            KvEvent::AllBlocksCleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
        })
        .collect();
    let batch = Value::Array(vec![Value::from(0.0), Value::Array(events), Value::Nil]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("writing to a Vec cannot fail");
    out
}

/// The short fuzzing run shared by every fuzzed crate (see its docs).
#[cfg(test)]
#[path = "../../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::replay;

    /// Every committed input of the `prometheus` fuzz target, then 3000 mutants of them.
    #[test]
    fn prometheus_seeds_and_mutants() {
        let ran = replay::replay(
            env!("CARGO_MANIFEST_DIR"),
            "prometheus",
            3000,
            super::prometheus,
        );
        assert!(ran > 3000);
    }

    /// Every committed input of the `kv_events` fuzz target, then 3000 mutants of them.
    #[test]
    fn kv_events_seeds_and_mutants() {
        let ran = replay::replay(
            env!("CARGO_MANIFEST_DIR"),
            "kv_events",
            3000,
            super::kv_events,
        );
        assert!(ran > 3000);
    }
}
