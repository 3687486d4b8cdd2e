//! A ring buffer of recent decision records, served at `/debug/decisions`.
//!
//! When an operator asks "why did this request go there", the record answers: the candidates with
//! every prediction input and its age, the chosen endpoint, the reason, the tags and the rules that
//! matched. It holds no prompt text.

use parking_lot::Mutex;
use serde::Serialize;
use std::{collections::VecDeque, sync::Arc};

/// One tag on the request, without the prompt it came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TagRecord {
    pub name: String,
    pub value: String,
    pub confidence: f32,
}

/// Why one request went where it went.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionRecord {
    pub request_id: String,
    /// The target whose stack decided: the configured default target (direct use), or the
    /// original destination `ip:port` of a redirected connection.
    pub target: String,
    pub unix_time_ms: u64,
    pub tenant: String,
    /// The model string the client sent.
    pub requested: String,
    pub service_class: String,
    pub tags: Vec<TagRecord>,
    pub rule_trace: Vec<crate::policy::RuleTrace>,
    pub candidate_models: Vec<String>,
    /// `enforce` or `shadow`.
    pub mode: &'static str,
    /// The routing core's decision: candidates, predictions with their inputs and ages, reason.
    pub decision: kinference_routing::Decision,
    /// Where the request was sent (differs from the decision's choice in shadow mode or after a
    /// retry), in order of attempts.
    pub attempts: Vec<String>,
    /// How long classification, policy and decision took, in seconds.
    pub decision_duration_s: f64,
}

/// The recent records, newest last. Clones share one ring, so the stacks of every destination a
/// sidecar serves write to the one `/debug/decisions` shows.
#[derive(Clone, Debug)]
pub struct Decisions {
    capacity: usize,
    records: Arc<Mutex<VecDeque<DecisionRecord>>>,
}

impl Decisions {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            records: Arc::new(Mutex::new(VecDeque::with_capacity(capacity.clamp(1, 4096)))),
        }
    }

    pub fn push(&self, record: DecisionRecord) {
        let mut r = self.records.lock();
        if r.len() == self.capacity {
            r.pop_front();
        }
        r.push_back(record);
    }

    /// Updates the record of `request_id` (its attempts), if it is still held.
    pub fn update(&self, request_id: &str, f: impl FnOnce(&mut DecisionRecord)) {
        if let Some(r) = self
            .records
            .lock()
            .iter_mut()
            .rev()
            .find(|r| r.request_id == request_id)
        {
            f(r);
        }
    }

    /// The records, newest first, optionally only one request's.
    pub fn snapshot(&self, request_id: Option<&str>) -> Vec<DecisionRecord> {
        self.records
            .lock()
            .iter()
            .rev()
            .filter(|r| request_id.is_none_or(|id| r.request_id == id))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_routing::{Decision, ModelName, Reason, Time};

    fn record(id: &str) -> DecisionRecord {
        DecisionRecord {
            request_id: id.into(),
            target: "llm:8000".into(),
            unix_time_ms: 0,
            tenant: "t".into(),
            requested: "m".into(),
            service_class: "Standard".into(),
            tags: vec![],
            rule_trace: vec![],
            candidate_models: vec!["m".into()],
            mode: "enforce",
            decision: Decision {
                at: Time::ZERO,
                requested_model: ModelName::from("m"),
                prompt_tokens: 1,
                reason: Reason::NoCandidates,
                chosen: None,
                candidates: vec![],
                excluded: vec![],
                tie_window_s: 0.005,
            },
            attempts: vec![],
            decision_duration_s: 0.0,
        }
    }

    #[test]
    fn keeps_the_newest_up_to_capacity() {
        let d = Decisions::new(2);
        d.push(record("a"));
        d.push(record("b"));
        d.push(record("c"));
        let ids: Vec<_> = d.snapshot(None).into_iter().map(|r| r.request_id).collect();
        assert_eq!(ids, vec!["c", "b"]);
        d.update("b", |r| r.attempts.push("127.0.0.1:1".into()));
        assert_eq!(d.snapshot(Some("b"))[0].attempts, vec!["127.0.0.1:1"]);
        assert!(d.snapshot(Some("a")).is_empty());
    }
}
