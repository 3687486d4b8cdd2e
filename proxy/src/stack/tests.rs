//! The whole stack over a fake forward service: what reaches the endpoints, in which order, and
//! what is recorded. Time is tokio's, paused where a test depends on it.

use super::*;
use crate::{
    body::ENDPOINT_HEADER,
    endpoints::EndpointTable,
    forward::{Attempt, ForwardError},
    router::RouterHandle,
    target::{self, Feed},
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use kinference_decision::Mode;
use kinference_proxy_api::inference as api;
use kinference_proxy_discovery::{
    Endpoint, Endpoints,
    testing::{example_classifiers, example_proto},
};
use kinference_routing::{EndpointId, Scrape};
use parking_lot::Mutex;
use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};
use tower::ServiceExt;

type Seen = Arc<Mutex<Vec<(SocketAddr, Bytes)>>>;

/// A forward service that records what it was sent and answers `status`.
fn fake(
    seen: Seen,
    status: impl Fn(SocketAddr) -> u16 + Clone + Send + Sync + 'static,
) -> impl tower::Service<
    Attempt,
    Response = http::Response<Full<Bytes>>,
    Error = ForwardError,
    Future = impl Send,
> + Clone
+ Send
+ Sync
+ 'static {
    tower::service_fn(move |a: Attempt| {
        let seen = seen.clone();
        let status = status.clone();
        async move {
            let body = a.request.into_body().collect().await.unwrap().to_bytes();
            seen.lock().push((a.addr, body));
            let mut rsp = http::Response::new(Full::new(Bytes::from_static(b"{}")));
            *rsp.status_mut() = http::StatusCode::from_u16(status(a.addr)).unwrap();
            Ok::<_, ForwardError>(rsp)
        }
    })
}

/// The example policy with `mode` and the keyword tag `translation` as the rule's only tag (these
/// tests do not depend on the complexity model's weights).
fn example(mode: api::balancer::Mode) -> api::InferencePolicy {
    let mut proto = example_proto();
    proto.balancer.as_mut().unwrap().mode = mode as i32;
    proto.classifiers = example_classifiers();
    proto.classifiers[0]
        .tags
        .retain(|t| t.name == "translation");
    proto.rules[0].r#match.as_mut().unwrap().tags = vec![api::rule::TagMatch {
        name: "translation".into(),
        values: vec!["true".into()],
        min_confidence: 0.5,
    }];
    proto
}

fn ep(port: u16) -> Endpoint {
    Endpoint {
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        labels: BTreeMap::new(),
    }
}

/// glm-5.3 on port 1, qwen-3.6-27b on port 3.
fn endpoints() -> Endpoints {
    Endpoints {
        by_backend: BTreeMap::from([
            (
                "glm-5.3.default.inferencepool.kinference.io".into(),
                vec![ep(1)],
            ),
            (
                "qwen-3.6-27b.default.inferencepool.kinference.io".into(),
                vec![ep(3)],
            ),
        ]),
    }
}

struct Fixture {
    target: Target,
    shared: Shared,
    // Held so the target's policy channel stays open.
    _feed: Feed,
}

fn fixture(proto: api::InferencePolicy, endpoints: &Endpoints) -> Fixture {
    let (target, feed) = target::new("llm:8000", RouterHandle::default());
    let active = feed.apply(Arc::new(proto));
    target
        .endpoints
        .sync(&active.policy, endpoints, &target.router);
    let shared = Shared {
        metrics: Metrics::new(),
        decisions: Decisions::new(16),
        traffic: crate::traffic::Traffic::new(16, None).unwrap(),
        workload: Workload::parse("default/app", vec![]),
        settings: Settings {
            max_attempts: 2,
            body_limit_bytes: 1 << 20,
            allow_tenant_header: false,
            tenant: "default/app".into(),
            access_log: false,
            retry_ratio: 0.2,
            retry_min_per_second: 10,
        },
    };
    Fixture {
        target,
        shared,
        _feed: feed,
    }
}

fn scrape(target: &Target, port: u16, waiting: u32) {
    target.router.observe_scrape(
        &EndpointId::from(format!("127.0.0.1:{port}")),
        &Scrape {
            num_requests_waiting: Some(waiting),
            num_requests_running: Some(0),
            kv_cache_usage: Some(0.0),
            ..Scrape::default()
        },
        target.router.now(),
    );
}

/// glm loaded, qwen idle.
fn loaded(mode: api::balancer::Mode) -> Fixture {
    let f = fixture(example(mode), &endpoints());
    scrape(&f.target, 1, 60);
    scrape(&f.target, 3, 0);
    f
}

fn post(body: &str, id: &str) -> http::Request<Full<Bytes>> {
    http::Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("x-request-id", id)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

const LOW: &str = r#"{"model":"glm-5.3","messages":[{"role":"user","content":"Please translate hello in French"}]}"#;

#[tokio::test]
async fn model_is_rewritten_only_when_a_substitute_wins() {
    let f = loaded(api::balancer::Mode::Enforce);
    let seen: Seen = Arc::default();
    let svc = layered(&f.target, &f.shared, fake(seen.clone(), |_| 200));
    // Tagged translation=true: qwen (idle) may serve it and beats loaded glm; the body names qwen.
    let rsp = svc.clone().oneshot(post(LOW, "r1")).await.unwrap();
    let rec = f.shared.decisions.snapshot(Some("r1"));
    assert_eq!(
        rsp.headers()[ENDPOINT_HEADER],
        "127.0.0.1:3",
        "{}",
        serde_json::to_string(&rec).unwrap()
    );
    let (addr, body) = seen.lock()[0].clone();
    assert_eq!(addr.port(), 3);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["model"], "qwen-3.6-27b");
    drop(rsp);
    // Not tagged: only glm is allowed; the body is forwarded byte for byte.
    let high = r#"{"model":"glm-5.3", "messages":[{"role":"user","content":"Design a distributed consensus protocol tolerant to Byzantine faults for a geo-replicated database; derive its message complexity, prove safety and liveness under partial synchrony, and compare it with PBFT and HotStuff in latency and throughput."}]}"#;
    let rsp = svc.oneshot(post(high, "r2")).await.unwrap();
    assert_eq!(rsp.headers()[ENDPOINT_HEADER], "127.0.0.1:1");
    let (addr, body) = seen.lock()[1].clone();
    assert_eq!(addr.port(), 1);
    assert_eq!(&body[..], high.as_bytes());
}

#[tokio::test]
async fn a_503_before_the_first_byte_is_retried_on_the_next_best() {
    let f = loaded(api::balancer::Mode::Enforce);
    let seen: Seen = Arc::default();
    let svc = layered(
        &f.target,
        &f.shared,
        fake(
            seen.clone(),
            |a: SocketAddr| if a.port() == 3 { 503 } else { 200 },
        ),
    );
    let rsp = svc.oneshot(post(LOW, "r1")).await.unwrap();
    assert_eq!(rsp.status(), 200);
    let ports: Vec<u16> = seen.lock().iter().map(|(a, _)| a.port()).collect();
    assert_eq!(ports, vec![3, 1]);
    // The retry went back to the requested model: its body names glm-5.3 again.
    let v: serde_json::Value = serde_json::from_slice(&seen.lock()[1].1).unwrap();
    assert_eq!(v["model"], "glm-5.3");
    assert_eq!(
        f.shared.decisions.snapshot(Some("r1"))[0].attempts,
        vec!["127.0.0.1:3", "127.0.0.1:1"]
    );
    let text = f.shared.metrics.encode();
    assert!(text.contains(r#"reason="status_5xx"} 1"#), "{text}");
}

#[tokio::test]
async fn shadow_mode_records_the_decision_but_sends_to_the_requested_pool() {
    let f = loaded(api::balancer::Mode::Shadow);
    let seen: Seen = Arc::default();
    let svc = layered(&f.target, &f.shared, fake(seen.clone(), |_| 200));
    let rsp = svc.oneshot(post(LOW, "r1")).await.unwrap();
    assert_eq!(rsp.headers()[ENDPOINT_HEADER], "127.0.0.1:1");
    let rec = &f.shared.decisions.snapshot(Some("r1"))[0];
    assert_eq!(rec.plan.mode, Mode::Shadow);
    assert_eq!(
        rec.plan.decision.chosen_endpoint().map(|e| e.as_str()),
        Some("127.0.0.1:3")
    );
    assert_eq!(rec.attempts, vec!["127.0.0.1:1"]);
    assert_eq!(&seen.lock()[0].1[..], LOW.as_bytes(), "not rewritten");
    let text = f.shared.metrics.encode();
    assert!(text.contains(r#"mode="shadow",arm=""} 1"#), "{text}");
}

#[tokio::test]
async fn label_values_come_from_policy_not_from_the_client() {
    let f = loaded(api::balancer::Mode::Enforce);
    let svc = layered(&f.target, &f.shared, fake(Arc::default(), |_| 200));
    for name in ["gpt-4o", "my-own-series"] {
        let body = format!(r#"{{"model":"{name}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        let rsp = svc.clone().oneshot(post(&body, "r1")).await.unwrap();
        assert_eq!(rsp.status(), 404);
    }
    let text = f.shared.metrics.encode();
    assert!(
        !text.contains("gpt-4o") && !text.contains("my-own-series"),
        "{text}"
    );
    assert!(
        text.contains(
            r#"requested_model="unknown",served_model="",pool="",service_class="",status="404",arm=""} 2"#
        ),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn signals_past_the_freshness_budget_fall_back_and_fail_closed() {
    // The example policy fails closed, with a 250 ms freshness budget.
    let mut proto = example(api::balancer::Mode::Enforce);
    proto.balancer.as_mut().unwrap().failure_mode = api::balancer::FailureMode::FailClose as i32;
    let f = fixture(proto, &endpoints());
    scrape(&f.target, 1, 0);
    scrape(&f.target, 3, 0);
    let seen: Seen = Arc::default();
    let svc = layered(&f.target, &f.shared, fake(seen.clone(), |_| 200));
    let rsp = svc.clone().oneshot(post(LOW, "fresh")).await.unwrap();
    assert_eq!(rsp.status(), 200);
    drop(rsp);
    tokio::time::advance(Duration::from_millis(200)).await;
    let rsp = svc.clone().oneshot(post(LOW, "still")).await.unwrap();
    assert_eq!(rsp.status(), 200, "200 ms old is within the budget");
    drop(rsp);
    tokio::time::advance(Duration::from_millis(100)).await;
    let rsp = svc.oneshot(post(LOW, "stale")).await.unwrap();
    assert_eq!(rsp.status(), 503);
    let rec = &f.shared.decisions.snapshot(Some("stale"))[0];
    assert!(
        rec.plan.decision.reason.is_fallback(),
        "{:?}",
        rec.plan.decision.reason
    );
    assert_eq!(seen.lock().len(), 2, "nothing sent on stale signals");
    let text = f.shared.metrics.encode();
    assert!(
        text.contains(r#"reason="stale_signals",failure_mode="fail_close",arm=""} 1"#),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn signal_ages_advance_with_tokio_s_clock() {
    let f = loaded(api::balancer::Mode::Enforce);
    tokio::time::advance(Duration::from_millis(1_500)).await;
    let view = crate::admin::endpoints_view(&f.target);
    let glm = &view["endpoints"][0];
    assert_eq!(glm["endpoint"], "127.0.0.1:1");
    assert_eq!(glm["signals"]["num_requests_waiting"]["value"], 60);
    assert_eq!(glm["signals"]["num_requests_waiting"]["age_s"], 1.5);
}

#[tokio::test(start_paused = true)]
async fn a_silent_endpoint_fails_over_after_the_response_timeout() {
    // Port A accepts and never answers; port B answers at once.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let answering = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (a, b) = (
        silent.local_addr().unwrap(),
        answering.local_addr().unwrap(),
    );
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (s, _) = silent.accept().await.unwrap();
            held.push(s);
        }
    });
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let (mut s, _) = answering.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                    .await;
            });
        }
    });
    let eps = Endpoints {
        by_backend: BTreeMap::from([(
            "glm-5.3.default.inferencepool.kinference.io".into(),
            vec![
                Endpoint {
                    addr: a,
                    labels: BTreeMap::new(),
                },
                Endpoint {
                    addr: b,
                    labels: BTreeMap::new(),
                },
            ],
        )]),
    };
    let f = fixture(example(api::balancer::Mode::Enforce), &eps);
    // The silent one looks idle, the other busy: the plan tries the silent one first.
    for (addr, waiting) in [(a, 0), (b, 30)] {
        f.target.router.observe_scrape(
            &EndpointId::from(addr.to_string()),
            &Scrape {
                num_requests_waiting: Some(waiting),
                num_requests_running: Some(0),
                kv_cache_usage: Some(0.0),
                ..Scrape::default()
            },
            f.target.router.now(),
        );
    }
    let forward = Forward::new(
        crate::config::UpstreamProtocol::Http1,
        Duration::from_secs(1),
        Some(Duration::from_secs(2)),
    );
    let svc = layered(&f.target, &f.shared, forward);
    let started = tokio::time::Instant::now();
    let high = r#"{"model":"glm-5.3","messages":[{"role":"user","content":"Prove it."}]}"#;
    let rsp = svc.oneshot(post(high, "r1")).await.unwrap();
    assert_eq!(rsp.status(), 200);
    assert_eq!(rsp.headers()[ENDPOINT_HEADER], b.to_string());
    // Exactly the response timeout was spent on the silent endpoint, on tokio's clock.
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(
        f.shared.decisions.snapshot(Some("r1"))[0].attempts,
        vec![a.to_string(), b.to_string()]
    );
}

#[tokio::test]
async fn kv_event_pools_route_on_the_blocks_their_endpoints_report() {
    use kinference_proxy_signals::{PromptRef, Tokenizer};
    use kinference_routing::KvEvent;
    let mut proto = example(api::balancer::Mode::Enforce);
    for m in &mut proto.models {
        m.backend.as_mut().unwrap().kv_events = Some(api::KvEvents {
            port: Some(api::kv_events::Port::Offset(1000)),
            topic: String::new(),
            tokenizer: "kinference-sim".into(),
        });
    }
    let eps = Endpoints {
        by_backend: BTreeMap::from([(
            "glm-5.3.default.inferencepool.kinference.io".into(),
            vec![ep(1), ep(2)],
        )]),
    };
    let f = fixture(proto, &eps);
    scrape(&f.target, 1, 0);
    scrape(&f.target, 2, 0);
    // Endpoint 2 reports the blocks of a long prompt, hashed as the simulator does.
    let text = "You are a careful assistant. ".repeat(60);
    let t = Tokenizer::KinferenceSim;
    let tokens = t.tokens(PromptRef::Completion(&text)).unwrap();
    let hashes = t.block_hashes(&tokens, 16);
    assert!(hashes.len() > 10);
    let id = EndpointId::from("127.0.0.1:2");
    assert!(f.target.router.apply_kv_events(
        &id,
        &[KvEvent::BlockStored {
            block_hashes: hashes.clone(),
            parent_block_hash: None,
            token_ids: vec![],
            block_size: 16,
        }],
    ));
    let svc = layered(&f.target, &f.shared, fake(Arc::default(), |_| 200));
    let body = serde_json::json!({"model": "glm-5.3", "prompt": text}).to_string();
    let req = http::Request::post("/v1/completions")
        .header("content-type", "application/json")
        .header("x-request-id", "r1")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let rsp = svc.oneshot(req).await.unwrap();
    assert_eq!(rsp.headers()[ENDPOINT_HEADER], "127.0.0.1:2");
    let rec = &f.shared.decisions.snapshot(Some("r1"))[0];
    let d = &rec.plan.decision;
    // The pool's tokenizer counted the prompt, not the proxy's estimate.
    assert_eq!(d.prompt_tokens as usize, tokens.len());
    let chosen = d.chosen().unwrap();
    assert_eq!(
        chosen.prediction.prefix_source,
        Some(kinference_routing::prefix::PrefixSource::Precise)
    );
    // Every full block is held (the last prompt token is always computed again).
    assert_eq!(
        chosen.prediction.cached_tokens as usize,
        (hashes.len() * 16).min(tokens.len() - 1)
    );
    let _: &EndpointTable = &f.target.endpoints;
}

#[tokio::test(start_paused = true)]
async fn cheapest_within_slo_sends_a_simple_prompt_to_the_cheaper_model_while_it_meets_the_slo() {
    let mut proto = example(api::balancer::Mode::Enforce);
    let b = proto.balancer.as_mut().unwrap();
    b.objective = api::balancer::Objective::CheapestWithinSlo as i32;
    b.failure_mode = api::balancer::FailureMode::FailOpen as i32;
    proto.service_classes = vec![api::ServiceClass {
        name: "Standard".into(),
        ttft_slo: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        max_queue_time: None,
        reserved_share: 0.0,
    }];
    // Both idle: glm (12k prefill tokens/s) answers first, qwen (6k) is cheaper and well within
    // the SLO for a short prompt.
    let f = fixture(proto, &endpoints());
    scrape(&f.target, 1, 0);
    scrape(&f.target, 3, 0);
    let svc = layered(&f.target, &f.shared, fake(Arc::default(), |_| 200));
    let rsp = svc.clone().oneshot(post(LOW, "r1")).await.unwrap();
    assert_eq!(rsp.headers()[ENDPOINT_HEADER], "127.0.0.1:3");
    drop(rsp);
    let json = serde_json::to_value(&f.shared.decisions.snapshot(Some("r1"))[0]).unwrap();
    assert_eq!(json["objective"]["objective"], "cheapest_within_slo");
    assert_eq!(json["objective"]["decided_by"], "cheapest_within_slo");
    assert_eq!(json["objective"]["ttft_slo_s"], 1.0);
    // Without the tag, only glm is allowed: the fastest, and the only one.
    let high = r#"{"model":"glm-5.3","messages":[{"role":"user","content":"Prove it."}]}"#;
    let rsp = svc.clone().oneshot(post(high, "r2")).await.unwrap();
    assert_eq!(rsp.headers()[ENDPOINT_HEADER], "127.0.0.1:1");
    drop(rsp);
    // A second later the signals are stale: the fallback's pick stands, recorded as such.
    tokio::time::advance(Duration::from_secs(1)).await;
    let rsp = svc.oneshot(post(LOW, "r3")).await.unwrap();
    assert_eq!(rsp.status(), 200);
    let json = serde_json::to_value(&f.shared.decisions.snapshot(Some("r3"))[0]).unwrap();
    assert_eq!(json["objective"]["decided_by"], "fallback");
    let text = f.shared.metrics.encode();
    assert!(
        text.contains(r#"kinference_proxy_objective_decisions_total{tenant="default/app",requested_model="glm-5.3",served_model="qwen-3.6-27b",objective="cheapest_within_slo",decided_by="cheapest_within_slo"} 1"#),
        "{text}"
    );
}

/// Both endpoints of glm-5.3 (ports 1 and 2), idle.
fn two_glm(proto: api::InferencePolicy) -> Fixture {
    let eps = Endpoints {
        by_backend: BTreeMap::from([(
            "glm-5.3.default.inferencepool.kinference.io".into(),
            vec![ep(1), ep(2)],
        )]),
    };
    let f = fixture(proto, &eps);
    scrape(&f.target, 1, 0);
    scrape(&f.target, 2, 1);
    f
}

const HIGH: &str = r#"{"model":"glm-5.3","messages":[{"role":"user","content":"Prove it."}]}"#;

#[tokio::test]
async fn a_fast_failing_endpoint_is_ejected_after_consecutive_failures() {
    let f = two_glm(example(api::balancer::Mode::Enforce));
    let seen: Seen = Arc::default();
    // Port 1 looks best (an empty queue) and answers 503 to everything.
    let svc = layered(
        &f.target,
        &f.shared,
        fake(
            seen.clone(),
            |a: SocketAddr| if a.port() == 1 { 503 } else { 200 },
        ),
    );
    for i in 0..10 {
        let rsp = svc
            .clone()
            .oneshot(post(HIGH, &format!("r{i}")))
            .await
            .unwrap();
        assert_eq!(
            rsp.status(),
            200,
            "every request is answered by the healthy one"
        );
    }
    // The first seven paid a retry; then port 1 was ejected and the rest went to port 2 first.
    let firsts: Vec<u16> = (0..10)
        .map(|i| {
            let rec = &f.shared.decisions.snapshot(Some(&format!("r{i}")))[0];
            rec.attempts[0].rsplit(':').next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(firsts, [1, 1, 1, 1, 1, 1, 1, 2, 2, 2]);
    let rec = &f.shared.decisions.snapshot(Some("r8"))[0];
    assert!(
        rec.plan
            .decision
            .excluded
            .iter()
            .any(|e| e.endpoint.as_str() == "127.0.0.1:1"
                && e.why == kinference_routing::decision::Exclusion::Ejected)
    );
    let text = f.shared.metrics.encode();
    assert!(
        text.contains(r#"kinference_proxy_endpoint_ejections_total{pool="glm-5.3",model="glm-5.3",endpoint="127.0.0.1:1"} 1"#),
        "{text}"
    );
    let view = crate::admin::endpoints_view(&f.target);
    let e1 = &view["endpoints"][0]["accrual"];
    assert_eq!(e1["ejections"], 1, "{view}");
    assert!(e1["ejected_for_s"].as_f64().unwrap() > 0.0);
}

/// The body of [`sse`]'s answers.
type SseBody = http_body_util::StreamBody<
    futures::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, std::convert::Infallible>>,
>;

/// A forward service whose answers are SSE streams that send the role-only opener and then
/// whatever `rest` yields (pending forever after it).
fn sse(
    rest: Vec<&'static str>,
) -> impl tower::Service<
    Attempt,
    Response = http::Response<SseBody>,
    Error = ForwardError,
    Future = impl Send,
> + Clone
+ Send
+ Sync
+ 'static {
    tower::service_fn(move |_a: Attempt| {
        let rest = rest.clone();
        async move {
            use futures::StreamExt;
            let opener = Bytes::from_static(
                b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            );
            let frames = futures::stream::iter(
                std::iter::once(opener)
                    .chain(rest.into_iter().map(|s| Bytes::from(s.to_string())))
                    .map(|b| Ok(http_body::Frame::data(b))),
            )
            .chain(futures::stream::pending())
            .boxed();
            let mut rsp = http::Response::new(http_body_util::StreamBody::new(frames));
            rsp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
            Ok::<_, ForwardError>(rsp)
        }
    })
}

fn stream_post(id: &str) -> http::Request<Full<Bytes>> {
    post(
        r#"{"model":"glm-5.3","stream":true,"messages":[{"role":"user","content":"Prove it."}]}"#,
        id,
    )
}

#[tokio::test(start_paused = true)]
async fn a_stream_without_a_first_token_ends_with_a_timeout_event_at_its_deadline() {
    let f = two_glm(example(api::balancer::Mode::Enforce));
    let svc = layered(&f.target, &f.shared, sse(vec![]));
    let started = tokio::time::Instant::now();
    let rsp = svc.oneshot(stream_post("r1")).await.unwrap();
    assert_eq!(rsp.status(), 200);
    let body = rsp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains(r#""code":"timeout""#), "{text}");
    assert!(text.contains("no first token within its timeout"), "{text}");
    // The prediction is milliseconds: the wait is the 10 s floor, on tokio's clock.
    assert_eq!(started.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_goes_silent_ends_after_the_idle_timeout() {
    let f = two_glm(example(api::balancer::Mode::Enforce));
    let svc = layered(
        &f.target,
        &f.shared,
        sse(vec![
            "data: {\"choices\":[{\"delta\":{\"content\":\"Yes\"}}]}\n\n",
        ]),
    );
    let started = tokio::time::Instant::now();
    let rsp = svc.oneshot(stream_post("r1")).await.unwrap();
    let body = rsp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("Yes"), "{text}");
    assert!(
        text.contains("the endpoint sent nothing for the stream idle timeout"),
        "{text}"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    let text = f.shared.metrics.encode();
    assert!(
        text.contains(r#"status="stream",arm=""} 1"#),
        "counted as a stream error: {text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_endpoint_is_left_at_the_derived_first_byte_wait() {
    // No response timeout in the forward service: the retry layer's own wait applies.
    let f = two_glm(example(api::balancer::Mode::Enforce));
    let seen: Seen = Arc::default();
    let slow = {
        let seen = seen.clone();
        tower::service_fn(move |a: Attempt| {
            let seen = seen.clone();
            async move {
                seen.lock().push((a.addr, Bytes::new()));
                if a.addr.port() == 1 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, ForwardError>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
            }
        })
    };
    let svc = layered(&f.target, &f.shared, slow);
    let started = tokio::time::Instant::now();
    let rsp = svc.oneshot(post(HIGH, "r1")).await.unwrap();
    assert_eq!(rsp.status(), 200);
    assert_eq!(rsp.headers()[ENDPOINT_HEADER], "127.0.0.1:2");
    // A non-stream answer's first byte is the whole answer: the wait is four times the
    // predicted TTFT plus 256 tokens (no max_tokens) at the predicted decode step, within the
    // floor and the cap, and it was spent on the silent one before the retry.
    let rec = &f.shared.decisions.snapshot(Some("r1"))[0];
    let c = rec.plan.attempt(0).unwrap();
    assert_eq!(c.endpoint.as_str(), "127.0.0.1:1");
    let p = &c.prediction;
    let expected =
        Duration::from_secs_f64(4.0 * (p.dated.predicted_ttft_s + 256.0 * p.decode_step_s));
    assert!(expected > Duration::from_secs(10) && expected < Duration::from_secs(120));
    let elapsed = started.elapsed();
    assert!(
        elapsed.abs_diff(expected) < Duration::from_millis(1),
        "{elapsed:?} against {expected:?}"
    );
    let text = f.shared.metrics.encode();
    assert!(text.contains(r#"reason="timeout"} 1"#), "{text}");
}

#[tokio::test]
async fn retries_stop_when_the_retry_budget_is_spent() {
    // Port 1 answers 503, port 2 200; failure accrual off, so only the budget stops retries:
    // no share of requests, one retry a second over 10 s (10 in reserve).
    let eps = Endpoints {
        by_backend: BTreeMap::from([(
            "glm-5.3.default.inferencepool.kinference.io".into(),
            vec![ep(1), ep(2)],
        )]),
    };
    let mut f = fixture(example(api::balancer::Mode::Enforce), &eps);
    let mut config = kinference_routing::RouterConfig::default();
    config.accrual.consecutive_failures = u32::MAX;
    let (target, feed) = target::new(
        "llm:8000",
        RouterHandle::new(crate::clock::Clock::new(), config),
    );
    let active = feed.apply(Arc::new(example(api::balancer::Mode::Enforce)));
    target.endpoints.sync(&active.policy, &eps, &target.router);
    f.target = target;
    f._feed = feed;
    f.shared.settings.retry_ratio = 0.0;
    f.shared.settings.retry_min_per_second = 1;
    scrape(&f.target, 1, 0);
    scrape(&f.target, 2, 1);
    let svc = layered(
        &f.target,
        &f.shared,
        fake(
            Arc::default(),
            |a: SocketAddr| if a.port() == 1 { 503 } else { 200 },
        ),
    );
    let mut refused = 0;
    for i in 0..20 {
        let id = format!("r{i}");
        let rsp = svc.clone().oneshot(post(HIGH, &id)).await.unwrap();
        let attempts = f.shared.decisions.snapshot(Some(&id))[0].attempts.clone();
        match rsp.status().as_u16() {
            200 => {}
            // Past the budget, port 1's own answer goes back, untried elsewhere.
            503 => {
                assert_eq!(attempts, ["127.0.0.1:1"]);
                refused += 1;
            }
            other => panic!("{id}: {other}"),
        }
    }
    // Ten retries in reserve, and not one more.
    let text = f.shared.metrics.encode();
    assert!(text.contains(r#"reason="status_5xx"} 10"#), "{text}");
    assert!(refused > 0);
    assert!(
        text.contains(&format!(r#"reason="budget_exhausted"}} {refused}"#)),
        "{refused}: {text}"
    );
}

#[tokio::test]
async fn only_the_allowed_openai_paths_pass_and_internal_headers_are_stripped() {
    let f = loaded(api::balancer::Mode::Enforce);
    let headers: Arc<Mutex<Vec<http::HeaderMap>>> = Arc::default();
    let forward = {
        let headers = headers.clone();
        tower::service_fn(move |a: Attempt| {
            let headers = headers.clone();
            async move {
                headers.lock().push(a.request.headers().clone());
                Ok::<_, ForwardError>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
            }
        })
    };
    let svc = layered(&f.target, &f.shared, forward);
    let req = |path: &str| {
        http::Request::post(path)
            .header("content-type", "application/json")
            .header("authorization", "Bearer app-token")
            .header("x-sim-fault", "503")
            .header("x-kinference-tenant", "someone-else")
            .body(Full::new(Bytes::from_static(
                br#"{"model":"glm-5.3","input":"hello"}"#,
            )))
            .unwrap()
    };
    let rsp = svc.clone().oneshot(req("/v1/embeddings")).await.unwrap();
    assert_eq!(rsp.status(), 200);
    let sent = headers.lock()[0].clone();
    assert_eq!(
        sent["authorization"], "Bearer app-token",
        "the app's own headers pass"
    );
    assert!(sent.get("x-sim-fault").is_none() && sent.get("x-kinference-tenant").is_none());
    // Engine administration and unknown paths are never forwarded.
    for path in [
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/v1/anything",
    ] {
        let rsp = svc.clone().oneshot(req(path)).await.unwrap();
        assert_eq!(rsp.status(), 404, "{path}");
        let body = rsp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    assert_eq!(headers.lock().len(), 1);
    // Completions strip them too.
    let rsp = svc
        .oneshot(
            http::Request::post("/v1/chat/completions")
                .header("content-type", "application/json")
                .header("x-sim-fault", "503")
                .body(Full::new(Bytes::from(HIGH)))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(rsp.status(), 200);
    assert!(headers.lock()[1].get("x-sim-fault").is_none());
}
