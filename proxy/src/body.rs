//! The bodies and headers of every response the proxy answers.
//!
//! Upstream bodies stream through boxed (`ProxyBody`), so each layer answers one type whether the
//! answer came from an endpoint or from the proxy itself; the proxy's own answers are whole
//! bodies, and its refusals are OpenAI error objects carrying the request id.

use crate::{
    metrics::{RequestLabels, RequestMetrics},
    stream::BoxError,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use kinference_openai::ApiError;

/// The body of every response the proxy answers.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// The request id header, kept from the client when it is sane, else made, and returned.
pub const REQUEST_ID: &str = "x-request-id";
/// The endpoint that served a response (for operators and tests; never request content).
pub const ENDPOINT_HEADER: &str = "x-kinference-endpoint";

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

/// An error response with the request id.
pub fn error_response(e: &ApiError, request_id: &str) -> http::Response<ProxyBody> {
    let mut rsp: http::Response<Bytes> = e.to_response();
    if let Ok(v) = http::HeaderValue::from_str(request_id) {
        rsp.headers_mut().insert(REQUEST_ID, v);
    }
    rsp.map(full)
}

/// Answers a refusal (or a request no endpoint could answer), counted under the request's labels.
pub fn refuse(
    metrics: &RequestMetrics,
    labels: &RequestLabels,
    e: &ApiError,
    request_id: &str,
) -> http::Response<ProxyBody> {
    metrics.requests.get_or_create(labels).inc();
    metrics.error(labels, e.status.as_str());
    tracing::debug!(request_id, tenant = %labels.tenant, requested_model = %labels.requested_model, status = e.status.as_u16(), error = %e.message, "request refused");
    error_response(e, request_id)
}
