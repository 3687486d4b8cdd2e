//! The proxy's Prometheus metrics, per tenant, requested model, served model, pool and service class.
//!
//! Platform teams answer "which model served each app, how fast, at what cost" from these, and
//! operators see how often prediction fell back and why. Label values are names from policy and
//! configuration only, never request content.
//!
//! Two families are labelled per endpoint (`endpoint` = `host:port`, the proxy's endpoint id):
//! observed and predicted TTFT and their difference, so the endpoints view can set predicted
//! against observed per endpoint. Their cardinality is bounded by the endpoints of the pools the
//! sidecar's policy names (a pool's replicas, typically a handful to a few dozen), not by
//! traffic; a series of an endpoint that left stays until the proxy restarts, as with any
//! Prometheus client. They carry no tenant label, which keeps them at endpoints × 1 rather than
//! endpoints × tenants × models.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::{Metric, Registry},
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

/// One endpoint of a pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub pool: String,
    /// The model the endpoint serves (the policy's name).
    pub model: String,
    /// `host:port`.
    pub endpoint: String,
}

/// Decisions by the policy rule that matched.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub tenant: String,
    pub requested_model: String,
    /// The model the decision chose (in shadow mode, the one it would have sent to).
    pub served_model: String,
    pub rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KvErrorLabels {
    pub pool: String,
    pub model: String,
    /// `connect`, `recv`, `sequence_gap` (events lost), `decode` (events lost).
    pub reason: String,
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

/// Connections accepted on the outbound listener, by how they were served.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabels {
    /// `direct` (the app called the proxy's port), `inference_target` (redirected to a
    /// destination with an inference policy, served by its stack) or `forwarded` (redirected
    /// elsewhere, copied as plain TCP).
    pub served: String,
}

/// Forwarded connections that failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardErrorLabels {
    /// `connect` (refused or unreachable), `connect_timeout`, `io` (after connecting).
    pub reason: String,
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
    pub kv_event_batches: Family<PoolLabels, Counter>,
    pub kv_event_errors: Family<KvErrorLabels, Counter>,
    pub endpoint_ttft_seconds: Hist<EndpointLabels>,
    pub endpoint_predicted_ttft_seconds: Hist<EndpointLabels>,
    pub endpoint_prediction_error_seconds: Hist<EndpointLabels>,
    pub rule_decisions: Family<RuleLabels, Counter>,
    pub connections: Family<ConnectionLabels, Counter>,
    pub forward_errors: Family<ForwardErrorLabels, Counter>,
    pub target_evictions: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers `metric` under `name` and hands it back, for the struct that keeps it.
fn registered<M: Metric + Clone>(r: &mut Registry, name: &str, help: &str, metric: M) -> M {
    r.register(name, help, metric.clone());
    metric
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("kinference_proxy");
        Self {
            requests: registered(&mut r, "requests", "Requests answered", Family::default()),
            errors: registered(
                &mut r,
                "errors",
                "Requests answered with an error, by status",
                Family::default(),
            ),
            ttft_seconds: registered(
                &mut r,
                "ttft_seconds",
                "Time to first token observed by the proxy (streaming requests)",
                hist(latency_histogram),
            ),
            inter_token_latency_seconds: registered(
                &mut r,
                "inter_token_latency_seconds",
                "Gaps between streamed tokens",
                hist(itl_histogram),
            ),
            request_duration_seconds: registered(
                &mut r,
                "request_duration_seconds",
                "End-to-end request latency, from arrival to the last byte",
                hist(latency_histogram),
            ),
            prompt_tokens: registered(
                &mut r,
                "prompt_tokens",
                "Prompt tokens, as the server reported",
                Family::default(),
            ),
            cached_prompt_tokens: registered(
                &mut r,
                "cached_prompt_tokens",
                "Prompt tokens served from the prefix cache",
                Family::default(),
            ),
            completion_tokens: registered(
                &mut r,
                "completion_tokens",
                "Completion tokens",
                Family::default(),
            ),
            cost_usd: registered(
                &mut r,
                "cost_usd",
                "Cost of the tokens at the policy's prices",
                Family::default(),
            ),
            decision_duration_seconds: registered(
                &mut r,
                "decision_duration_seconds",
                "Time to classify, apply policy and decide",
                hist(decision_histogram),
            ),
            prediction_error_seconds: registered(
                &mut r,
                "prediction_error_seconds",
                "Absolute difference between observed and predicted TTFT",
                hist(latency_histogram),
            ),
            decisions: registered(
                &mut r,
                "decisions",
                "Routing decisions by reason",
                Family::default(),
            ),
            fallbacks: registered(
                &mut r,
                "fallbacks",
                "Decisions that fell back from prediction",
                Family::default(),
            ),
            stale_signals: registered(
                &mut r,
                "stale_signals",
                "Candidate endpoints whose scraped signals were older than the freshness budget",
                Family::default(),
            ),
            retries: registered(
                &mut r,
                "retries",
                "Attempts retried on the next-best endpoint",
                Family::default(),
            ),
            scrape_errors: registered(
                &mut r,
                "scrape_errors",
                "Failed scrapes of endpoint metrics",
                Family::default(),
            ),
            kv_event_batches: registered(
                &mut r,
                "kv_event_batches",
                "vLLM KV-event batches applied to the precise prefix index",
                Family::default(),
            ),
            kv_event_errors: registered(
                &mut r,
                "kv_event_errors",
                "Failures on KV-event streams (sequence_gap and decode lose events and clear the endpoint's index)",
                Family::default(),
            ),
            endpoint_ttft_seconds: registered(
                &mut r,
                "endpoint_ttft_seconds",
                "TTFT observed by the proxy per endpoint, from dispatch (streams whose prediction is known)",
                hist(latency_histogram),
            ),
            endpoint_predicted_ttft_seconds: registered(
                &mut r,
                "endpoint_predicted_ttft_seconds",
                "TTFT predicted for the same requests as endpoint_ttft_seconds",
                hist(latency_histogram),
            ),
            endpoint_prediction_error_seconds: registered(
                &mut r,
                "endpoint_prediction_error_seconds",
                "Absolute difference between observed and predicted TTFT, per endpoint",
                hist(latency_histogram),
            ),
            rule_decisions: registered(
                &mut r,
                "rule_decisions",
                "Routing decisions whose policy evaluation matched a rule, by the model chosen",
                Family::default(),
            ),
            connections: registered(
                &mut r,
                "connections",
                "Connections accepted on the outbound listener, by how they were served",
                Family::default(),
            ),
            forward_errors: registered(
                &mut r,
                "forward_errors",
                "Redirected connections forwarded as plain TCP that failed, by reason",
                Family::default(),
            ),
            target_evictions: registered(
                &mut r,
                "target_evictions",
                "Stacks of redirected inference targets stopped after their idle timeout",
                Counter::default(),
            ),
            registry: Arc::new(r),
        }
    }

    /// Counts an accepted connection by how it was served.
    pub fn connection(&self, served: &str) {
        self.connections
            .get_or_create(&ConnectionLabels {
                served: served.to_string(),
            })
            .inc();
    }

    /// Counts a failed forwarded connection.
    pub fn forward_error(&self, reason: &str) {
        self.forward_errors
            .get_or_create(&ForwardErrorLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// An observed TTFT (from dispatch) set against its prediction: the pool-labelled error and
    /// the endpoint-labelled observed, predicted and error.
    pub fn observe_prediction(
        &self,
        labels: &RequestLabels,
        endpoint: &str,
        observed_s: f64,
        predicted_s: f64,
    ) {
        let error_s = (observed_s - predicted_s).abs();
        self.prediction_error_seconds
            .get_or_create(labels)
            .observe(error_s);
        let e = EndpointLabels {
            pool: labels.pool.clone(),
            model: labels.served_model.clone(),
            endpoint: endpoint.to_string(),
        };
        self.endpoint_ttft_seconds
            .get_or_create(&e)
            .observe(observed_s);
        self.endpoint_predicted_ttft_seconds
            .get_or_create(&e)
            .observe(predicted_s);
        self.endpoint_prediction_error_seconds
            .get_or_create(&e)
            .observe(error_s);
    }

    /// Counts one decision under each rule that matched it.
    pub fn rule_decisions<'a>(
        &self,
        tenant: &str,
        requested_model: &str,
        served_model: &str,
        rules: impl Iterator<Item = &'a str>,
    ) {
        for rule in rules {
            self.rule_decisions
                .get_or_create(&RuleLabels {
                    tenant: tenant.to_string(),
                    requested_model: requested_model.to_string(),
                    served_model: served_model.to_string(),
                    rule: rule.to_string(),
                })
                .inc();
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

    #[test]
    fn predictions_are_labelled_per_endpoint_and_rules_per_decision() {
        let m = Metrics::new();
        let l = RequestLabels {
            tenant: "team-a/chat".into(),
            requested_model: "glm-5.3".into(),
            served_model: "qwen-3.6-27b".into(),
            pool: "qwen-3.6-27b".into(),
            service_class: "Standard".into(),
        };
        m.observe_prediction(&l, "127.0.0.1:8003", 0.3, 0.2);
        m.rule_decisions(
            "team-a/chat",
            "glm-5.3",
            "qwen-3.6-27b",
            ["low-complexity-may-use-qwen"].into_iter(),
        );
        m.rule_decisions("team-a/chat", "glm-5.3", "glm-5.3", std::iter::empty());
        let text = m.encode();
        let ep = r#"{pool="qwen-3.6-27b",model="qwen-3.6-27b",endpoint="127.0.0.1:8003"}"#;
        for family in [
            "endpoint_ttft_seconds",
            "endpoint_predicted_ttft_seconds",
            "endpoint_prediction_error_seconds",
        ] {
            assert!(
                text.contains(&format!("kinference_proxy_{family}_count{ep} 1")),
                "{family}: {text}"
            );
        }
        assert!(text.contains(&format!(
            "kinference_proxy_endpoint_ttft_seconds_sum{ep} 0.3"
        )));
        assert!(text.contains(&format!(
            "kinference_proxy_endpoint_predicted_ttft_seconds_sum{ep} 0.2"
        )));
        assert!(text.contains(r#"kinference_proxy_prediction_error_seconds_count{tenant="team-a/chat",requested_model="glm-5.3",served_model="qwen-3.6-27b",pool="qwen-3.6-27b",service_class="Standard"} 1"#));
        assert!(text.contains(r#"kinference_proxy_rule_decisions_total{tenant="team-a/chat",requested_model="glm-5.3",served_model="qwen-3.6-27b",rule="low-complexity-may-use-qwen"} 1"#), "{text}");
        assert_eq!(
            text.matches("kinference_proxy_rule_decisions_total{")
                .count(),
            1
        );
    }

    #[test]
    fn capture_families_count_connections_and_forward_errors() {
        let m = Metrics::new();
        m.connection("inference_target");
        m.connection("inference_target");
        m.connection("forwarded");
        m.forward_error("connect");
        m.target_evictions.inc();
        let text = m.encode();
        assert!(
            text.contains(r#"kinference_proxy_connections_total{served="inference_target"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kinference_proxy_connections_total{served="forwarded"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kinference_proxy_forward_errors_total{reason="connect"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("kinference_proxy_target_evictions_total 1"),
            "{text}"
        );
    }
}
