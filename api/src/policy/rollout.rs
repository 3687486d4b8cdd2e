//! A policy's rollout: a candidate routing tried on a cohort beside a control group, with the
//! thresholds that roll it back declared before it starts.
//!
//! A routing change is risky in the way any production change is: it is tried on a small,
//! sticky cohort while a control group of the same size keeps the current policy, and the
//! controller compares the two over a window against limits the team wrote down in advance. The
//! candidate may change only where a request goes (the rules and the balancer), never the models
//! the policy declares or what a request asks for, so that the arms differ in routing alone.
//! Promotion is an explicit step (`kinfctl rollout promote` sets `state: Promoted`); a crossed
//! threshold moves the cohort back to the control policy by itself. See `docs/rollout.md`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::{Balancer, PolicyRule};
use crate::duration::{DurationError, GatewayDuration};

/// The default window the arms are compared over: 10 minutes.
pub const DEFAULT_ROLLOUT_WINDOW: Duration = Duration::from_secs(600);

/// The default of how often each proxy reports its arms to the controller.
pub const DEFAULT_ROLLOUT_REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// The shortest report interval: each report is one RPC per proxy, and a thousand proxies
/// reporting every second is already a thousand RPCs a second at the controller.
pub const MIN_ROLLOUT_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// The default minimum of requests in each arm before any threshold is judged.
pub const DEFAULT_ROLLOUT_MIN_SAMPLES: u64 = 400;

/// Rollout tries a candidate routing on a cohort of the traffic beside a control group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Name identifies the rollout in status, metrics, decision records and traces, and salts
    /// the assignment: a new name draws a new cohort.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,

    /// Candidate is the routing the cohort gets: rules and balancer, with the same schema as the
    /// policy's own. A part left unset is the policy's own. It cannot declare models, aliases or
    /// anything a request asks for: both arms are served by the same models.
    pub candidate: RolloutCandidate,

    /// CohortPercent of the keys get the candidate. In (0, 100].
    pub cohort_percent: f64,

    /// ControlPercent of the keys keep the current policy and are measured against the cohort.
    /// In (0, 100]; cohortPercent + controlPercent at most 100. The rest keep the current policy
    /// and are not compared.
    pub control_percent: f64,

    /// AssignBy is what a request's arm is keyed by, so that it keeps its arm: Tenant (the
    /// default; the calling workload's namespace/name), Workload, Header (the value of the
    /// request header named by `header`; a request without it is in neither arm) or Request (a
    /// fresh draw per request: declared explicitly, since the arms then share users).
    #[serde(default = "default_assign_by")]
    pub assign_by: String,

    /// Header names the request header the arm is keyed by, with assignBy Header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,

    /// Window is how far back the arms are compared, as a duration such as "10m". Defaults to
    /// 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<GatewayDuration>,

    /// MinSamples is how many requests each arm needs in the window before any threshold is
    /// judged. At least 1. Defaults to 400 (see docs/rollout.md for how many a regression needs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_samples: Option<u64>,

    /// ReportInterval is how often each proxy sends its arms' measurements to the controller, as
    /// a duration such as "5s", and so how finely the window slides (one bucket per interval).
    /// At least 1s and at most half the window. A shorter interval judges sooner after a
    /// regression starts; a longer one costs fewer RPCs. Defaults to 5s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_interval: Option<GatewayDuration>,

    /// Thresholds roll the cohort back when crossed. At least one is required.
    pub thresholds: RolloutThresholds,

    /// State is Running (the default: the cohort gets the candidate until a threshold is
    /// crossed), Promoted (every request gets the candidate) or Aborted (every request gets the
    /// current policy). Set by `kinfctl rollout promote|abort`.
    #[serde(default)]
    pub state: RolloutState,
}

/// The routing part of a policy that a rollout's candidate may replace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutCandidate {
    /// Rules replace the policy's rules for the cohort (an empty list: no rules). Unset: the
    /// policy's own. They may name only the models and aliases the policy declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<PolicyRule>>,

    /// Balancer replaces the policy's balancer for the cohort. Unset: the policy's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balancer: Option<Balancer>,
}

/// RolloutThresholds are how much worse than control the cohort may be. Rates are absolute
/// increases over control's (0.02 = two points), in [0, 1]; TTFT limits are ratios cohort /
/// control, at least 1 (1.2 = 20% slower); saturation is a ceiling on the cohort's endpoints, in
/// (0, 1]. A threshold is crossed only when the whole confidence interval is past it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutThresholds {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_rate: Option<f64>,
    #[serde(
        default,
        rename = "ttftP90Ratio",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttft_p90_ratio: Option<f64>,
    #[serde(
        default,
        rename = "ttftP99Ratio",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttft_p99_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturation: Option<f64>,
}

impl RolloutThresholds {
    /// Whether no threshold is declared.
    pub fn is_empty(&self) -> bool {
        self.error_rate.is_none()
            && self.fallback_rate.is_none()
            && self.timeout_rate.is_none()
            && self.ttft_p90_ratio.is_none()
            && self.ttft_p99_ratio.is_none()
            && self.saturation.is_none()
    }
}

/// Where a rollout stands, as the user declared it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RolloutState {
    /// The cohort gets the candidate (until the controller rolls it back).
    #[default]
    Running,
    /// Every request gets the candidate.
    Promoted,
    /// Every request gets the current policy.
    Aborted,
}

/// The keys a rollout's arm may be assigned by.
pub const ASSIGN_BY: [&str; 4] = ["Tenant", "Workload", "Header", "Request"];

fn default_assign_by() -> String {
    "Tenant".to_string()
}

impl Rollout {
    /// The window, parsed, with its default.
    pub fn window(&self) -> Result<Duration, DurationError> {
        self.window
            .as_ref()
            .map_or(Ok(DEFAULT_ROLLOUT_WINDOW), GatewayDuration::parse)
    }

    /// The report interval, with its default.
    pub fn report_interval(&self) -> Result<Duration, DurationError> {
        self.report_interval
            .as_ref()
            .map_or(Ok(DEFAULT_ROLLOUT_REPORT_INTERVAL), GatewayDuration::parse)
    }

    /// The minimum sample, with its default.
    pub fn min_samples(&self) -> u64 {
        self.min_samples.unwrap_or(DEFAULT_ROLLOUT_MIN_SAMPLES)
    }

    /// A percentage in basis points of the whole (10,000).
    pub fn basis_points(percent: f64) -> u32 {
        (percent.clamp(0.0, 100.0) * 100.0).round() as u32
    }
}

/// Where a rollout stands, as the controller observed it (`status.rollout.phase`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RolloutPhase {
    /// The cohort gets the candidate; the arms are being compared.
    #[default]
    Running,
    /// A threshold was crossed: the controller moved the cohort back to the control policy, and
    /// the rollout is not served again under this name.
    RolledBack,
    /// Promoted on request: every request gets the candidate.
    Promoted,
    /// Aborted on request: every request gets the current policy.
    Aborted,
}

impl RolloutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "Running",
            Self::RolledBack => "RolledBack",
            Self::Promoted => "Promoted",
            Self::Aborted => "Aborted",
        }
    }
}

/// RolloutStatus is what the controller made of the rollout: its phase, the last verdict, each
/// arm's counts over the window and every declared threshold with how close the cohort is to it.
/// A rolled-back rollout keeps the comparisons that rolled it back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// Name of the rollout this status is about (`spec.rollout.name`): a status naming another
    /// rollout is stale, and a new name starts fresh.
    pub name: String,

    /// Phase: Running, RolledBack, Promoted or Aborted.
    pub phase: RolloutPhase,

    /// Verdict of the last judgement: Insufficient (too few requests in an arm), Hold (no
    /// threshold crossed) or Rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,

    /// Crossed names the threshold that rolled the cohort back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crossed: Option<String>,

    /// Message says what was decided and why, for a person to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// MinSamples each arm needed before a threshold was judged.
    #[serde(default)]
    pub min_samples: u64,

    /// Cohort is what the cohort did over the window.
    #[serde(default)]
    pub cohort: RolloutArmStatus,

    /// Control is what the control group did over the window.
    #[serde(default)]
    pub control: RolloutArmStatus,

    /// Proxies that reported in the window.
    #[serde(default)]
    pub proxies: u64,

    /// Thresholds: each declared threshold's comparison (the cohort against control), once both
    /// arms have the minimum sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thresholds: Vec<RolloutThresholdStatus>,
}

/// One arm's counts over the window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutArmStatus {
    pub requests: u64,
    pub errors: u64,
    pub fallbacks: u64,
    pub timeouts: u64,
    /// Requests with a first token, in the TTFT histogram.
    pub ttft_samples: u64,
    /// What the arm's answered tokens cost, in USD at the declared prices.
    pub cost_usd: f64,
    pub tokens: u64,
}

/// One threshold's comparison: a difference of rates, a ratio of TTFT quantiles, or the
/// cohort's saturation, with its confidence interval and the declared limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutThresholdStatus {
    /// Threshold: errorRate, fallbackRate, timeoutRate, ttftP90, ttftP99 or saturation.
    pub threshold: String,
    pub estimate: f64,
    /// Low and High bound the confidence interval of the estimate.
    pub low: f64,
    pub high: f64,
    pub limit: f64,
    /// Closeness of the interval's favourable end to the limit: 0 where the cohort is no worse
    /// than control, 1 at the limit, above 1 crossed.
    pub closeness: f64,
    /// Crossed when the whole interval is past the limit.
    pub crossed: bool,
}
