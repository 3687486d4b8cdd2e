//! What a service class is promised.
//!
//! Rules put requests in a service class (Critical, Standard, Sheddable). A class's objective is
//! the time to first token its requests should see: the `CheapestWithinSLO` objective sends a
//! request to the cheapest candidate predicted to meet it, and the benchmarks count goodput
//! against it.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ServiceClass;
use crate::duration::{DurationError, GatewayDuration};

/// ServiceClassPolicy is one service class's objectives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceClassPolicy {
    /// Name is the service class: Critical, Standard or Sheddable.
    pub name: ServiceClass,

    /// TTFTSLO is the time to first token this class's requests should see, as a duration such
    /// as "2s". Must be greater than 0s.
    #[serde(rename = "ttftSLO", default, skip_serializing_if = "Option::is_none")]
    pub ttft_slo: Option<GatewayDuration>,

    /// MaxQueueTime: a request of this class whose every candidate is predicted to miss ttftSLO
    /// is held by the proxy, up to this long, until one is predicted to meet it (higher classes
    /// first: Critical, then Standard, then Sheddable); past it, it is answered 429 with
    /// Retry-After. Unset: requests are never held (sent to the fastest candidate, as without
    /// admission control). Needs ttftSLO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue_time: Option<GatewayDuration>,

    /// ReservedShare is the share of held requests' releases this class is guaranteed while it
    /// has requests held, so that a higher class's backlog never starves it. In [0, 1).
    /// Defaults to 0 (strict priority).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_share: Option<f64>,
}

impl ServiceClassPolicy {
    /// The TTFT objective, parsed.
    pub fn ttft_slo(&self) -> Option<Result<Duration, DurationError>> {
        self.ttft_slo.as_ref().map(GatewayDuration::parse)
    }

    /// The longest hold, parsed.
    pub fn max_queue_time(&self) -> Option<Result<Duration, DurationError>> {
        self.max_queue_time.as_ref().map(GatewayDuration::parse)
    }
}
