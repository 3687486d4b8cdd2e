use super::*;
use crate::policy::{FailureMode, Mode, tests::example};
use kinference_classify::{ClassifierId, Tag};
use kinference_routing::{EndpointMeta, RouterConfig, Scrape};
use rand::{SeedableRng, rngs::SmallRng};

fn router(endpoints: &[(&str, u16)]) -> Router {
    let mut r = Router::new(RouterConfig::default());
    for (model, port) in endpoints {
        let id = EndpointId::from(format!("127.0.0.1:{port}"));
        r.upsert_endpoint(EndpointMeta::new(id.clone(), *model), Time::ZERO);
        r.set_ready(&id, true).unwrap();
    }
    r
}

fn scrape(r: &mut Router, port: u16, waiting: u32, at: Time) {
    r.observe_scrape(
        &EndpointId::from(format!("127.0.0.1:{port}")),
        &Scrape {
            num_requests_waiting: Some(waiting),
            num_requests_running: Some(0),
            kv_cache_usage: Some(0.0),
            ..Scrape::default()
        },
        at,
    )
    .unwrap();
}

fn policy(mode: Mode, failure_mode: FailureMode) -> Policy {
    let mut p = example();
    p.balancer.mode = mode;
    p.balancer.failure_mode = failure_mode;
    p
}

fn tags(pairs: &[(&str, &str)]) -> Tags {
    let mut t = Tags::new();
    for (name, value) in pairs {
        t.insert(Tag {
            name: (*name).into(),
            value: (*value).into(),
            confidence: 0.9,
            source: ClassifierId::Rules,
        });
    }
    t
}

/// The plan for a 100-token request for `requested`, at `now`.
fn plan(policy: &Policy, router: &Router, requested: &str, tags: &Tags, now: Time) -> Plan {
    let blocks = PromptBlocks::from_text(b"hello", &Default::default());
    let workload = Workload::default();
    let input = Input {
        requested,
        tags,
        workload: &workload,
        prompt_tokens: 100,
        max_tokens: None,
        prompt_blocks: &blocks,
        block_hasher: None,
        max_attempts: usize::MAX,
    };
    decide(policy, router, &input, now, &mut SmallRng::seed_from_u64(7)).unwrap()
}

fn endpoints(plan: &Plan) -> Vec<&str> {
    plan.order
        .iter()
        .map(|&i| plan.decision.candidates[i].endpoint.as_str())
        .collect()
}

#[test]
fn enforce_picks_the_lowest_prediction_and_orders_retries() {
    let mut r = router(&[("glm-5.3", 1), ("glm-5.3", 2)]);
    scrape(&mut r, 1, 40, Time::ZERO);
    scrape(&mut r, 2, 0, Time::ZERO);
    let p = plan(
        &policy(Mode::Enforce, FailureMode::FailOpen),
        &r,
        "glm-5.3",
        &Tags::new(),
        Time::ZERO,
    );
    assert!(p.refused.is_none());
    assert_eq!(endpoints(&p), vec!["127.0.0.1:2", "127.0.0.1:1"]);
    assert_eq!(p.candidates.models, vec!["glm-5.3"]);
}

#[test]
fn the_rules_decide_which_models_are_candidates() {
    let mut r = router(&[("glm-5.3", 1), ("qwen-3.6-27b", 3)]);
    scrape(&mut r, 1, 60, Time::ZERO);
    scrape(&mut r, 3, 0, Time::ZERO);
    let p = policy(Mode::Enforce, FailureMode::FailOpen);
    // Tagged low: qwen (idle) may serve it and beats loaded glm; through the alias too.
    let low = plan(
        &p,
        &r,
        "default",
        &tags(&[("complexity", "low")]),
        Time::ZERO,
    );
    assert_eq!(low.candidates.requested_model, "glm-5.3");
    assert_eq!(endpoints(&low)[0], "127.0.0.1:3");
    assert!(low.candidates.rule_trace[0].matched);
    // Not tagged: only glm.
    let high = plan(
        &p,
        &r,
        "glm-5.3",
        &tags(&[("complexity", "high")]),
        Time::ZERO,
    );
    assert_eq!(endpoints(&high), vec!["127.0.0.1:1"]);
    // A name the policy does not know.
    let blocks = PromptBlocks::from_text(b"", &Default::default());
    let (t, w) = (Tags::new(), Workload::default());
    let input = Input {
        requested: "gpt-4o",
        tags: &t,
        workload: &w,
        prompt_tokens: 1,
        max_tokens: None,
        prompt_blocks: &blocks,
        block_hasher: None,
        max_attempts: usize::MAX,
    };
    let err = decide(&p, &r, &input, Time::ZERO, &mut SmallRng::seed_from_u64(1)).unwrap_err();
    assert_eq!(err, UnknownModel("gpt-4o".into()));
}

#[test]
fn fail_close_refuses_on_stale_signals_and_fail_open_routes() {
    for (mode, refused) in [
        (FailureMode::FailClose, true),
        (FailureMode::FailOpen, false),
    ] {
        let r = router(&[("glm-5.3", 1), ("glm-5.3", 2)]);
        // No scrape ever arrived: the core falls back.
        let p = plan(
            &policy(Mode::Enforce, mode),
            &r,
            "glm-5.3",
            &Tags::new(),
            Time::ZERO,
        );
        assert!(p.decision.reason.is_fallback());
        assert_eq!(p.refused.is_some(), refused, "{mode:?}");
        assert_eq!(p.order.is_empty(), refused);
        assert_eq!(p.fallback(), Some(mode));
    }
}

#[test]
fn signals_older_than_the_freshness_budget_fall_back() {
    let mut r = router(&[("glm-5.3", 1), ("glm-5.3", 2)]);
    scrape(&mut r, 1, 0, Time::ZERO);
    scrape(&mut r, 2, 0, Time::ZERO);
    let p = policy(Mode::Enforce, FailureMode::FailClose);
    let fresh = plan(&p, &r, "glm-5.3", &Tags::new(), Time::from_secs_f64(0.1));
    assert!(!fresh.decision.reason.is_fallback());
    assert!(fresh.refused.is_none());
    // Past the router's freshness budget (500 ms by default), nothing fresh is left.
    let stale = plan(&p, &r, "glm-5.3", &Tags::new(), Time::from_secs_f64(2.0));
    assert_eq!(
        stale.decision.reason,
        kinference_routing::Reason::FallbackStaleSignals
    );
    assert_eq!(stale.refused, Some(Refusal::FailClosed));
}

#[test]
fn shadow_records_the_decision_and_sends_within_the_requested_pool() {
    let mut r = router(&[("glm-5.3", 1), ("qwen-3.6-27b", 3)]);
    // qwen is idle, glm is loaded: the decision picks qwen but shadow sends to glm.
    scrape(&mut r, 1, 50, Time::ZERO);
    scrape(&mut r, 3, 0, Time::ZERO);
    let p = plan(
        &policy(Mode::Shadow, FailureMode::FailOpen),
        &r,
        "glm-5.3",
        &tags(&[("complexity", "low")]),
        Time::ZERO,
    );
    assert_eq!(
        p.decision.chosen_model().map(|m| m.as_str()),
        Some("qwen-3.6-27b")
    );
    assert_eq!(p.mode, Mode::Shadow);
    let sent: Vec<&str> = p
        .order
        .iter()
        .map(|&i| p.decision.candidates[i].model.as_str())
        .collect();
    assert_eq!(sent, vec!["glm-5.3"]);
}

#[test]
fn unready_endpoints_are_not_candidates() {
    let mut r = router(&[("glm-5.3", 1)]);
    r.set_ready(&EndpointId::from("127.0.0.1:1"), false)
        .unwrap();
    let p = policy(Mode::Enforce, FailureMode::FailOpen);
    let refused = plan(&p, &r, "glm-5.3", &Tags::new(), Time::ZERO);
    assert_eq!(refused.refused, Some(Refusal::NoReadyEndpoint));
    scrape(&mut r, 1, 0, Time::ZERO);
    r.set_ready(&EndpointId::from("127.0.0.1:1"), true).unwrap();
    assert!(
        plan(&p, &r, "glm-5.3", &Tags::new(), Time::ZERO)
            .refused
            .is_none()
    );
}

#[test]
fn passthrough_balances_over_the_resolved_models_endpoints() {
    let r = router(&[("glm-5.3", 1), ("glm-5.3", 2), ("qwen-3.6-27b", 3)]);
    let p = example();
    let plain = passthrough(
        &p,
        &r,
        "default",
        Time::ZERO,
        &mut SmallRng::seed_from_u64(3),
    )
    .unwrap();
    assert_eq!(plain.model.name, "glm-5.3");
    let mut ids: Vec<&str> = plain.order.iter().map(|e| e.as_str()).collect();
    ids.sort();
    assert_eq!(ids, vec!["127.0.0.1:1", "127.0.0.1:2"]);
    assert!(passthrough(&p, &r, "nope", Time::ZERO, &mut SmallRng::seed_from_u64(3)).is_err());
}

#[test]
fn the_plan_serializes_without_prompt_text() {
    let mut r = router(&[("glm-5.3", 1)]);
    scrape(&mut r, 1, 0, Time::ZERO);
    let p = plan(
        &policy(Mode::Enforce, FailureMode::FailOpen),
        &r,
        "glm-5.3",
        &Tags::new(),
        Time::ZERO,
    );
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["mode"], "enforce");
    assert_eq!(json["candidates"]["models"], serde_json::json!(["glm-5.3"]));
    assert_eq!(json["order"], serde_json::json!([0]));
    assert!(!json.to_string().contains("hello"));
}

#[test]
fn the_plan_orders_only_the_attempts_the_caller_will_make() {
    let mut r = router(&[
        ("glm-5.3", 1),
        ("glm-5.3", 2),
        ("glm-5.3", 3),
        ("glm-5.3", 4),
    ]);
    for (port, waiting) in [(1, 30), (2, 0), (3, 20), (4, 10)] {
        scrape(&mut r, port, waiting, Time::ZERO);
    }
    let p = policy(Mode::Enforce, FailureMode::FailOpen);
    let full = plan(&p, &r, "glm-5.3", &Tags::new(), Time::ZERO);
    assert_eq!(
        endpoints(&full),
        vec!["127.0.0.1:2", "127.0.0.1:4", "127.0.0.1:3", "127.0.0.1:1"]
    );
    let blocks = PromptBlocks::from_text(b"hello", &Default::default());
    let (t, w) = (Tags::new(), Workload::default());
    for max in [1, 2, 3] {
        let input = Input {
            requested: "glm-5.3",
            tags: &t,
            workload: &w,
            prompt_tokens: 100,
            max_tokens: None,
            prompt_blocks: &blocks,
            block_hasher: None,
            max_attempts: max,
        };
        let capped = decide(&p, &r, &input, Time::ZERO, &mut SmallRng::seed_from_u64(7)).unwrap();
        assert_eq!(
            endpoints(&capped),
            endpoints(&full)[..max].to_vec(),
            "{max}"
        );
    }
}
