//! A rollout's arms over real processes and sockets (issue 23): a scripted controller (real
//! tonic, the discovery crate's test controller) serving a policy with a rollout, one glm-5.3 and
//! one qwen-3.6-27b simulator (`vllm-sim`), and the proxy binary, driven over real HTTP.
//!
//! The policy's own rules keep glm-5.3 on glm-5.3; the rollout's candidate rewrites every glm-5.3
//! request to qwen-3.6-27b, for half the tenants (the cohort), beside a control half. Tenants are
//! chosen by the split's own function, so the test knows each one's arm. What must follow:
//! - a cohort tenant's requests are served by qwen, a control tenant's by glm, every time;
//! - each decision record names the rollout and the arm, the cohort's with the candidate's rule;
//! - `/metrics` counts each arm's requests, first tokens and cost;
//! - a `RolloutReport` reaches the controller whose counts are the requests sent, per arm.

#[path = "support/client.rs"]
mod client;
#[path = "../discovery/tests/discovery/support.rs"]
mod controller;

use client::{ProxyClient, served_by};
use controller::{GLM, QWEN, Script, Server, inference_policy, outbound_policy};
use kinference_decision::rollout::{Arm, AssignBy, Split};
use kinference_local::{Program, poll::wait_until, stack::spawn_proxy, stack::spawn_sim};
use kinference_proxy_api::inference as inf;
use serde_json::{Value, json};
use std::{collections::BTreeMap, time::Duration};

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
const ROLLOUT: &str = "everything-to-qwen";
/// Requests per tenant.
const N: u64 = 4;

fn policy() -> inf::InferencePolicy {
    let mut p = inference_policy("7", &[("glm-5.3", GLM), ("qwen-3.6-27b", QWEN)]);
    for m in &mut p.models {
        m.price = Some(inf::Price {
            prompt_usd_per_million_tokens: 1.0,
            cached_prompt_usd_per_million_tokens: 0.25,
            completion_usd_per_million_tokens: 4.0,
            currency: String::new(),
        });
    }
    p.rollout = Some(inf::Rollout {
        name: ROLLOUT.into(),
        cohort_basis_points: 5_000,
        control_basis_points: 5_000,
        assign_by: inf::rollout::AssignBy::Tenant as i32,
        header: String::new(),
        candidate_rules: vec![inf::Rule {
            name: "glm-to-qwen".into(),
            r#match: Some(inf::rule::Match {
                models: vec!["glm-5.3".into()],
                ..Default::default()
            }),
            action: Some(inf::rule::Action {
                rewrite_to: "qwen-3.6-27b".into(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        candidate_balancer: None,
        report_interval: Some(prost_types::Duration {
            seconds: 0,
            nanos: 300_000_000,
        }),
    });
    p
}

/// The first tenant of the form `team-N/chat` the split puts in `arm`.
fn tenant_in(split: &Split, arm: Arm) -> String {
    (0..)
        .map(|i| format!("team-{i}/chat"))
        .find(|t| split.arm_of_key(t) == arm)
        .unwrap()
}

/// The sums over every report of `rollout`: (cohort, control) requests, and the cohort's
/// first tokens (the +Inf bucket).
fn reported(reports: &[inf::RolloutReport]) -> (u64, u64, u64) {
    reports
        .iter()
        .filter(|r| r.rollout == ROLLOUT && r.proxy == "default/web-0")
        .fold((0, 0, 0), |(c, k, t), r| {
            let cohort = r.cohort.clone().unwrap_or_default();
            let control = r.control.clone().unwrap_or_default();
            (
                c + cohort.requests,
                k + control.requests,
                t + cohort.ttft_counts.last().copied().unwrap_or(0),
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cohort_follows_the_candidate_a_control_group_does_not_and_both_are_measured() {
    let (glm, qwen) = tokio::task::spawn_blocking(|| {
        let sim = |profile| spawn_sim(&Program::vllm_sim(), profile, 10.0, &[], true).unwrap();
        (sim("glm-5.3"), sim("qwen-3.6-27b"))
    })
    .await
    .unwrap();
    let script = Script::new();
    script.inference.send_replace(Some(policy()));
    script
        .outbound
        .send_replace(Some(outbound_policy("http", &[GLM, QWEN])));
    script.pools.send_replace(BTreeMap::from([
        (
            GLM.to_string(),
            BTreeMap::from([(glm.addr, "glm-0".to_string())]),
        ),
        (
            QWEN.to_string(),
            BTreeMap::from([(qwen.addr, "qwen-0".to_string())]),
        ),
    ]));
    let server = Server::start(script.clone(), "127.0.0.1:0".parse().unwrap());
    let grpc = server.addr;
    let proxy = tokio::task::spawn_blocking(move || {
        let args = [
            "--allow-tenant-header",
            "--pod-name",
            "web-0",
            "--pod-namespace",
            "default",
        ]
        .map(String::from);
        spawn_proxy(&Program::Path(PROXY.into()), grpc, &args, true).unwrap()
    })
    .await
    .unwrap();
    let client = ProxyClient::of(&proxy);
    client.wait_ready().await;

    let split = Split {
        name: ROLLOUT.into(),
        cohort: 5_000,
        control: 5_000,
        assign_by: AssignBy::Tenant,
    };
    let cohort = tenant_in(&split, Arm::Cohort);
    let control = tenant_in(&split, Arm::Control);
    let body = json!({
        "model": "glm-5.3",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    for (tenant, arm, served) in [
        (&cohort, "cohort", qwen.addr),
        (&control, "control", glm.addr),
    ] {
        for i in 0..N {
            let id = format!("{arm}-{i}");
            let rsp = client
                .http
                .post(format!("{}/v1/chat/completions", client.base))
                .header("x-request-id", &id)
                .header("x-kinference-tenant", tenant.as_str())
                .json(&body)
                .send()
                .await
                .expect("the proxy answers");
            assert_eq!(rsp.status(), 200, "{id}");
            assert_eq!(served_by(&rsp), served.to_string(), "{id} ({tenant})");
            let text = rsp.text().await.unwrap();
            assert!(text.contains("[DONE]"), "{id}: {text}");
            let record = client.decision(&id).await;
            assert_eq!(
                record["rollout"],
                json!({"name": ROLLOUT, "arm": arm}),
                "{record}"
            );
            assert_eq!(record["tenant"], tenant.as_str());
            let rules: Vec<&str> = record["rule_trace"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["matched"] == true)
                .filter_map(|r| r["rule"].as_str())
                .collect();
            if arm == "cohort" {
                assert_eq!(rules, vec!["glm-to-qwen"], "{record}");
                assert_eq!(record["candidate_models"], json!(["qwen-3.6-27b"]));
            } else {
                assert!(rules.is_empty(), "{record}");
                assert_eq!(record["candidate_models"], json!(["glm-5.3"]));
            }
        }
    }

    // The metrics: every request of each arm, ok, with its first token and its cost.
    let metric = |name: &'static str, arm: &'static str, extra: &'static str| {
        let client = client.clone();
        async move {
            let rollout = format!(r#"rollout="{ROLLOUT}""#);
            let arm = format!(r#"arm="{arm}""#);
            client.metric(name, &[&rollout, &arm, extra]).await
        }
    };
    for arm in ["cohort", "control"] {
        let ok = metric(
            "kinference_proxy_rollout_requests_total",
            arm,
            r#"outcome="ok""#,
        )
        .await;
        assert_eq!(ok, N as f64, "{arm}");
        let ttft = metric("kinference_proxy_rollout_ttft_seconds_count", arm, "").await;
        assert_eq!(ttft, N as f64, "{arm}");
    }
    for arm in ["cohort", "control"] {
        let cost = metric("kinference_proxy_rollout_cost_usd_total", arm, "").await;
        assert!(cost > 0.0, "{arm}: {cost}");
    }
    // The request families every dashboard reads carry the arm too, beside tenant and model.
    for (arm, served) in [("cohort", "qwen-3.6-27b"), ("control", "glm-5.3")] {
        let labels = [
            format!(r#"arm="{arm}""#),
            format!(r#"served_model="{served}""#),
        ];
        let labels = [labels[0].as_str(), labels[1].as_str()];
        for family in [
            "kinference_proxy_requests_total",
            "kinference_proxy_ttft_seconds_count",
            "kinference_proxy_decisions_total",
        ] {
            assert_eq!(
                client.metric(family, &labels).await,
                N as f64,
                "{family} {arm}"
            );
        }
    }
    // The split covers every tenant: nothing falls outside both arms.
    let text = client.metrics_text().await;
    assert!(!text.contains(r#"arm="rest""#), "{text}");

    // The controller hears each arm's requests from this proxy, as deltas that add up to them.
    let mut reports = script.rollout_reports.subscribe();
    let want = (N, N, N);
    match tokio::time::timeout(
        Duration::from_secs(20),
        reports.wait_for(|r| reported(r) == want),
    )
    .await
    {
        Ok(Ok(_)) => {}
        _ => panic!(
            "no reports adding up to {want:?}: {:?}",
            reported(&script.rollout_reports.borrow())
        ),
    }
    {
        let all = script.rollout_reports.borrow();
        let r = all
            .iter()
            .find(|r| r.cohort.as_ref().is_some_and(|c| c.requests > 0))
            .unwrap();
        assert_eq!(r.revision, "7");
        let cohort = r.cohort.as_ref().unwrap();
        assert_eq!(cohort.ttft_bounds_s.last(), Some(&f64::INFINITY));
        assert_eq!(cohort.errors + cohort.timeouts + cohort.fallbacks, 0);
        assert!(cohort.tokens > 0, "{cohort:?}");
    }

    // The rollout ends: the proxy sends its last report, then the cohort is the policy's own.
    let mut ended = policy();
    ended.rollout = None;
    ended.revision = "8".into();
    script.inference.send_replace(Some(ended));
    wait_until(
        "the cohort tenant back on the policy's own rules",
        Duration::from_secs(20),
        || async {
            let rsp = client
                .http
                .post(format!("{}/v1/chat/completions", client.base))
                .header("x-kinference-tenant", cohort.as_str())
                .json(&json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}))
                .send()
                .await
                .ok()?;
            (served_by(&rsp) == glm.addr.to_string()).then_some(())
        },
    )
    .await;
    let last: Value = client.admin_json("/debug/decisions").await[0].clone();
    assert!(last.get("rollout").is_none(), "{last}");
    drop(server);
}
