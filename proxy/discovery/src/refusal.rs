//! The proxy's own last-good rule: a message that would leave a working target with no policy is
//! refused, and the policy the target has is kept.
//!
//! The controller keeps the last valid version of a policy it can no longer validate (it sends it
//! as `LAST_GOOD`), so most bad edits never reach the proxy. Two cases do: a controller restarted
//! on an invalid policy has no valid version to keep and sends the target as `INVALID`, and a
//! deleted InferencePolicy is sent as `NOT_FOUND`. Either would turn every request into a 404.
//! As Envoy NACKs a configuration it cannot use and keeps the last one, the proxy keeps serving
//! the policy it has, says so (`/debug/targets`, a WARN, a counter), and takes the next message
//! that has models. A target that never had a policy takes the empty one: there is nothing to keep.

use kinference_proxy_api::inference::{InferencePolicy, status::Kind};
use std::collections::BTreeMap;

/// A message the proxy refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `not_found` (the policy was deleted), `invalid` (the controller has no valid version) or
    /// `empty` (a policy with no models for another reason): a fixed set, fit for a label.
    pub reason: &'static str,
    /// The controller's status message for the refused message.
    pub message: String,
}

/// What the target's policy stream has refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refusals {
    /// Refused messages since the proxy started, by reason.
    pub total: BTreeMap<&'static str, u64>,
    /// The refusal the current policy is kept over; cleared when a message is taken.
    pub kept: Option<Refusal>,
}

impl Refusals {
    pub fn count(&self) -> u64 {
        self.total.values().sum()
    }
}

/// Why `new` must not replace `current`, if it must not.
pub fn judge(current: Option<&InferencePolicy>, new: &InferencePolicy) -> Option<Refusal> {
    let working = current.is_some_and(|c| !c.models.is_empty());
    if !working || !new.models.is_empty() {
        return None;
    }
    let status = new.status.clone().unwrap_or_default();
    let reason = match Kind::try_from(status.kind) {
        Ok(Kind::NotFound) => "not_found",
        Ok(Kind::Invalid) => "invalid",
        _ => "empty",
    };
    let message = if status.message.is_empty() {
        "the controller sent a policy with no models".to_string()
    } else {
        status.message
    };
    Some(Refusal { reason, message })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_proxy_api::inference::{Model, Status};

    fn policy(models: usize, kind: Kind, message: &str) -> InferencePolicy {
        InferencePolicy {
            revision: "r".into(),
            models: (0..models)
                .map(|i| Model {
                    name: format!("m{i}"),
                    ..Model::default()
                })
                .collect(),
            status: Some(Status {
                kind: kind as i32,
                message: message.into(),
            }),
            ..InferencePolicy::default()
        }
    }

    #[test]
    fn an_empty_policy_is_refused_only_over_a_working_one() {
        let working = policy(2, Kind::Served, "");
        let deleted = policy(0, Kind::NotFound, "no InferencePolicy targets llm");
        let invalid = policy(0, Kind::Invalid, "alias cycle: default -> fast -> default");
        assert_eq!(
            judge(Some(&working), &deleted),
            Some(Refusal {
                reason: "not_found",
                message: "no InferencePolicy targets llm".into()
            })
        );
        assert_eq!(judge(Some(&working), &invalid).unwrap().reason, "invalid");
        let bare = InferencePolicy::default();
        let r = judge(Some(&working), &bare).unwrap();
        assert_eq!(r.reason, "empty");
        assert!(!r.message.is_empty());
        // Nothing to keep: the first message, or one after an empty one, is taken.
        assert_eq!(judge(None, &deleted), None);
        assert_eq!(judge(Some(&deleted), &invalid), None);
        // A policy with models is always taken, whatever its status.
        let kept = policy(1, Kind::LastGood, "InferenceClassifier rejected");
        assert_eq!(judge(Some(&working), &kept), None);
    }
}
