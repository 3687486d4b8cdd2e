//! The entry point the `openai_request` fuzz target (`fuzz/`) and this crate's seed-replay test
//! share, so that the short run in the normal test suite exercises exactly what the fuzzer does.
//!
//! Request bodies come straight from clients, so the parser must turn any byte string into a
//! request or an OpenAI error, never a panic. Beyond that, one property is checked: a request
//! that parses still parses after `model` is rewritten (what the proxy does when a substitute
//! model wins), with the new model and everything else unchanged.

use crate::{Endpoint, InferenceRequest, rewrite_model};
use bytes::Bytes;

/// Parses `data` as a body of both endpoints and checks the rewrite round trip. Panics only when
/// a property fails.
pub fn request(data: &[u8]) {
    for endpoint in [Endpoint::Chat, Endpoint::Completion] {
        let raw = Bytes::copy_from_slice(data);
        let req = match InferenceRequest::parse(endpoint, raw) {
            Ok(req) => req,
            Err(e) => {
                assert!(e.status.is_client_error(), "{e}");
                continue;
            }
        };
        assert!(!req.model.trim().is_empty());
        assert_eq!(req.raw.as_ref(), data);
        assert!(req.estimated_prompt_tokens() >= 1);
        let _ = req.prefix_text();
        let rewritten = rewrite_model(data, "fuzz-substitute").expect("a parsed body re-encodes");
        let again = InferenceRequest::parse(endpoint, rewritten)
            .expect("a rewritten body parses as the original did");
        assert_eq!(again.model, "fuzz-substitute");
        assert_eq!(again.prompt, req.prompt);
        assert_eq!(again.stream, req.stream);
        assert_eq!(again.max_tokens, req.max_tokens);
        assert_eq!(again.include_usage, req.include_usage);
    }
}

/// The short fuzzing run shared by every fuzzed crate (see its docs).
#[cfg(test)]
#[path = "../../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::replay;

    /// Every committed input of the `openai_request` fuzz target, then 3000 mutants of them.
    #[test]
    fn openai_request_seeds_and_mutants() {
        let ran = replay::replay(
            env!("CARGO_MANIFEST_DIR"),
            "openai_request",
            3000,
            super::request,
        );
        assert!(ran > 3000);
    }
}
