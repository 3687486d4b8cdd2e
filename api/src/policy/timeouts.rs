//! How long the proxy waits for an endpoint, and when it gives up.
//!
//! An inference request's time to first token ranges from milliseconds to minutes with its
//! prompt, so one fixed timeout is either too short for long prompts or too long to notice a
//! wedged replica. The proxy derives the wait for a first byte (response headers for a stream,
//! the whole answer otherwise) from its own prediction: a multiple of the predicted time, within
//! a floor and a cap. Before the first byte an expired attempt is retried elsewhere; after it, a
//! stream that stops sending for `streamIdle`, or outlives `request`, ends with an SSE error
//! event.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::{DurationError, GatewayDuration};

/// The defaults: a first byte within 4× its prediction, at least 10s and at most 2m; a stream
/// idle for 30s or open for 10m is ended.
pub const DEFAULT_FIRST_BYTE_FLOOR: Duration = Duration::from_secs(10);
pub const DEFAULT_FIRST_BYTE_CAP: Duration = Duration::from_secs(120);
pub const DEFAULT_FIRST_BYTE_MULTIPLE: u32 = 4;
pub const DEFAULT_STREAM_IDLE: Duration = Duration::from_secs(30);
pub const DEFAULT_REQUEST: Duration = Duration::from_secs(600);

/// Timeouts configures how long the proxy waits for each attempt and each stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// FirstByteMultiple: an attempt's first byte (a stream's response headers, a non-stream
    /// answer) is waited for this many times its predicted time (TTFT, plus the decode of
    /// max_tokens for a non-stream answer), within firstByteFloor and firstByteCap. Defaults to 4.
    #[serde(default = "default_multiple")]
    #[schemars(range(min = 1, max = 100))]
    pub first_byte_multiple: u32,

    /// FirstByteFloor is the shortest wait for a first byte. Defaults to 10s.
    #[serde(default = "default_floor")]
    pub first_byte_floor: GatewayDuration,

    /// FirstByteCap is the longest wait for a first byte (never longer than request). Defaults
    /// to 2m.
    #[serde(default = "default_cap")]
    pub first_byte_cap: GatewayDuration,

    /// StreamIdle ends a stream (with an SSE error event) when nothing arrives from the endpoint
    /// for this long, its first token included. Defaults to 30s.
    #[serde(default = "default_idle")]
    pub stream_idle: GatewayDuration,

    /// Request bounds a whole request, from arrival to its last byte. Defaults to 10m.
    #[serde(default = "default_request")]
    pub request: GatewayDuration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            first_byte_multiple: DEFAULT_FIRST_BYTE_MULTIPLE,
            first_byte_floor: default_floor(),
            first_byte_cap: default_cap(),
            stream_idle: default_idle(),
            request: default_request(),
        }
    }
}

impl Timeouts {
    pub fn first_byte_floor(&self) -> Result<Duration, DurationError> {
        self.first_byte_floor.parse()
    }
    pub fn first_byte_cap(&self) -> Result<Duration, DurationError> {
        self.first_byte_cap.parse()
    }
    pub fn stream_idle(&self) -> Result<Duration, DurationError> {
        self.stream_idle.parse()
    }
    pub fn request(&self) -> Result<Duration, DurationError> {
        self.request.parse()
    }
}

fn default_multiple() -> u32 {
    DEFAULT_FIRST_BYTE_MULTIPLE
}
fn default_floor() -> GatewayDuration {
    GatewayDuration::from_duration(DEFAULT_FIRST_BYTE_FLOOR)
}
fn default_cap() -> GatewayDuration {
    GatewayDuration::from_duration(DEFAULT_FIRST_BYTE_CAP)
}
fn default_idle() -> GatewayDuration {
    GatewayDuration::from_duration(DEFAULT_STREAM_IDLE)
}
fn default_request() -> GatewayDuration {
    GatewayDuration::from_duration(DEFAULT_REQUEST)
}
