//! A policy's rollout, as served and as its status records it.
//!
//! What a proxy is served follows the declared state and the controller's own decision: a
//! running rollout travels with its candidate filled in from the policy's own rules and balancer
//! where it leaves them unset; a promoted one's candidate becomes the policy's routing and no
//! rollout travels; an aborted one, or one the controller rolled back, is not served at all, so
//! every request gets the control policy. The rolled-back decision is the controller's memory in
//! manifest mode and, in Kubernetes, the policy's `status.rollout` too, which this module reads
//! back ([`outcome_of`]) and writes ([`status_of`]) so that a restarted controller keeps it.

use crate::inference::{balancer, rule};
use kinference_api::policy::{
    self as api, InferencePolicySpec, RolloutArmStatus, RolloutPhase, RolloutState, RolloutStatus,
    RolloutThresholdStatus,
};
use kinference_policy_core::{
    inference::{self as core, AssignBy, Balancer, Rule},
    rollout::{
        Comparison, Threshold, Thresholds,
        judge::{ArmSummary, DeclaredState, Outcome, Phase, VerdictKind},
    },
};

/// The policy's routing and rollout as served, from its own `rules` and `balancer`.
pub(crate) fn served(
    spec: &InferencePolicySpec,
    rules: Vec<Rule>,
    own_balancer: Balancer,
    rolled_back: bool,
) -> Result<(Vec<Rule>, Balancer, Option<core::Rollout>), String> {
    let Some(r) = &spec.rollout else {
        return Ok((rules, own_balancer, None));
    };
    let candidate_rules = || {
        r.candidate
            .rules
            .as_ref()
            .map_or_else(|| rules.clone(), |rs| rs.iter().map(rule).collect())
    };
    let candidate_balancer = || match &r.candidate.balancer {
        Some(b) => balancer(b, "spec.rollout.candidate.balancer"),
        None => Ok(own_balancer.clone()),
    };
    match r.state {
        RolloutState::Promoted => {
            let (rules, b) = (candidate_rules(), candidate_balancer()?);
            Ok((rules, b, None))
        }
        RolloutState::Aborted => Ok((rules, own_balancer, None)),
        RolloutState::Running if rolled_back => Ok((rules, own_balancer, None)),
        RolloutState::Running => {
            let rollout = core::Rollout {
                name: r.name.clone(),
                cohort_basis_points: api::Rollout::basis_points(r.cohort_percent),
                control_basis_points: api::Rollout::basis_points(r.control_percent),
                assign_by: match r.assign_by.as_str() {
                    "Workload" => AssignBy::Workload,
                    "Header" => AssignBy::Header,
                    "Request" => AssignBy::Request,
                    _ => AssignBy::Tenant,
                },
                header: r.header.clone(),
                candidate_rules: candidate_rules(),
                candidate_balancer: candidate_balancer()?,
                report_interval: r
                    .report_interval()
                    .map_err(|e| format!("spec.rollout.reportInterval: {e}"))?,
                window: r
                    .window()
                    .map_err(|e| format!("spec.rollout.window: {e}"))?,
                thresholds: thresholds(r),
            };
            Ok((rules, own_balancer, Some(rollout)))
        }
    }
}

/// The declared thresholds, with the minimum sample.
pub(crate) fn thresholds(r: &api::Rollout) -> Thresholds {
    let t = &r.thresholds;
    Thresholds {
        error_rate_increase: t.error_rate,
        fallback_rate_increase: t.fallback_rate,
        timeout_rate_increase: t.timeout_rate,
        ttft_p90_ratio: t.ttft_p90_ratio,
        ttft_p99_ratio: t.ttft_p99_ratio,
        saturation: t.saturation,
        min_samples: r.min_samples(),
        confidence: 0.0,
    }
}

pub(crate) fn declared_state(s: RolloutState) -> DeclaredState {
    match s {
        RolloutState::Running => DeclaredState::Running,
        RolloutState::Promoted => DeclaredState::Promoted,
        RolloutState::Aborted => DeclaredState::Aborted,
    }
}

fn phase_of(p: RolloutPhase) -> Phase {
    match p {
        RolloutPhase::Running => Phase::Running,
        RolloutPhase::RolledBack => Phase::RolledBack,
        RolloutPhase::Promoted => Phase::Promoted,
        RolloutPhase::Aborted => Phase::Aborted,
    }
}

fn api_phase(p: Phase) -> RolloutPhase {
    match p {
        Phase::Running => RolloutPhase::Running,
        Phase::RolledBack => RolloutPhase::RolledBack,
        Phase::Promoted => RolloutPhase::Promoted,
        Phase::Aborted => RolloutPhase::Aborted,
    }
}

/// Rounded to 6 significant decimals, so a status does not change on noise in the last digit.
fn round(x: f64) -> f64 {
    if x.is_finite() {
        (x * 1e6).round() / 1e6
    } else {
        0.0
    }
}

fn arm_status(a: &ArmSummary) -> RolloutArmStatus {
    RolloutArmStatus {
        requests: a.requests,
        errors: a.errors,
        fallbacks: a.fallbacks,
        timeouts: a.timeouts,
        ttft_samples: a.ttft_samples,
        cost_usd: round(a.cost_usd),
        tokens: a.tokens,
    }
}

fn arm_summary(a: &RolloutArmStatus) -> ArmSummary {
    ArmSummary {
        requests: a.requests,
        errors: a.errors,
        fallbacks: a.fallbacks,
        timeouts: a.timeouts,
        ttft_samples: a.ttft_samples,
        cost_usd: a.cost_usd,
        tokens: a.tokens,
    }
}

fn threshold_status(c: &Comparison) -> RolloutThresholdStatus {
    RolloutThresholdStatus {
        threshold: c.threshold.as_str().to_string(),
        estimate: round(c.estimate),
        low: round(c.low),
        high: round(c.high),
        limit: round(c.limit),
        closeness: round(c.closeness()),
        crossed: c.crossed(),
    }
}

fn comparison(t: &RolloutThresholdStatus) -> Option<Comparison> {
    Some(Comparison {
        threshold: Threshold::parse(&t.threshold)?,
        estimate: t.estimate,
        low: t.low,
        high: t.high,
        limit: t.limit,
    })
}

/// What `status.rollout` says of an outcome.
pub fn status_of(o: &Outcome) -> RolloutStatus {
    RolloutStatus {
        name: o.name.clone(),
        phase: api_phase(o.phase),
        verdict: o.verdict.map(|v| v.as_str().to_string()),
        crossed: o.crossed.map(|c| c.threshold.as_str().to_string()),
        message: (!o.message.is_empty()).then(|| o.message.clone()),
        min_samples: o.min_samples,
        cohort: arm_status(&o.cohort),
        control: arm_status(&o.control),
        proxies: o.proxies as u64,
        thresholds: o.comparisons.iter().map(threshold_status).collect(),
    }
}

/// The outcome a `status.rollout` records (thresholds this controller does not know are
/// skipped).
pub fn outcome_of(s: &RolloutStatus) -> Outcome {
    let comparisons: Vec<Comparison> = s.thresholds.iter().filter_map(comparison).collect();
    let crossed = s.crossed.as_deref().and_then(|name| {
        comparisons
            .iter()
            .find(|c| c.threshold.as_str() == name)
            .copied()
    });
    Outcome {
        name: s.name.clone(),
        phase: phase_of(s.phase),
        verdict: s.verdict.as_deref().and_then(|v| match v {
            "Insufficient" => Some(VerdictKind::Insufficient),
            "Hold" => Some(VerdictKind::Hold),
            "Rollback" => Some(VerdictKind::Rollback),
            _ => None,
        }),
        crossed,
        comparisons,
        cohort: arm_summary(&s.cohort),
        control: arm_summary(&s.control),
        min_samples: s.min_samples,
        proxies: usize::try_from(s.proxies).unwrap_or(usize::MAX),
        message: s.message.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_reads_back_from_its_status() {
        let crossed = Comparison {
            threshold: Threshold::ErrorRate,
            estimate: 0.25,
            low: 0.2,
            high: 0.3,
            limit: 0.02,
        };
        let o = Outcome {
            name: "spread".into(),
            phase: Phase::RolledBack,
            verdict: Some(VerdictKind::Rollback),
            crossed: Some(crossed),
            comparisons: vec![crossed],
            cohort: ArmSummary {
                requests: 400,
                errors: 100,
                cost_usd: 0.25,
                ..ArmSummary::default()
            },
            control: ArmSummary {
                requests: 410,
                ..ArmSummary::default()
            },
            min_samples: 400,
            proxies: 2,
            message: "rolled back".into(),
        };
        let s = status_of(&o);
        assert_eq!(s.phase, RolloutPhase::RolledBack);
        assert_eq!(s.crossed.as_deref(), Some("errorRate"));
        assert!(s.thresholds[0].crossed);
        assert!((s.thresholds[0].closeness - 10.0).abs() < 1e-9);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["cohort"]["requests"], 400);
        assert_eq!(json["thresholds"][0]["threshold"], "errorRate");
        let back: RolloutStatus = serde_json::from_value(json).unwrap();
        assert_eq!(outcome_of(&back), o);
    }
}
