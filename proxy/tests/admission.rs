//! Admission control over real processes (issue 22): the controller, the simulators and the proxy
//! binary on `examples/` with two aliases whose rules set a service class: `batch` requests are
//! Sheddable, with a 1 ms time-to-first-token objective no endpoint meets and a 5 s
//! `maxQueueTime`; `interactive` requests are Critical, with a 30 s objective every endpoint
//! meets and no hold.
//!
//! A burst of batch requests is held in the proxy, never reaching an engine, and each is answered
//! 429 with `Retry-After` and OpenAI error JSON when its hold ends; interactive requests sent
//! while the burst is held are served at once (their decision records say they were not held).
//! Every request is answered. A second test gives every tenant a token budget per window: once
//! it is spent, requests are answered 429 with `Retry-After` until the window ends.

#[path = "support/client.rs"]
mod client;

use kinference_local::{StackOptions, program::workspace_root};
use serde_json::{Value, json};
use std::time::Duration;

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");

fn manifests() -> tempfile::TempDir {
    with_policy(|spec| {
        spec["aliases"] = serde_yaml::from_str(
            "[{name: default, target: glm-5.3}, {name: batch, target: glm-5.3}, \
             {name: interactive, target: glm-5.3}]",
        )
        .unwrap();
        spec["rules"] = serde_yaml::from_str(
            "[{name: batch-is-sheddable, match: {models: [batch]}, action: {serviceClass: Sheddable}},\
              {name: interactive-is-critical, match: {models: [interactive]}, action: {serviceClass: Critical}}]",
        )
        .unwrap();
        spec["serviceClasses"] = serde_yaml::from_str(
            "[{name: Critical, ttftSLO: 30s}, {name: Sheddable, ttftSLO: 1ms, maxQueueTime: 5s}]",
        )
        .unwrap();
    })
}

/// `examples/` with its policy's spec changed by `edit`.
fn with_policy(edit: impl FnOnce(&mut serde_yaml::Value)) -> tempfile::TempDir {
    let examples = workspace_root().join("examples");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() && path.file_name().unwrap() != "policy.yaml" {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let mut policy: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(examples.join("policy.yaml")).unwrap())
            .unwrap();
    edit(&mut policy["spec"]);
    std::fs::write(
        dir.path().join("policy.yaml"),
        serde_yaml::to_string(&policy).unwrap(),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_sheddable_work_is_refused_with_retry_after_and_never_delays_critical_requests() {
    let dir = manifests();
    let opts = StackOptions {
        manifests: dir.path().to_path_buf(),
        ..StackOptions::default()
    };
    let (stack, client) = client::start_stack(PROXY, opts).await;
    // A prompt long enough that no prediction is under 1 ms.
    let prompt = "Summarise the following report in one line. ".repeat(200);
    let body = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4});

    // The burst: 12 batch requests at once.
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..12 {
        let client = client.clone();
        let body = body("batch");
        burst.spawn(async move {
            let rsp = client.post_chat(&body, &format!("batch-{i}")).await;
            let status = rsp.status();
            let retry_after = rsp
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let v: Value = rsp.json().await.unwrap();
            (status, retry_after, v)
        });
    }
    // While they are held, interactive requests are served at once.
    kinference_local::poll::wait_until("the burst is held", Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let t = client.admin_json("/debug/targets").await;
            (t["default"]["admission_held"].as_u64() == Some(12)).then_some(())
        }
    })
    .await;
    for i in 0..3 {
        let id = format!("interactive-{i}");
        let rsp = client.post_chat(&body("interactive"), &id).await;
        assert_eq!(rsp.status(), 200);
        let record = client.decision(&id).await;
        assert_eq!(record["service_class"], "Critical");
        assert_eq!(record["held_s"], 0.0, "{record}");
    }
    let t = client.admin_json("/debug/targets").await;
    assert_eq!(
        t["default"]["admission_held"], 12,
        "the burst is still held while the critical requests were served"
    );
    // The held work in seconds, for an autoscaler: the burst's predicted prefill.
    let work = client
        .metric(
            "kinference_proxy_admission_held_work_seconds",
            &["service_class=\"Sheddable\""],
        )
        .await;
    assert!(work > 0.0, "{work}");

    // Each batch request is answered 429 with Retry-After and OpenAI error JSON.
    let mut answered = 0;
    while let Some(r) = burst.join_next().await {
        let (status, retry_after, v) = r.unwrap();
        assert_eq!(status, 429, "{v}");
        let secs: u64 = retry_after.expect("Retry-After").parse().unwrap();
        assert!(secs >= 1);
        assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
        assert_eq!(v["error"]["code"], "queue_timeout", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("1ms time to first token the Sheddable class is admitted at"),
            "{v}"
        );
        answered += 1;
    }
    assert_eq!(answered, 12);
    // Each refusal is recorded with why and how long it was held.
    let record = client.decision("batch-0").await;
    assert_eq!(record["refused"], "queue_timeout", "{record}");
    assert_eq!(record["service_class"], "Sheddable");
    assert!(record["held_s"].as_f64().unwrap() >= 4.9, "{record}");
    // None reached an engine: the proxy served only the interactive requests.
    let served = client
        .metric(
            "kinference_proxy_requests_total",
            &["served_model=\"glm-5.3\""],
        )
        .await;
    assert_eq!(served, 3.0);
    let refused = client
        .metric(
            "kinference_proxy_errors_total",
            &["service_class=\"Sheddable\"", "status=\"429\""],
        )
        .await;
    assert_eq!(refused, 12.0);
    let rejections = client
        .metric(
            "kinference_proxy_admission_rejections_total",
            &["service_class=\"Sheddable\"", "reason=\"queue_timeout\""],
        )
        .await;
    assert_eq!(rejections, 12.0);
    let held_now = client
        .metric(
            "kinference_proxy_admission_held",
            &["service_class=\"Sheddable\""],
        )
        .await;
    assert_eq!(held_now, 0.0);
    let work_now = client
        .metric(
            "kinference_proxy_admission_held_work_seconds",
            &["service_class=\"Sheddable\""],
        )
        .await;
    assert!(work_now.abs() < 1e-9, "{work_now}");
    let waited = client
        .metric(
            "kinference_proxy_admission_held_seconds_count",
            &["service_class=\"Sheddable\"", "outcome=\"rejected\""],
        )
        .await;
    assert_eq!(waited, 12.0);
    drop(stack);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_token_budget_is_refused_until_the_window_ends() {
    let dir = with_policy(|spec| {
        spec["tenantBudgets"] =
            serde_yaml::from_str("[{tenant: '*', tokens: 400, window: 1m}]").unwrap();
    });
    let opts = StackOptions {
        manifests: dir.path().to_path_buf(),
        ..StackOptions::default()
    };
    let (stack, client) = client::start_stack(PROXY, opts).await;
    let body = json!({"model": "glm-5.3", "max_tokens": 100,
        "messages": [{"role": "user", "content": "Write a short poem about the sea."}]});
    let mut served = 0;
    let mut refused = None;
    for i in 0..8 {
        let rsp = client.post_chat(&body, &format!("budget-{i}")).await;
        match rsp.status().as_u16() {
            200 => {
                // Each answer's usage settles its reservation before the next is sent.
                let _: Value = rsp.json().await.unwrap();
                served += 1;
            }
            429 => {
                let retry_after: u64 = rsp
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .expect("Retry-After")
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let v: Value = rsp.json().await.unwrap();
                refused = Some((i, retry_after, v));
                break;
            }
            other => panic!("status {other}"),
        }
    }
    // About 120 tokens an answer (a short prompt and 100 completion tokens): three fit in 400.
    let (i, retry_after, v) = refused.expect("the budget runs out");
    assert!(
        (2..=3).contains(&served),
        "{served} served before the refusal"
    );
    assert_eq!(i, served);
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(v["error"]["code"], "budget_exhausted", "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("400 tokens per 60s"),
        "{v}"
    );
    let counted = client
        .metric(
            "kinference_proxy_admission_rejections_total",
            &["reason=\"budget_exhausted\""],
        )
        .await;
    assert_eq!(counted, 1.0);
    let record = client.decision(&format!("budget-{i}")).await;
    assert_eq!(record["refused"], "budget_exhausted", "{record}");
    drop(stack);
}
