//! A request's arm under the policy's rollout, and what its answer adds to the arm's measures.
//!
//! A rollout tries a candidate routing on a sticky cohort beside a control group that keeps the
//! policy's own, so that the controller can compare the two and roll the cohort back. The route
//! layer computes each request's arm from the rollout's split ([`arm_of`]: the tenant, the
//! workload, a declared header, or a draw), decides a cohort request under the cohort's policy
//! (`Policy::cohort`: the same models, the candidate's rules and balancer), and carries an
//! [`ArmTag`] with the request to the end of its answer. There the tag records the outcome once,
//! whichever way the request ended (refused after its decision, every attempt failed, or an
//! answer streamed to its end): the `kinference_proxy_rollout_*` metrics for dashboards, and the
//! [`RolloutLedger`] the reporter sends to the controller. The rest (in neither arm) is decided
//! as control is and not measured: its records still say `rest`.

use crate::metrics::{RolloutLabels, RolloutMetrics, RolloutOutcomeLabels};
use kinference_decision::{
    Workload,
    rollout::{Arm, AssignBy, Split},
};
use kinference_proxy_discovery::{ArmOutcome, RolloutLedger};
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

/// The arm of a request from `tenant` and `workload` with `headers` under `split`; `draw` is
/// called only for a split drawn per request.
pub fn arm_of(
    split: &Split,
    tenant: &str,
    workload: &Workload,
    headers: &http::HeaderMap,
    draw: impl FnOnce() -> u64,
) -> Arm {
    match &split.assign_by {
        AssignBy::Tenant => split.arm_of_key(tenant),
        AssignBy::Workload => {
            split.arm_of_key(&format!("{}/{}", workload.namespace, workload.name))
        }
        // A request without the header is in neither arm.
        AssignBy::Header(name) => headers
            .get(name.as_str())
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map_or(Arm::Rest, |v| split.arm_of_key(v)),
        AssignBy::Request => split.arm_of_draw(draw()),
    }
}

/// The rollout and arm a decision record names.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RolloutRecord {
    pub name: String,
    pub arm: &'static str,
}

/// How a request of an arm ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ended {
    /// The status answered.
    pub status: u16,
    /// The answer failed after its first byte.
    pub stream_failed: bool,
    /// It ended by a first-byte, idle or request timeout.
    pub timed_out: bool,
    pub ttft_s: Option<f64>,
    pub cost_usd: f64,
    pub tokens: u64,
}

/// A request's place in a rollout, from its decision to the end of its answer.
#[derive(Debug)]
pub struct ArmTag {
    pub rollout: Arc<str>,
    pub arm: Arm,
    /// The decision fell back (fail-open routed, or fail-close refused).
    fallback: bool,
    /// The saturation of the endpoint it was sent to, at dispatch.
    saturation: Option<f64>,
    /// The last attempt ended by its first-byte timeout.
    attempt_timed_out: AtomicBool,
    recorded: AtomicBool,
    ledger: Arc<RolloutLedger>,
    metrics: RolloutMetrics,
}

impl ArmTag {
    pub fn new(
        rollout: Arc<str>,
        arm: Arm,
        fallback: bool,
        saturation: Option<f64>,
        ledger: Arc<RolloutLedger>,
        metrics: RolloutMetrics,
    ) -> Self {
        Self {
            rollout,
            arm,
            fallback,
            saturation,
            attempt_timed_out: AtomicBool::new(false),
            recorded: AtomicBool::new(false),
            ledger,
            metrics,
        }
    }

    pub fn record_of(&self) -> RolloutRecord {
        RolloutRecord {
            name: self.rollout.to_string(),
            arm: self.arm.as_str(),
        }
    }

    /// Whether the latest attempt ended by its first-byte timeout (the retry layer says).
    pub fn set_attempt_timed_out(&self, timed_out: bool) {
        self.attempt_timed_out.store(timed_out, Ordering::Relaxed);
    }

    /// Records how the request ended, once; nothing for the rest.
    ///
    /// The report counts errors, fallbacks and timeouts apart (a fallback that failed is both);
    /// the metric's `outcome` is one of them, the most telling first: `timeout`, `error`,
    /// `fallback`, else `ok` (a 4xx the client caused included).
    pub fn record(&self, end: Ended) {
        if self.arm == Arm::Rest || self.recorded.swap(true, Ordering::Relaxed) {
            return;
        }
        let timeout =
            end.timed_out || (self.attempt_timed_out.load(Ordering::Relaxed) && end.status >= 500);
        let error = !timeout && (end.status >= 500 || end.stream_failed);
        let outcome = ArmOutcome {
            error,
            fallback: self.fallback,
            timeout,
            ttft_s: end.ttft_s,
            saturation: self.saturation,
            cost_usd: end.cost_usd,
            tokens: end.tokens,
        };
        let labels = RolloutLabels {
            rollout: self.rollout.to_string(),
            arm: self.arm.as_str().into(),
        };
        let name = if timeout {
            "timeout"
        } else if error {
            "error"
        } else if self.fallback {
            "fallback"
        } else {
            "ok"
        };
        self.metrics
            .requests
            .get_or_create(&RolloutOutcomeLabels {
                rollout: labels.rollout.clone(),
                arm: labels.arm.clone(),
                outcome: name.into(),
            })
            .inc();
        if let Some(t) = end.ttft_s {
            self.metrics.ttft_seconds.get_or_create(&labels).observe(t);
        }
        if end.cost_usd.is_finite() && end.cost_usd > 0.0 {
            self.metrics
                .cost_usd
                .get_or_create(&labels)
                .inc_by(end.cost_usd);
        }
        self.ledger.record(&self.rollout, self.arm, &outcome);
    }
}

/// A new random id for a proxy that was not told its pod's name.
pub fn random_proxy_id() -> String {
    format!("proxy-{:016x}", rand::random::<u64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Metrics, TTFT_BUCKETS};

    fn split(assign_by: AssignBy) -> Split {
        Split {
            name: "cheaper".into(),
            cohort: 3_000,
            control: 3_000,
            assign_by,
        }
    }

    #[test]
    fn a_tenant_keeps_its_arm_and_each_key_is_the_declared_one() {
        let w = Workload::parse("apps/web", vec![]);
        let none = http::HeaderMap::new();
        let by_tenant = split(AssignBy::Tenant);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..200 {
            let tenant = format!("team-{i}/chat");
            let arm = arm_of(&by_tenant, &tenant, &w, &none, || unreachable!());
            // Sticky, and the split's own function of the key.
            for _ in 0..3 {
                assert_eq!(arm_of(&by_tenant, &tenant, &w, &none, || 0), arm);
            }
            assert_eq!(arm, by_tenant.arm_of_key(&tenant));
            seen.insert(arm);
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
        // By workload: every tenant of the workload is in the workload's arm.
        let by_workload = split(AssignBy::Workload);
        let arm = by_workload.arm_of_key("apps/web");
        for i in 0..20 {
            assert_eq!(
                arm_of(&by_workload, &format!("t-{i}"), &w, &none, || 0),
                arm
            );
        }
        // By header: its value; without it, the rest.
        let by_header = split(AssignBy::Header("x-user-id".into()));
        let mut h = http::HeaderMap::new();
        h.insert("x-user-id", "user-7".parse().unwrap());
        assert_eq!(
            arm_of(&by_header, "t", &w, &h, || 0),
            by_header.arm_of_key("user-7")
        );
        assert_eq!(arm_of(&by_header, "t", &w, &none, || 0), Arm::Rest);
        // By request: the draw.
        let by_request = split(AssignBy::Request);
        for d in 0..50 {
            assert_eq!(
                arm_of(&by_request, "t", &w, &none, || d),
                by_request.arm_of_draw(d)
            );
        }
    }

    #[test]
    fn an_arm_records_once_with_one_outcome_and_the_rest_not_at_all() {
        let m = Metrics::new();
        let ledger = Arc::new(RolloutLedger::new(&TTFT_BUCKETS));
        let tag = |arm, fallback| {
            ArmTag::new(
                "cheaper".into(),
                arm,
                fallback,
                Some(0.4),
                ledger.clone(),
                m.rollout.clone(),
            )
        };
        let ok = Ended {
            status: 200,
            ttft_s: Some(0.2),
            cost_usd: 0.01,
            tokens: 50,
            ..Ended::default()
        };
        let t = tag(Arm::Cohort, false);
        t.record(ok);
        t.record(ok);
        tag(Arm::Cohort, true).record(ok);
        let timed_out = tag(Arm::Control, false);
        timed_out.set_attempt_timed_out(true);
        timed_out.record(Ended {
            status: 502,
            ..Ended::default()
        });
        tag(Arm::Control, false).record(Ended {
            status: 200,
            stream_failed: true,
            ..Ended::default()
        });
        tag(Arm::Control, false).record(Ended {
            status: 429,
            ..Ended::default()
        });
        tag(Arm::Rest, false).record(ok);
        let text = m.encode();
        for (arm, outcome, n) in [
            ("cohort", "ok", 1),
            ("cohort", "fallback", 1),
            ("control", "timeout", 1),
            ("control", "error", 1),
            ("control", "ok", 1),
        ] {
            let line = format!(
                r#"kinference_proxy_rollout_requests_total{{rollout="cheaper",arm="{arm}",outcome="{outcome}"}} {n}"#
            );
            assert!(text.contains(&line), "{line}\n{text}");
        }
        assert!(!text.contains(r#"arm="rest""#), "{text}");
        assert!(text.contains(
            r#"kinference_proxy_rollout_ttft_seconds_count{rollout="cheaper",arm="cohort"} 2"#
        ));
        assert!(text.contains(r#"kinference_proxy_rollout_ttft_seconds_bucket{le="0.25",rollout="cheaper",arm="cohort"} 2"#), "{text}");
        assert!(text.contains(
            r#"kinference_proxy_rollout_cost_usd_total{rollout="cheaper",arm="cohort"} 0.02"#
        ));
        let d = ledger.take("cheaper");
        assert_eq!((d.cohort.requests, d.cohort.fallbacks), (2, 1));
        assert_eq!(d.cohort.tokens, 100);
        assert_eq!(d.cohort.saturation, 0.4);
        assert_eq!(
            (d.control.requests, d.control.errors, d.control.timeouts),
            (3, 1, 1)
        );
    }
}
