//! A routing change rolled out as an experiment, over real processes (issue 23, docs/rollout.md):
//! the policy controller on a copy of `examples/` whose InferencePolicy declares a rollout, two
//! glm-5.3 and two qwen-3.6-27b simulators, the proxy, and the real `kinfctl`.
//!
//! - A worse candidate (a balancer whose 1 ms freshness budget makes every cohort decision a
//!   fallback) is rolled back by the controller by itself, within the declared window, naming the
//!   threshold it crossed; the cohort is then served the control policy.
//! - A candidate that crosses nothing runs until `kinfctl rollout promote` makes it the policy.
//! - With two controller replicas, each with its own proxy, neither replica alone receives the
//!   minimum sample; with `--rollout-peers` each judges both halves and both roll back.
//!
//! Requests carry a user header the rollout is keyed by; the test computes each user's arm with
//! the proxy's own split (`kinference_decision::rollout`), so both arms get traffic.

use kinference_decision::rollout::{Arm, AssignBy, Split};
use kinference_local::{
    Programs, Stack, StackOptions,
    poll::wait_until,
    process::{Stderr, free_port},
    stack::{spawn_controller_to, spawn_proxy},
};
use serde_json::{Value, json};
use std::{path::Path, time::Duration};

const HEADER: &str = "x-user";
/// How often the controller judges (`--rollout-judge-interval-ms`).
const JUDGE_MS: u64 = 500;
/// The declared window.
const WINDOW_S: u64 = 60;

fn rollout(name: &str, candidate: Value, thresholds: Value) -> serde_yaml::Value {
    serde_yaml::to_value(json!({
        "name": name,
        "candidate": candidate,
        "cohortPercent": 50,
        "controlPercent": 50,
        "assignBy": "Header",
        "header": HEADER,
        "window": format!("{WINDOW_S}s"),
        "minSamples": 20,
        "thresholds": thresholds,
    }))
    .unwrap()
}

async fn start(rollout: serde_yaml::Value) -> Stack {
    start_with(rollout, StackOptions::default(), vec![]).await
}

/// The stack with `opts` and the controller's `extra` flags.
async fn start_with(rollout: serde_yaml::Value, opts: StackOptions, extra: Vec<String>) -> Stack {
    let mut controller_args = vec!["--rollout-judge-interval-ms".into(), JUDGE_MS.to_string()];
    controller_args.extend(extra);
    let opts = StackOptions {
        time_scale: 0.2,
        controller_args,
        ..opts
    };
    let stack = tokio::task::spawn_blocking(move || {
        Stack::start(&Programs::workspace(), &opts, &move |doc| {
            if doc["kind"] == "InferencePolicy" {
                doc["spec"]["rollout"] = rollout.clone();
            }
        })
    })
    .await
    .unwrap()
    .expect("the local stack starts");
    let admin = format!("http://{}", stack.proxy.admin);
    wait_until("the proxy is ready", Duration::from_secs(60), || async {
        let rsp = reqwest::get(format!("{admin}/ready")).await.ok()?;
        rsp.status().is_success().then_some(())
    })
    .await;
    stack
}

/// Users in the cohort and in the control group of rollout `name`.
fn users(name: &str, per_arm: usize) -> (Vec<String>, Vec<String>) {
    let split = Split {
        name: name.into(),
        cohort: 5_000,
        control: 5_000,
        assign_by: AssignBy::Header(HEADER.into()),
    };
    let (mut cohort, mut control) = (vec![], vec![]);
    for i in 0.. {
        let user = format!("user-{i}");
        match split.arm_of_key(&user) {
            Arm::Cohort if cohort.len() < per_arm => cohort.push(user),
            Arm::Control if control.len() < per_arm => control.push(user),
            _ => {}
        }
        if cohort.len() == per_arm && control.len() == per_arm {
            return (cohort, control);
        }
    }
    unreachable!()
}

/// One short chat completion as `user`, answered 200; its decision record.
async fn chat(stack: &Stack, http: &reqwest::Client, user: &str, id: &str) -> Value {
    chat_via(&stack.proxy, http, user, id).await
}

/// [`chat`] through `proxy`.
async fn chat_via(
    proxy: &kinference_local::Proxy,
    http: &reqwest::Client,
    user: &str,
    id: &str,
) -> Value {
    let body = json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "Hi! What is 2+2?"}], "max_tokens": 4});
    let rsp = http
        .post(format!("http://{}/v1/chat/completions", proxy.listen))
        .header(HEADER, user)
        .header("x-request-id", id)
        .json(&body)
        .send()
        .await
        .expect("the proxy answers");
    let status = rsp.status();
    let text = rsp.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{user}: {text}");
    let records: Value = http
        .get(format!(
            "http://{}/debug/decisions?request_id={id}",
            proxy.admin
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    records
        .as_array()
        .or_else(|| records["decisions"].as_array())
        .and_then(|r| r.first().cloned())
        .unwrap_or_else(|| panic!("no decision record for {id}: {records}"))
}

/// The rollout of policy `default/llm` as the controller's admin API shows it.
async fn rollout_status(stack: &Stack, http: &reqwest::Client) -> Value {
    rollout_status_at(stack.controller.admin, http).await
}

/// [`rollout_status`] of the controller whose admin listener is `admin`.
async fn rollout_status_at(admin: std::net::SocketAddr, http: &reqwest::Client) -> Value {
    let v: Value = http
        .get(format!("http://{admin}/rollouts"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["policies"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "llm"))
        .map(|p| p["rollout"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worse_candidate_is_rolled_back_within_the_window() {
    let name = "stale-signals";
    let candidate = json!({"balancer": {
        "freshnessBudget": "1ms", "failureMode": "FailOpen", "tieWindow": "20ms", "mode": "Enforce"}});
    let stack = start(rollout(name, candidate, json!({"fallbackRate": 0.3}))).await;
    let http = reqwest::Client::new();
    let (cohort, control) = users(name, 8);

    let first = chat(&stack, &http, &cohort[0], "first-cohort").await;
    assert_eq!(first["rollout"]["arm"], "cohort", "{first}");
    let started = tokio::time::Instant::now();
    let mut sent = 0;
    let status = loop {
        for (i, (a, b)) in cohort.iter().zip(&control).enumerate() {
            chat(&stack, &http, a, &format!("c{sent}-{i}")).await;
            chat(&stack, &http, b, &format!("k{sent}-{i}")).await;
        }
        sent += 1;
        let s = rollout_status(&stack, &http).await;
        if s["phase"] == "RolledBack" {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(WINDOW_S),
            "not rolled back within the {WINDOW_S} s window: {s}"
        );
    };
    eprintln!(
        "rolled back after {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        status["message"]
    );
    assert_eq!(status["name"], name);
    assert_eq!(status["crossed"], "fallbackRate", "{status}");
    let crossed = status["thresholds"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["threshold"] == "fallbackRate"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(crossed["crossed"], true, "{status}");
    assert!(
        crossed["low"].as_f64().unwrap() > 0.3,
        "crossed only when the whole interval is past the limit: {crossed}"
    );

    // The cohort is served the control policy again: no rollout on its decisions.
    wait_until(
        "the cohort back on the control policy",
        Duration::from_secs(30),
        || async {
            let r = chat(&stack, &http, &cohort[0], &format!("after-{}", rand_id())).await;
            r["rollout"].is_null().then_some(())
        },
    )
    .await;
    let metrics = http
        .get(format!("http://{}/metrics", stack.controller.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("kinference_controller_rollout_rollbacks_total{")
                && l.contains("fallbackRate")
                && !l.ends_with(" 0")
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_candidate_that_crosses_nothing_is_promoted_on_request() {
    let name = "no-widening";
    // The candidate drops the policy's rules: glm-5.3 requests are served by glm-5.3 alone.
    let candidate = json!({"rules": []});
    let stack = start(rollout(
        name,
        candidate,
        json!({"errorRate": 0.2, "ttftP90Ratio": 5.0}),
    ))
    .await;
    let http = reqwest::Client::new();
    let (cohort, control) = users(name, 4);
    for round in 0..3 {
        for (i, (a, b)) in cohort.iter().zip(&control).enumerate() {
            let c = chat(&stack, &http, a, &format!("c{round}-{i}")).await;
            assert_eq!(c["rollout"]["arm"], "cohort", "{c}");
            assert_eq!(c["candidate_models"], json!(["glm-5.3"]), "{c}");
            let k = chat(&stack, &http, b, &format!("k{round}-{i}")).await;
            assert_eq!(k["rollout"]["arm"], "control", "{k}");
        }
    }
    let s = rollout_status(&stack, &http).await;
    assert_ne!(s["phase"], "RolledBack", "{s}");

    let dir = stack.manifests.path().to_str().unwrap().to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .args(["rollout", "promote", "llm", "--manifests", &dir])
        .output()
        .expect("kinfctl runs");
    assert!(out.status.success(), "{out:?}");

    // Promoted: every request gets the candidate, with no arm.
    wait_until(
        "the candidate promoted",
        Duration::from_secs(30),
        || async {
            let r = chat(&stack, &http, &control[0], &format!("p-{}", rand_id())).await;
            (r["rollout"].is_null() && r["candidate_models"] == json!(["glm-5.3"])).then_some(())
        },
    )
    .await;
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .args([
            "rollout",
            "status",
            "--admin",
            &format!("http://{}", stack.controller.admin),
        ])
        .output()
        .expect("kinfctl runs");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && text.contains("Promoted"),
        "{text}"
    );
    assert!(Path::new(&dir).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_judge_all_the_traffic_together() {
    let name = "stale-on-two";
    let candidate = json!({"balancer": {
        "freshnessBudget": "1ms", "failureMode": "FailOpen", "tieWindow": "20ms", "mode": "Enforce"}});
    let mut declared = rollout(name, candidate, json!({"fallbackRate": 0.3}));
    declared["reportInterval"] = "1s".into();
    // Both replicas' admin ports are known up front: each names both as its peers (itself
    // included, as a headless Service would; it recognises its own answer).
    let admin = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let (one, two) = (admin(free_port().unwrap()), admin(free_port().unwrap()));
    let peers = vec!["--rollout-peers".to_string(), format!("{one},{two}")];
    let mut opts = StackOptions::default();
    opts.addrs.controller_admin = one;
    let stack = start_with(declared, opts, peers.clone()).await;
    let mut extra = vec!["--rollout-judge-interval-ms".into(), JUDGE_MS.to_string()];
    extra.extend(peers);
    let (program, manifests) = (
        stack.programs.controller.clone(),
        stack.manifests.path().to_path_buf(),
    );
    let second = tokio::task::spawn_blocking(move || {
        let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        spawn_controller_to(&program, &manifests, any, two, &extra, &Stderr::quiet(true))
    })
    .await
    .unwrap()
    .expect("the second replica starts");
    let (program, grpc) = (stack.programs.proxy.clone(), second.grpc);
    let proxy_two = tokio::task::spawn_blocking(move || spawn_proxy(&program, grpc, &[], true))
        .await
        .unwrap()
        .expect("the second replica's proxy starts");
    let http = reqwest::Client::new();
    let ready = format!("http://{}/ready", proxy_two.admin);
    wait_until(
        "the second proxy is ready",
        Duration::from_secs(60),
        || async {
            let rsp = http.get(&ready).send().await.ok()?;
            rsp.status().is_success().then_some(())
        },
    )
    .await;

    // 12 requests a side through each replica's proxy: 24 in all, over the minimum of 20;
    // either replica alone has 12. The cohort may be rolled back before the last are sent.
    const PER_PROXY: usize = 12;
    let (cohort, control) = users(name, PER_PROXY);
    for (p, proxy) in [(1, &stack.proxy), (2, &proxy_two)] {
        let first = chat_via(proxy, &http, &cohort[0], &format!("first-{p}")).await;
        assert_eq!(first["rollout"]["arm"], "cohort", "{first}");
    }
    for (i, (a, b)) in cohort.iter().zip(&control).enumerate().skip(1) {
        for (p, proxy) in [(1, &stack.proxy), (2, &proxy_two)] {
            chat_via(proxy, &http, a, &format!("c{p}-{i}")).await;
            chat_via(proxy, &http, b, &format!("k{p}-{i}")).await;
        }
    }
    for replica in [one, two] {
        let status = wait_until(
            "each replica rolled back",
            Duration::from_secs(30),
            || async {
                let s = rollout_status_at(replica, &http).await;
                (s["phase"] == "RolledBack").then_some(s)
            },
        )
        .await;
        eprintln!("replica {replica}: {}", status["message"]);
        assert_eq!(status["crossed"], "fallbackRate", "{status}");
        // Judged over both halves: more than either replica received, from both proxies.
        let judged = status["cohort"]["requests"].as_u64().unwrap();
        assert!(judged > PER_PROXY as u64, "{status}");
        assert_eq!(status["proxies"], 2, "{status}");
    }
    let metrics = http
        .get(format!("http://{one}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|l| l
            .starts_with("kinference_controller_rollout_peer_fetches_total{result=\"ok\"}")
            && !l.ends_with(" 0")),
        "{metrics}"
    );
    drop(second);
}

fn rand_id() -> u64 {
    use std::hash::BuildHasher as _;
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}
