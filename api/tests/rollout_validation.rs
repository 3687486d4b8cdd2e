//! A policy's rollout: one test per mistake, each from the example scenario with a good rollout
//! (which validates clean), checking the exact field path and message.

use std::path::PathBuf;

use kinference_api::{
    InferenceClassifier, InferencePolicy, InferencePool,
    policy::{
        Balancer, BalancerMode, PolicyRule, Rollout, RolloutCandidate, RolloutState,
        RolloutThresholds, RuleAction, RuleMatch,
    },
    validate::ErrorKind,
    validate_policy,
};

fn read_all<T: serde::de::DeserializeOwned>(file: &str) -> Vec<T> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| T::deserialize(doc).unwrap())
        .collect()
}

fn good_rollout() -> Rollout {
    serde_json::from_value(serde_json::json!({
        "name": "qwen-for-everything",
        "candidate": {
            "rules": [{"name": "all-may-use-qwen", "action": {"addModels": ["qwen-3.6-27b"]}}],
        },
        "cohortPercent": 10,
        "controlPercent": 10,
        "assignBy": "Header",
        "header": "x-user-id",
        "window": "5m",
        "minSamples": 200,
        "thresholds": {"errorRate": 0.02, "ttftP90Ratio": 1.2},
    }))
    .unwrap()
}

fn with(rollout: Rollout) -> Vec<(String, ErrorKind, String)> {
    let mut policy: InferencePolicy = read_all("policy.yaml").remove(0);
    policy.spec.rollout = Some(rollout);
    let classifier: InferenceClassifier = read_all("classifier.yaml").remove(0);
    let pools: Vec<InferencePool> = read_all("inferencepools.yaml");
    match validate_policy(&policy, std::slice::from_ref(&classifier), &pools) {
        Ok(()) => vec![],
        Err(e) => e
            .into_iter()
            .map(|e| (e.field, e.kind, e.message))
            .collect(),
    }
}

fn fields(errors: &[(String, ErrorKind, String)]) -> Vec<&str> {
    errors.iter().map(|e| e.0.as_str()).collect()
}

#[test]
fn a_good_rollout_is_clean_and_reads_its_defaults() {
    assert_eq!(with(good_rollout()), vec![]);
    let r = good_rollout();
    assert_eq!(r.state, RolloutState::Running);
    assert_eq!(r.window().unwrap().as_secs(), 300);
    let minimal: Rollout = serde_json::from_value(serde_json::json!({
        "name": "r", "candidate": {"balancer": {"tieWindow": "0s"}},
        "cohortPercent": 5, "controlPercent": 5, "thresholds": {"saturation": 0.9},
    }))
    .unwrap();
    assert_eq!(minimal.assign_by, "Tenant");
    assert_eq!(minimal.min_samples(), 400);
    assert_eq!(minimal.window().unwrap().as_secs(), 600);
    assert_eq!(minimal.report_interval().unwrap().as_secs(), 5);
    assert_eq!(Rollout::basis_points(12.5), 1_250);
    assert_eq!(with(minimal), vec![]);
}

#[test]
fn shares_out_of_range_or_past_the_whole_are_denied() {
    let mut r = good_rollout();
    r.cohort_percent = 0.0;
    r.control_percent = 120.0;
    let errors = with(r);
    assert_eq!(
        errors
            .iter()
            .map(|e| (e.0.as_str(), e.2.as_str()))
            .collect::<Vec<_>>(),
        [
            ("spec.rollout.cohortPercent", "0 must be in (0, 100]"),
            ("spec.rollout.controlPercent", "120 must be in (0, 100]"),
            (
                "spec.rollout.controlPercent",
                "cohortPercent 0 + controlPercent 120 is more than 100: the arms are disjoint \
                 shares of the keys"
            ),
        ]
    );
    let mut r = good_rollout();
    r.cohort_percent = 60.0;
    r.control_percent = 50.0;
    assert_eq!(fields(&with(r)), ["spec.rollout.controlPercent"]);
}

#[test]
fn an_unknown_key_or_a_header_without_a_name_is_denied() {
    let mut r = good_rollout();
    r.assign_by = "Cookie".into();
    let errors = with(r);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].0, "spec.rollout.assignBy");
    assert_eq!(errors[0].1, ErrorKind::NotSupported);
    assert_eq!(
        errors[0].2,
        "\"Cookie\" is not a key the proxies can assign arms by: one of Tenant, Workload, \
         Header, Request"
    );
    let mut r = good_rollout();
    r.header = None;
    assert_eq!(
        with(r)[0].2,
        "assignBy Header needs the header's name (e.g. x-user-id)"
    );
    let mut r = good_rollout();
    r.header = Some("x user".into());
    assert_eq!(fields(&with(r)), ["spec.rollout.header"]);
    let mut r = good_rollout();
    r.assign_by = "Tenant".into();
    assert_eq!(with(r)[0].2, "applies to assignBy Header only, not Tenant");
}

#[test]
fn thresholds_missing_negative_or_uncrossable_are_denied() {
    let mut r = good_rollout();
    r.thresholds = RolloutThresholds::default();
    let errors = with(r);
    assert_eq!(fields(&errors), ["spec.rollout.thresholds"]);
    assert_eq!(errors[0].1, ErrorKind::Required);
    let mut r = good_rollout();
    r.thresholds = RolloutThresholds {
        error_rate: Some(-0.1),
        ttft_p99_ratio: Some(0.8),
        saturation: Some(0.0),
        ..RolloutThresholds::default()
    };
    let errors = with(r);
    assert_eq!(
        errors
            .iter()
            .map(|e| (e.0.as_str(), e.2.as_str()))
            .collect::<Vec<_>>(),
        [
            (
                "spec.rollout.thresholds.errorRate",
                "-0.1 must be in [0, 1]"
            ),
            (
                "spec.rollout.thresholds.ttftP99Ratio",
                "0.8 must be 1 or more"
            ),
            ("spec.rollout.thresholds.saturation", "0 must be in (0, 1]"),
        ]
    );
    let mut r = good_rollout();
    r.min_samples = Some(0);
    r.window = Some("0s".into());
    assert_eq!(
        fields(&with(r)),
        ["spec.rollout.window", "spec.rollout.minSamples"]
    );
}

#[test]
fn a_report_interval_too_short_too_long_or_unparsed_is_denied() {
    let interval = |i: &str| {
        let mut r = good_rollout();
        r.report_interval = Some(i.into());
        with(r)
    };
    assert_eq!(interval("2s"), vec![]);
    // The window is 5m: a report every 150s still leaves two in it.
    assert_eq!(interval("150s"), vec![]);
    for (i, says) in [
        ("500ms", "is shorter than 1s"),
        ("151s", "is more than half the window (300s)"),
        ("soon", ""),
    ] {
        let errors = interval(i);
        assert_eq!(fields(&errors), ["spec.rollout.reportInterval"], "{i}");
        assert!(errors[0].2.contains(says), "{i}: {errors:?}");
        assert_eq!(errors[0].1, ErrorKind::Invalid, "{i}");
    }
}

#[test]
fn a_candidate_may_change_routing_only() {
    // A rule naming a model the policy does not declare: the cohort would be served by another
    // model than control's.
    let mut r = good_rollout();
    r.candidate.rules = Some(vec![PolicyRule {
        name: "to-another-model".into(),
        r#match: RuleMatch::default(),
        action: RuleAction {
            rewrite_to: Some("llama-4".into()),
            ..RuleAction::default()
        },
        quality_guard: None,
    }]);
    let errors = with(r);
    assert_eq!(
        fields(&errors),
        ["spec.rollout.candidate.rules[0].action.rewriteTo"]
    );
    assert!(
        errors[0].2.contains("is not declared in spec.models"),
        "{}",
        errors[0].2
    );
    // The schema of a candidate has no models: a candidate that declares some does not read.
    let models: Result<RolloutCandidate, _> = serde_json::from_value(serde_json::json!({
        "models": [{"name": "llama-4"}],
    }));
    assert_eq!(models.unwrap(), RolloutCandidate::default());
    let mut r = good_rollout();
    r.candidate = RolloutCandidate::default();
    assert_eq!(fields(&with(r)), ["spec.rollout.candidate"]);
    // A candidate balancer is held to the policy balancer's checks, at its own path.
    let mut r = good_rollout();
    r.candidate.balancer = Some(Balancer {
        freshness_budget: "0s".into(),
        mode: BalancerMode::Shadow,
        ..Balancer::default()
    });
    assert_eq!(
        fields(&with(r)),
        ["spec.rollout.candidate.balancer.freshnessBudget"]
    );
}

#[test]
fn a_candidate_declaring_models_as_written_is_denied() {
    let document = serde_json::json!({"spec": {"rollout": {"candidate": {
        "rules": [], "models": [{"name": "llama-4"}], "timeouts": {},
    }}}});
    let errors = kinference_api::validate_policy_document(&document).unwrap_err();
    let fields: Vec<&str> = errors.errors().iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.rollout.candidate.models",
            "spec.rollout.candidate.timeouts"
        ]
    );
    assert!(
        errors.errors()[0]
            .message
            .contains("only routing (rules, balancer)")
    );
    let routing = serde_json::json!({"spec": {"rollout": {"candidate": {"rules": []}}}});
    assert!(kinference_api::validate_policy_document(&routing).is_ok());
}
