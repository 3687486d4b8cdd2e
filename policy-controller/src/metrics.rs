//! The controller's Prometheus metrics.
//!
//! Index sizes say what the controller knows; watch events and update latency say how
//! quickly it learns; stream counts (from the gRPC crate) say who is listening; rejected
//! resources and the parents served a last good policy say what bad configuration it is
//! riding out (docs/reliability.md, "Bad configuration").

use kinference_policy_grpc::GrpcMetrics;
use kinference_policy_k8s_index::{IndexSizes, ResourceKind};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
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
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
