//! Per-tenant token budgets: how many tokens each calling workload may use per window.
//!
//! A budget counts prompt plus completion tokens. The proxy reserves a request's estimate
//! (its prompt and `max_tokens`) when it admits it, settles the reservation on the usage the
//! response reports, and answers a request that would go over with 429 and `Retry-After` (the
//! window's end). Each proxy counts its own requests: a workload with N replicas behind N
//! sidecars has N times the budget, so divide it by the replica count where that matters.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::{DurationError, GatewayDuration};

pub const DEFAULT_BUDGET_WINDOW: Duration = Duration::from_secs(60);

/// TenantBudget limits one tenant's tokens per window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantBudget {
    /// Tenant is the calling workload as `namespace/name`, or `*` for every tenant without a
    /// budget of its own.
    #[schemars(length(min = 1))]
    pub tenant: String,

    /// Tokens is how many prompt plus completion tokens the tenant may use per window. At
    /// least 1.
    #[schemars(range(min = 1))]
    pub tokens: u64,

    /// Window is the length of the fixed windows the budget is counted over. Defaults to 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<GatewayDuration>,
}

impl TenantBudget {
    pub fn window(&self) -> Result<Duration, DurationError> {
        self.window
            .as_ref()
            .map_or(Ok(DEFAULT_BUDGET_WINDOW), GatewayDuration::parse)
    }
}
