//! Every PromQL query viz runs, in one place, so that a test can check each metric and label it
//! names against the proxy's real exposition (and the Grafana dashboards use the same shapes).
//!
//! Metric names are the proxy's (`kinference_proxy_*`, see `proxy/src/metrics.rs`) and vLLM's
//! (`vllm:*`, scraped from each replica; `instance` is the replica's `host:port`, which is also
//! the proxy's endpoint id).

use std::fmt;

/// A range-vector window such as `1m`: digits and one unit of `s`, `m`, `h` or `d`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("window {0:?} is not a duration such as 30s, 1m, 1h or 1d")]
    Window(String),
    #[error(
        "cannot group by {0:?}: use tenant, requested_model, model (the served model), pool or service_class"
    )]
    GroupBy(String),
    #[error("rollout {0:?} is not a name (letters, digits, '-', '.', '_')")]
    Rollout(String),
}

impl Window {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let (digits, unit) = s.split_at(s.len().saturating_sub(1));
        let ok = !digits.is_empty()
            && digits.len() <= 6
            && digits.bytes().all(|b| b.is_ascii_digit())
            && digits.parse::<u64>().is_ok_and(|n| n > 0)
            && matches!(unit, "s" | "m" | "h" | "d");
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(Error::Window(s.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The duration in seconds.
    pub fn seconds(&self) -> u64 {
        let (digits, unit) = self.0.split_at(self.0.len() - 1);
        let n: u64 = digits.parse().unwrap_or(1);
        n * match unit {
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => 1,
        }
    }
}

impl Default for Window {
    fn default() -> Self {
        Self("1m".into())
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The request labels viz groups by. `model` is the served model (the question is which model
/// served each application).
pub fn group_label(name: &str) -> Result<&'static str, Error> {
    match name.trim() {
        "tenant" => Ok("tenant"),
        "requested_model" | "requested" => Ok("requested_model"),
        "model" | "served_model" | "served" => Ok("served_model"),
        "pool" => Ok("pool"),
        "service_class" => Ok("service_class"),
        other => Err(Error::GroupBy(other.to_string())),
    }
}

/// Parses `tenant,model` into proxy label names, without duplicates.
pub fn group_by(spec: &str) -> Result<Vec<&'static str>, Error> {
    let mut out: Vec<&'static str> = Vec::new();
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let l = group_label(part)?;
        if !out.contains(&l) {
            out.push(l);
        }
    }
    if out.is_empty() {
        out.push("tenant");
    }
    Ok(out)
}

/// The figures of one `stat` row, each a query grouped by the row's labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatFigure {
    RequestsPerS,
    RequestsTotal,
    ErrorsPerS,
    /// Refused 429 by admission control or a token budget (a subset of the errors).
    RefusedPerS,
    TtftP50,
    TtftP95,
    TtftP99,
    ItlP50,
    ItlP95,
    E2eP50,
    E2eP95,
    E2eP99,
    PromptTokens,
    CachedPromptTokens,
    CompletionTokens,
    CostUsd,
}

impl StatFigure {
    pub const ALL: [StatFigure; 16] = [
        Self::RequestsPerS,
        Self::RequestsTotal,
        Self::ErrorsPerS,
        Self::RefusedPerS,
        Self::TtftP50,
        Self::TtftP95,
        Self::TtftP99,
        Self::ItlP50,
        Self::ItlP95,
        Self::E2eP50,
        Self::E2eP95,
        Self::E2eP99,
        Self::PromptTokens,
        Self::CachedPromptTokens,
        Self::CompletionTokens,
        Self::CostUsd,
    ];

    /// The field name in the API's JSON.
    pub fn field(self) -> &'static str {
        match self {
            Self::RequestsPerS => "requests_per_s",
            Self::RequestsTotal => "requests_total",
            Self::ErrorsPerS => "errors_per_s",
            Self::RefusedPerS => "refused_429_per_s",
            Self::TtftP50 => "ttft_p50_s",
            Self::TtftP95 => "ttft_p95_s",
            Self::TtftP99 => "ttft_p99_s",
            Self::ItlP50 => "itl_p50_s",
            Self::ItlP95 => "itl_p95_s",
            Self::E2eP50 => "e2e_p50_s",
            Self::E2eP95 => "e2e_p95_s",
            Self::E2eP99 => "e2e_p99_s",
            Self::PromptTokens => "prompt_tokens",
            Self::CachedPromptTokens => "cached_prompt_tokens",
            Self::CompletionTokens => "completion_tokens",
            Self::CostUsd => "cost_usd",
        }
    }

    /// The query, grouped by `by`, over `window`.
    pub fn promql(self, by: &[&str], window: &Window) -> String {
        let by = by.join(", ");
        let rate = |m: &str| format!("sum by ({by}) (rate(kinference_proxy_{m}[{window}]))");
        let increase =
            |m: &str| format!("sum by ({by}) (increase(kinference_proxy_{m}[{window}]))");
        let quantile = |q: f64, m: &str| {
            format!(
                "histogram_quantile({q}, sum by ({by}, le) (rate(kinference_proxy_{m}_bucket[{window}])))"
            )
        };
        match self {
            Self::RequestsPerS => rate("requests_total"),
            Self::RequestsTotal => format!("sum by ({by}) (kinference_proxy_requests_total)"),
            Self::ErrorsPerS => rate("errors_total"),
            Self::RefusedPerS => format!(
                "sum by ({by}) (rate(kinference_proxy_errors_total{{status=\"429\"}}[{window}]))"
            ),
            Self::TtftP50 => quantile(0.5, "ttft_seconds"),
            Self::TtftP95 => quantile(0.95, "ttft_seconds"),
            Self::TtftP99 => quantile(0.99, "ttft_seconds"),
            Self::ItlP50 => quantile(0.5, "inter_token_latency_seconds"),
            Self::ItlP95 => quantile(0.95, "inter_token_latency_seconds"),
            Self::E2eP50 => quantile(0.5, "request_duration_seconds"),
            Self::E2eP95 => quantile(0.95, "request_duration_seconds"),
            Self::E2eP99 => quantile(0.99, "request_duration_seconds"),
            Self::PromptTokens => increase("prompt_tokens_total"),
            Self::CachedPromptTokens => increase("cached_prompt_tokens_total"),
            Self::CompletionTokens => increase("completion_tokens_total"),
            Self::CostUsd => increase("cost_usd_total"),
        }
    }
}

/// Requests moved from the requested model to each served model, per tenant, over `window`.
pub fn flows(window: &Window) -> String {
    format!(
        "sum by (tenant, requested_model, served_model) (increase(kinference_proxy_requests_total[{window}]))"
    )
}

/// Decisions each policy rule matched, by tenant, requested model and the model chosen, over
/// `window` (the proxy's `rule_decisions` counter).
pub fn rule_decisions(window: &Window) -> String {
    format!(
        "sum by (tenant, requested_model, served_model, rule) (increase(kinference_proxy_rule_decisions_total[{window}]))"
    )
}

/// Each quality guard's current state (the proxies export 1 for it), by tenant, rule and family.
pub fn guard_states() -> String {
    "max by (tenant, rule, family, state) (kinference_proxy_guard_state) == 1".to_string()
}

/// Each quality guard's measured gap (the largest over proxies).
pub fn guard_gaps() -> String {
    "max by (tenant, rule, family) (kinference_proxy_guard_gap)".to_string()
}

/// Decisions per tenant and requested model over `window`: the denominator of rule shares.
pub fn decisions(window: &Window) -> String {
    format!(
        "sum by (tenant, requested_model) (increase(kinference_proxy_decisions_total[{window}]))"
    )
}

/// The figures of the endpoints view, each keyed by `instance` (vLLM), `endpoint` or `pool`
/// (the proxy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointFigure {
    /// vLLM's own TTFT, median, per replica.
    ObservedTtftP50,
    /// vLLM's own TTFT, mean, per replica.
    ObservedTtftMean,
    /// Prefix-cache hits over queries, per replica.
    CacheHitRate,
    /// The proxy's observed TTFT, median, per pool.
    PoolTtftP50,
    /// |observed − predicted| TTFT, mean, per pool.
    PoolPredictionErrorMean,
    /// |observed − predicted| TTFT, 95th percentile, per pool.
    PoolPredictionErrorP95,
    /// The proxy's predicted TTFT, mean, per endpoint (requests whose first token it saw).
    EndpointPredictedTtftMean,
    /// The proxy's observed TTFT (from dispatch), mean, per endpoint, for the same requests.
    EndpointObservedTtftMean,
    /// |observed − predicted| TTFT, mean, per endpoint.
    EndpointPredictionErrorMean,
    /// |observed − predicted| TTFT, 95th percentile, per endpoint.
    EndpointPredictionErrorP95,
}

impl EndpointFigure {
    pub const ALL: [EndpointFigure; 10] = [
        Self::ObservedTtftP50,
        Self::ObservedTtftMean,
        Self::CacheHitRate,
        Self::PoolTtftP50,
        Self::PoolPredictionErrorMean,
        Self::PoolPredictionErrorP95,
        Self::EndpointPredictedTtftMean,
        Self::EndpointObservedTtftMean,
        Self::EndpointPredictionErrorMean,
        Self::EndpointPredictionErrorP95,
    ];

    pub fn field(self) -> &'static str {
        match self {
            Self::ObservedTtftP50 => "observed_ttft_p50_s",
            Self::ObservedTtftMean => "observed_ttft_mean_s",
            Self::CacheHitRate => "cache_hit_rate",
            Self::PoolTtftP50 => "pool_ttft_p50_s",
            Self::PoolPredictionErrorMean => "pool_prediction_error_mean_s",
            Self::PoolPredictionErrorP95 => "pool_prediction_error_p95_s",
            Self::EndpointPredictedTtftMean => "proxy_predicted_ttft_mean_s",
            Self::EndpointObservedTtftMean => "proxy_observed_ttft_mean_s",
            Self::EndpointPredictionErrorMean => "prediction_error_mean_s",
            Self::EndpointPredictionErrorP95 => "prediction_error_p95_s",
        }
    }

    /// The label the samples are keyed by.
    pub fn key(self) -> &'static str {
        match self {
            Self::ObservedTtftP50 | Self::ObservedTtftMean | Self::CacheHitRate => "instance",
            Self::EndpointPredictedTtftMean
            | Self::EndpointObservedTtftMean
            | Self::EndpointPredictionErrorMean
            | Self::EndpointPredictionErrorP95 => "endpoint",
            _ => "pool",
        }
    }

    pub fn promql(self, window: &Window) -> String {
        let mean = |m: &str| {
            format!(
                "sum by (endpoint) (rate(kinference_proxy_{m}_sum[{window}])) / sum by (endpoint) (rate(kinference_proxy_{m}_count[{window}]))"
            )
        };
        match self {
            Self::ObservedTtftP50 => format!(
                "histogram_quantile(0.5, sum by (instance, le) (rate(vllm:time_to_first_token_seconds_bucket[{window}])))"
            ),
            Self::ObservedTtftMean => format!(
                "sum by (instance) (rate(vllm:time_to_first_token_seconds_sum[{window}])) / sum by (instance) (rate(vllm:time_to_first_token_seconds_count[{window}]))"
            ),
            Self::CacheHitRate => format!(
                "sum by (instance) (rate(vllm:prefix_cache_hits_total[{window}])) / sum by (instance) (rate(vllm:prefix_cache_queries_total[{window}]))"
            ),
            Self::PoolTtftP50 => format!(
                "histogram_quantile(0.5, sum by (pool, le) (rate(kinference_proxy_ttft_seconds_bucket[{window}])))"
            ),
            Self::PoolPredictionErrorMean => format!(
                "sum by (pool) (rate(kinference_proxy_prediction_error_seconds_sum[{window}])) / sum by (pool) (rate(kinference_proxy_prediction_error_seconds_count[{window}]))"
            ),
            Self::PoolPredictionErrorP95 => format!(
                "histogram_quantile(0.95, sum by (pool, le) (rate(kinference_proxy_prediction_error_seconds_bucket[{window}])))"
            ),
            Self::EndpointPredictedTtftMean => mean("endpoint_predicted_ttft_seconds"),
            Self::EndpointObservedTtftMean => mean("endpoint_ttft_seconds"),
            Self::EndpointPredictionErrorMean => mean("endpoint_prediction_error_seconds"),
            Self::EndpointPredictionErrorP95 => format!(
                "histogram_quantile(0.95, sum by (endpoint, le) (rate(kinference_proxy_endpoint_prediction_error_seconds_bucket[{window}])))"
            ),
        }
    }
}

/// A rollout's name as it may appear in a label selector: a Kubernetes name (letters, digits,
/// `-`, `.`, `_`, at most 253), so that it needs no escaping in PromQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutName(String);

impl RolloutName {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let ok = !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(Error::Rollout(s.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The per-arm figures of the experiment page's table, over the window, each by `rollout` and
/// `arm` (the proxies' `kinference_proxy_rollout_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmFigure {
    RequestsPerS,
    /// Requests by `outcome` (`ok`, `error`, `fallback`, `timeout`), over the window: the rates
    /// are computed from these, so they add up to the requests.
    Outcomes,
    TtftP50,
    TtftP90,
    TtftP99,
    CostUsd,
}

impl ArmFigure {
    pub const ALL: [ArmFigure; 6] = [
        Self::RequestsPerS,
        Self::Outcomes,
        Self::TtftP50,
        Self::TtftP90,
        Self::TtftP99,
        Self::CostUsd,
    ];

    pub fn field(self) -> &'static str {
        match self {
            Self::RequestsPerS => "requests_per_s",
            Self::Outcomes => "requests",
            Self::TtftP50 => "ttft_p50_s",
            Self::TtftP90 => "ttft_p90_s",
            Self::TtftP99 => "ttft_p99_s",
            Self::CostUsd => "cost_usd",
        }
    }

    pub fn promql(self, window: &Window) -> String {
        let quantile = |q: f64| {
            format!(
                "histogram_quantile({q}, sum by (rollout, arm, le) (rate(kinference_proxy_rollout_ttft_seconds_bucket[{window}])))"
            )
        };
        match self {
            Self::RequestsPerS => format!(
                "sum by (rollout, arm) (rate(kinference_proxy_rollout_requests_total[{window}]))"
            ),
            Self::Outcomes => format!(
                "sum by (rollout, arm, outcome) (increase(kinference_proxy_rollout_requests_total[{window}]))"
            ),
            Self::TtftP50 => quantile(0.5),
            Self::TtftP90 => quantile(0.9),
            Self::TtftP99 => quantile(0.99),
            Self::CostUsd => format!(
                "sum by (rollout, arm) (increase(kinference_proxy_rollout_cost_usd_total[{window}]))"
            ),
        }
    }
}

/// The rollouts the proxies have measured (all time), by name.
pub fn rollouts_measured() -> String {
    "sum by (rollout) (kinference_proxy_rollout_requests_total)".to_string()
}

/// The time series of the experiment page's charts, one line per arm, for one rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutSeries {
    TtftP50,
    TtftP90,
    /// Requests answered with an error (`outcome="error"`) over all requests of the arm; 0, not
    /// missing, while the arm has requests and no errors.
    ErrorRate,
    /// The arm's cost over its requests: arms of different shares compare per request.
    CostPerRequest,
    RequestsPerS,
}

impl RolloutSeries {
    pub const ALL: [RolloutSeries; 5] = [
        Self::TtftP50,
        Self::TtftP90,
        Self::ErrorRate,
        Self::CostPerRequest,
        Self::RequestsPerS,
    ];

    /// The name in the API's JSON.
    pub fn field(self) -> &'static str {
        match self {
            Self::TtftP50 => "ttft_p50_s",
            Self::TtftP90 => "ttft_p90_s",
            Self::ErrorRate => "error_rate",
            Self::CostPerRequest => "cost_per_request_usd",
            Self::RequestsPerS => "requests_per_s",
        }
    }

    /// The query for `rollout`, each point a rate over `rate_window` (at least a minute, and at
    /// least the step, so that no request falls between two points).
    pub fn promql(self, rollout: &RolloutName, rate_window: &Window) -> String {
        let r = rollout.as_str();
        let w = rate_window;
        let requests = format!(
            "sum by (arm) (rate(kinference_proxy_rollout_requests_total{{rollout=\"{r}\"}}[{w}]))"
        );
        let quantile = |q: f64| {
            format!(
                "histogram_quantile({q}, sum by (arm, le) (rate(kinference_proxy_rollout_ttft_seconds_bucket{{rollout=\"{r}\"}}[{w}])))"
            )
        };
        match self {
            Self::TtftP50 => quantile(0.5),
            Self::TtftP90 => quantile(0.9),
            Self::ErrorRate => format!(
                "(sum by (arm) (rate(kinference_proxy_rollout_requests_total{{rollout=\"{r}\",outcome=\"error\"}}[{w}])) or {requests} * 0) / {requests}"
            ),
            Self::CostPerRequest => format!(
                "sum by (arm) (rate(kinference_proxy_rollout_cost_usd_total{{rollout=\"{r}\"}}[{w}])) / {requests}"
            ),
            Self::RequestsPerS => requests,
        }
    }
}

/// The controller's view of each rollout (`kinference_controller_rollout_*`, from the
/// controller's admin `/metrics`), by policy and rollout. With several controller replicas the
/// largest value is shown: the most alarming closeness, the current phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControllerFigure {
    /// 1 for the current phase (`Running`, `RolledBack`, `Promoted`, `Aborted`).
    Phase,
    /// How close the cohort is to each threshold: 0 no change against control, 1 at the limit,
    /// above 1 crossed (the favourable end of the interval).
    ThresholdRatio,
    /// The estimate the ratio is made of: a rate difference, a TTFT ratio or a saturation.
    ThresholdEstimate,
    /// The declared limit.
    ThresholdLimit,
    /// Rollbacks by the threshold crossed (all time).
    Rollbacks,
}

impl ControllerFigure {
    pub const ALL: [ControllerFigure; 5] = [
        Self::Phase,
        Self::ThresholdRatio,
        Self::ThresholdEstimate,
        Self::ThresholdLimit,
        Self::Rollbacks,
    ];

    pub fn field(self) -> &'static str {
        match self {
            Self::Phase => "phase",
            Self::ThresholdRatio => "ratio",
            Self::ThresholdEstimate => "estimate",
            Self::ThresholdLimit => "limit",
            Self::Rollbacks => "rollbacks",
        }
    }

    pub fn promql(self) -> String {
        let by_threshold =
            |agg: &str, m: &str| format!("{agg} by (policy, rollout, threshold) ({m})");
        match self {
            Self::Phase => {
                "max by (policy, rollout, phase) (kinference_controller_rollout_phase) == 1".into()
            }
            Self::ThresholdRatio => {
                by_threshold("max", "kinference_controller_rollout_threshold_ratio")
            }
            Self::ThresholdEstimate => {
                by_threshold("max", "kinference_controller_rollout_threshold_estimate")
            }
            Self::ThresholdLimit => {
                by_threshold("max", "kinference_controller_rollout_threshold_limit")
            }
            Self::Rollbacks => by_threshold("sum", "kinference_controller_rollout_rollbacks_total"),
        }
    }
}

/// The controller's rollout queries (the metric-name test reads the controller's exposition for
/// these, the proxy's and vLLM's for [`all`]).
pub fn controller_all() -> Vec<String> {
    ControllerFigure::ALL.iter().map(|f| f.promql()).collect()
}

/// Every query viz can run, with the widest grouping, for the metric-name test.
pub fn all() -> Vec<String> {
    let w = Window::default();
    let by = [
        "tenant",
        "requested_model",
        "served_model",
        "pool",
        "service_class",
    ];
    let mut out: Vec<String> = StatFigure::ALL.iter().map(|f| f.promql(&by, &w)).collect();
    out.push(flows(&w));
    out.push(rule_decisions(&w));
    out.push(decisions(&w));
    out.push(guard_states());
    out.push(guard_gaps());
    out.extend(EndpointFigure::ALL.iter().map(|f| f.promql(&w)));
    out.extend(ArmFigure::ALL.iter().map(|f| f.promql(&w)));
    out.push(rollouts_measured());
    let r = RolloutName("cheaper".into());
    out.extend(RolloutSeries::ALL.iter().map(|f| f.promql(&r, &w)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_durations_only() {
        assert_eq!(Window::parse("1m").unwrap().as_str(), "1m");
        assert_eq!(Window::parse("30s").unwrap().as_str(), "30s");
        for bad in ["", "m", "0m", "1", "1y", "1m]) or vector(1", "-1m", "1.5m"] {
            assert_eq!(Window::parse(bad), Err(Error::Window(bad.into())), "{bad}");
        }
    }

    #[test]
    fn a_window_knows_its_seconds() {
        for (w, s) in [
            ("30s", 30),
            ("1m", 60),
            ("15m", 900),
            ("6h", 21_600),
            ("1d", 86_400),
        ] {
            assert_eq!(Window::parse(w).unwrap().seconds(), s, "{w}");
        }
    }

    #[test]
    fn rollout_names_cannot_break_out_of_a_selector() {
        assert_eq!(
            RolloutName::parse("cheaper-v2.1_a").unwrap().as_str(),
            "cheaper-v2.1_a"
        );
        for bad in ["", "a\"", "a\"} or vector(1) or x{b=\"", "a b", "a\\"] {
            assert_eq!(
                RolloutName::parse(bad),
                Err(Error::Rollout(bad.into())),
                "{bad}"
            );
        }
        assert!(RolloutName::parse(&"a".repeat(254)).is_err());
    }

    #[test]
    fn rollout_series_select_the_rollout_and_keep_one_line_per_arm() {
        let r = RolloutName::parse("cheaper").unwrap();
        let w = Window::parse("1m").unwrap();
        assert_eq!(
            RolloutSeries::TtftP90.promql(&r, &w),
            "histogram_quantile(0.9, sum by (arm, le) (rate(kinference_proxy_rollout_ttft_seconds_bucket{rollout=\"cheaper\"}[1m])))"
        );
        // An arm without errors reads 0 (the `or ... * 0`), not a missing line.
        let requests =
            "sum by (arm) (rate(kinference_proxy_rollout_requests_total{rollout=\"cheaper\"}[1m]))";
        assert_eq!(
            RolloutSeries::ErrorRate.promql(&r, &w),
            format!(
                "(sum by (arm) (rate(kinference_proxy_rollout_requests_total{{rollout=\"cheaper\",outcome=\"error\"}}[1m])) or {requests} * 0) / {requests}"
            )
        );
        assert_eq!(
            ArmFigure::TtftP50.promql(&Window::parse("5m").unwrap()),
            "histogram_quantile(0.5, sum by (rollout, arm, le) (rate(kinference_proxy_rollout_ttft_seconds_bucket[5m])))"
        );
        assert_eq!(
            ControllerFigure::Phase.promql(),
            "max by (policy, rollout, phase) (kinference_controller_rollout_phase) == 1"
        );
    }

    #[test]
    fn group_by_maps_model_to_the_served_model() {
        assert_eq!(
            group_by("tenant,model").unwrap(),
            vec!["tenant", "served_model"]
        );
        assert_eq!(group_by("").unwrap(), vec!["tenant"]);
        assert_eq!(
            group_by("tenant,prompt"),
            Err(Error::GroupBy("prompt".into()))
        );
    }

    #[test]
    fn stat_queries_group_by_the_labels_asked_for() {
        let w = Window::parse("5m").unwrap();
        assert_eq!(
            StatFigure::TtftP95.promql(&["tenant", "served_model"], &w),
            "histogram_quantile(0.95, sum by (tenant, served_model, le) (rate(kinference_proxy_ttft_seconds_bucket[5m])))"
        );
        assert_eq!(
            StatFigure::CostUsd.promql(&["tenant"], &w),
            "sum by (tenant) (increase(kinference_proxy_cost_usd_total[5m]))"
        );
    }
}
