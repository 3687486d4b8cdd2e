//! The proxy's Prometheus metrics, per tenant, requested model, served model, pool and service class.
//!
//! Platform teams answer "which model served each app, how fast, at what cost" from these, and
//! operators see how often prediction fell back and why. Label values are names from policy and
//! configuration only, never request content.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};
use std::sync::{Arc, atomic::AtomicU64};

/// The labels of a served (or refused) request.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub tenant: String,
    pub requested_model: String,
    pub served_model: String,
    pub pool: String,
    pub service_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub tenant: String,
    pub requested_model: String,
    pub served_model: String,
    pub pool: String,
    pub service_class: String,
    /// The HTTP status answered, or `stream` for a failure after the first byte.
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub tenant: String,
    pub requested_model: String,
    pub served_model: String,
    pub reason: String,
    /// `enforce` or `shadow`.
    pub mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    pub tenant: String,
    pub requested_model: String,
    /// `stale_signals`, `no_signals`.
    pub reason: String,
    /// `fail_open` (routed by the fallback balancer) or `fail_close` (refused).
    pub failure_mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    pub tenant: String,
    pub requested_model: String,
    /// `connect`, `status_5xx`, `status_429`.
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
    pub requested_model: String,
}

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

fn hist<L: Clone + std::hash::Hash + Eq>(f: fn() -> Histogram) -> Hist<L> {
    Family::new_with_constructor(f)
}

fn latency_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ])
}

fn itl_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28,
    ])
}

fn decision_histogram() -> Histogram {
    Histogram::new([
        0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01,
    ])
}

/// Every metric family the proxy exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub requests: Family<RequestLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub ttft_seconds: Hist<RequestLabels>,
    pub inter_token_latency_seconds: Hist<RequestLabels>,
    pub request_duration_seconds: Hist<RequestLabels>,
    pub prompt_tokens: Family<RequestLabels, Counter>,
    pub cached_prompt_tokens: Family<RequestLabels, Counter>,
    pub completion_tokens: Family<RequestLabels, Counter>,
    pub cost_usd: Family<RequestLabels, Counter<f64, AtomicU64>>,
    pub decision_duration_seconds: Hist<TenantLabels>,
    pub prediction_error_seconds: Hist<RequestLabels>,
    pub decisions: Family<DecisionLabels, Counter>,
    pub fallbacks: Family<FallbackLabels, Counter>,
    pub stale_signals: Family<PoolLabels, Counter>,
    pub retries: Family<RetryLabels, Counter>,
    pub scrape_errors: Family<PoolLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("kinference_proxy");
        let requests = Family::default();
        r.register("requests", "Requests answered", requests.clone());
        let errors = Family::default();
        r.register(
            "errors",
            "Requests answered with an error, by status",
            errors.clone(),
        );
        let ttft_seconds: Hist<RequestLabels> = hist(latency_histogram);
        r.register(
            "ttft_seconds",
            "Time to first token observed by the proxy (streaming requests)",
            ttft_seconds.clone(),
        );
        let inter_token_latency_seconds: Hist<RequestLabels> = hist(itl_histogram);
        r.register(
            "inter_token_latency_seconds",
            "Gaps between streamed tokens",
            inter_token_latency_seconds.clone(),
        );
        let request_duration_seconds: Hist<RequestLabels> = hist(latency_histogram);
        r.register(
            "request_duration_seconds",
            "End-to-end request latency, from arrival to the last byte",
            request_duration_seconds.clone(),
        );
        let prompt_tokens = Family::default();
        r.register(
            "prompt_tokens",
            "Prompt tokens, as the server reported",
            prompt_tokens.clone(),
        );
        let cached_prompt_tokens = Family::default();
        r.register(
            "cached_prompt_tokens",
            "Prompt tokens served from the prefix cache",
            cached_prompt_tokens.clone(),
        );
        let completion_tokens = Family::default();
        r.register(
            "completion_tokens",
            "Completion tokens",
            completion_tokens.clone(),
        );
        let cost_usd = Family::default();
        r.register(
            "cost_usd",
            "Cost of the tokens at the policy's prices",
            cost_usd.clone(),
        );
        let decision_duration_seconds: Hist<TenantLabels> = hist(decision_histogram);
        r.register(
            "decision_duration_seconds",
            "Time to classify, apply policy and decide",
            decision_duration_seconds.clone(),
        );
        let prediction_error_seconds: Hist<RequestLabels> = hist(latency_histogram);
        r.register(
            "prediction_error_seconds",
            "Absolute difference between observed and predicted TTFT",
            prediction_error_seconds.clone(),
        );
        let decisions = Family::default();
        r.register(
            "decisions",
            "Routing decisions by reason",
            decisions.clone(),
        );
        let fallbacks = Family::default();
        r.register(
            "fallbacks",
            "Decisions that fell back from prediction",
            fallbacks.clone(),
        );
        let stale_signals = Family::default();
        r.register(
            "stale_signals",
            "Candidate endpoints whose scraped signals were older than the freshness budget",
            stale_signals.clone(),
        );
        let retries = Family::default();
        r.register(
            "retries",
            "Attempts retried on the next-best endpoint",
            retries.clone(),
        );
        let scrape_errors = Family::default();
        r.register(
            "scrape_errors",
            "Failed scrapes of endpoint metrics",
            scrape_errors.clone(),
        );
        Self {
            registry: Arc::new(r),
            requests,
            errors,
            ttft_seconds,
            inter_token_latency_seconds,
            request_duration_seconds,
            prompt_tokens,
            cached_prompt_tokens,
            completion_tokens,
            cost_usd,
            decision_duration_seconds,
            prediction_error_seconds,
            decisions,
            fallbacks,
            stale_signals,
            retries,
            scrape_errors,
        }
    }

    /// Counts an answered error.
    pub fn error(&self, labels: &RequestLabels, status: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                tenant: labels.tenant.clone(),
                requested_model: labels.requested_model.clone(),
                served_model: labels.served_model.clone(),
                pool: labels.pool.clone(),
                service_class: labels.service_class.clone(),
                status: status.to_string(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_exported_with_their_labels() {
        let m = Metrics::new();
        let l = RequestLabels {
            tenant: "team-a/chat".into(),
            requested_model: "glm-5.3".into(),
            served_model: "qwen-3.6-27b".into(),
            pool: "qwen-3.6-27b".into(),
            service_class: "Standard".into(),
        };
        m.requests.get_or_create(&l).inc();
        m.cost_usd.get_or_create(&l).inc_by(0.5);
        m.ttft_seconds.get_or_create(&l).observe(0.2);
        m.error(&l, "503");
        let text = m.encode();
        assert!(text.contains(r#"kinference_proxy_requests_total{tenant="team-a/chat",requested_model="glm-5.3",served_model="qwen-3.6-27b",pool="qwen-3.6-27b",service_class="Standard"} 1"#), "{text}");
        assert!(text.contains("kinference_proxy_cost_usd_total{"), "{text}");
        assert!(text.contains(r#"status="503"} 1"#), "{text}");
        assert!(
            text.contains("kinference_proxy_ttft_seconds_bucket{"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
