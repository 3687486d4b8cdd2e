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
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Metric, Registry},
};
use std::sync::{Arc, atomic::AtomicU64};

/// The `requested_model` of a request whose model the policy does not know: label values come
/// from policy and configuration only, so a client cannot mint series by naming models.
pub const UNKNOWN_MODEL: &str = "unknown";

/// The labels of a served (or refused) request.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub tenant: String,
    pub requested_model: String,
    pub served_model: String,
    pub pool: String,
    pub service_class: String,
    /// The request's arm of the policy's rollout (`cohort`, `control`, `rest`), empty when the
    /// policy runs none: three values at most, so every family a dashboard splits by tenant and
    /// model can also be split by arm (issue 23).
    pub arm: String,
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
    /// The rollout arm, as in [`RequestLabels::arm`].
    pub arm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub tenant: String,
    pub requested_model: String,
    pub served_model: String,
    pub reason: String,
    /// `enforce` or `shadow`.
    pub mode: String,
    /// The rollout arm, as in [`RequestLabels::arm`].
    pub arm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    pub tenant: String,
    pub requested_model: String,
    /// `stale_signals`, `no_signals`.
    pub reason: String,
    /// `fail_open` (routed by the fallback balancer) or `fail_close` (refused).
    pub failure_mode: String,
    /// The rollout arm, as in [`RequestLabels::arm`].
    pub arm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NoticeLabels {
    pub pool: String,
    pub model: String,
    /// `sent`, `dropped`, `applied` or `lost`.
    pub result: &'static str,
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

/// Decisions by what the policy's objective decided.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectiveLabels {
    pub tenant: String,
    pub requested_model: String,
    /// The model chosen (in shadow mode, the one it would have sent to).
    pub served_model: String,
    /// `lowest_ttft` or `cheapest_within_slo`.
    pub objective: String,
    /// `fastest`, `cheaper_within_tolerance`, `cheapest_within_slo`, `none_within_slo` or
    /// `fallback`.
    pub decided_by: String,
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
    /// `connect`, `timeout`, `failed`, `status_5xx`, `status_429`, or `budget_exhausted` (a
    /// retry the retry budget did not allow).
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

/// Policy messages the proxy refused, keeping its working policy.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    /// `not_found`, `invalid` or `empty` (`kinference_proxy_discovery::Refusal::reason`).
    pub reason: String,
}

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

fn hist<L: Clone + std::hash::Hash + Eq>(f: fn() -> Histogram) -> Hist<L> {
    Family::new_with_constructor(f)
}

/// The upper bounds of the latency histograms (TTFT among them), in seconds.
pub const TTFT_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
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

/// What every answered request adds: counts, errors, latencies, tokens and cost, per tenant,
/// requested and served model, pool and service class; and observed against predicted TTFT.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub ttft_seconds: Hist<RequestLabels>,
    pub inter_token_latency_seconds: Hist<RequestLabels>,
    pub request_duration_seconds: Hist<RequestLabels>,
    pub prompt_tokens: Family<RequestLabels, Counter>,
    pub cached_prompt_tokens: Family<RequestLabels, Counter>,
    /// The part of `cached_prompt_tokens` that is the decision's prediction, not the server's
    /// report (a usage without `prompt_tokens_details.cached_tokens`).
    pub cached_prompt_tokens_estimated: Family<RequestLabels, Counter>,
    pub completion_tokens: Family<RequestLabels, Counter>,
    pub cost_usd: Family<RequestLabels, Counter<f64, AtomicU64>>,
    pub prediction_error_seconds: Hist<RequestLabels>,
    pub endpoint_ttft_seconds: Hist<EndpointLabels>,
    pub endpoint_predicted_ttft_seconds: Hist<EndpointLabels>,
    pub endpoint_prediction_error_seconds: Hist<EndpointLabels>,
}

/// What the route layer decided: how long it took, by which reason and rule, and how often it fell
/// back.
#[derive(Clone, Debug)]
pub struct DecisionMetrics {
    pub decision_duration_seconds: Hist<TenantLabels>,
    pub decisions: Family<DecisionLabels, Counter>,
    pub fallbacks: Family<FallbackLabels, Counter>,
    pub stale_signals: Family<PoolLabels, Counter>,
    pub rule_decisions: Family<RuleLabels, Counter>,
    pub objective_decisions: Family<ObjectiveLabels, Counter>,
}

/// Admission control (see `crate::admission`): what is held, for how long, and what is refused.
#[derive(Clone, Debug)]
pub struct AdmissionMetrics {
    /// Requests held now, per requested model and class (an autoscaler's signal: work waiting
    /// for capacity).
    pub held: Family<ClassLabels, Gauge>,
    /// The engine work held now, in seconds: each held request's predicted prefill on the
    /// candidate it would go to (its uncached prompt at the model's rate). Beside `held`, the
    /// signal for a pool whose held requests are few but long.
    pub held_work_seconds: Family<ClassLabels, Gauge<f64, AtomicU64>>,
    /// How long each held request waited, by how its hold ended (`admitted` or `rejected`).
    pub held_seconds: Hist<HoldLabels>,
    /// Requests refused 429, by reason (`queue_timeout`, `queue_full`).
    pub rejections: Family<AdmissionRejectionLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    /// The model the held requests asked for (after aliases): the pool an autoscaler grows.
    pub requested_model: String,
    pub service_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HoldLabels {
    pub tenant: String,
    pub service_class: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionRejectionLabels {
    pub tenant: String,
    pub service_class: String,
    pub reason: String,
}

/// The quality guards (see `crate::guard`): per tenant, rule and prompt family.
#[derive(Clone, Debug)]
pub struct GuardMetrics {
    /// 1 for the key's current state, 0 for the others.
    pub state: Family<GuardStateLabels, Gauge>,
    /// P(requested better) - P(rule's model better) over the window.
    pub gap: Family<GuardLabels, Gauge<f64, AtomicU64>>,
    pub verdicts: Family<GuardVerdictLabels, Counter>,
    /// Requests a guard kept on the requested model.
    pub held: Family<GuardHoldLabels, Counter>,
    /// Sampled requests, by what became of them.
    pub samples: Family<GuardSampleLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardLabels {
    pub tenant: String,
    pub rule: String,
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardStateLabels {
    pub tenant: String,
    pub rule: String,
    pub family: String,
    /// `measuring`, `trusted` or `suspended`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardVerdictLabels {
    pub tenant: String,
    pub rule: String,
    pub family: String,
    /// `requested`, `added` or `tie`.
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardHoldLabels {
    pub tenant: String,
    pub rule: String,
    pub family: String,
    /// `capped` or `suspended`.
    pub hold: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardSampleLabels {
    pub tenant: String,
    pub rule: String,
    /// `judged`, `no_headroom`, `mirror_failed`, `judge_failed`, `judge_unclear`, `no_answer`
    /// or `dropped` (too many judgements in flight).
    pub outcome: String,
}

/// A rollout's arm (`cohort` or `control`; the rest is not measured).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutLabels {
    pub rollout: String,
    pub arm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutOutcomeLabels {
    pub rollout: String,
    pub arm: String,
    /// `ok`, `error`, `fallback` or `timeout` (see `crate::rollout::ArmTag::record`).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutReportLabels {
    /// `sent`, `failed` (its measurements go with the next) or `dropped`.
    pub result: String,
}

/// The arms of the policy's rollout (see `crate::rollout`), and the reports to the controller.
#[derive(Clone, Debug)]
pub struct RolloutMetrics {
    pub requests: Family<RolloutOutcomeLabels, Counter>,
    pub ttft_seconds: Hist<RolloutLabels>,
    pub cost_usd: Family<RolloutLabels, Counter<f64, AtomicU64>>,
    /// Rollouts the proxy dropped as invalid (the policy served without them), by reason.
    pub rejections: Family<RejectionLabels, Counter>,
    pub reports: Family<RolloutReportLabels, Counter>,
}

/// Attempts the retry layer sent again elsewhere.
#[derive(Clone, Debug)]
pub struct RetryMetrics {
    pub retries: Family<RetryLabels, Counter>,
    /// Endpoints failure accrual took out of rotation.
    pub ejections: Family<EndpointLabels, Counter>,
}

/// What the signals tasks could not read.
#[derive(Clone, Debug)]
pub struct SignalMetrics {
    pub scrape_errors: Family<PoolLabels, Counter>,
    /// Switches of a pool to reading its engines directly because the signal service failed.
    pub signal_fallbacks: Family<PoolLabels, Counter>,
    /// Signal-service messages applied.
    pub signal_updates: Family<PoolLabels, Counter>,
    /// 1 while a pool's readings come from the signal service, 0 while it reads the engines.
    pub signal_stream_live: Family<PoolLabels, Gauge>,
    /// How old each reading from the signal service was when it arrived (from the service's
    /// scrape to this proxy): the freshness the service gives.
    pub signal_reading_age_seconds: Hist<PoolLabels>,
    /// Notices: this proxy's own `sent` or `dropped`, others' `applied` or `lost` (to slowness).
    pub signal_notices: Family<NoticeLabels, Counter>,
    pub kv_event_batches: Family<PoolLabels, Counter>,
    pub kv_event_errors: Family<KvErrorLabels, Counter>,
    /// Prefix-cache deltas from the signal service applied to the precise index (the engines'
    /// KV events, subscribed to once by the controller).
    pub signal_prefix_deltas: Family<PoolLabels, Counter>,
}

/// How the outbound listener served its connections.
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
    pub connections: Family<ConnectionLabels, Counter>,
    pub forward_errors: Family<ForwardErrorLabels, Counter>,
    pub target_evictions: Counter,
}

/// What discovery refused.
#[derive(Clone, Debug)]
pub struct DiscoveryMetrics {
    pub policy_rejections: Family<RejectionLabels, Counter>,
}

/// Every metric family the proxy exports, grouped by the layer or task that writes them: each
/// holds only its group.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub http: RequestMetrics,
    pub route: DecisionMetrics,
    pub retry: RetryMetrics,
    pub signals: SignalMetrics,
    pub guard: GuardMetrics,
    pub admission: AdmissionMetrics,
    pub server: ConnectionMetrics,
    pub discovery: DiscoveryMetrics,
    pub rollout: RolloutMetrics,
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
        let requests = registered(&mut r, "requests", "Requests answered", Family::default());
        let errors = registered(
            &mut r,
            "errors",
            "Requests answered with an error, by status",
            Family::default(),
        );
        let ttft_seconds = registered(
            &mut r,
            "ttft_seconds",
            "Time to first token observed by the proxy (streaming requests)",
            hist(latency_histogram),
        );
        let inter_token_latency_seconds = registered(
            &mut r,
            "inter_token_latency_seconds",
            "Gaps between streamed tokens",
            hist(itl_histogram),
        );
        let request_duration_seconds = registered(
            &mut r,
            "request_duration_seconds",
            "End-to-end request latency, from arrival to the last byte",
            hist(latency_histogram),
        );
        let prompt_tokens = registered(
            &mut r,
            "prompt_tokens",
            "Prompt tokens, as the server reported",
            Family::default(),
        );
        let cached_prompt_tokens = registered(
            &mut r,
            "cached_prompt_tokens",
            "Prompt tokens served from the prefix cache: as the server reported, or as predicted \
             where it reported none",
            Family::default(),
        );
        let cached_prompt_tokens_estimated = registered(
            &mut r,
            "cached_prompt_tokens_estimated",
            "The cached prompt tokens counted from the routing prediction, because the server's \
             usage had no cached_tokens (vLLM without --enable-prompt-tokens-details)",
            Family::default(),
        );
        let completion_tokens = registered(
            &mut r,
            "completion_tokens",
            "Completion tokens",
            Family::default(),
        );
        let cost_usd = registered(
            &mut r,
            "cost_usd",
            "Cost of the tokens at the policy's prices",
            Family::default(),
        );
        let decision_duration_seconds = registered(
            &mut r,
            "decision_duration_seconds",
            "Time to classify, apply policy and decide",
            hist(decision_histogram),
        );
        let prediction_error_seconds = registered(
            &mut r,
            "prediction_error_seconds",
            "Absolute difference between observed and predicted TTFT",
            hist(latency_histogram),
        );
        let decisions = registered(
            &mut r,
            "decisions",
            "Routing decisions by reason",
            Family::default(),
        );
        let fallbacks = registered(
            &mut r,
            "fallbacks",
            "Decisions that fell back from prediction",
            Family::default(),
        );
        let stale_signals = registered(
            &mut r,
            "stale_signals",
            "Candidate endpoints whose scraped signals were older than the freshness budget",
            Family::default(),
        );
        let retries = registered(
            &mut r,
            "retries",
            "Attempts retried on the next-best endpoint",
            Family::default(),
        );
        let ejections = registered(
            &mut r,
            "endpoint_ejections",
            "Endpoints taken out of rotation by failure accrual (consecutive failures)",
            Family::default(),
        );
        let scrape_errors = registered(
            &mut r,
            "scrape_errors",
            "Failed scrapes of endpoint metrics",
            Family::default(),
        );
        let signal_fallbacks = registered(
            &mut r,
            "signal_fallbacks",
            "Switches of a pool to reading its engines directly because the signal service failed",
            Family::default(),
        );
        let signal_updates = registered(
            &mut r,
            "signal_updates",
            "Signal-service messages applied",
            Family::default(),
        );
        let signal_reading_age_seconds = registered(
            &mut r,
            "signal_reading_age_seconds",
            "Age of each signal-service reading on arrival, from the service's scrape",
            hist(itl_histogram),
        );
        let signal_notices = registered(
            &mut r,
            "signal_notices",
            "Request notices through the signal service: own sent or dropped, others' applied or lost",
            Family::default(),
        );
        let signal_stream_live = registered(
            &mut r,
            "signal_stream_live",
            "1 while a pool's engine readings come from the signal service, 0 while the proxy reads the engines",
            Family::default(),
        );
        let kv_event_batches = registered(
            &mut r,
            "kv_event_batches",
            "vLLM KV-event batches applied to the precise prefix index",
            Family::default(),
        );
        let signal_prefix_deltas = registered(
            &mut r,
            "signal_prefix_deltas",
            "Prefix-cache deltas (block hashes stored and removed) from the signal service applied to the precise prefix index",
            Family::default(),
        );
        let kv_event_errors = registered(
            &mut r,
            "kv_event_errors",
            "Failures on KV-event streams (sequence_gap and decode lose events and clear the endpoint's index)",
            Family::default(),
        );
        let endpoint_ttft_seconds = registered(
            &mut r,
            "endpoint_ttft_seconds",
            "TTFT observed by the proxy per endpoint, from dispatch (streams whose prediction is known)",
            hist(latency_histogram),
        );
        let endpoint_predicted_ttft_seconds = registered(
            &mut r,
            "endpoint_predicted_ttft_seconds",
            "TTFT predicted for the same requests as endpoint_ttft_seconds",
            hist(latency_histogram),
        );
        let endpoint_prediction_error_seconds = registered(
            &mut r,
            "endpoint_prediction_error_seconds",
            "Absolute difference between observed and predicted TTFT, per endpoint",
            hist(latency_histogram),
        );
        let rule_decisions = registered(
            &mut r,
            "rule_decisions",
            "Routing decisions whose policy evaluation matched a rule, by the model chosen",
            Family::default(),
        );
        let objective_decisions = registered(
            &mut r,
            "objective_decisions",
            "Routing decisions by the policy's objective and what decided the choice",
            Family::default(),
        );
        let connections = registered(
            &mut r,
            "connections",
            "Connections accepted on the outbound listener, by how they were served",
            Family::default(),
        );
        let forward_errors = registered(
            &mut r,
            "forward_errors",
            "Redirected connections forwarded as plain TCP that failed, by reason",
            Family::default(),
        );
        let target_evictions = registered(
            &mut r,
            "target_evictions",
            "Stacks of redirected inference targets stopped after their idle timeout",
            Counter::default(),
        );
        let policy_rejections = registered(
            &mut r,
            "policy_rejections",
            "Inference policy messages refused because they would leave a working target with no models, by reason (the working policy is kept)",
            Family::default(),
        );
        let guard = GuardMetrics {
            state: registered(
                &mut r,
                "guard_state",
                "A quality guard's state per tenant, rule and prompt family: 1 for the current one",
                Family::default(),
            ),
            gap: registered(
                &mut r,
                "guard_gap",
                "A quality guard's measured gap: P(requested model better) - P(rule's model better) over its window",
                Family::default(),
            ),
            verdicts: registered(
                &mut r,
                "guard_verdicts",
                "Judged samples by which answer the judge found better",
                Family::default(),
            ),
            held: registered(
                &mut r,
                "guard_held",
                "Requests a quality guard kept on the requested model, by why",
                Family::default(),
            ),
            samples: registered(
                &mut r,
                "guard_samples",
                "Requests sampled for judging, by what became of them",
                Family::default(),
            ),
        };
        let admission = AdmissionMetrics {
            held: registered(
                &mut r,
                "admission_held",
                "Requests held now for their service class's TTFT objective",
                Family::default(),
            ),
            held_work_seconds: registered(
                &mut r,
                "admission_held_work_seconds",
                "Predicted prefill seconds of the requests held now",
                Family::default(),
            ),
            held_seconds: registered(
                &mut r,
                "admission_held_seconds",
                "How long held requests waited, by how the hold ended",
                hist(latency_histogram),
            ),
            rejections: registered(
                &mut r,
                "admission_rejections",
                "Requests refused 429 by admission control, by reason",
                Family::default(),
            ),
        };
        let rollout = RolloutMetrics {
            requests: registered(
                &mut r,
                "rollout_requests",
                "Requests of a rollout's cohort and control arms, by outcome",
                Family::default(),
            ),
            ttft_seconds: registered(
                &mut r,
                "rollout_ttft_seconds",
                "Time to first token of a rollout's arms (streaming requests)",
                hist(latency_histogram),
            ),
            cost_usd: registered(
                &mut r,
                "rollout_cost_usd",
                "Cost of a rollout's arms' tokens at the policy's prices",
                Family::default(),
            ),
            rejections: registered(
                &mut r,
                "rollout_rejections",
                "Rollouts dropped as invalid (the policy is served without them), by reason",
                Family::default(),
            ),
            reports: registered(
                &mut r,
                "rollout_reports",
                "Rollout reports to the controller, by what became of them",
                Family::default(),
            ),
        };
        Self {
            registry: Arc::new(r),
            rollout,
            http: RequestMetrics {
                requests,
                errors,
                ttft_seconds,
                inter_token_latency_seconds,
                request_duration_seconds,
                prompt_tokens,
                cached_prompt_tokens,
                cached_prompt_tokens_estimated,
                completion_tokens,
                cost_usd,
                prediction_error_seconds,
                endpoint_ttft_seconds,
                endpoint_predicted_ttft_seconds,
                endpoint_prediction_error_seconds,
            },
            route: DecisionMetrics {
                decision_duration_seconds,
                decisions,
                fallbacks,
                stale_signals,
                rule_decisions,
                objective_decisions,
            },
            retry: RetryMetrics { retries, ejections },
            signals: SignalMetrics {
                scrape_errors,
                signal_fallbacks,
                signal_updates,
                signal_stream_live,
                signal_notices,
                signal_reading_age_seconds,
                kv_event_batches,
                kv_event_errors,
                signal_prefix_deltas,
            },
            server: ConnectionMetrics {
                connections,
                forward_errors,
                target_evictions,
            },
            discovery: DiscoveryMetrics { policy_rejections },
            guard,
            admission,
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl ConnectionMetrics {
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
}

impl RequestMetrics {
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
                arm: labels.arm.clone(),
            })
            .inc();
    }
}

impl DecisionMetrics {
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
            arm: "cohort".into(),
        };
        m.http.requests.get_or_create(&l).inc();
        m.http.cost_usd.get_or_create(&l).inc_by(0.5);
        m.http.ttft_seconds.get_or_create(&l).observe(0.2);
        m.http.error(&l, "503");
        let text = m.encode();
        assert!(text.contains(r#"kinference_proxy_requests_total{tenant="team-a/chat",requested_model="glm-5.3",served_model="qwen-3.6-27b",pool="qwen-3.6-27b",service_class="Standard",arm="cohort"} 1"#), "{text}");
        assert!(text.contains("kinference_proxy_cost_usd_total{"), "{text}");
        assert!(text.contains(r#"status="503",arm="cohort"} 1"#), "{text}");
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
            arm: String::new(),
        };
        m.http.observe_prediction(&l, "127.0.0.1:8003", 0.3, 0.2);
        m.route.rule_decisions(
            "team-a/chat",
            "glm-5.3",
            "qwen-3.6-27b",
            ["low-complexity-may-use-qwen"].into_iter(),
        );
        m.route
            .rule_decisions("team-a/chat", "glm-5.3", "glm-5.3", std::iter::empty());
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
        assert!(text.contains(r#"kinference_proxy_prediction_error_seconds_count{tenant="team-a/chat",requested_model="glm-5.3",served_model="qwen-3.6-27b",pool="qwen-3.6-27b",service_class="Standard",arm=""} 1"#));
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
        m.server.connection("inference_target");
        m.server.connection("inference_target");
        m.server.connection("forwarded");
        m.server.forward_error("connect");
        m.server.target_evictions.inc();
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
