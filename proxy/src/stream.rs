//! The response body on its way back: passed through frame by frame, observed on the way.
//!
//! The proxy never buffers a response. [`ObservedBody`] forwards each frame as it arrives and
//! watches it: for a stream, the first SSE event whose choices carry generated output is the
//! first token (TTFT; a chat stream's opening role-only event is not, since a server may send it
//! before prefill), the gaps between later ones are inter-token latencies, and the usage chunk
//! gives token counts; for a
//! non-stream response, the usage object is read from a bounded copy of the body. If the upstream
//! fails mid-stream, the client gets an SSE `error` event and a clean end instead of a cut
//! connection. When the body ends (or the client goes away) the [`Hooks`] hear how it went.
//!
//! The body also keeps the request's [`Deadlines`]: a stream whose first token does not come in
//! time, that sends nothing for the idle timeout, or that outlives the request's bound ends the
//! same way, with an SSE `error` event naming the timeout (a non-stream body is cut with an
//! error); nothing waits on a wedged endpoint without a bound.

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use kinference_openai::Usage;
use serde_json::value::RawValue;
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::Instant;

#[doc(hidden)]
pub mod fuzzing;

/// The error type of bodies the proxy serves.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a response ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub usage: Option<Usage>,
    /// SSE events with generated output (about one per token for vLLM).
    pub token_events: u64,
    /// The upstream failed after the first byte.
    pub upstream_error: Option<String>,
    /// The failure was a timeout (first token, idle or the request's bound).
    pub timed_out: bool,
    /// The body was dropped before its end (the client went away).
    pub cancelled: bool,
    /// The first choice's text, when the body was asked to keep it ([`ObservedBody::capture`]).
    pub answer: Option<String>,
}

/// Told what the body sees.
pub trait Hooks: Send + 'static {
    /// The first token arrived (streams only).
    fn first_token(&mut self, at: Instant);
    /// A streamed token after the first arrived at `at`, `gap` after the previous one.
    fn token(&mut self, at: Instant, gap: Duration);
    /// The body ended; called exactly once.
    fn end(&mut self, summary: Summary);
}

/// When a body must have made progress (tokio instants).
#[derive(Copy, Clone, Debug)]
pub struct Deadlines {
    /// The first token must have arrived by then (streams only).
    pub first_token: Option<Instant>,
    /// Nothing may be silent for longer than this.
    pub idle: Duration,
    /// The whole body must be over by then.
    pub end: Instant,
}

/// The most of a non-stream body kept to read its usage.
const MAX_KEPT_BYTES: usize = 4 * 1024 * 1024;

/// The most of an answer's text kept for its judge.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A response body observed on its way to the client.
pub struct ObservedBody<B> {
    inner: B,
    stream: bool,
    hooks: Option<Box<dyn Hooks>>,
    /// SSE: the incomplete tail of the last frame. Non-stream: the body so far (bounded).
    buf: BytesMut,
    last_token_at: Option<Instant>,
    summary: Summary,
    done: bool,
    deadlines: Option<Deadlines>,
    /// When the endpoint last sent anything.
    last_frame_at: Instant,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Keeps the answer's text (a sampled request's, for its judge).
    capture: bool,
}

impl<B> std::fmt::Debug for ObservedBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservedBody")
            .field("stream", &self.stream)
            .field("summary", &self.summary)
            .finish_non_exhaustive()
    }
}

impl<B> ObservedBody<B> {
    pub fn new(inner: B, stream: bool, hooks: Box<dyn Hooks>) -> Self {
        Self {
            inner,
            stream,
            hooks: Some(hooks),
            buf: BytesMut::new(),
            last_token_at: None,
            summary: Summary::default(),
            done: false,
            deadlines: None,
            last_frame_at: Instant::now(),
            timer: None,
            capture: false,
        }
    }

    /// Keeps the first choice's text (up to [`MAX_ANSWER_BYTES`]) for [`Summary::answer`].
    pub fn capture(mut self) -> Self {
        self.capture = true;
        self
    }

    /// Bounds the body by `deadlines`.
    pub fn with_deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = Some(deadlines);
        self
    }

    /// The earliest deadline still ahead, and what it is.
    fn next_deadline(&self) -> Option<(Instant, &'static str)> {
        let d = self.deadlines?;
        let mut next = (
            self.last_frame_at + d.idle,
            "the endpoint sent nothing for the stream idle timeout",
        );
        if d.end < next.0 {
            next = (d.end, "the request outlived its timeout");
        }
        if let Some(first) = d.first_token.filter(|_| self.last_token_at.is_none())
            && first < next.0
        {
            next = (first, "no first token within its timeout");
        }
        Some(next)
    }

    fn observe(&mut self, data: &[u8], now: Instant) {
        if !self.stream {
            if self.buf.len() + data.len() <= MAX_KEPT_BYTES {
                self.buf.extend_from_slice(data);
            }
            return;
        }
        self.buf.extend_from_slice(data);
        while let Some(end) = find_event_end(&self.buf) {
            let event = self.buf.split_to(end.0 + end.1);
            self.event(&event[..end.0], now);
        }
        if self.buf.len() > MAX_KEPT_BYTES {
            // Not SSE after all: stop looking rather than grow.
            self.buf.clear();
        }
    }

    fn event(&mut self, event: &[u8], now: Instant) {
        let Ok(text) = std::str::from_utf8(event) else {
            return;
        };
        // One `data:` line, as servers send: borrowed; several are joined, as SSE defines.
        let mut lines = text.lines().filter_map(|l| l.strip_prefix("data:"));
        let data: std::borrow::Cow<'_, str> = match (lines.next(), lines.next()) {
            (None, _) => return,
            (Some(one), None) => one.trim_start().into(),
            (Some(first), Some(second)) => {
                let mut joined = format!("{}\n{}", first.trim_start(), second.trim_start());
                for l in lines {
                    joined.push('\n');
                    joined.push_str(l.trim_start());
                }
                joined.into()
            }
        };
        if data.is_empty() || data == "[DONE]" {
            return;
        }
        if self.capture
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&data)
            && let Some(piece) = crate::guard::delta_text(&v)
        {
            let answer = self.summary.answer.get_or_insert_with(String::new);
            if answer.len() + piece.len() <= MAX_ANSWER_BYTES {
                answer.push_str(piece);
            }
        }
        let Some((usage, has_output)) = read_event(&data) else {
            return;
        };
        if let Some(u) = usage {
            self.summary.usage = Some(u);
        }
        if has_output {
            self.summary.token_events += 1;
            match self.last_token_at {
                None => {
                    if let Some(h) = self.hooks.as_mut() {
                        h.first_token(now);
                    }
                }
                Some(prev) => {
                    if let Some(h) = self.hooks.as_mut() {
                        h.token(now, now.saturating_duration_since(prev));
                    }
                }
            }
            self.last_token_at = Some(now);
        }
    }

    fn finish(&mut self) {
        if !self.stream && !self.buf.is_empty() {
            self.summary.usage = read_usage(&self.buf);
            if self.capture {
                self.summary.answer = serde_json::from_slice::<serde_json::Value>(&self.buf)
                    .ok()
                    .as_ref()
                    .and_then(crate::guard::answer_text)
                    .filter(|a| a.len() <= MAX_ANSWER_BYTES);
            }
            self.buf.clear();
        }
        if let Some(mut h) = self.hooks.take() {
            h.end(std::mem::take(&mut self.summary));
        }
    }
}

/// What the proxy reads of one streamed event: its usage, and whether any choice carries output.
///
/// Read without building a JSON tree: only the fields looked at are deserialized, the rest are
/// skipped (and text deltas stay borrowed). An event of another shape is read the slow way, as a
/// tree, so an unusual but valid event is never misread.
fn read_event(data: &str) -> Option<(Option<Usage>, bool)> {
    #[derive(serde::Deserialize)]
    struct Event<'a> {
        #[serde(borrow, default)]
        choices: Option<Vec<Choice<'a>>>,
        #[serde(default)]
        usage: Option<WireUsage>,
    }
    #[derive(serde::Deserialize)]
    struct Choice<'a> {
        #[serde(borrow, default)]
        text: Option<&'a RawValue>,
        #[serde(borrow, default)]
        delta: Option<Delta<'a>>,
        #[serde(borrow, default)]
        finish_reason: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Delta<'a> {
        #[serde(borrow, default)]
        content: Option<&'a RawValue>,
        #[serde(borrow, default)]
        reasoning_content: Option<&'a RawValue>,
        #[serde(borrow, default)]
        reasoning: Option<&'a RawValue>,
        #[serde(borrow, default)]
        tool_calls: Option<&'a RawValue>,
    }
    // Present, and neither null, "" nor an empty array (which a server may write `[ ]`).
    let non_empty = |v: Option<&RawValue>| {
        v.is_some_and(|v| {
            let v = v.get().trim();
            let empty_array = v
                .strip_prefix('[')
                .and_then(|v| v.strip_suffix(']'))
                .is_some_and(|inner| inner.trim().is_empty());
            !(v == "null" || v == "\"\"" || empty_array)
        })
    };
    match serde_json::from_str::<Event<'_>>(data) {
        Ok(e) => {
            let has_output = e.choices.iter().flatten().any(|c| {
                let d = c.delta.as_ref();
                non_empty(c.text)
                    || non_empty(d.and_then(|d| d.content))
                    || non_empty(d.and_then(|d| d.reasoning_content))
                    || non_empty(d.and_then(|d| d.reasoning))
                    || non_empty(d.and_then(|d| d.tool_calls))
                    || non_empty(c.finish_reason)
            });
            Some((e.usage.map(WireUsage::into_usage), has_output))
        }
        Err(_) => read_event_tree(data),
    }
}

/// [`read_event`] the slow way, from a JSON tree: what the fast path must agree with.
fn read_event_tree(data: &str) -> Option<(Option<Usage>, bool)> {
    let v = serde_json::from_str::<serde_json::Value>(data).ok()?;
    let usage = v.get("usage").and_then(Usage::from_json);
    let has_output = v
        .get("choices")
        .and_then(|c| c.as_array())
        .is_some_and(|c| c.iter().any(carries_output));
    Some((usage, has_output))
}

/// The `usage` of a whole (non-stream) response body, read as [`read_event`] reads events.
fn read_usage(body: &[u8]) -> Option<Usage> {
    #[derive(serde::Deserialize)]
    struct Whole {
        #[serde(default)]
        usage: Option<WireUsage>,
    }
    match serde_json::from_slice::<Whole>(body) {
        Ok(w) => w.usage.map(WireUsage::into_usage),
        Err(_) => read_usage_tree(body),
    }
}

/// [`read_usage`] the slow way, from a JSON tree: what the fast path must agree with.
fn read_usage_tree(body: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("usage")
        .and_then(Usage::from_json)
}

/// An OpenAI `usage` object, as servers send it.
#[derive(serde::Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<WireDetails>,
}

#[derive(serde::Deserialize)]
struct WireDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl WireUsage {
    fn into_usage(self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            cached_tokens: self.prompt_tokens_details.and_then(|d| d.cached_tokens),
        }
    }
}

/// Whether a streamed choice carries generated output: text, content, reasoning, a tool call, or
/// the finish of a generation that produced none. A chat stream's opening event (`delta: {role:
/// "assistant", content: ""}`) does not: a server may send it before prefill has even started,
/// and counting it would make every TTFT (and the predictor's feedback) the time to the headers.
fn carries_output(choice: &serde_json::Value) -> bool {
    let non_empty = |v: Option<&serde_json::Value>| match v {
        Some(serde_json::Value::String(s)) => !s.is_empty(),
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(serde_json::Value::Null) | None => false,
        Some(_) => true,
    };
    let delta = choice.get("delta");
    non_empty(choice.get("text"))
        || non_empty(delta.and_then(|d| d.get("content")))
        || non_empty(delta.and_then(|d| d.get("reasoning_content")))
        || non_empty(delta.and_then(|d| d.get("reasoning")))
        || non_empty(delta.and_then(|d| d.get("tool_calls")))
        || non_empty(choice.get("finish_reason"))
}

/// The end of the first complete SSE event: (its length, the separator's length).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The SSE event sent when the upstream fails mid-stream (`code` `upstream_stream_failed`) or
/// the stream times out (`timeout`).
pub fn error_event(message: &str, code: &str) -> Bytes {
    let v = serde_json::json!({
        "error": {
            "message": message,
            "type": "upstream_error",
            "param": null,
            "code": code,
        }
    });
    Bytes::from(format!("data: {v}\n\n"))
}

impl<B> Body for ObservedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                let Some((at, why)) = this.next_deadline() else {
                    return Poll::Pending;
                };
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if timer.deadline() != at {
                    timer.as_mut().reset(at);
                }
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.done = true;
                let message = format!("the request timed out: {why}");
                this.summary.upstream_error = Some(message.clone());
                this.summary.timed_out = true;
                this.finish();
                if this.stream {
                    Poll::Ready(Some(Ok(Frame::data(error_event(&message, "timeout")))))
                } else {
                    Poll::Ready(Some(Err(message.into())))
                }
            }
            Poll::Ready(Some(Ok(frame))) => {
                let now = Instant::now();
                this.last_frame_at = now;
                if let Some(data) = frame.data_ref() {
                    this.observe(data, now);
                }
                // A body of known length is over with its last byte: the server stops polling
                // and drops it there, which must not read as the client going away.
                if this.inner.is_end_stream() {
                    this.done = true;
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.done = true;
                let message = format!("the model server failed mid-response: {e}");
                this.summary.upstream_error = Some(message.clone());
                this.summary.timed_out = true;
                this.finish();
                if this.stream {
                    Poll::Ready(Some(Ok(Frame::data(error_event(
                        &message,
                        "upstream_stream_failed",
                    )))))
                } else {
                    Poll::Ready(Some(Err(message.into())))
                }
            }
            Poll::Ready(None) => {
                this.done = true;
                this.finish();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.stream {
            // An error event may be added: no exact size.
            http_body::SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

impl<B> Drop for ObservedBody<B> {
    fn drop(&mut self) {
        if self.hooks.is_some() {
            self.summary.cancelled = !self.done;
            self.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;
    use http_body_util::{BodyExt, StreamBody};
    use parking_lot::Mutex;
    use std::sync::Arc;

    #[derive(Default, Debug)]
    struct Seen {
        first: usize,
        gaps: usize,
        end: Option<Summary>,
        ends: usize,
    }

    struct Rec(Arc<Mutex<Seen>>);
    impl Hooks for Rec {
        fn first_token(&mut self, _at: Instant) {
            self.0.lock().first += 1;
        }
        fn token(&mut self, _at: Instant, _gap: Duration) {
            self.0.lock().gaps += 1;
        }
        fn end(&mut self, summary: Summary) {
            let mut s = self.0.lock();
            s.end = Some(summary);
            s.ends += 1;
        }
    }

    type Chunks = Vec<Result<Frame<Bytes>, std::io::Error>>;
    type TestBody =
        StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::io::Error>>>>;

    fn body(chunks: Chunks) -> TestBody {
        StreamBody::new(stream::iter(chunks))
    }

    fn data(s: &str) -> Result<Frame<Bytes>, std::io::Error> {
        Ok(Frame::data(Bytes::from(s.to_string())))
    }

    #[tokio::test]
    async fn sse_first_token_gaps_and_usage_across_split_frames() {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let chunks = vec![
            data("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n"),
            data("\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choi"),
            data("ces\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\r\n"),
            data(
                "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n",
            ),
        ];
        let expected: Vec<u8> = chunks
            .iter()
            .flat_map(|c| c.as_ref().unwrap().data_ref().unwrap().to_vec())
            .collect();
        let b = ObservedBody::new(body(chunks), true, Box::new(Rec(seen.clone())));
        let out = b.collect().await.unwrap().to_bytes();
        assert_eq!(out.to_vec(), expected, "passed through unchanged");
        let s = seen.lock();
        // The opening role event is not a token: "a" is the first, "b" the second.
        assert_eq!(s.first, 1);
        assert_eq!(s.gaps, 1);
        assert_eq!(s.ends, 1);
        let end = s.end.clone().unwrap();
        assert_eq!(end.token_events, 2);
        assert_eq!(
            end.usage,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 2,
                cached_tokens: Some(4)
            })
        );
        assert!(!end.cancelled);
    }

    #[tokio::test]
    async fn role_only_openers_are_not_tokens_but_a_bare_finish_is() {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let chunks = vec![
            data(
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
            ),
            data(
                "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
            ),
        ];
        let b = ObservedBody::new(body(chunks), true, Box::new(Rec(seen.clone())));
        b.collect().await.unwrap();
        let s = seen.lock();
        assert_eq!(s.first, 1, "the finish is the first output");
        assert_eq!(s.end.as_ref().unwrap().token_events, 1);
        assert!(!carries_output(
            &serde_json::json!({"delta": {"role": "assistant"}})
        ));
        assert!(carries_output(
            &serde_json::json!({"delta": {"tool_calls": [{"index": 0}]}})
        ));
        assert!(carries_output(
            &serde_json::json!({"text": " the", "finish_reason": null})
        ));
    }

    #[tokio::test]
    async fn upstream_failure_mid_stream_ends_with_an_error_event() {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let chunks = vec![
            data("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"),
            Err(std::io::Error::other("reset")),
        ];
        let b = ObservedBody::new(body(chunks), true, Box::new(Rec(seen.clone())));
        let out = b.collect().await.unwrap().to_bytes();
        let text = String::from_utf8(out.to_vec()).unwrap();
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(v["error"]["code"], "upstream_stream_failed");
        let s = seen.lock();
        assert!(s.end.as_ref().unwrap().upstream_error.is_some());
        assert_eq!(s.ends, 1);
    }

    #[tokio::test]
    async fn non_stream_usage_and_cancel_on_drop() {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let chunks = vec![
            data("{\"choices\":[{\"message\":{\"content\":\"hi\"}}],"),
            data("\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}"),
        ];
        let b = ObservedBody::new(body(chunks), false, Box::new(Rec(seen.clone())));
        b.collect().await.unwrap();
        {
            let s = seen.lock();
            assert_eq!(s.first, 0, "no TTFT from a non-stream body");
            assert_eq!(s.end.as_ref().unwrap().usage.unwrap().prompt_tokens, 3);
        }
        // A body of known length is complete after its last frame even if it is never polled
        // for its end (hyper stops at content-length).
        let seen = Arc::new(Mutex::new(Seen::default()));
        let full = http_body_util::Full::new(Bytes::from_static(
            b"{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}",
        ))
        .map_err(|e| match e {});
        let mut b = ObservedBody::new(full, false, Box::new(Rec(seen.clone())));
        assert!(b.frame().await.unwrap().unwrap().is_data());
        assert!(b.is_end_stream());
        drop(b);
        {
            let s = seen.lock();
            assert_eq!(s.ends, 1);
            let end = s.end.as_ref().unwrap();
            assert!(!end.cancelled, "{end:?}");
            assert_eq!(end.usage.unwrap().completion_tokens, 1);
        }
        let seen = Arc::new(Mutex::new(Seen::default()));
        let b = ObservedBody::new(body(vec![data("x")]), true, Box::new(Rec(seen.clone())));
        drop(b);
        let s = seen.lock();
        assert_eq!(s.ends, 1);
        assert!(s.end.as_ref().unwrap().cancelled);
    }

    /// vLLM 0.32 sends `prompt_tokens_details: null` without `--enable-prompt-tokens-details`
    /// (recorded in `proxy/signals/tests/fixtures/vllm-0.32.0/default`): no cached-token figure,
    /// which the observe layer tells from a reported zero.
    #[test]
    fn usage_without_prompt_tokens_details_has_no_cached_figure() {
        let body = br#"{"usage":{"prompt_tokens":304,"total_tokens":308,"completion_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null}}"#;
        let u = read_usage(body).unwrap();
        assert_eq!((u.prompt_tokens, u.cached_tokens), (304, None));
        assert_eq!(read_usage_tree(body), Some(u));
        let body = br#"{"usage":{"prompt_tokens":304,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0,"created_cache_tokens":null,"multimodal_tokens":null}}}"#;
        assert_eq!(read_usage(body).unwrap().cached_tokens, Some(0));
        assert_eq!(read_usage(body), read_usage_tree(body));
        let event = r#"{"choices":[],"usage":{"prompt_tokens":304,"completion_tokens":4}}"#;
        assert_eq!(read_event(event).unwrap().0.unwrap().cached_tokens, None);
        assert_eq!(read_event(event), read_event_tree(event));
    }

    /// Found while writing the `sse` fuzz target's differential property (the fast reader against
    /// the JSON tree): the fast reader took an empty array written with a space
    /// (`"content": [ ]`) for output, where the tree does not.
    #[test]
    fn an_empty_array_with_spaces_is_not_output() {
        for event in [
            r#"{"choices":[{"delta":{"content":[ ]}}]}"#,
            r#"{"choices":[{"text":[
]}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[	]},"finish_reason":null}]}"#,
        ] {
            assert_eq!(read_event(event), Some((None, false)), "{event}");
            assert_eq!(read_event(event), read_event_tree(event), "{event}");
        }
        let output = r#"{"choices":[{"delta":{"tool_calls":[ {"index": 0} ]}}]}"#;
        assert_eq!(read_event(output), Some((None, true)));
    }
}
