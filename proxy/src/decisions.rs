//! A ring buffer of recent decision records, served at `/debug/decisions`.
//!
//! When an operator asks "why did this request go there", the record answers: the candidates with
//! every prediction input and its age, the chosen endpoint, the reason, the tags and the rules that
//! matched. It holds no prompt text.

use kinference_decision::Plan;
use parking_lot::Mutex;
use serde::Serialize;
use std::{collections::VecDeque, sync::Arc};

/// One tag on the request, without the prompt it came from.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct TagRecord {
    pub name: String,
    pub value: String,
    pub confidence: f32,
}

/// Why one request went where it went.
#[derive(Clone, Debug)]
pub struct DecisionRecord {
    pub request_id: String,
    /// The target whose stack decided: the configured default target (direct use), or the
    /// original destination `ip:port` of a redirected connection.
    pub target: String,
    pub unix_time_ms: u64,
    pub tenant: String,
    /// The model string the client sent.
    pub requested: String,
    pub tags: Vec<TagRecord>,
    /// The decision's plan, shared with the request it routes (never copied per request).
    pub plan: Arc<Plan>,
    /// Where the request was sent (differs from the decision's choice in shadow mode or after a
    /// retry), in order of attempts.
    pub attempts: Vec<String>,
    /// How long classification, policy and decision took, in seconds.
    pub decision_duration_s: f64,
    /// How long admission control held the request for its class's TTFT objective.
    pub held_s: f64,
    /// The policy's rollout and the request's arm in it (`cohort`, `control` or `rest`), when one
    /// runs: a cohort request's rules and plan are the candidate's.
    pub rollout: Option<crate::rollout::RolloutRecord>,
}

/// The record as `/debug/decisions` shows it: flat, the plan's parts beside the request's.
impl Serialize for DecisionRecord {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let plan = &self.plan;
        let mut r = s.serialize_struct("DecisionRecord", 17)?;
        r.serialize_field("request_id", &self.request_id)?;
        r.serialize_field("target", &self.target)?;
        r.serialize_field("unix_time_ms", &self.unix_time_ms)?;
        r.serialize_field("tenant", &self.tenant)?;
        r.serialize_field("requested", &self.requested)?;
        r.serialize_field("service_class", &plan.candidates.service_class)?;
        r.serialize_field("tags", &self.tags)?;
        r.serialize_field("rule_trace", &plan.candidates.rule_trace)?;
        r.serialize_field("candidate_models", &plan.candidates.models)?;
        // `enforce` or `shadow`.
        r.serialize_field("mode", &plan.mode)?;
        r.serialize_field("decision", &plan.decision)?;
        match &plan.objective {
            Some(o) => r.serialize_field("objective", o)?,
            None => r.skip_field("objective")?,
        }
        if let Some(refused) = plan.refused {
            r.serialize_field("refused", &refused)?;
        } else {
            r.skip_field("refused")?;
        }
        r.serialize_field("attempts", &self.attempts)?;
        r.serialize_field("decision_duration_s", &self.decision_duration_s)?;
        r.serialize_field("held_s", &self.held_s)?;
        match &self.rollout {
            Some(rollout) => r.serialize_field("rollout", rollout)?,
            None => r.skip_field("rollout")?,
        }
        r.end()
    }
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
    use kinference_decision::{Candidates, Mode, Refusal};
    use kinference_routing::{Decision, ModelName, Reason, Time};

    fn record(id: &str) -> DecisionRecord {
        DecisionRecord {
            request_id: id.into(),
            target: "llm:8000".into(),
            unix_time_ms: 0,
            tenant: "t".into(),
            requested: "m".into(),
            tags: vec![],
            plan: Arc::new(Plan {
                candidates: Candidates {
                    requested_model: "m".into(),
                    models: vec!["m".into()],
                    service_class: "Standard".into(),
                    rule_trace: vec![],
                },
                mode: Mode::Enforce,
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
                objective: None,
                order: vec![],
                refused: Some(Refusal::NoReadyEndpoint),
            }),
            attempts: vec![],
            decision_duration_s: 0.0,
            held_s: 0.0,
            rollout: None,
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
        let json = serde_json::to_value(&d.snapshot(Some("b"))[0]).unwrap();
        assert_eq!(json["mode"], "enforce");
        assert_eq!(json["service_class"], "Standard");
        assert_eq!(json["candidate_models"], serde_json::json!(["m"]));
        assert_eq!(json["refused"], "no_ready_endpoint");
        assert_eq!(json["decision"]["reason"]["kind"], "no_candidates");
        assert!(json.get("rollout").is_none());
        d.update("c", |r| {
            r.rollout = Some(crate::rollout::RolloutRecord {
                name: "cheaper".into(),
                arm: "cohort",
            })
        });
        let json = serde_json::to_value(&d.snapshot(Some("c"))[0]).unwrap();
        assert_eq!(
            json["rollout"],
            serde_json::json!({"name": "cheaper", "arm": "cohort"})
        );
    }
}
