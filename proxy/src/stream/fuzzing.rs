//! The entry point the `sse` fuzz target (`fuzz/`) and the proxy's seed-replay test share, so
//! that the short run in the normal test suite exercises exactly what the fuzzer does.
//!
//! A response body is whatever the model server sends, cut into frames wherever the network cuts
//! it. The reader must never panic on it, and these properties are checked:
//! - how the body is cut into frames does not change what is read (tokens, usage);
//! - the hooks hear one first token exactly when there were tokens, one gap per later token, and
//!   one end;
//! - the fast, borrowed reading of an event (and of a whole body's usage) agrees with reading it
//!   as a JSON tree, which is what the docs of [`read_event`] promise, for JSON of an event's
//!   shape ([`openai_shaped`]).
//!
//! The first input byte seeds where the body is cut; the rest is the body.

use super::{ObservedBody, Summary, read_event, read_event_tree, read_usage, read_usage_tree};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

#[derive(Debug, Default)]
struct Heard {
    first_tokens: u64,
    tokens: u64,
    ends: Vec<Summary>,
}

struct Recorder(Arc<Mutex<Heard>>);

impl super::Hooks for Recorder {
    fn first_token(&mut self, _: Instant) {
        self.0.lock().unwrap().first_tokens += 1;
    }
    fn token(&mut self, _: Instant, _: std::time::Duration) {
        self.0.lock().unwrap().tokens += 1;
    }
    fn end(&mut self, summary: Summary) {
        self.0.lock().unwrap().ends.push(summary);
    }
}

/// Observes `frames` as one body and returns what its hooks heard.
fn observe<'a>(stream: bool, frames: impl IntoIterator<Item = &'a [u8]>) -> Heard {
    let heard = Arc::new(Mutex::new(Heard::default()));
    let mut body = ObservedBody::new((), stream, Box::new(Recorder(heard.clone())));
    let now = Instant::now();
    for frame in frames {
        body.observe(frame, now);
    }
    body.finish();
    drop(body);
    Arc::try_unwrap(heard).unwrap().into_inner().unwrap()
}

/// Cuts `body` into frames of pseudo-random sizes (1 to 16 bytes) from `seed`.
fn cut(seed: u8, body: &[u8]) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 0x100;
    let mut frames = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = (state % 16 + 1) as usize;
        let (frame, tail) = rest.split_at(n.min(rest.len()));
        frames.push(frame);
        rest = tail;
    }
    frames
}

/// Whether `v` has an OpenAI event's (or response's) shape where the fast reader reads structs:
/// an object, whose `choices` are objects with an object `delta`, and whose `usage` and
/// `prompt_tokens_details` are objects (each may be absent or null). Elsewhere the two readings
/// may differ, and may: serde reads a struct from an array too (its fields by position), which
/// no server sends, so the fast reader may count `[["x"]]` as output where the tree does not.
/// (`fuzz/seeds/sse/array_as_struct.sse` is such an event.)
fn openai_shaped(v: &Value) -> bool {
    let object_or_null = |v: Option<&Value>| v.is_none_or(|v| v.is_object() || v.is_null());
    let Some(obj) = v.as_object() else {
        return false;
    };
    let choices_ok = match obj.get("choices") {
        None | Some(Value::Null) => true,
        Some(Value::Array(choices)) => choices
            .iter()
            .all(|c| c.is_object() && object_or_null(c.get("delta"))),
        Some(_) => true,
    };
    let usage = obj.get("usage");
    choices_ok
        && object_or_null(usage)
        && object_or_null(usage.and_then(|u| u.get("prompt_tokens_details")))
}

/// Reads `data` as described in the module docs. Panics only when a property fails.
pub fn sse(data: &[u8]) {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let whole = observe(true, [body]);
    let pieces = observe(true, cut(seed, body));
    assert_eq!(whole.ends.len(), 1);
    assert_eq!(
        pieces.ends, whole.ends,
        "the frames' boundaries changed the reading"
    );
    let summary = &whole.ends[0];
    assert_eq!(whole.first_tokens, u64::from(summary.token_events > 0));
    assert_eq!(whole.tokens, summary.token_events.saturating_sub(1));
    assert_eq!(
        (pieces.first_tokens, pieces.tokens),
        (whole.first_tokens, whole.tokens)
    );

    // The body as one event's data, and as a whole non-stream response, when it has the shape
    // of one (see [`openai_shaped`]).
    if let Ok(text) = std::str::from_utf8(body)
        && serde_json::from_str::<Value>(text).is_ok_and(|v| openai_shaped(&v))
    {
        assert_eq!(read_event(text), read_event_tree(text), "event {text:?}");
        assert_eq!(read_usage(body), read_usage_tree(body), "body {text:?}");
    }
    let plain = observe(false, cut(seed, body));
    assert_eq!(plain.ends.len(), 1);
    assert_eq!(plain.ends[0].usage, read_usage(body));
    assert_eq!(plain.first_tokens + plain.tokens, 0);
}

/// The short fuzzing run shared by every fuzzed crate (see its docs).
#[cfg(test)]
#[path = "../../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::replay;

    /// Every committed input of the `sse` fuzz target, then 2000 mutants of them.
    #[test]
    fn sse_seeds_and_mutants() {
        let ran = replay::replay(env!("CARGO_MANIFEST_DIR"), "sse", 2000, super::sse);
        assert!(ran > 2000);
    }
}
