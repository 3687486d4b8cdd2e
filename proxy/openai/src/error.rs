//! OpenAI error objects: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.
//!
//! Every request the proxy cannot serve is answered with one of these, so an OpenAI client raises
//! its usual exception (BadRequestError, NotFoundError, ...) instead of failing to parse.

use bytes::Bytes;
use http::{StatusCode, header};

/// An error answered to the client in OpenAI's format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`, e.g. `invalid_request_error`.
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// 429: admission control held the request as long as its service class allows, and no
    /// endpoint was predicted to meet its TTFT objective (OpenAI's rate-limit type, so clients
    /// back off and retry; the caller adds `Retry-After`).
    pub fn queue_timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            .with_code("queue_timeout")
    }

    /// 429: the tenant's token budget for the window is spent.
    pub fn budget_exhausted(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            .with_code("budget_exhausted")
    }

    /// 429: admission control's queue is full.
    pub fn queue_full(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
            .with_code("queue_full")
    }

    /// 400: the body is not valid JSON or a field is missing or has the wrong type.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 about one field.
    pub fn bad_field(param: &'static str, message: impl Into<String>) -> Self {
        Self::bad_request(message).with_param(param)
    }

    /// 400: the prompt is longer than every candidate endpoint's context window, as vLLM and
    /// OpenAI answer it (`context_length_exceeded`). `at_least` is the proxy's lower bound on the
    /// prompt's tokens (it has no tokenizer).
    pub fn context_length_exceeded(window: u32, at_least: u64, max_tokens: Option<u32>) -> Self {
        let asked = match max_tokens {
            Some(n) => {
                format!("at least {at_least} tokens in the messages and {n} in the completion")
            }
            None => format!("at least {at_least} tokens in the messages"),
        };
        Self::bad_request(format!(
            "This model's maximum context length is {window} tokens. However, you requested \
             {asked}. Please reduce the length of the messages or completion."
        ))
        .with_param("messages")
        .with_code("context_length_exceeded")
    }

    /// 404: the model is neither a policy model nor an alias.
    pub fn unknown_model(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{model}` does not exist or you do not have access to it."),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 404: no such route.
    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("Unknown path {path:?}"),
        )
        .with_code("not_found")
    }

    /// 404: an admin request named a target (`?target=`) the sidecar holds no stack for.
    pub fn unknown_target(target: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "No inference target {target:?} in this proxy: GET /debug/targets lists the default \
                 target and the redirected ones it holds"
            ),
        )
        .with_param("target")
        .with_code("target_not_found")
    }

    /// 405: the route exists with another method.
    pub fn method_not_allowed(method: &http::Method, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("Method {method} is not allowed on {path}"),
        )
        .with_code("method_not_allowed")
    }

    /// 413: the body is over the configured limit.
    pub fn too_large(limit_bytes: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The request body is larger than the limit of {limit_bytes} bytes"),
        )
        .with_code("request_too_large")
    }

    /// 415: the body is not `application/json`.
    pub fn unsupported_media_type(got: Option<&str>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            format!(
                "Content-Type must be application/json, got {}",
                got.unwrap_or("none")
            ),
        )
        .with_code("unsupported_media_type")
    }

    /// 503: no endpoint can serve the request (none ready, policy refuses to guess, or all failed).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        )
        .with_code("no_endpoint")
    }

    /// 502: every attempt failed.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "upstream_error", message).with_code("upstream_error")
    }

    /// The JSON object, as OpenAI writes it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// The full HTTP response.
    pub fn to_response<B: From<Bytes>>(&self) -> http::Response<B> {
        let body = Bytes::from(self.to_json().to_string());
        let mut rsp = http::Response::new(B::from(body));
        *rsp.status_mut() = self.status;
        rsp.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        rsp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_object_has_openai_shape() {
        let e = ApiError::unknown_model("gpt-9");
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        let v = e.to_json();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert!(v["error"]["message"].as_str().unwrap().contains("gpt-9"));
        let rsp: http::Response<Bytes> = ApiError::too_large(10).to_response();
        assert_eq!(rsp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(rsp.headers()[header::CONTENT_TYPE], "application/json");
        let v: serde_json::Value = serde_json::from_slice(rsp.body()).unwrap();
        assert_eq!(v["error"]["code"], "request_too_large");
    }
}
