//! Mooncake's public synthetic trace: long prompts whose `hash_ids` say which 512-token blocks
//! repeat an earlier prompt's.
//!
//! Each `hash_id` becomes a deterministic block of 512 token ids (seeded by the id), and a prompt is
//! its blocks in order cut to `input_length`, so two requests that share leading ids share exactly
//! that token prefix. A window of the trace is replayed with its timestamps scaled to the offered
//! load. The prompts (15k tokens on average, up to 66k) need the big model's context window, so the
//! fleet is `glm-5.3` (TP=8 nodes). Each seed replays its own window of the trace
//! (`super::window_start`) and its own block contents (the tokens of a `hash_id` depend on the
//! seed), so the prefix structure is the trace's and the tokens are the seed's.

use std::{collections::HashMap, path::Path, sync::Arc};

use super::{RequestSpec, Size, Workload, WorkloadError, WorkloadKind, shrunk};
use crate::fleet::FleetSpec;

pub const FILE: &str = "mooncake_synthetic_trace.jsonl";
pub const BLOCK_TOKENS: usize = 512;
pub const ENDPOINTS: usize = 4;
pub const PROFILE: &str = "glm-5.3";

#[derive(serde::Deserialize)]
struct Row {
    timestamp: f64,
    input_length: usize,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// The tokens of block `id` under `seed`: a deterministic function of the two.
pub fn block_tokens(id: u64, seed: u64) -> Vec<u32> {
    let span = u64::from(kinference_sim::tokenizer::ENDOFTEXT_ID - 1);
    let key = (id ^ 0x6d6f_6f6e) ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..BLOCK_TOKENS as u64)
        .map(|i| 1 + (xxhash_rust::xxh3::xxh3_64_with_seed(&i.to_le_bytes(), key) % span) as u32)
        .collect()
}

/// `window` picks the rows (a seed number), `seed` the token contents.
pub fn build(
    dir: &Path,
    load_rps: f64,
    size: Size,
    window: u64,
    seed: u64,
) -> Result<Workload, WorkloadError> {
    let path = dir.join(FILE);
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|source| WorkloadError::Io {
        path: shown.clone(),
        source,
    })?;
    let lines = || {
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
    };
    let start = super::window_start(window, lines().count(), size.requests);
    let mut rows = Vec::new();
    for (i, line) in lines().skip(start).take(size.requests) {
        let row: Row = serde_json::from_str(line).map_err(|e| WorkloadError::Parse {
            path: shown.clone(),
            line: i + 1,
            msg: e.to_string(),
        })?;
        rows.push(row);
    }
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return Err(WorkloadError::Empty(shown));
    };
    // The window's own rate; timestamps are scaled so the window arrives at `load_rps`.
    let span_s = ((last.timestamp - first.timestamp) / 1_000.0).max(1e-3);
    let native_rps = rows.len() as f64 / span_s;
    let scale = native_rps / load_rps.max(1e-9);
    let t0 = first.timestamp;
    let mut blocks: HashMap<u64, Vec<u32>> = HashMap::new();
    let requests = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let mut prompt = Vec::with_capacity(row.input_length);
            for id in &row.hash_ids {
                if prompt.len() >= row.input_length {
                    break;
                }
                let block = blocks.entry(*id).or_insert_with(|| block_tokens(*id, seed));
                let take = (row.input_length - prompt.len()).min(BLOCK_TOKENS);
                prompt.extend_from_slice(&block[..take]);
            }
            RequestSpec {
                at_s: (row.timestamp - t0) / 1_000.0 * scale,
                prompt: Arc::from(prompt),
                output_tokens: row.output_length.max(1),
                pool: 0,
                low_complexity: false,
                service_class: None,
                tenant: 0,
                client: i as u32,
            }
        })
        .collect();
    Ok(Workload {
        kind: WorkloadKind::Mooncake,
        load_rps,
        fleet: FleetSpec::single(PROFILE, shrunk(ENDPOINTS, size)),
        requests,
        sessions: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_hash_ids_become_shared_token_prefixes() {
        let dir = tempfile::tempdir().unwrap();
        let rows = [
            r#"{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}"#,
            r#"{"timestamp": 1000, "input_length": 700, "output_length": 0, "hash_ids": [0, 9]}"#,
        ];
        std::fs::write(dir.path().join(FILE), rows.join("\n")).unwrap();
        let w = build(
            dir.path(),
            4.0,
            Size {
                requests: 10,
                shrink: 1,
            },
            1,
            0,
        )
        .unwrap();
        let (a, b) = (&w.requests[0], &w.requests[1]);
        assert_eq!((a.prompt.len(), b.prompt.len()), (1100, 700));
        assert_eq!(a.prompt[..512], b.prompt[..512]);
        assert_ne!(a.prompt[512..700], b.prompt[512..700]);
        assert_eq!(a.prompt[..512], block_tokens(0, 0)[..]);
        assert_ne!(block_tokens(0, 0), block_tokens(0, 1));
        // Another window: seed 2 of a one-row window starts one row in.
        let w2 = build(
            dir.path(),
            4.0,
            Size {
                requests: 1,
                shrink: 1,
            },
            2,
            0,
        )
        .unwrap();
        assert_eq!(w2.requests[0].prompt.len(), 700);
        // Two requests one second apart form a 2 req/s window; at 4 req/s the gap halves.
        assert!((b.at_s - 0.5).abs() < 1e-9, "{}", b.at_s);
        assert_eq!(b.output_tokens, 1);
        assert!(
            build(
                dir.path().join("missing").as_path(),
                1.0,
                Size {
                    requests: 1,
                    shrink: 1
                },
                1,
                0
            )
            .is_err()
        );
    }
}
