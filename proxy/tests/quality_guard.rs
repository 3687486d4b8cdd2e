//! A rule's quality guard over real processes (issue 18): the controller, two glm-5.3 and two
//! qwen-3.6-27b simulators and the proxy binary, on the cost-objective scenario with a
//! `qualityGuard` on its rule, and a judge stand-in over real HTTP that scores from labels.
//!
//! The simulators begin every answer with their model's name (`--answer-prefix`), so the judge
//! can tell the answers apart without the proxy telling it which is which. Its labels: the small
//! model answers trivia as well as the big one (a tie) and answers math worse (the big model's
//! answer wins). Everyday low-complexity prompts of both families are sent for glm-5.3, one at a
//! time, each judged before the next.
//!
//! What must follow, per prompt family (the guard measures each apart):
//! - while measuring, the rule moves at most its capped share, and the rest are held on glm-5.3;
//! - trivia: within tolerance after `minSamples` verdicts, so trusted, and then moved in full;
//! - math: out of tolerance, so suspended, and then never moved;
//! - the decision records, `/debug/guards` and the metrics say so.

#[path = "support/client.rs"]
mod client;

use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use kinference_local::{StackOptions, program::workspace_root};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

const PROXY: &str = env!("CARGO_BIN_EXE_kinference-proxy");
const MIN_SAMPLES: u32 = 4;
const CAPPED_SHARE: f64 = 0.5;

/// The judge stand-in: prefers the big model's answer to a math question, ties otherwise.
struct Judge {
    /// question -> the family its label is for.
    labels: BTreeMap<String, String>,
    calls: AtomicU64,
}

impl Judge {
    fn verdict(&self, prompt: &str) -> &'static str {
        let section = |name: &str| {
            let start = prompt.find(&format!("[{name}]\n"))? + name.len() + 3;
            let rest = &prompt[start..];
            let end = rest.find("\n\n[").unwrap_or(rest.len());
            Some(&rest[..end])
        };
        let (Some(q), Some(a), Some(b)) = (
            section("Question"),
            section("Answer A"),
            section("Answer B"),
        ) else {
            return "unsure";
        };
        match self.labels.get(q).map(String::as_str) {
            Some("math") if a.starts_with("[glm-5.3]") && b.starts_with("[qwen-3.6-27b]") => "A",
            Some("math") if b.starts_with("[glm-5.3]") && a.starts_with("[qwen-3.6-27b]") => "B",
            Some(_) if a.starts_with('[') && b.starts_with('[') => "TIE",
            _ => "unsure",
        }
    }
}

async fn serve_judge(judge: Arc<Judge>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let judge = judge.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let judge = judge.clone();
                    async move {
                        assert_eq!(req.uri().path(), "/v1/chat/completions");
                        let body = req.into_body().collect().await?.to_bytes();
                        let v: Value = serde_json::from_slice(&body).unwrap();
                        assert_eq!(v["model"], "judge");
                        let prompt = v["messages"][1]["content"].as_str().unwrap_or_default();
                        judge.calls.fetch_add(1, Ordering::Relaxed);
                        let said = judge.verdict(prompt);
                        let answer = json!({
                            "id": "judge-1", "object": "chat.completion", "model": "judge",
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": said}}],
                        });
                        Ok::<_, hyper::Error>(http::Response::new(Full::new(bytes::Bytes::from(
                            answer.to_string(),
                        ))))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    addr
}

/// The cost-objective scenario with a quality guard on its rule, judged at `judge`.
fn manifests(judge: SocketAddr) -> tempfile::TempDir {
    let root = workspace_root();
    let dir = tempfile::tempdir().unwrap();
    let scenario = root.join("integration/local/scenarios/cheapest-within-slo");
    for (name, path) in kinference_local::manifests::files(&scenario).unwrap() {
        if name != "policy.yaml" {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    let mut policy: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(scenario.join("policy.yaml")).unwrap())
            .unwrap();
    policy["spec"]["rules"][0]["qualityGuard"] = serde_yaml::from_str(&format!(
        "{{sampleShare: 1.0, tolerance: 0.1, minSamples: {MIN_SAMPLES}, window: {MIN_SAMPLES}, \
         cappedShare: {CAPPED_SHARE}, judge: {{url: 'http://{judge}/v1', model: judge, timeout: 20s}}}}"
    ))
    .unwrap();
    std::fs::write(
        dir.path().join("policy.yaml"),
        serde_yaml::to_string(&policy).unwrap(),
    )
    .unwrap();
    dir
}

/// Everyday prompts of `families`, as (prompt, family), from the classifier's labelled set.
fn everyday(families: &[&str]) -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("classify/tests/everyday.jsonl");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["level"] == "low" && families.contains(&v["family"].as_str().unwrap()))
        .map(|v| {
            (
                v["prompt"].as_str().unwrap().to_string(),
                v["family"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn tag<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v["explanation"]["tags"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == name)
}

/// Per family: requests the rule applied to, how many went to qwen-3.6-27b, and the holds.
#[derive(Debug, Default)]
struct Seen {
    sent: u32,
    moved: u32,
    capped: u32,
    suspended: u32,
    /// Whether each request was moved, in order.
    trail: Vec<bool>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_caps_then_trusts_or_suspends_a_rule_by_what_the_judge_finds() {
    let mut candidates = everyday(&["trivia", "math"]);
    // The labels are the judge's: a question is scored as its labelled family is.
    let labels: BTreeMap<String, String> = candidates.iter().cloned().collect();
    let judge = Arc::new(Judge {
        labels,
        calls: AtomicU64::new(0),
    });
    let judge_addr = serve_judge(judge.clone()).await;
    let dir = manifests(judge_addr);
    let opts = StackOptions {
        time_scale: 10.0,
        manifests: dir.path().to_path_buf(),
        sim_args: vec!["--answer-prefix".into(), "[{model}] ".into()],
        ..StackOptions::default()
    };
    let (stack, client) = client::start_stack(PROXY, opts).await;

    // Keep the prompts the rule applies to whose family tag agrees with their label: the guard
    // measures by the tag, the judge scores by the label.
    let mut kept = vec![];
    for (prompt, family) in candidates.drain(..) {
        let v = client.classify("glm-5.3", &prompt).await;
        let low = tag(&v, "complexity")
            .is_some_and(|t| t["value"] == "low" && t["confidence"].as_f64() >= Some(0.5));
        let same = tag(&v, "family").is_some_and(|t| t["value"] == family.as_str());
        if low && same {
            kept.push((prompt, family));
        }
    }
    let per = |f: &str| kept.iter().filter(|(_, g)| g == f).count();
    println!(
        "prompts kept: trivia {}, math {}",
        per("trivia"),
        per("math")
    );
    assert!(per("trivia") >= 6 && per("math") >= 4, "{kept:?}");

    // Each family's prompts, round after round, one request at a time; each judged before the
    // next is sent.
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let rounds = 3;
    let mut n: u32 = 0;
    for round in 0..rounds {
        for (prompt, family) in &kept {
            n += 1;
            let id = format!("guard-{round}-{n}");
            let before = client
                .metric("kinference_proxy_guard_samples_total", &[])
                .await;
            let body = json!({
                "model": "glm-5.3",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 8,
            });
            let rsp = client.post_chat(&body, &id).await;
            assert_eq!(rsp.status(), 200);
            let v: Value = rsp.json().await.unwrap();
            let served = v["model"].as_str().unwrap().to_string();
            let answer = v["choices"][0]["message"]["content"].as_str().unwrap();
            assert!(answer.starts_with(&format!("[{served}] ")), "{answer}");
            let record = client.decision(&id).await;
            let trace = &record["rule_trace"][0];
            let s = seen.entry(family.clone()).or_default();
            s.sent += 1;
            s.trail.push(served == "qwen-3.6-27b");
            s.moved += u32::from(served == "qwen-3.6-27b");
            match trace["held"].as_str() {
                Some("capped") => s.capped += 1,
                Some("suspended") => s.suspended += 1,
                None => {}
                Some(other) => panic!("held {other}"),
            }
            // The judgement (mirror, then judge) finishes off the request path.
            kinference_local::poll::wait_until(
                "the sample is judged",
                Duration::from_secs(20),
                || {
                    let client = client.clone();
                    async move {
                        let now = client
                            .metric("kinference_proxy_guard_samples_total", &[])
                            .await;
                        (now > before).then_some(())
                    }
                },
            )
            .await;
        }
    }
    let guards = client.admin_json("/debug/guards").await;
    println!("{seen:#?}\n{guards:#}");
    let state = |family: &str| {
        guards["guards"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["family"] == family)
            .map(|g| g["state"].as_str().unwrap().to_string())
    };
    // Every sample was judged unless the mirrored pool had no idle endpoint at the time (under
    // a loaded machine's stale scrapes).
    let outcome = |o: &str| {
        let client = client.clone();
        let label = format!("outcome=\"{o}\"");
        async move {
            client
                .metric("kinference_proxy_guard_samples_total", &[label.as_str()])
                .await
        }
    };
    let judged = outcome("judged").await;
    let no_headroom = outcome("no_headroom").await;
    assert_eq!(
        judged + no_headroom,
        f64::from(n),
        "{}",
        client.metrics_text().await
    );
    assert!(judged >= f64::from(n) * 0.8, "{judged} of {n}");
    assert_eq!(judge.calls.load(Ordering::Relaxed) as f64, judged);
    let trivia = &seen["trivia"];
    let math = &seen["math"];
    let samples = MIN_SAMPLES as usize;

    // While measuring (the first minSamples requests of each family), at most the capped share
    // moved and the rest were held.
    for s in [trivia, math] {
        let moved = s.trail[..samples].iter().filter(|m| **m).count();
        assert!(
            moved as f64 <= CAPPED_SHARE * samples as f64,
            "{moved} of {samples}: {s:?}"
        );
        assert!(s.capped >= 1, "{s:?}");
    }
    // The last round, long after minSamples verdicts of each family:
    // trivia, the small model as good, is trusted and every request moves;
    let last = |s: &Seen| s.trail[s.trail.len() - s.trail.len() / rounds..].to_vec();
    assert_eq!(state("trivia").as_deref(), Some("trusted"), "{guards}");
    assert!(last(trivia).iter().all(|m| *m), "{trivia:?}");
    // math, the small model worse, is suspended and nothing moves.
    assert_eq!(state("math").as_deref(), Some("suspended"), "{guards}");
    assert!(last(math).iter().all(|m| !*m), "{math:?}");
    assert!(math.suspended >= 1, "{math:?}");

    // The metrics agree.
    let m = |name: &str, labels: &[&str]| {
        let client = client.clone();
        let name = name.to_string();
        let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
        async move {
            let l: Vec<&str> = labels.iter().map(String::as_str).collect();
            client.metric(&name, &l).await
        }
    };
    let state_metric = m(
        "kinference_proxy_guard_state",
        &["family=\"math\"", "state=\"suspended\""],
    )
    .await;
    assert_eq!(state_metric, 1.0);
    let held = m(
        "kinference_proxy_guard_held_total",
        &["family=\"math\"", "hold=\"suspended\""],
    )
    .await;
    assert_eq!(held, f64::from(math.suspended));
    let requested_wins = m(
        "kinference_proxy_guard_verdicts_total",
        &["family=\"math\"", "verdict=\"requested\""],
    )
    .await;
    assert!(requested_wins >= f64::from(MIN_SAMPLES), "{requested_wins}");
    let ties = m(
        "kinference_proxy_guard_verdicts_total",
        &["family=\"trivia\"", "verdict=\"tie\""],
    )
    .await;
    assert!(ties >= f64::from(MIN_SAMPLES), "{ties}");

    // An explained math prompt shows what its rule's guard now allows.
    let (math_prompt, _) = kept.iter().find(|(_, f)| f == "math").unwrap();
    let explained: Value = client
        .http
        .post(format!("{}/debug/explain", client.admin))
        .json(&json!({"model": "glm-5.3", "messages": [{"role": "user", "content": math_prompt}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let g = &explained["guards"][0];
    assert_eq!(
        (
            g["rule"].as_str(),
            g["family"].as_str(),
            g["state"].as_str()
        ),
        (
            Some("low-complexity-may-use-qwen"),
            Some("math"),
            Some("suspended")
        ),
        "{explained:#}"
    );

    // The controller has the proxy's report, and its merged condition names the suspension.
    let url = format!("http://{}/debug/guards", stack.controller.admin);
    let report = kinference_local::poll::wait_until(
        "the controller has the guard report",
        Duration::from_secs(15),
        || {
            let url = url.clone();
            let http = client.http.clone();
            async move {
                let v: Value = http.get(&url).send().await.ok()?.json().await.ok()?;
                let p = v["policies"].get(0)?.clone();
                (p["merged"].as_array()?.len() == 2).then_some(p)
            }
        },
    )
    .await;
    assert_eq!(
        (report["namespace"].as_str(), report["name"].as_str()),
        (Some("default"), Some("llm"))
    );
    let condition = &report["condition"];
    assert_eq!(condition["status"], "False", "{report:#}");
    assert_eq!(condition["reason"], "RuleSuspended");
    let message = condition["message"].as_str().unwrap();
    assert!(message.contains("family math: gap 1.00"), "{message}");
    assert!(!message.contains("trivia"), "{message}");
    drop(stack);
}
