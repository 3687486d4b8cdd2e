//! The OpenAI-compatible wire format: request bodies in, response JSON and SSE chunks out.
//!
//! Shapes follow vLLM's `entrypoints/openai/protocol.py`, so the OpenAI SDKs and the Kinference
//! proxy read the simulator exactly as they read vLLM. Parsing reduces both endpoints' requests to
//! one [`Job`] (prompt tokens, output length, adapter, streaming options); the engine never sees
//! JSON.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::{
    config::ReplicaConfig,
    error::ApiError,
    text::{self, ChatTurn},
};

/// Which endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// A validated completion request, ready for the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub endpoint: Endpoint,
    /// The model name the client asked for (echoed back in responses).
    pub model: String,
    pub lora: Option<String>,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub stream: bool,
    pub include_usage: bool,
    /// What the answer's first token is preceded by (see `ReplicaConfig::answer_prefix`).
    pub answer_prefix: String,
    /// Usage reports `prompt_tokens_details` (see `ReplicaConfig::prompt_tokens_details`).
    pub prompt_tokens_details: bool,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    n: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<MessageContent>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    model: String,
    prompt: Prompt,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    n: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

/// The body of `POST /tokenize`: a `prompt` or chat `messages`.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request"
        };
        ApiError::bad_request(format!("{what}: {e}"))
    })
}

fn turns(messages: &[ChatMessage]) -> Result<Vec<ChatTurn>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("`messages` must not be empty").with_param("messages"));
    }
    messages
        .iter()
        .map(|m| {
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.kind.as_str(), &part.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad_request(format!(
                                    "content part of type {kind:?} is not supported (text only)"
                                ))
                                .with_param("messages"));
                            }
                        }
                    }
                    text
                }
            };
            Ok(ChatTurn {
                role: m.role.clone(),
                content,
            })
        })
        .collect()
}

fn resolve_model(config: &ReplicaConfig, model: &str) -> Result<Option<String>, ApiError> {
    if model == config.model {
        Ok(None)
    } else if let Some(lora) = config.lora(model) {
        Ok(Some(lora.to_string()))
    } else {
        Err(ApiError::model_not_found(model))
    }
}

fn max_tokens(config: &ReplicaConfig, requested: Option<u32>) -> Result<u32, ApiError> {
    match requested {
        Some(0) => Err(
            ApiError::bad_request("max_tokens must be at least 1, got 0").with_param("max_tokens"),
        ),
        Some(n) => Ok(n),
        None => Ok(config.default_max_tokens),
    }
}

fn single_choice(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::bad_request(format!(
            "n={n} is not supported by the simulator (only n=1)"
        ))
        .with_param("n")),
    }
}

fn answer_prefix(config: &ReplicaConfig) -> String {
    config.answer_prefix.replace("{model}", &config.model)
}

/// Parses and validates `POST /v1/chat/completions`.
pub fn parse_chat(config: &ReplicaConfig, body: &[u8]) -> Result<Job, ApiError> {
    let req: ChatRequest = parse_json(body)?;
    single_choice(req.n)?;
    let lora = resolve_model(config, &req.model)?;
    let prompt = text::encode(&text::chat_prompt(&turns(&req.messages)?, true));
    let max_tokens = max_tokens(config, req.max_completion_tokens.or(req.max_tokens))?;
    let stream = req.stream.unwrap_or(false);
    Ok(Job {
        endpoint: Endpoint::Chat,
        model: req.model,
        lora,
        prompt,
        max_tokens,
        stream,
        include_usage: stream
            && req
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        answer_prefix: answer_prefix(config),
        prompt_tokens_details: config.prompt_tokens_details,
    })
}

/// Parses and validates `POST /v1/completions`.
pub fn parse_completion(config: &ReplicaConfig, body: &[u8]) -> Result<Job, ApiError> {
    let req: CompletionRequest = parse_json(body)?;
    single_choice(req.n)?;
    let lora = resolve_model(config, &req.model)?;
    let batched = || {
        ApiError::bad_request("batched prompts are not supported by the simulator (one prompt)")
            .with_param("prompt")
    };
    let prompt = match req.prompt {
        Prompt::Text(t) => text::encode(&t),
        Prompt::Tokens(t) => t,
        Prompt::Texts(mut ts) if ts.len() == 1 => text::encode(&ts.remove(0)),
        Prompt::TokenLists(mut ts) if ts.len() == 1 => ts.remove(0),
        Prompt::Texts(_) | Prompt::TokenLists(_) => return Err(batched()),
    };
    let max_tokens = max_tokens(config, req.max_tokens)?;
    let stream = req.stream.unwrap_or(false);
    Ok(Job {
        endpoint: Endpoint::Completions,
        model: req.model,
        lora,
        prompt,
        max_tokens,
        stream,
        include_usage: stream
            && req
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        answer_prefix: answer_prefix(config),
        prompt_tokens_details: config.prompt_tokens_details,
    })
}

/// Parses `POST /tokenize` into prompt tokens.
pub fn parse_tokenize(config: &ReplicaConfig, body: &[u8]) -> Result<Vec<u32>, ApiError> {
    let req: TokenizeRequest = parse_json(body)?;
    if let Some(model) = &req.model {
        resolve_model(config, model)?;
    }
    match (&req.prompt, &req.messages) {
        (Some(p), None) => Ok(text::encode(p)),
        (None, Some(m)) => Ok(text::encode(&text::chat_prompt(
            &turns(m)?,
            req.add_generation_prompt.unwrap_or(true),
        ))),
        _ => Err(ApiError::bad_request(
            "exactly one of `prompt` or `messages` must be given",
        )),
    }
}

/// Usage, as vLLM reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    /// `prompt_tokens_details.cached_tokens` is reported (vLLM's
    /// `--enable-prompt-tokens-details`). Without it vLLM 0.32 writes `"prompt_tokens_details":
    /// null` in a response and leaves the key out of a stream's usage chunk (recorded in
    /// `proxy/signals/tests/fixtures/vllm-0.32.0`).
    pub prompt_tokens_details: bool,
}

impl Usage {
    /// The `usage` of a response (`stream: false`) or of a stream's usage chunk.
    pub fn json(&self, stream: bool) -> Value {
        let mut usage = json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
        });
        if self.prompt_tokens_details {
            usage["prompt_tokens_details"] = json!({ "cached_tokens": self.cached_tokens });
        } else if !stream {
            usage["prompt_tokens_details"] = Value::Null;
        }
        if !stream {
            usage["completion_tokens_details"] = Value::Null;
        }
        usage
    }
}

/// The identity shared by a response and all its chunks.
#[derive(Clone, Debug)]
pub struct ResponseId {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseId {
    pub fn new(endpoint: Endpoint, request: u64, model: &str) -> Self {
        let created = crate::driver::unix_now_s() as u64;
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        Self {
            id: format!("{prefix}-{created:x}{request:016x}"),
            created,
            model: model.to_string(),
        }
    }
}

/// The non-streaming response.
pub fn full_response(endpoint: Endpoint, rid: &ResponseId, text: &str, usage: Usage) -> Value {
    let choice = match endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": { "role": "assistant", "content": text, "tool_calls": [] },
            "logprobs": null,
            "finish_reason": "length",
            "stop_reason": null,
        }),
        Endpoint::Completions => json!({
            "index": 0,
            "text": text,
            "logprobs": null,
            "finish_reason": "length",
            "stop_reason": null,
        }),
    };
    json!({
        "id": rid.id,
        "object": match endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completions => "text_completion",
        },
        "created": rid.created,
        "model": rid.model,
        "choices": [choice],
        "usage": usage.json(false),
    })
}

fn chunk_object(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "chat.completion.chunk",
        Endpoint::Completions => "text_completion",
    }
}

/// A streaming chunk carrying `piece` (the role-only first chunk of a chat when `role` is set),
/// with `finish_reason` on the last token's chunk, as vLLM sends them.
pub fn chunk(endpoint: Endpoint, rid: &ResponseId, piece: Piece<'_>) -> Value {
    let finish = if piece.last {
        json!("length")
    } else {
        Value::Null
    };
    let choice = match endpoint {
        Endpoint::Chat => {
            let delta = if piece.role {
                json!({ "role": "assistant", "content": "" })
            } else {
                json!({ "content": piece.text })
            };
            json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish })
        }
        Endpoint::Completions => {
            json!({ "index": 0, "text": piece.text, "logprobs": null, "finish_reason": finish })
        }
    };
    let mut choice = choice;
    if piece.last {
        choice["stop_reason"] = Value::Null;
    }
    json!({
        "id": rid.id,
        "object": chunk_object(endpoint),
        "created": rid.created,
        "model": rid.model,
        "choices": [choice],
    })
}

/// What one streaming chunk carries.
#[derive(Clone, Copy, Debug)]
pub struct Piece<'a> {
    pub text: &'a str,
    pub role: bool,
    pub last: bool,
}

/// The usage chunk sent after the last token when `stream_options.include_usage` is set.
pub fn usage_chunk(endpoint: Endpoint, rid: &ResponseId, usage: Usage) -> Value {
    json!({
        "id": rid.id,
        "object": chunk_object(endpoint),
        "created": rid.created,
        "model": rid.model,
        "choices": [],
        "usage": usage.json(true),
    })
}

/// One SSE event: `data: {json}\n\n`.
pub fn sse(value: &Value) -> bytes::Bytes {
    bytes::Bytes::from(format!("data: {value}\n\n"))
}

/// The end of an SSE stream.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

/// `GET /v1/models`, in vLLM's shape.
pub fn models(config: &ReplicaConfig, created: u64) -> Value {
    let permission = |n: usize| {
        json!([{
            "id": format!("modelperm-{created:x}{n:04x}"),
            "object": "model_permission",
            "created": created,
            "allow_create_engine": false,
            "allow_sampling": true,
            "allow_logprobs": true,
            "allow_search_indices": false,
            "allow_view": true,
            "allow_fine_tuning": false,
            "organization": "*",
            "group": null,
            "is_blocking": false,
        }])
    };
    let mut data = vec![json!({
        "id": config.model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": config.model,
        "parent": null,
        "max_model_len": config.engine.max_model_len,
        "permission": permission(0),
    })];
    for (i, lora) in config.lora_modules.iter().enumerate() {
        data.push(json!({
            "id": lora,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": format!("/adapters/{lora}"),
            "parent": config.model,
            "max_model_len": null,
            "permission": permission(i + 1),
        }));
    }
    json!({ "object": "list", "data": data })
}

/// vLLM's message for a request longer than the context window.
pub fn too_long_message(max_model_len: u32, prompt: u32, max_tokens: u32) -> String {
    format!(
        "This model's maximum context length is {max_model_len} tokens. However, you requested \
         {} tokens ({prompt} in the messages, {max_tokens} in the completion). Please reduce the \
         length of the messages or completion.",
        u64::from(prompt) + u64::from(max_tokens)
    )
}
