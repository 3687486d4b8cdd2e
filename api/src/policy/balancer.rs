//! The balancer settings of a policy, with their defaults.
//!
//! The proxy's prediction is only as good as its signals; these settings say how old a signal
//! may be before the proxy stops trusting it, what it does then, how close two predictions must
//! be to count as a tie, whether the decision is enforced or only recorded, and what the choice
//! among candidate models optimizes: the first token soonest, or the lowest cost that still meets
//! the service class's TTFT objective.

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

    /// Objective is what the choice among candidates optimizes. LowestTTFT (the default): the
    /// candidate predicted to return its first token soonest. CheapestWithinSLO: the cheapest
    /// candidate (by its model's prices and the prompt's uncached and cached tokens) whose
    /// predicted TTFT meets the request's service class ttftSLO (see spec.serviceClasses); when
    /// none does, the fastest.
    #[serde(default)]
    pub objective: Objective,

    /// PreferCheaperWithin is, with objective LowestTTFT, how much later than the fastest a
    /// cheaper candidate may be predicted to answer and still win, as a duration such as "50ms".
    /// Unset or "0s": the fastest always wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_cheaper_within: Option<GatewayDuration>,
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

    /// The tolerance of LowestTTFT for a cheaper candidate, parsed (zero when unset).
    pub fn prefer_cheaper_within(&self) -> Result<Duration, DurationError> {
        self.prefer_cheaper_within
            .as_ref()
            .map_or(Ok(Duration::ZERO), GatewayDuration::parse)
    }
}

impl Default for Balancer {
    fn default() -> Self {
        Self {
            freshness_budget: default_freshness_budget(),
            failure_mode: FailureMode::default(),
            tie_window: default_tie_window(),
            mode: BalancerMode::default(),
            objective: Objective::default(),
            prefer_cheaper_within: None,
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

/// What the choice among candidate endpoints optimizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Objective {
    /// The candidate predicted to return its first token soonest. The default.
    #[default]
    #[serde(rename = "LowestTTFT")]
    LowestTtft,
    /// The cheapest candidate predicted to meet the service class's TTFT objective; the fastest
    /// when none is.
    #[serde(rename = "CheapestWithinSLO")]
    CheapestWithinSlo,
}
