//! The entry point the `admission_review` fuzz target (`fuzz/`) and this crate's seed-replay test
//! share, so that the short run in the normal test suite exercises exactly what the fuzzer does.
//!
//! The webhook's body comes from the API server, but anything that can reach the port can send
//! one, and the objects in it are whatever a user wrote. Any byte string must be answered (a
//! review, or a `ReviewError` for a 400), never a panic. Checked beyond that: an answer is a
//! review for the same request (`uid`), it serializes and reads back, and a deletion is allowed.

use crate::review;
use kube::core::{
    DynamicObject,
    admission::{AdmissionRequest, AdmissionReview, Operation},
};

/// Answers `data` as a validating AdmissionReview. Panics only when a property fails.
pub fn admission_review(data: &[u8]) {
    let Ok(answer) = review(data) else {
        return;
    };
    let asked: AdmissionReview<DynamicObject> =
        serde_json::from_slice(data).expect("a reviewed body parses");
    let request: AdmissionRequest<DynamicObject> =
        asked.try_into().expect("a reviewed body has a request");
    let response = answer.response.as_ref().expect("an answer has a response");
    assert_eq!(response.uid, request.uid);
    if matches!(request.operation, Operation::Delete | Operation::Connect) {
        assert!(response.allowed, "a {:?} was denied", request.operation);
    }
    let json = serde_json::to_vec(&answer).expect("an answer serializes");
    let back: AdmissionReview<DynamicObject> =
        serde_json::from_slice(&json).expect("an answer reads back");
    let back = back.response.expect("the answer read back has a response");
    assert_eq!(back.uid, response.uid);
    assert_eq!(back.allowed, response.allowed);
}

/// The short fuzzing run shared by every fuzzed crate (see its docs).
#[cfg(test)]
#[path = "../../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::replay;

    /// Every committed input of the `admission_review` fuzz target, then 1000 mutants of them.
    #[test]
    fn admission_review_seeds_and_mutants() {
        let ran = replay::replay(
            env!("CARGO_MANIFEST_DIR"),
            "admission_review",
            1000,
            super::admission_review,
        );
        assert!(ran > 1000);
    }
}
