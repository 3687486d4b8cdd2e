//! The HTTP external classifier: POSTs `{"tag": ..., "prompt": ...}` as JSON to a URL and reads
//! `{"value": "...", "confidence": x}`. Plain HTTP/1.1 over hyper 1, one pooled client per tag.

use super::{BoxFuture, ExternalAnswer, ExternalClassifier, ExternalError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

/// Answers larger than this are refused.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UrlError {
    #[error("invalid URL {url:?}: {error}")]
    Invalid { url: String, error: String },
    #[error("URL {0:?} must be http:// with a host")]
    Scheme(String),
}

#[derive(Debug)]
pub struct HttpClassifier {
    uri: hyper::Uri,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl HttpClassifier {
    pub fn new(url: &str) -> Result<Self, UrlError> {
        let uri: hyper::Uri =
            url.parse()
                .map_err(|e: hyper::http::uri::InvalidUri| UrlError::Invalid {
                    url: url.to_string(),
                    error: e.to_string(),
                })?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(UrlError::Scheme(url.to_string()));
        }
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(Self { uri, client })
    }
}

#[derive(serde::Serialize)]
struct Request<'a> {
    tag: &'a str,
    prompt: &'a str,
}

impl ExternalClassifier for HttpClassifier {
    fn classify<'a>(
        &'a self,
        tag: &'a str,
        text: &'a str,
    ) -> BoxFuture<'a, Result<ExternalAnswer, ExternalError>> {
        Box::pin(async move {
            let body = serde_json::to_vec(&Request { tag, prompt: text })
                .map_err(|e| ExternalError::Unavailable(e.to_string()))?;
            let req = hyper::Request::post(self.uri.clone())
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| ExternalError::Unavailable(e.to_string()))?;
            let rsp = self
                .client
                .request(req)
                .await
                .map_err(|e| ExternalError::Unavailable(e.to_string()))?;
            if !rsp.status().is_success() {
                return Err(ExternalError::Unavailable(format!(
                    "status {}",
                    rsp.status()
                )));
            }
            let body = Limited::new(rsp.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| ExternalError::InvalidResponse(e.to_string()))?
                .to_bytes();
            serde_json::from_slice::<ExternalAnswer>(&body)
                .map_err(|e| ExternalError::InvalidResponse(e.to_string()))
        })
    }
}
