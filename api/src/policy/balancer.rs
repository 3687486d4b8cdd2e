//! The balancer settings of a policy, with their defaults.
//!
//! The proxy's prediction is only as good as its signals; these settings say how old a signal
//! may be before the proxy stops trusting it, what it does then, how close two predictions must
//! be to count as a tie, and whether the decision is enforced or only recorded.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::{DurationError, GatewayDuration};

/// The default freshness budget: 500ms.
pub const DEFAULT_FRESHNESS_BUDGET: Duration = Duration::from_millis(500);

/// The default tie window: 20ms.
pub const DEFAULT_TIE_WINDOW: Duration = Duration::from_millis(20);

/// Balancer configures how the proxy chooses among the endpoints of the candidate models.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Balancer {
    /// FreshnessBudget is the oldest an endpoint's signals (queue, cache usage, prefix cache)
    /// may be for the proxy to predict with them, as a duration such as "500ms". Beyond it,
    /// failureMode applies. Must be greater than 0s. Defaults to 500ms.
    #[serde(default = "default_freshness_budget")]
    pub freshness_budget: GatewayDuration,

    /// FailureMode is what the proxy does when signals are older than freshnessBudget:
    /// FailOpen (the default) balances over the requested model's pool by peak-EWMA latency;
    /// FailClose answers the request with an OpenAI-format 503 error.
    #[serde(default)]
    pub failure_mode: FailureMode,

    /// TieWindow is how close two predicted times to first token must be for the proxy to treat
    /// them as equal, as a duration such as "20ms": among equals it draws two at random and takes
    /// the one using less of its KV cache, so that many proxies do not herd onto one endpoint and
    /// new work goes where prefixes stay cached. "0s" disables it. Defaults to 20ms.
    #[serde(default = "default_tie_window")]
    pub tie_window: GatewayDuration,

    /// Mode is Enforce (the default: send each request where the policy decides) or Shadow
    /// (decide and record the decision, but send the request where it would go without
    /// Kinference).
    #[serde(default)]
    pub mode: BalancerMode,
}

impl Balancer {
    /// The freshness budget, parsed.
    pub fn freshness_budget(&self) -> Result<Duration, DurationError> {
        self.freshness_budget.parse()
    }

    /// The tie window, parsed.
    pub fn tie_window(&self) -> Result<Duration, DurationError> {
        self.tie_window.parse()
    }
}

impl Default for Balancer {
    fn default() -> Self {
        Self {
            freshness_budget: default_freshness_budget(),
            failure_mode: FailureMode::default(),
            tie_window: default_tie_window(),
            mode: BalancerMode::default(),
        }
    }
}

fn default_freshness_budget() -> GatewayDuration {
    GatewayDuration::from_duration(DEFAULT_FRESHNESS_BUDGET)
}

fn default_tie_window() -> GatewayDuration {
    GatewayDuration::from_duration(DEFAULT_TIE_WINDOW)
}

/// What the proxy does when an endpoint's signals are older than the freshness budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FailureMode {
    /// Fall back to peak-EWMA balancing over the requested model's pool. The default.
    #[default]
    FailOpen,
    /// Answer with an OpenAI-format 503 error.
    FailClose,
}

/// Whether the proxy acts on its decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum BalancerMode {
    /// Send each request where the policy decides. The default.
    #[default]
    Enforce,
    /// Record the decision, but send the request where it would go without Kinference.
    Shadow,
}
