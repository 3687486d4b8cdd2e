//! The controller's Prometheus metrics.
//!
//! Index sizes say what the controller knows; watch events and update latency say how
//! quickly it learns; stream counts (from the gRPC crate) say who is listening; rejected
//! resources and the parents served a last good policy say what bad configuration it is
//! riding out (docs/reliability.md, "Bad configuration"). Rollouts have their own names
//! (`kinference_controller_rollout_*`, [`RolloutMetrics`]): how each is faring against its
//! thresholds, for the experiment dashboard.

use kinference_policy_core::rollout::judge::{Outcome, PolicyKey, Rollback};
use kinference_policy_grpc::GrpcMetrics;
use kinference_policy_k8s_index::{IndexSizes, ResourceKind};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub kind: &'static str,
    pub op: &'static str,
}

/// A rejected resource version: the resource's kind, and why (see
/// `kinference_policy_core::inference::Rejection::reason`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    pub kind: &'static str,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    pub api: &'static str,
}

#[derive(Clone, Debug)]
pub struct Metrics {
    pub registry: Arc<Registry>,
    pub grpc: GrpcMetrics,
    /// The engine-signals service's (`kinference_policy_signals_*`).
    pub signals: kinference_policy_signals::SignalsMetrics,
    resources: Family<KindLabels, Gauge>,
    targets: Family<TargetLabels, Gauge>,
    invalid_policies: Gauge,
    last_good_parents: Gauge,
    rejected: Family<RejectionLabels, Counter>,
    events: Family<EventLabels, Counter>,
    manifest_errors: Counter,
    update_seconds: Histogram,
    ready: Arc<AtomicBool>,
    /// `kinference_controller_rollout_*`, encoded after the rest.
    pub rollout: RolloutMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutThresholdLabels {
    /// The InferencePolicy, `namespace/name`.
    pub policy: String,
    pub rollout: String,
    pub threshold: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutPhaseLabels {
    pub policy: String,
    pub rollout: String,
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutArmLabels {
    pub policy: String,
    pub rollout: String,
    pub arm: &'static str,
}

/// The rollout loop's metrics: rollbacks counted as they happen, the rest set from the
/// outcomes at every scrape (a rollout that went away leaves no series behind).
#[derive(Clone, Debug)]
pub struct RolloutMetrics {
    pub registry: Arc<Registry>,
    rollbacks: Family<RolloutThresholdLabels, Counter>,
    phase: Family<RolloutPhaseLabels, Gauge>,
    closeness: Family<RolloutThresholdLabels, Gauge<f64, AtomicU64>>,
    estimate: Family<RolloutThresholdLabels, Gauge<f64, AtomicU64>>,
    limit: Family<RolloutThresholdLabels, Gauge<f64, AtomicU64>>,
    requests: Family<RolloutArmLabels, Gauge>,
    errors: Family<RolloutArmLabels, Gauge>,
    /// Fetches of the peer replicas' window sums (`--rollout-peers`), by result.
    pub peer_fetches: crate::peers::PeerFetches,
}

impl RolloutMetrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("kinference_controller_rollout");
        let rollbacks = Family::<RolloutThresholdLabels, Counter>::default();
        registry.register(
            "rollbacks",
            "Rollouts the controller rolled back, by the threshold crossed",
            rollbacks.clone(),
        );
        let phase = Family::<RolloutPhaseLabels, Gauge>::default();
        registry.register(
            "phase",
            "1 for each rollout's phase (Running, RolledBack, Promoted, Aborted)",
            phase.clone(),
        );
        let closeness = Family::<RolloutThresholdLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "threshold_ratio",
            "How close the cohort is to each threshold: the favourable end of the interval, 0 at no change against control, 1 at the limit, above 1 crossed",
            closeness.clone(),
        );
        let estimate = Family::<RolloutThresholdLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "threshold_estimate",
            "Each threshold's estimate: the cohort's rate minus control's, the TTFT quantile ratio, or the cohort's saturation",
            estimate.clone(),
        );
        let limit = Family::<RolloutThresholdLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "threshold_limit",
            "Each declared threshold's limit",
            limit.clone(),
        );
        let requests = Family::<RolloutArmLabels, Gauge>::default();
        registry.register(
            "arm_requests",
            "Requests in each arm over the window",
            requests.clone(),
        );
        let errors = Family::<RolloutArmLabels, Gauge>::default();
        registry.register(
            "arm_errors",
            "Errors in each arm over the window",
            errors.clone(),
        );
        let peer_fetches = crate::peers::PeerFetches::default();
        registry.register(
            "peer_fetches",
            "Fetches of the other controller replicas' rollout windows (--rollout-peers), by result",
            peer_fetches.clone(),
        );
        Self {
            registry: Arc::new(registry),
            peer_fetches,
            rollbacks,
            phase,
            closeness,
            estimate,
            limit,
            requests,
            errors,
        }
    }

    /// Counts a rollback.
    pub fn rolled_back(&self, rb: &Rollback) {
        self.rollbacks
            .get_or_create(&RolloutThresholdLabels {
                policy: format!("{}/{}", rb.key.namespace, rb.key.policy),
                rollout: rb.key.rollout.clone(),
                threshold: rb.crossed.threshold.as_str(),
            })
            .inc();
    }

    /// Sets the gauges from the loop's outcomes.
    pub fn set_outcomes(&self, outcomes: &BTreeMap<PolicyKey, Outcome>) {
        self.phase.clear();
        self.closeness.clear();
        self.estimate.clear();
        self.limit.clear();
        self.requests.clear();
        self.errors.clear();
        for ((ns, name), o) in outcomes {
            let policy = format!("{ns}/{name}");
            self.phase
                .get_or_create(&RolloutPhaseLabels {
                    policy: policy.clone(),
                    rollout: o.name.clone(),
                    phase: o.phase.as_str(),
                })
                .set(1);
            for c in &o.comparisons {
                let labels = RolloutThresholdLabels {
                    policy: policy.clone(),
                    rollout: o.name.clone(),
                    threshold: c.threshold.as_str(),
                };
                self.closeness.get_or_create(&labels).set(c.closeness());
                self.estimate.get_or_create(&labels).set(c.estimate);
                self.limit.get_or_create(&labels).set(c.limit);
            }
            for (arm, a) in [("cohort", &o.cohort), ("control", &o.control)] {
                let labels = RolloutArmLabels {
                    policy: policy.clone(),
                    rollout: o.name.clone(),
                    arm,
                };
                let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                self.requests.get_or_create(&labels).set(n(a.requests));
                self.errors.get_or_create(&labels).set(n(a.errors));
            }
        }
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kinference_policy");
        let grpc = GrpcMetrics::register(&mut registry);
        let signals = kinference_policy_signals::SignalsMetrics::register(&mut registry);
        let resources = Family::<KindLabels, Gauge>::default();
        registry.register(
            "index_resources",
            "Resources in the index, by kind",
            resources.clone(),
        );
        let targets = Family::<TargetLabels, Gauge>::default();
        registry.register(
            "index_watched_targets",
            "Targets with a publisher in the index, by API",
            targets.clone(),
        );
        let invalid_policies = Gauge::default();
        registry.register(
            "index_invalid_policies",
            "InferencePolicies selected for a target but not served because they are invalid",
            invalid_policies.clone(),
        );
        let last_good_parents = Gauge::default();
        registry.register(
            "index_last_good_parents",
            "Watched parents served a last good policy because a newer version of it, or of a resource it depends on, was rejected",
            last_good_parents.clone(),
        );
        let rejected = Family::<RejectionLabels, Counter>::default();
        registry.register(
            "rejected_resources",
            "Resource versions rejected (invalid, or unreadable by the source), by kind and reason; each version once",
            rejected.clone(),
        );
        let events = Family::<EventLabels, Counter>::default();
        registry.register(
            "watch_events",
            "Resource changes applied to the index, by kind and operation",
            events.clone(),
        );
        let manifest_errors = Counter::default();
        registry.register(
            "manifest_errors",
            "Manifest documents that could not be read",
            manifest_errors.clone(),
        );
        let update_seconds = Histogram::new([
            0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0,
        ]);
        registry.register(
            "index_update_seconds",
            "Time to apply one batch of changes to the index and publish the results",
            update_seconds.clone(),
        );
        Self {
            registry: Arc::new(registry),
            grpc,
            signals,
            resources,
            targets,
            invalid_policies,
            last_good_parents,
            rejected,
            events,
            manifest_errors,
            update_seconds,
            ready: Arc::default(),
            rollout: RolloutMetrics::new(),
        }
    }

    pub fn set_sizes(&self, sizes: &IndexSizes) {
        for (kind, n) in &sizes.resources {
            self.resources
                .get_or_create(&KindLabels {
                    kind: kind.as_str(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        for (api, n) in [
            ("outbound", sizes.outbound_targets),
            ("inference", sizes.inference_targets),
            ("destination", sizes.pool_targets + sizes.service_targets),
        ] {
            self.targets
                .get_or_create(&TargetLabels { api })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.invalid_policies
            .set(i64::try_from(sizes.invalid_policies).unwrap_or(i64::MAX));
        self.last_good_parents
            .set(i64::try_from(sizes.last_good_parents).unwrap_or(i64::MAX));
        // The index counts; the counters follow its totals, which never go down.
        for ((kind, reason), total) in &sizes.rejections {
            let counter = self.rejected.get_or_create(&RejectionLabels {
                kind: kind.as_str(),
                reason: reason.clone(),
            });
            let seen = counter.get();
            if *total > seen {
                counter.inc_by(total - seen);
            }
        }
    }

    pub fn event(&self, kind: ResourceKind, op: &'static str) {
        self.events
            .get_or_create(&EventLabels {
                kind: kind.as_str(),
                op,
            })
            .inc();
    }

    pub fn manifest_error(&self) {
        self.manifest_errors.inc();
    }

    pub fn observe_update(&self, seconds: f64) {
        self.update_seconds.observe(seconds);
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Every metric in the text format: the controller's, then the rollouts'.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        use prometheus_client::encoding::text;
        let mut body = String::new();
        text::encode_registry(&mut body, &self.registry)?;
        text::encode_registry(&mut body, &self.rollout.registry)?;
        text::encode_eof(&mut body)?;
        Ok(body)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
