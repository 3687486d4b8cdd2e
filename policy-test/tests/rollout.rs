//! A rollout in manifest mode (no cluster, as `kinference-local` runs): the controller serves
//! the rollout declared in the manifest, sums the proxies' reports, rolls a bad cohort back by
//! itself (proxies are served the policy without the rollout) and shows the decision on the
//! admin API's `/rollouts`, with the same content a cluster's `status.rollout` has; a rollout
//! with a new name starts fresh, and a promoted one is served as the policy.

use kinference_policy_test::{Controller, controller_binary, examples_dir, next_matching};
use kinference_proxy_api::{
    InferencePoliciesClient,
    inference::{ArmReport, InferenceTarget, RolloutReport, inference_target},
};
use serde_json::Value;

const AUTHORITY: &str = "llm.default.svc.cluster.local:8000";

const ROLLOUT: &str = "
  rollout:
    name: NAME
    candidate:
      balancer: {failureMode: FailClose}
    cohortPercent: 10
    controlPercent: 10
    window: 5m
    minSamples: 100
    thresholds: {errorRate: 0.02, ttftP90Ratio: 1.5}
    state: STATE
";

fn with_rollout(ctl: &Controller, name: &str, state: &str) {
    let base = std::fs::read_to_string(examples_dir().join("policy.yaml")).unwrap();
    let text = format!(
        "{}{}",
        base.trim_end(),
        ROLLOUT.replace("NAME", name).replace("STATE", state)
    );
    ctl.write("policy.yaml", &text).unwrap();
}

fn target() -> InferenceTarget {
    InferenceTarget {
        source_workload: "apps:chat".into(),
        target: Some(inference_target::Target::Authority(AUTHORITY.into())),
    }
}

fn arm(requests: u64, errors: u64) -> ArmReport {
    ArmReport {
        requests,
        errors,
        ttft_bounds_s: vec![0.1, 0.5, f64::INFINITY],
        ttft_counts: vec![requests / 2, requests, requests],
        ..ArmReport::default()
    }
}

async fn rollouts(ctl: &Controller) -> Value {
    let (code, body) = ctl.admin_get("/rollouts").await.unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls `/rollouts` until the policy's rollout satisfies `ok`.
async fn wait_rollout(ctl: &Controller, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let view = rollouts(ctl).await;
        if let Some(r) = view["policies"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == "llm"))
            .map(|p| p["rollout"].clone())
            && ok(&r)
        {
            return r;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {view}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn manifest_mode_rolls_a_bad_cohort_back_and_shows_it_on_the_admin_api() {
    let bin = controller_binary(env!(
        "CARGO_BIN_EXE_kinference-policy-controller-under-test"
    ));
    let ctl = Controller::start(&bin, &examples_dir()).await.unwrap();
    with_rollout(&ctl, "fail-closed", "Running");
    let mut client = InferencePoliciesClient::new(ctl.channel().await.unwrap());
    let mut stream = client.watch(target()).await.unwrap().into_inner();
    let (policy, _) = next_matching(&mut stream, "the policy with its rollout", |p| {
        p.rollout.as_ref().is_some_and(|r| r.name == "fail-closed")
    })
    .await
    .unwrap();
    let measuring = wait_rollout(&ctl, "measuring", |r| r["verdict"] == "Insufficient").await;
    assert_eq!(measuring["phase"], "Running", "{measuring}");

    let report = |proxy: &str, cohort: ArmReport, control: ArmReport| RolloutReport {
        target: Some(target()),
        revision: policy.revision.clone(),
        rollout: "fail-closed".into(),
        proxy: proxy.into(),
        cohort: Some(cohort),
        control: Some(control),
        interval: None,
    };
    for proxy in ["a", "b"] {
        client
            .report_rollout(report(proxy, arm(100, 30), arm(100, 1)))
            .await
            .unwrap();
    }
    let (back, _) = next_matching(&mut stream, "the policy without its rollout", |p| {
        p.rollout.is_none()
    })
    .await
    .unwrap();
    assert!(!back.models.is_empty());
    let r = wait_rollout(&ctl, "rolled back", |r| r["phase"] == "RolledBack").await;
    assert_eq!(r["crossed"], "errorRate", "{r}");
    assert_eq!(r["cohort"]["requests"], 200, "{r}");
    assert_eq!(r["control"]["errors"], 2, "{r}");
    assert_eq!(r["proxies"], 2, "{r}");
    let crossed = r["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["threshold"] == "errorRate")
        .unwrap();
    assert_eq!(crossed["crossed"], true, "{r}");
    assert!(crossed["closeness"].as_f64().unwrap() > 1.0, "{r}");
    let (_, metrics) = ctl.admin_get("/metrics").await.unwrap();
    assert!(
        metrics.contains(
            "kinference_controller_rollout_rollbacks_total{policy=\"default/llm\",rollout=\"fail-closed\",threshold=\"errorRate\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "kinference_controller_rollout_phase{policy=\"default/llm\",rollout=\"fail-closed\",phase=\"RolledBack\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("kinference_controller_rollout_threshold_ratio{"),
        "{metrics}"
    );

    // Reloading the same manifest keeps it rolled back; a new name starts fresh; promoted, the
    // candidate is the policy.
    with_rollout(&ctl, "fail-closed-2", "Running");
    next_matching(&mut stream, "the renamed rollout", |p| {
        p.rollout
            .as_ref()
            .is_some_and(|r| r.name == "fail-closed-2")
    })
    .await
    .unwrap();
    let fresh = wait_rollout(&ctl, "a fresh rollout", |r| r["name"] == "fail-closed-2").await;
    assert_eq!(fresh["phase"], "Running", "{fresh}");
    with_rollout(&ctl, "fail-closed-2", "Promoted");
    let (promoted, _) = next_matching(&mut stream, "the promoted policy", |p| {
        p.rollout.is_none() && p.balancer.as_ref().is_some_and(|b| b.failure_mode == 2)
    })
    .await
    .unwrap();
    assert_eq!(promoted.models.len(), back.models.len());
    wait_rollout(&ctl, "promoted", |r| r["phase"] == "Promoted").await;
}
