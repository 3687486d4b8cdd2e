//! Errors as OpenAI clients expect them: a status and `{"error":{"message","type","param","code"}}`.
//!
//! Every refusal the simulator makes goes through [`ApiError`], so each one carries the right
//! status and the JSON shape current vLLM returns (its `ErrorResponse`), which the OpenAI SDKs
//! parse into their typed exceptions.

use http::StatusCode;

/// An error answer.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    /// vLLM's answer to a model it does not serve.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("The model `{model}` does not exist."),
        )
        .with_param("model")
    }

    /// The `type` vLLM puts in its error JSON for a status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
            StatusCode::TOO_MANY_REQUESTS => "RateLimitError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            s if s.is_server_error() => "InternalServerError",
            _ => "BadRequestError",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape() {
        let e = ApiError::model_not_found("nope");
        assert_eq!(
            e.body(),
            serde_json::json!({"error": {
                "message": "The model `nope` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }})
        );
    }
}
