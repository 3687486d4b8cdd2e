//! The prompt as the user gives it, turned into the request body the proxy would receive.
//!
//! People paste what they have: a sentence, the `messages` array from a log, or a whole request
//! body. Each becomes one OpenAI body, so the classifier sees exactly what it sees in production
//! (chat turns stay turns).

use anyhow::Context as _;
use serde_json::{Value, json};

/// The request body for `text`: a whole chat or completion body (an object with `messages` or
/// `prompt`), a JSON array of chat messages, or else plain text sent as one user message.
/// `model` names the model (overriding the body's); `max_tokens` is set when given.
pub fn request_body(
    text: &str,
    model: Option<&str>,
    max_tokens: Option<u32>,
) -> anyhow::Result<Value> {
    let parsed: Option<Value> = serde_json::from_str(text.trim()).ok();
    let mut body = match parsed {
        Some(Value::Object(o)) if o.contains_key("messages") || o.contains_key("prompt") => {
            Value::Object(o)
        }
        Some(Value::Array(messages)) if messages.iter().all(|m| m.get("role").is_some()) => {
            json!({ "messages": messages })
        }
        _ => json!({ "messages": [{ "role": "user", "content": text }] }),
    };
    if let Some(m) = model {
        body["model"] = Value::from(m);
    }
    body.get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .context("name the requested model with --model (the body names none)")?;
    if let Some(n) = max_tokens {
        body["max_tokens"] = Value::from(n);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_becomes_one_user_message() {
        let b = request_body("What is 2+2?\n", Some("glm-5.3"), Some(8)).unwrap();
        assert_eq!(
            b,
            json!({"model": "glm-5.3", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "What is 2+2?\n"}]})
        );
    }

    #[test]
    fn a_messages_array_keeps_its_turns() {
        let text = r#"[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]"#;
        let b = request_body(text, Some("default"), None).unwrap();
        assert_eq!(b["messages"].as_array().unwrap().len(), 2);
        assert_eq!(b["model"], "default");
    }

    #[test]
    fn a_whole_body_is_used_and_model_overrides_it() {
        let text = r#"{"model":"qwen-3.6-27b","prompt":"Once upon a time"}"#;
        let b = request_body(text, None, None).unwrap();
        assert_eq!(b["model"], "qwen-3.6-27b");
        assert_eq!(b["prompt"], "Once upon a time");
        let b = request_body(text, Some("glm-5.3"), None).unwrap();
        assert_eq!(b["model"], "glm-5.3");
    }

    #[test]
    fn a_model_is_required() {
        let e = request_body("hello", None, None).unwrap_err();
        assert!(e.to_string().contains("--model"), "{e}");
        // JSON that is neither a body nor messages is plain text.
        let b = request_body("[1, 2]", Some("m"), None).unwrap();
        assert_eq!(b["messages"][0]["content"], "[1, 2]");
    }
}
