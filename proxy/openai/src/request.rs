//! The typed view of one OpenAI completion request, parsed once from its raw bytes.

use super::ApiError;
use bytes::Bytes;
use kinference_classify::{ClassifierSet, Explanation, Prompt, Role, Tags, Turn};
use serde_json::Value;

/// Which OpenAI endpoint a request was sent to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Completion => "/v1/completions",
        }
    }
}

/// One chat turn's role and text (the text parts of its content, joined).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTurn {
    pub role: Role,
    pub text: String,
}

/// The prompt, as classifiers and the prefix index read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptText {
    Chat(Vec<ChatTurn>),
    Completion(String),
}

/// A parsed completion request. Holds the prompt text for classification only; it is never logged.
#[derive(Clone, Debug)]
pub struct InferenceRequest {
    pub endpoint: Endpoint,
    /// The model (or alias) the client asked for.
    pub model: String,
    pub prompt: PromptText,
    pub stream: bool,
    /// `max_tokens`, or `max_completion_tokens` when that is set instead.
    pub max_tokens: Option<u32>,
    /// Whether a streaming client asked for the usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    /// The body exactly as received.
    pub raw: Bytes,
}

/// Token counts a response reports.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens`; `None` when the server reported no such figure
    /// (vLLM sends `prompt_tokens_details: null` unless started with
    /// `--enable-prompt-tokens-details`).
    pub cached_tokens: Option<u64>,
}

impl Usage {
    /// Reads an OpenAI `usage` object; `None` when it is absent, null or not an object.
    pub fn from_json(v: &Value) -> Option<Self> {
        let u = v.as_object()?;
        let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
        Some(Self {
            prompt_tokens: n(u.get("prompt_tokens")),
            completion_tokens: n(u.get("completion_tokens")),
            cached_tokens: u
                .get("prompt_tokens_details")
                .and_then(|d| d.get("cached_tokens"))
                .and_then(Value::as_u64),
        })
    }
}

impl InferenceRequest {
    /// Parses a body sent to `endpoint`.
    pub fn parse(endpoint: Endpoint, raw: Bytes) -> Result<Self, ApiError> {
        let value: Value = serde_json::from_slice(&raw)
            .map_err(|e| ApiError::bad_request(format!("The body is not valid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(ApiError::bad_request("The body must be a JSON object"));
        };
        let model = match obj.get("model") {
            Some(Value::String(m)) if !m.trim().is_empty() => m.clone(),
            Some(Value::String(_)) => {
                return Err(ApiError::bad_field("model", "`model` must not be empty"));
            }
            Some(_) => return Err(ApiError::bad_field("model", "`model` must be a string")),
            None => return Err(ApiError::bad_field("model", "`model` is required")),
        };
        let prompt = match endpoint {
            Endpoint::Chat => PromptText::Chat(parse_messages(obj.get("messages"))?),
            Endpoint::Completion => PromptText::Completion(parse_prompt(obj.get("prompt"))?),
        };
        let stream = match obj.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::bad_field("stream", "`stream` must be a boolean")),
        };
        let max_tokens = match (obj.get("max_tokens"), obj.get("max_completion_tokens")) {
            (Some(v), _) if !v.is_null() => Some(parse_max_tokens("max_tokens", v)?),
            (_, Some(v)) if !v.is_null() => Some(parse_max_tokens("max_completion_tokens", v)?),
            _ => None,
        };
        let include_usage = obj
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Self {
            endpoint,
            model,
            prompt,
            stream,
            max_tokens,
            include_usage,
            raw,
        })
    }

    /// The prompt as the classifier crate reads it.
    pub fn with_classifier_prompt<R>(&self, f: impl FnOnce(Prompt<'_>) -> R) -> R {
        match &self.prompt {
            PromptText::Completion(text) => f(Prompt::Completion(text)),
            PromptText::Chat(turns) => {
                let turns: Vec<Turn<'_>> = turns
                    .iter()
                    .map(|t| Turn {
                        role: t.role,
                        text: &t.text,
                    })
                    .collect();
                f(Prompt::Chat(&turns))
            }
        }
    }

    /// The tags of the request's prompt under `set`: local classifiers, then external ones, each
    /// within its budget.
    pub async fn classify(&self, set: &ClassifierSet) -> Tags {
        let local = self.classify_local(set);
        Self::classify_external(set, local).await
    }

    /// The local classifiers' tags (CPU only, sized by the prompt), and the text the external
    /// ones are sent, if any: the part of [`Self::classify`] a caller may run off the async
    /// workers.
    pub fn classify_local(&self, set: &ClassifierSet) -> (Tags, Option<String>) {
        self.with_classifier_prompt(|p| (set.classify(p), set.external_text(p)))
    }

    /// Adds the external classifiers' tags to what [`Self::classify_local`] gave.
    pub async fn classify_external(
        set: &ClassifierSet,
        (mut tags, text): (Tags, Option<String>),
    ) -> Tags {
        if let Some(text) = text {
            for t in set.run_external(&text).await {
                tags.insert(t.tag);
            }
        }
        tags
    }

    /// [`Self::classify`] with scores and the features that drove them.
    pub async fn explain(&self, set: &ClassifierSet) -> Explanation {
        let (mut explanation, text) =
            self.with_classifier_prompt(|p| (set.explain(p), set.external_text(p)));
        if let Some(text) = text {
            explanation.tags.extend(set.run_external(&text).await);
        }
        explanation
    }

    /// The prompt as one byte string, in order, for the prefix index (role markers included so
    /// that the same text under another role is another prefix).
    pub fn prefix_text(&self) -> Vec<u8> {
        match &self.prompt {
            PromptText::Completion(text) => text.as_bytes().to_vec(),
            PromptText::Chat(turns) => {
                let mut out = Vec::with_capacity(turns.iter().map(|t| t.text.len() + 12).sum());
                for t in turns {
                    out.extend_from_slice(role_name(t.role).as_bytes());
                    out.push(b'\n');
                    out.extend_from_slice(t.text.as_bytes());
                    out.push(b'\n');
                }
                out
            }
        }
    }

    /// The prompt's size in bytes (chat turns' text; what estimates and bounds are made from).
    pub fn prompt_bytes(&self) -> usize {
        match &self.prompt {
            PromptText::Completion(t) => t.len(),
            PromptText::Chat(turns) => turns.iter().map(|t| t.text.len()).sum(),
        }
    }

    /// A lower bound on the prompt's tokens for refusing it early: one token per
    /// [`MAX_BYTES_PER_TOKEN`] bytes, twice what BPE vocabularies average on prose and code, so
    /// a prompt refused on it would need tokens averaging over 8 bytes to fit.
    pub fn min_prompt_tokens(&self) -> u64 {
        (self.prompt_bytes() / MAX_BYTES_PER_TOKEN) as u64
    }

    /// The prompt's size in tokens, estimated at four bytes per token (the proxy has no tokenizer;
    /// the usage the server reports is what metrics count).
    pub fn estimated_prompt_tokens(&self) -> u32 {
        let bytes = match &self.prompt {
            PromptText::Completion(t) => t.len(),
            PromptText::Chat(turns) => turns.iter().map(|t| t.text.len() + 4).sum(),
        };
        u32::try_from(bytes.div_ceil(4).max(1)).unwrap_or(u32::MAX)
    }
}

/// The most bytes per token [`InferenceRequest::min_prompt_tokens`] assumes.
pub const MAX_BYTES_PER_TOKEN: usize = 8;

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn parse_max_tokens(param: &'static str, v: &Value) -> Result<u32, ApiError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            ApiError::bad_field(param, format!("`{param}` must be a non-negative integer"))
        })
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<ChatTurn>, ApiError> {
    let Some(v) = v else {
        return Err(ApiError::bad_field("messages", "`messages` is required"));
    };
    let Some(items) = v.as_array() else {
        return Err(ApiError::bad_field(
            "messages",
            "`messages` must be an array",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::bad_field(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Some(obj) = m.as_object() else {
                return Err(ApiError::bad_field(
                    "messages",
                    format!("messages[{i}] must be an object"),
                ));
            };
            let role = match obj.get("role").and_then(Value::as_str) {
                Some("system" | "developer") => Role::System,
                Some("user") => Role::User,
                Some("assistant") => Role::Assistant,
                Some("tool" | "function") => Role::Tool,
                Some(other) => {
                    return Err(ApiError::bad_field(
                        "messages",
                        format!("messages[{i}].role {other:?} is not a known role"),
                    ));
                }
                None => {
                    return Err(ApiError::bad_field(
                        "messages",
                        format!("messages[{i}].role is required"),
                    ));
                }
            };
            let text = match obj.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        if let Some(t) = p.get("text").and_then(Value::as_str) {
                            if !text.is_empty() {
                                text.push('\n');
                            }
                            text.push_str(t);
                        }
                    }
                    text
                }
                Some(_) => {
                    return Err(ApiError::bad_field(
                        "messages",
                        format!("messages[{i}].content must be a string or an array of parts"),
                    ));
                }
            };
            Ok(ChatTurn { role, text })
        })
        .collect()
}

fn parse_prompt(v: Option<&Value>) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) if !items.is_empty() => {
            // A list of strings (a batch) or of token ids: the text we can read is the strings.
            let mut text = String::new();
            for item in items {
                match item {
                    Value::String(s) => text.push_str(s),
                    Value::Number(_) | Value::Array(_) => {}
                    _ => {
                        return Err(ApiError::bad_field(
                            "prompt",
                            "`prompt` must be a string, an array of strings or token ids",
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(Value::Array(_)) => Err(ApiError::bad_field("prompt", "`prompt` must not be empty")),
        Some(_) => Err(ApiError::bad_field(
            "prompt",
            "`prompt` must be a string or an array",
        )),
        None => Err(ApiError::bad_field("prompt", "`prompt` is required")),
    }
}

/// The body with only `model` replaced by `model`; every other field is kept.
pub fn rewrite_model(raw: &[u8], model: &str) -> Result<Bytes, ApiError> {
    let mut value: serde_json::Map<String, Value> = serde_json::from_slice(raw)
        .map_err(|e| ApiError::bad_request(format!("The body is not valid JSON: {e}")))?;
    value.insert("model".into(), Value::String(model.to_string()));
    serde_json::to_vec(&value)
        .map(Bytes::from)
        .map_err(|e| ApiError::bad_request(format!("cannot re-encode the body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn chat(body: &str) -> Result<InferenceRequest, ApiError> {
        InferenceRequest::parse(Endpoint::Chat, Bytes::from(body.to_string()))
    }

    #[test]
    fn parses_chat_fields() {
        let r = chat(
            r#"{"model":"glm-5.3","stream":true,"max_tokens":16,"stream_options":{"include_usage":true},
                "messages":[{"role":"system","content":"be brief"},
                            {"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{}}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.model, "glm-5.3");
        assert!(r.stream);
        assert!(r.include_usage);
        assert_eq!(r.max_tokens, Some(16));
        assert_eq!(
            r.prompt,
            PromptText::Chat(vec![
                ChatTurn {
                    role: Role::System,
                    text: "be brief".into()
                },
                ChatTurn {
                    role: Role::User,
                    text: "hi".into()
                },
            ])
        );
        assert_eq!(r.prefix_text(), b"system\nbe brief\nuser\nhi\n".to_vec());
        // (8 + 4 + 2 + 4) bytes / 4, rounded up.
        assert_eq!(r.estimated_prompt_tokens(), 5);
    }

    #[test]
    fn parses_completion_and_max_completion_tokens() {
        let r = InferenceRequest::parse(
            Endpoint::Completion,
            Bytes::from_static(br#"{"model":"m","prompt":["ab","cd"],"max_completion_tokens":3}"#),
        )
        .unwrap();
        assert_eq!(r.prompt, PromptText::Completion("abcd".into()));
        assert_eq!(r.max_tokens, Some(3));
        assert!(!r.stream);
    }

    #[test]
    fn every_malformed_body_is_a_400_naming_its_field() {
        let cases: &[(&str, Option<&str>)] = &[
            ("not json", None),
            ("[1,2]", None),
            (
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                Some("model"),
            ),
            (r#"{"model":7,"messages":[]}"#, Some("model")),
            (r#"{"model":" ","messages":[]}"#, Some("model")),
            (r#"{"model":"m"}"#, Some("messages")),
            (r#"{"model":"m","messages":{}}"#, Some("messages")),
            (r#"{"model":"m","messages":[]}"#, Some("messages")),
            (
                r#"{"model":"m","messages":[{"content":"x"}]}"#,
                Some("messages"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"wizard","content":"x"}]}"#,
                Some("messages"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
                Some("messages"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
                Some("stream"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-1}"#,
                Some("max_tokens"),
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}"#,
                Some("max_tokens"),
            ),
        ];
        for (body, param) in cases {
            let e = chat(body).expect_err(body);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param, *param, "{body}");
        }
        let e = InferenceRequest::parse(
            Endpoint::Completion,
            Bytes::from_static(br#"{"model":"m"}"#),
        )
        .unwrap_err();
        assert_eq!(e.param, Some("prompt"));
        let e = InferenceRequest::parse(
            Endpoint::Completion,
            Bytes::from_static(br#"{"model":"m","prompt":{}}"#),
        )
        .unwrap_err();
        assert_eq!(e.param, Some("prompt"));
    }

    #[test]
    fn rewrite_changes_only_the_model() {
        let raw = br#"{"model":"glm-5.3","messages":[{"role":"user","content":"hi"}],"temperature":0.2,"extra":{"a":[1,2]}}"#;
        let out = rewrite_model(raw, "qwen-3.6-27b").unwrap();
        let before: Value = serde_json::from_slice(raw).unwrap();
        let mut after: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(after["model"], "qwen-3.6-27b");
        after["model"] = before["model"].clone();
        assert_eq!(after, before);
    }

    #[test]
    fn usage_reads_cached_tokens() {
        let v: Value = serde_json::from_str(
            r#"{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8}}"#,
        )
        .unwrap();
        assert_eq!(
            Usage::from_json(&v),
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 4,
                cached_tokens: Some(8)
            })
        );
        assert_eq!(Usage::from_json(&Value::Null), None);
        // vLLM 0.32 without `--enable-prompt-tokens-details`: no figure, which is not zero.
        for details in ["null", "{}", "{\"cached_tokens\":null}"] {
            let v: Value = serde_json::from_str(&format!(
                r#"{{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{details}}}"#
            ))
            .unwrap();
            assert_eq!(
                Usage::from_json(&v).unwrap().cached_tokens,
                None,
                "{details}"
            );
        }
        let v: Value = serde_json::from_str(r#"{"prompt_tokens":10}"#).unwrap();
        assert_eq!(Usage::from_json(&v).unwrap().cached_tokens, None);
    }
}
