//! The guard's HTTP: the mirrored request, the judge's call, and reading answers and questions
//! out of OpenAI bodies.
//!
//! The judge is asked as MT-Bench's pairwise judge is (Zheng et al., 2023): the question and
//! two answers, labelled A and B, with the order drawn at random by the caller so that a
//! position bias averages out, and a one-word verdict.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::{
    client::legacy::{Client as Hyper, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde_json::{Value, json};

/// Answers larger than this are not read.
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// The most of a question or answer the judge is shown.
const MAX_TEXT_BYTES: usize = 32 * 1024;

/// What the judge said.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Said {
    A,
    B,
    Tie,
    /// Anything else.
    Unclear,
}

const SYSTEM: &str = "You are an impartial judge. Compare two answers to the user's question \
for correctness, helpfulness and completeness, ignoring their length and order. Reply with \
exactly one word: A if answer A is better, B if answer B is better, or TIE if they are equally \
good.";

/// One pooled HTTP/1.1 client for mirrors and judges.
#[derive(Clone, Debug)]
pub struct Client {
    http: Hyper<HttpConnector, Full<Bytes>>,
}

impl Client {
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(std::time::Duration::from_secs(2)));
        Self {
            http: Hyper::builder(TokioExecutor::new()).build(connector),
        }
    }

    /// POSTs JSON and reads a JSON answer; an error status is an error.
    pub async fn post(&self, url: &str, body: Bytes) -> anyhow::Result<Value> {
        let req = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let rsp = self.http.request(req).await?;
        let status = rsp.status();
        let bytes = Limited::new(rsp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the answer: {e}"))?
            .to_bytes();
        anyhow::ensure!(status.is_success(), "answered {status}");
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// Asks the judge at `base` (an OpenAI API base) to compare `a` and `b`.
    pub async fn judge(
        &self,
        base: &str,
        model: &str,
        question: &str,
        a: &str,
        b: &str,
    ) -> anyhow::Result<Said> {
        let body = json!({
            "model": model,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": judge_prompt(question, a, b)},
            ],
            "max_tokens": 4,
            "temperature": 0,
        });
        let url = format!("{}/chat/completions", base.trim_end_matches('/'));
        let v = self.post(&url, Bytes::from(body.to_string())).await?;
        Ok(answer_text(&v).map_or(Said::Unclear, |t| parse_verdict(&t)))
    }
}

fn clip(s: &str) -> &str {
    if s.len() <= MAX_TEXT_BYTES {
        return s;
    }
    let mut end = MAX_TEXT_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The judge's user message.
pub fn judge_prompt(question: &str, a: &str, b: &str) -> String {
    format!(
        "[Question]\n{}\n\n[Answer A]\n{}\n\n[Answer B]\n{}\n\nWhich answer is better? Reply A, B or TIE.",
        clip(question),
        clip(a),
        clip(b)
    )
}

/// Reads a verdict from the judge's reply: its first word.
pub fn parse_verdict(text: &str) -> Said {
    let word: String = text
        .trim_start_matches(|c: char| !c.is_alphanumeric())
        .chars()
        .take_while(|c| c.is_alphanumeric())
        .collect();
    match word.to_ascii_uppercase().as_str() {
        "A" => Said::A,
        "B" => Said::B,
        "TIE" => Said::Tie,
        _ => Said::Unclear,
    }
}

/// The text of an OpenAI answer's first choice (chat `message.content`, or completion `text`).
pub fn answer_text(v: &Value) -> Option<String> {
    let c = v.get("choices")?.get(0)?;
    c.pointer("/message/content")
        .or_else(|| c.get("text"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The text a streamed event adds to the first choice's answer.
pub fn delta_text(v: &Value) -> Option<&str> {
    let c = v.get("choices")?.get(0)?;
    c.pointer("/delta/content")
        .or_else(|| c.get("text"))
        .and_then(Value::as_str)
}

/// The question the judge is shown: the last user message of a chat request (its text parts),
/// or a completion request's prompt.
pub fn question_text(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    if let Some(messages) = v.get("messages").and_then(Value::as_array) {
        let last = messages
            .iter()
            .rev()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
        return match last.get("content")? {
            Value::String(s) => Some(s.clone()),
            Value::Array(parts) => Some(
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            _ => None,
        };
    }
    v.get("prompt").and_then(Value::as_str).map(str::to_string)
}

/// The app's request as the mirror sends it: for `served_name`, in one piece (not streamed).
pub fn mirror_body(body: &[u8], served_name: &str) -> Option<Bytes> {
    let mut v: serde_json::Map<String, Value> = serde_json::from_slice(body).ok()?;
    v.insert("model".into(), Value::String(served_name.into()));
    v.insert("stream".into(), Value::Bool(false));
    v.remove("stream_options");
    Some(Bytes::from(serde_json::to_vec(&v).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_from_the_first_word() {
        assert_eq!(parse_verdict("A"), Said::A);
        assert_eq!(parse_verdict(" b."), Said::B);
        assert_eq!(parse_verdict("**TIE**"), Said::Tie);
        assert_eq!(parse_verdict("tie, both fine"), Said::Tie);
        assert_eq!(parse_verdict("Answer A"), Said::Unclear);
        assert_eq!(parse_verdict(""), Said::Unclear);
    }

    #[test]
    fn questions_and_answers_come_out_of_openai_bodies() {
        let chat = br#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":"first"},{"role":"assistant","content":"x"},
            {"role":"user","content":[{"type":"text","text":"What is"},{"type":"text","text":"2+2?"}]}]}"#;
        assert_eq!(question_text(chat).as_deref(), Some("What is\n2+2?"));
        let completion = br#"{"model":"m","prompt":"Once upon"}"#;
        assert_eq!(question_text(completion).as_deref(), Some("Once upon"));
        let a = json!({"choices":[{"message":{"role":"assistant","content":"4"}}]});
        assert_eq!(answer_text(&a).as_deref(), Some("4"));
        let t = json!({"choices":[{"text":" a time"}]});
        assert_eq!(answer_text(&t).as_deref(), Some(" a time"));
        let d = json!({"choices":[{"delta":{"content":"4"}}]});
        assert_eq!(delta_text(&d), Some("4"));
    }

    #[test]
    fn the_mirror_asks_for_the_whole_answer_of_the_other_model() {
        let body = br#"{"model":"glm-5.3","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
        let v: Value = serde_json::from_slice(&mirror_body(body, "qwen").unwrap()).unwrap();
        assert_eq!(v["model"], "qwen");
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none());
    }

    #[test]
    fn long_texts_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(MAX_TEXT_BYTES);
        let p = judge_prompt(&long, "a", "b");
        assert!(p.len() < 2 * MAX_TEXT_BYTES);
    }
}
