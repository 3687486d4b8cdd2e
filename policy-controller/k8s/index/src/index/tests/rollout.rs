//! A policy's rollout as served: running (candidate filled in from the policy's own routing),
//! promoted (the candidate is the policy), aborted, and rolled back by the controller (in memory
//! and as the status records it).

use super::*;
use kinference_api::policy::{InferencePolicyStatus, RolloutPhase, RolloutStatus};
use kinference_policy_core::{
    inference::AssignBy,
    rollout::{judge::DeclaredState, window::RolloutKey},
};

fn with_rollout(state: &str, name: &str) -> String {
    format!(
        r#"{}  rollout:
    name: {name}
    candidate:
      balancer: {{freshnessBudget: 100ms, failureMode: FailOpen, tieWindow: 5ms}}
    cohortPercent: 10
    controlPercent: 12.5
    assignBy: Header
    header: x-user
    window: 2m
    minSamples: 300
    reportInterval: 10s
    thresholds: {{errorRate: 0.02, ttftP90Ratio: 1.2}}
    state: {state}
"#,
        policy("HTTPRoute", "llm", "qwen-3.6-27b")
    )
}

fn served(index: &SharedIndex) -> InferencePolicy {
    index
        .read()
        .inference_policy(&target("llm", 8000))
        .policy()
        .cloned()
        .expect("served")
}

use kinference_policy_core::InferencePolicy;

fn rollout_key(name: &str) -> RolloutKey {
    RolloutKey::new(NS, "llm", name)
}

#[test]
fn a_running_rollout_is_served_with_the_policy_routing_filled_in() {
    let index = scenario();
    apply_yaml(&mut index.write(), &with_rollout("Running", "spread"));
    let p = served(&index);
    let r = p.rollout.as_ref().expect("a running rollout is served");
    assert_eq!(r.name, "spread");
    assert_eq!(
        (r.cohort_basis_points, r.control_basis_points),
        (1000, 1250)
    );
    assert_eq!(r.assign_by, AssignBy::Header);
    assert_eq!(r.header.as_deref(), Some("x-user"));
    // Rules unset in the candidate: the policy's own. Balancer set: the candidate's.
    assert_eq!(r.candidate_rules, p.rules);
    assert_eq!(
        r.candidate_balancer.freshness_budget,
        Duration::from_millis(100)
    );
    assert_eq!(r.candidate_balancer.failure_mode, FailureMode::FailOpen);
    // The control keeps the policy's own balancer.
    assert_eq!(p.balancer.failure_mode, FailureMode::FailClose);
    assert_eq!(r.window, Duration::from_secs(120));
    assert_eq!(r.report_interval, Duration::from_secs(10));
    assert_eq!(r.thresholds.min_samples, 300);
    assert_eq!(r.thresholds.error_rate_increase, Some(0.02));
    let declared = index.read().declared_rollouts();
    assert_eq!(declared.len(), 1);
    assert_eq!(declared[0].key, rollout_key("spread"));
    assert_eq!(declared[0].state, DeclaredState::Running);
    assert!(!declared[0].rolled_back);
}

#[test]
fn promoted_serves_the_candidate_as_the_policy_and_aborted_serves_none() {
    let index = scenario();
    apply_yaml(&mut index.write(), &with_rollout("Promoted", "spread"));
    let p = served(&index);
    assert_eq!(p.rollout, None);
    assert_eq!(p.balancer.freshness_budget, Duration::from_millis(100));
    assert_eq!(p.balancer.failure_mode, FailureMode::FailOpen);
    assert_eq!(p.rules.len(), 1, "the candidate left the rules unset");
    apply_yaml(&mut index.write(), &with_rollout("Aborted", "spread"));
    let p = served(&index);
    assert_eq!(p.rollout, None);
    assert_eq!(p.balancer.failure_mode, FailureMode::FailClose);
}

#[test]
fn a_rolled_back_rollout_is_not_served_again_until_renamed() {
    let index = scenario();
    apply_yaml(&mut index.write(), &with_rollout("Running", "spread"));
    let mut rx = index
        .watch_inference_policy(&target("llm", 8000))
        .expect("watch");
    assert!(rx.borrow_and_update().policy().unwrap().rollout.is_some());
    index.write().roll_back(&rollout_key("spread"));
    assert!(rx.has_changed().unwrap(), "watchers hear of the rollback");
    assert_eq!(rx.borrow_and_update().policy().unwrap().rollout, None);
    assert!(index.read().declared_rollouts()[0].rolled_back);
    // Re-applying the same declaration (a reload, a status update) keeps it rolled back.
    apply_yaml(&mut index.write(), &with_rollout("Running", "spread"));
    assert_eq!(served(&index).rollout, None);
    // A rollout of another name is not the other's: it is served.
    index.write().roll_back(&rollout_key("other"));
    apply_yaml(&mut index.write(), &with_rollout("Running", "spread-2"));
    assert_eq!(served(&index).rollout.unwrap().name, "spread-2");
}

#[test]
fn a_rollback_the_status_records_holds_across_restarts() {
    // A fresh index (a restarted controller) reads the policy with its status.
    let index = scenario();
    let yaml = with_rollout("Running", "spread");
    let value: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    let Resource::InferencePolicy(mut p) = Resource::from_yaml(value, NS).unwrap().unwrap() else {
        panic!("a policy");
    };
    let status = |name: &str| InferencePolicyStatus {
        conditions: vec![],
        rollout: Some(RolloutStatus {
            name: name.into(),
            phase: RolloutPhase::RolledBack,
            verdict: Some("Rollback".into()),
            crossed: Some("errorRate".into()),
            ..RolloutStatus::default()
        }),
    };
    p.status = Some(status("spread"));
    index.write().apply(Resource::InferencePolicy(p.clone()));
    assert_eq!(served(&index).rollout, None);
    let declared = index.read().declared_rollouts();
    assert!(declared[0].rolled_back);
    assert_eq!(declared[0].persisted.as_ref().unwrap().name, "spread");
    // A status about an older rollout does not hold a new one back.
    p.status = Some(status("older"));
    index.write().apply(Resource::InferencePolicy(p));
    assert_eq!(served(&index).rollout.unwrap().name, "spread");
    assert_eq!(index.read().declared_rollouts()[0].persisted, None);
}
