//! Recorded traffic: one record per answered request, for `kinfctl replay`.
//!
//! A what-if replay runs last hour's requests through another policy in the fleet simulation, so
//! it needs what shaped each request's TTFT and nothing more: when it came, who sent it for which
//! model, its tags and class, its size, which prefix blocks it shares with other prompts (the
//! 64-bit block hashes the decision already computed for the prefix index, never the text), what
//! served it and how fast. The records are kept in a bounded ring served at `GET /debug/traffic`
//! (newest last, `?since_ms=`) and, with `--traffic-log PATH`, appended to a JSON-lines file by a
//! writer thread, so the request path only fills a struct and sends it down a channel.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::{
    collections::VecDeque,
    io::Write as _,
    path::Path,
    sync::{Arc, mpsc},
};

/// Where a record's block hashes came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HashSource {
    /// vLLM-space hashes of the prompt's tokens (the precise prefix index's).
    Precise,
    /// The approximate index's chunks of the prompt's bytes (no pool with KV events).
    Approx,
}

/// One answered request. Holds no prompt text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrafficRecord {
    pub request_id: String,
    /// When the proxy received it (Unix milliseconds).
    pub arrival_ms: u64,
    pub tenant: String,
    /// The model string the client sent.
    pub requested_model: String,
    pub tags: Vec<crate::decisions::TagRecord>,
    pub service_class: String,
    /// The prompt's tokens: the usage's count when the engine reported it, else the proxy's
    /// estimate.
    pub prompt_tokens: u32,
    /// Tokens generated: the usage's, else the streamed chunks counted.
    pub completion_tokens: u32,
    /// Tokens of each block in `block_hashes`.
    pub block_size: u32,
    /// The prompt's full blocks, chained (a block's hash covers every block before it), as the
    /// decision hashed them for the prefix lookup.
    pub block_hashes: Vec<u64>,
    pub hash_source: HashSource,
    /// The model and endpoint that answered.
    pub served_model: String,
    pub endpoint: String,
    /// Measured time to first token (streams only; seconds).
    pub ttft_s: Option<f64>,
    /// The HTTP status answered.
    pub status: u16,
    /// The policy's rollout and the request's arm, when one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutArm>,
}

/// A record's rollout arm.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutArm {
    pub name: String,
    pub arm: String,
}

/// What the route layer knows of a request, finished into a record when its answer ends.
#[derive(Debug)]
pub struct Pending {
    pub sink: Traffic,
    pub record: TrafficRecord,
}

impl Pending {
    /// Completes the record with the answer and keeps it.
    pub fn finish(
        mut self,
        served_model: &str,
        endpoint: &str,
        status: u16,
        ttft_s: Option<f64>,
        usage: Option<(u64, u64)>,
        streamed_tokens: u64,
    ) {
        let r = &mut self.record;
        r.served_model = served_model.to_owned();
        r.endpoint = endpoint.to_owned();
        r.status = status;
        r.ttft_s = ttft_s;
        if let Some((prompt, completion)) = usage {
            r.prompt_tokens = u32::try_from(prompt).unwrap_or(u32::MAX);
            r.completion_tokens = u32::try_from(completion).unwrap_or(u32::MAX);
        } else {
            r.completion_tokens = u32::try_from(streamed_tokens).unwrap_or(u32::MAX);
        }
        self.sink.push(self.record);
    }
}

/// The recent records, newest last, and the log file's writer. Clones share both.
#[derive(Clone, Debug)]
pub struct Traffic {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    capacity: usize,
    ring: Mutex<VecDeque<TrafficRecord>>,
    log: Option<Mutex<mpsc::Sender<TrafficRecord>>>,
}

impl Traffic {
    /// A ring of `capacity` records (0: none kept), and with `log` a JSON-lines file appended to
    /// by its own thread.
    pub fn new(capacity: usize, log: Option<&Path>) -> anyhow::Result<Self> {
        let log = match log {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| anyhow::anyhow!("--traffic-log {}: {e}", path.display()))?;
                let (tx, rx) = mpsc::channel::<TrafficRecord>();
                std::thread::Builder::new()
                    .name("traffic-log".into())
                    .spawn(move || write_log(file, &rx))?;
                Some(Mutex::new(tx))
            }
            None => None,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                capacity,
                ring: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
                log,
            }),
        })
    }

    /// Whether records are kept at all (the route layer builds none otherwise).
    pub fn enabled(&self) -> bool {
        self.inner.capacity > 0 || self.inner.log.is_some()
    }

    pub fn push(&self, record: TrafficRecord) {
        if let Some(tx) = &self.inner.log {
            // The writer only stops with the process.
            let _ = tx.lock().send(record.clone());
        }
        if self.inner.capacity == 0 {
            return;
        }
        let mut ring = self.inner.ring.lock();
        if ring.len() == self.inner.capacity {
            ring.pop_front();
        }
        ring.push_back(record);
    }

    /// The records that arrived at or after `since_ms`, oldest first.
    pub fn since(&self, since_ms: u64) -> Vec<TrafficRecord> {
        self.inner
            .ring
            .lock()
            .iter()
            .filter(|r| r.arrival_ms >= since_ms)
            .cloned()
            .collect()
    }

    /// `records` as JSON lines.
    pub fn jsonl(records: &[TrafficRecord]) -> String {
        let mut out = String::new();
        for r in records {
            if let Ok(line) = serde_json::to_string(r) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }
}

/// Appends each record as a line, flushing whenever the channel runs dry.
fn write_log(file: std::fs::File, rx: &mpsc::Receiver<TrafficRecord>) {
    let mut out = std::io::BufWriter::new(file);
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(r) = next {
            if let Ok(line) = serde_json::to_string(&r)
                && writeln!(out, "{line}").is_err()
            {
                tracing::warn!("traffic log: write failed; records are no longer logged");
                return;
            }
            next = rx.try_recv().ok();
        }
        if out.flush().is_err() {
            tracing::warn!("traffic log: flush failed; records are no longer logged");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, at: u64) -> TrafficRecord {
        TrafficRecord {
            request_id: id.into(),
            arrival_ms: at,
            tenant: "default/app".into(),
            requested_model: "glm-5.3".into(),
            tags: vec![],
            service_class: "Standard".into(),
            prompt_tokens: 40,
            completion_tokens: 0,
            block_size: 16,
            block_hashes: vec![1, 2],
            hash_source: HashSource::Precise,
            served_model: String::new(),
            endpoint: String::new(),
            ttft_s: None,
            status: 0,
            rollout: None,
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_and_filters_by_arrival() {
        let t = Traffic::new(2, None).unwrap();
        assert!(t.enabled());
        for (i, at) in [10, 20, 30].into_iter().enumerate() {
            t.push(record(&format!("r{i}"), at));
        }
        let ids = |v: Vec<TrafficRecord>| v.into_iter().map(|r| r.request_id).collect::<Vec<_>>();
        assert_eq!(ids(t.since(0)), ["r1", "r2"]);
        assert_eq!(ids(t.since(25)), ["r2"]);
        assert!(!Traffic::new(0, None).unwrap().enabled());
    }

    #[test]
    fn a_finished_record_carries_the_answer_and_reaches_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("traffic.jsonl");
        let t = Traffic::new(4, Some(&path)).unwrap();
        Pending {
            sink: t.clone(),
            record: record("a", 5),
        }
        .finish(
            "qwen-3.6-27b",
            "10.0.0.2:8000",
            200,
            Some(0.25),
            Some((41, 7)),
            3,
        );
        Pending {
            sink: t.clone(),
            record: record("b", 6),
        }
        .finish("glm-5.3", "10.0.0.1:8000", 200, None, None, 3);
        let got = t.since(0);
        assert_eq!(got[0].served_model, "qwen-3.6-27b");
        assert_eq!((got[0].prompt_tokens, got[0].completion_tokens), (41, 7));
        assert_eq!(got[0].ttft_s, Some(0.25));
        // Without a usage: the estimate stands and the streamed tokens are counted.
        assert_eq!((got[1].prompt_tokens, got[1].completion_tokens), (40, 3));
        let text = Traffic::jsonl(&got);
        let back: Vec<TrafficRecord> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(back, got);
        // The writer thread appends both lines.
        for tries in 0.. {
            let logged = std::fs::read_to_string(&path).unwrap_or_default();
            if logged.lines().count() == 2 {
                let first: TrafficRecord =
                    serde_json::from_str(logged.lines().next().unwrap()).unwrap();
                assert_eq!(first, got[0]);
                break;
            }
            assert!(tries < 500, "{logged:?}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let v = serde_json::to_value(&got[0]).unwrap();
        assert_eq!(v["hash_source"], "precise");
        assert!(v.get("rollout").is_none());
    }
}
