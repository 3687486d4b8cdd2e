//! Scenarios: the controller runs on a copy of `examples/`; a client watches its gRPC
//! APIs while files are added, changed and deleted, and each expected update must
//! arrive (within a bound that catches hangs, not slowness).

use kinference_policy_test::{Controller, controller_binary, examples_dir, next_matching};
use kinference_proxy_api::{
    InferencePoliciesClient,
    inference::{
        self as inf, InferencePolicy, InferenceTarget, balancer, classifier, inference_target,
        status,
    },
};
use linkerd2_proxy_api::{
    destination::{self as dst, destination_client::DestinationClient, update},
    meta, net,
    outbound::{
        self as outbound, backend, http_route, outbound_policies_client::OutboundPoliciesClient,
        proxy_protocol, traffic_spec,
    },
};
use std::net::SocketAddr;

const AUTHORITY: &str = "llm.default.svc.cluster.local:8000";
const GLM_PATH: &str = "glm-5.3.default.inferencepool.kinference.io";
const QWEN_PATH: &str = "qwen-3.6-27b.default.inferencepool.kinference.io";

async fn start() -> anyhow::Result<Controller> {
    let bin = controller_binary(env!(
        "CARGO_BIN_EXE_kinference-policy-controller-under-test"
    ));
    Controller::start(&bin, &examples_dir()).await
}

fn target() -> InferenceTarget {
    InferenceTarget {
        source_workload: "apps:chat".into(),
        target: Some(inference_target::Target::Authority(AUTHORITY.into())),
    }
}

/// Replaces `from` with `to` in a manifest, failing when `from` is absent so a changed
/// example cannot make a scenario pass vacuously.
fn edit(ctl: &Controller, file: &str, from: &str, to: &str) -> anyhow::Result<()> {
    let text = ctl.read(file)?;
    anyhow::ensure!(text.contains(from), "{file} does not contain {from:?}");
    ctl.write(file, &text.replacen(from, to, 1))
}

fn status_kind(p: &InferencePolicy) -> status::Kind {
    p.status
        .as_ref()
        .map_or(status::Kind::Unspecified, |s| s.kind())
}

fn model_names(p: &InferencePolicy) -> Vec<&str> {
    p.models.iter().map(|m| m.name.as_str()).collect()
}

async fn watch_inference(ctl: &Controller) -> anyhow::Result<tonic::Streaming<InferencePolicy>> {
    let mut client = InferencePoliciesClient::new(ctl.channel().await?);
    Ok(client.watch(target()).await?.into_inner())
}

async fn watch_endpoints(
    ctl: &Controller,
    path: &str,
) -> anyhow::Result<tonic::Streaming<dst::Update>> {
    let mut client = DestinationClient::new(ctl.channel().await?);
    let req = dst::GetDestination {
        scheme: "http:".into(),
        path: path.into(),
        context_token: String::new(),
    };
    Ok(client.get(req).await?.into_inner())
}

fn added(u: &dst::Update) -> Vec<(SocketAddr, std::collections::HashMap<String, String>)> {
    match &u.update {
        Some(update::Update::Add(set)) => set
            .addrs
            .iter()
            .filter_map(|a| {
                let addr = SocketAddr::try_from(a.addr?).ok()?;
                Some((addr, a.metric_labels.clone()))
            })
            .collect(),
        _ => vec![],
    }
}

fn removed(u: &dst::Update) -> Vec<SocketAddr> {
    match &u.update {
        Some(update::Update::Remove(set)) => set
            .addrs
            .iter()
            .filter_map(|a| SocketAddr::try_from(*a).ok())
            .collect(),
        _ => vec![],
    }
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[tokio::test]
async fn serves_the_example_policy() -> anyhow::Result<()> {
    let ctl = start().await?;
    let mut stream = watch_inference(&ctl).await?;
    let (p, _) = next_matching(&mut stream, "the served policy", |_| true).await?;
    assert_eq!(status_kind(&p), status::Kind::Served, "{p:#?}");
    assert_eq!(model_names(&p), vec!["glm-5.3", "qwen-3.6-27b"]);
    let parent = p.parent.as_ref().unwrap();
    assert_eq!(
        (parent.kind.as_str(), parent.name.as_str(), parent.port),
        ("Service", "llm", 8000)
    );
    let source = p.source.as_ref().unwrap();
    assert_eq!(
        (source.kind.as_str(), source.name.as_str()),
        ("InferencePolicy", "llm")
    );

    let glm = &p.models[0];
    let backend = glm.backend.as_ref().unwrap();
    assert_eq!(backend.destination_path, GLM_PATH);
    assert_eq!(backend.pool.as_ref().unwrap().kind, "InferencePool");
    let prior = glm.prior.as_ref().unwrap();
    assert_eq!(prior.prefill_tokens_per_second, 20_000.0);
    assert!((prior.time_per_output_token_s - 0.015).abs() < 1e-12);
    let price = glm.price.as_ref().unwrap();
    assert_eq!(
        (
            price.prompt_usd_per_million_tokens,
            price.cached_prompt_usd_per_million_tokens,
            price.completion_usd_per_million_tokens
        ),
        (0.60, 0.11, 2.20)
    );
    assert_eq!(
        p.aliases,
        vec![inf::Alias {
            name: "default".into(),
            target: "glm-5.3".into()
        }]
    );

    let rule = &p.rules[0];
    assert_eq!(rule.name, "low-complexity-may-use-qwen");
    let m = rule.r#match.as_ref().unwrap();
    assert_eq!(m.models, vec!["glm-5.3", "default"]);
    assert_eq!(m.tags[0].name, "complexity");
    assert_eq!(m.tags[0].values, vec!["low"]);
    assert_eq!(m.tags[0].min_confidence, 0.5);
    assert_eq!(
        rule.action.as_ref().unwrap().add_models,
        vec!["qwen-3.6-27b"]
    );

    let tags = &p.classifiers[0].tags;
    assert_eq!(tags.len(), 4);
    assert_eq!(
        tags[0].kind,
        // The example leaves the thresholds to the model's calibration: sent unset.
        Some(classifier::tag::Kind::Complexity(classifier::Complexity {
            low_threshold: None,
            high_threshold: None
        }))
    );
    assert!(
        matches!(&tags[1].kind, Some(classifier::tag::Kind::Keywords(k)) if k.weight == 0.8 && k.values.len() == 4)
    );
    assert!(
        matches!(&tags[2].kind, Some(classifier::tag::Kind::Regex(r)) if r.patterns.len() == 2)
    );
    assert_eq!(
        tags[3].kind,
        Some(classifier::tag::Kind::Family(classifier::Family {}))
    );

    let b = p.balancer.as_ref().unwrap();
    assert_eq!(b.freshness_budget, Some(prost_duration(0, 500_000_000)));
    assert_eq!(b.tie_window, Some(prost_duration(0, 20_000_000)));
    assert_eq!(b.failure_mode(), balancer::FailureMode::FailOpen);
    assert_eq!(b.mode(), balancer::Mode::Enforce);

    // Get returns the same policy as the stream's first message.
    let mut client = InferencePoliciesClient::new(ctl.channel().await?);
    assert_eq!(client.get(target()).await?.into_inner(), p);
    Ok(())
}

fn prost_duration(seconds: i64, nanos: i32) -> kinference_proxy_api::prost_types::Duration {
    kinference_proxy_api::prost_types::Duration { seconds, nanos }
}

#[tokio::test]
async fn outbound_policy_routes_to_the_pool() -> anyhow::Result<()> {
    let ctl = start().await?;
    let mut client = OutboundPoliciesClient::new(ctl.channel().await?);
    let spec = outbound::TrafficSpec {
        source_workload: "apps:chat".into(),
        target: Some(traffic_spec::Target::Authority(AUTHORITY.into())),
    };
    let mut stream = client.watch(spec.clone()).await?.into_inner();
    let (policy, _) = next_matching(&mut stream, "the outbound policy", |_| true).await?;
    let backends = http_backends(&policy);
    assert_eq!(
        backends,
        vec![("InferencePool".into(), "glm-5.3".into(), GLM_PATH.into(), 1)]
    );

    // Sending half the traffic to qwen shows up as a second weighted backend.
    edit(
        &ctl,
        "httproute.yaml",
        "          weight: 1\n",
        "          weight: 1\n        - group: inference.networking.k8s.io\n          kind: InferencePool\n          name: qwen-3.6-27b\n          weight: 1\n",
    )?;
    let (policy, _) = next_matching(&mut stream, "a second backend", |p| {
        http_backends(p).len() == 2
    })
    .await?;
    assert_eq!(
        http_backends(&policy)[1],
        (
            "InferencePool".into(),
            "qwen-3.6-27b".into(),
            QWEN_PATH.into(),
            1
        )
    );

    // By address: the example Service has no cluster IP, so it is not found.
    let by_addr = outbound::TrafficSpec {
        source_workload: String::new(),
        target: Some(traffic_spec::Target::Addr(net::TcpAddress::from(local(
            8000,
        )))),
    };
    let err = client.get(by_addr).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    Ok(())
}

/// (kind, name, destination path, weight) of each backend of the first HTTP/1 route.
fn http_backends(p: &outbound::OutboundPolicy) -> Vec<(String, String, String, u32)> {
    let Some(proxy_protocol::Kind::Detect(detect)) =
        p.protocol.as_ref().and_then(|p| p.kind.as_ref())
    else {
        return vec![];
    };
    let routes = &detect.http1.as_ref().unwrap().routes;
    let Some(http_route::distribution::Kind::RandomAvailable(dist)) = routes[0].rules[0]
        .backends
        .as_ref()
        .and_then(|b| b.kind.as_ref())
    else {
        return vec![];
    };
    dist.backends
        .iter()
        .map(|wb| {
            let b = wb.backend.as_ref().unwrap().backend.as_ref().unwrap();
            let Some(meta::metadata::Kind::Resource(r)) = b.metadata.as_ref().unwrap().kind.clone()
            else {
                panic!("backend without resource metadata");
            };
            let path = match &b.kind {
                Some(backend::Kind::Balancer(bal)) => {
                    match bal.discovery.as_ref().unwrap().kind.as_ref().unwrap() {
                        backend::endpoint_discovery::Kind::Dst(d) => d.path.clone(),
                    }
                }
                _ => String::new(),
            };
            (r.kind, r.name, path, wb.weight)
        })
        .collect()
}

#[tokio::test]
async fn a_new_model_is_streamed() -> anyhow::Result<()> {
    let ctl = start().await?;
    let mut stream = watch_inference(&ctl).await?;
    next_matching(&mut stream, "the served policy", |p| {
        status_kind(p) == status::Kind::Served
    })
    .await?;
    edit(
        &ctl,
        "policy.yaml",
        "  aliases:\n",
        "    - name: qwen-3.6-27b-fast\n      servedName: qwen-3.6-27b\n      poolRef:\n        name: qwen-3.6-27b\n      prior:\n        prefillTokensPerSecond: 9000\n        timePerOutputTokenMs: 12\n  aliases:\n",
    )?;
    let (p, _) = next_matching(&mut stream, "three models", |p| p.models.len() == 3).await?;
    assert_eq!(
        model_names(&p),
        vec!["glm-5.3", "qwen-3.6-27b", "qwen-3.6-27b-fast"]
    );
    let fast = &p.models[2];
    assert_eq!(fast.served_name, "qwen-3.6-27b");
    assert_eq!(fast.backend.as_ref().unwrap().destination_path, QWEN_PATH);
    assert!((fast.prior.as_ref().unwrap().time_per_output_token_s - 0.012).abs() < 1e-12);
    Ok(())
}

#[tokio::test]
async fn a_rule_change_is_streamed() -> anyhow::Result<()> {
    let ctl = start().await?;
    let mut stream = watch_inference(&ctl).await?;
    let (first, _) = next_matching(&mut stream, "the served policy", |p| {
        status_kind(p) == status::Kind::Served
    })
    .await?;
    edit(
        &ctl,
        "policy.yaml",
        "minConfidence: 0.5",
        "minConfidence: 0.8",
    )?;
    let (p, skipped) = next_matching(&mut stream, "the new confidence", |p| {
        p.rules
            .first()
            .and_then(|r| r.r#match.as_ref())
            .map(|m| m.tags[0].min_confidence)
            == Some(0.8)
    })
    .await?;
    assert!(skipped.is_empty(), "no other update is sent: {skipped:#?}");
    assert_ne!(p.revision, first.revision);
    Ok(())
}

#[tokio::test]
async fn a_deleted_policy_is_withdrawn() -> anyhow::Result<()> {
    let ctl = start().await?;
    let mut stream = watch_inference(&ctl).await?;
    next_matching(&mut stream, "the served policy", |p| {
        status_kind(p) == status::Kind::Served
    })
    .await?;
    ctl.remove("policy.yaml")?;
    let (p, _) = next_matching(&mut stream, "no policy", |p| {
        status_kind(p) == status::Kind::NotFound
    })
    .await?;
    assert!(p.models.is_empty());
    assert!(p.rules.is_empty());
    assert_eq!(p.parent.as_ref().unwrap().name, "llm");
    Ok(())
}

#[tokio::test]
async fn an_invalid_edit_keeps_the_last_valid_policy_served() -> anyhow::Result<()> {
    let ctl = start().await?;
    let mut stream = watch_inference(&ctl).await?;
    let (served, _) = next_matching(&mut stream, "the served policy", |p| {
        status_kind(p) == status::Kind::Served
    })
    .await?;
    edit(
        &ctl,
        "policy.yaml",
        "addModels: [\"qwen-3.6-27b\"]",
        "addModels: [\"qwen-9\"]",
    )?;
    let (p, _) = next_matching(&mut stream, "the last valid policy", |p| {
        status_kind(p) == status::Kind::LastGood
    })
    .await?;
    // The rejected version is not served: the last valid one is, with what was rejected.
    assert_eq!(p.revision, served.revision);
    assert_eq!(model_names(&p), vec!["glm-5.3", "qwen-3.6-27b"]);
    let message = &p.status.as_ref().unwrap().message;
    assert!(
        message.contains("spec.rules[0].action.addModels[0]"),
        "{message}"
    );
    assert!(message.contains("qwen-9"), "{message}");
    // The admin metrics count it.
    let (_, metrics) = ctl.admin_get("/metrics").await?;
    assert!(
        metrics.contains("kinference_policy_index_last_good_parents 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"kinference_policy_rejected_resources_total{kind="InferencePolicy",reason="not_found"} 1"#
        ),
        "{metrics}"
    );

    // Fixing it serves the fixed version.
    edit(
        &ctl,
        "policy.yaml",
        "addModels: [\"qwen-9\"]",
        "addModels: [\"qwen-3.6-27b\"]",
    )?;
    let (p, _) = next_matching(&mut stream, "the fixed policy", |p| {
        status_kind(p) == status::Kind::Served
    })
    .await?;
    assert_eq!(model_names(&p), vec!["glm-5.3", "qwen-3.6-27b"]);
    Ok(())
}

#[tokio::test]
async fn a_malformed_file_keeps_its_last_good_contents() -> anyhow::Result<()> {
    let mut ctl = start().await?;
    let mut stream = watch_inference(&ctl).await?;
    next_matching(&mut stream, "the served policy", |p| {
        status_kind(p) == status::Kind::Served
    })
    .await?;
    ctl.write("policy.yaml", "spec: [unclosed\n")?;
    // A later, valid change elsewhere proves the reload happened.
    edit(
        &ctl,
        "classifier.yaml",
        "complexity: {}",
        "complexity: {thresholds: {low: 0.25, high: 0.7}}",
    )?;
    let (p, _) = next_matching(&mut stream, "the new threshold", |p| {
        matches!(
            p.classifiers.first().and_then(|c| c.tags[0].kind.as_ref()),
            Some(classifier::tag::Kind::Complexity(c)) if c.low_threshold == Some(0.25)
        )
    })
    .await?;
    // The policy file's newest version is not YAML: its last good version is served, as such.
    assert_eq!(status_kind(&p), status::Kind::LastGood);
    let message = &p.status.as_ref().unwrap().message;
    assert!(message.contains("yaml"), "{message}");
    assert_eq!(model_names(&p), vec!["glm-5.3", "qwen-3.6-27b"]);
    let (_, metrics) = ctl.admin_get("/metrics").await?;
    assert!(
        !metrics.contains("kinference_policy_manifest_errors_total 0"),
        "{metrics}"
    );
    assert!(ctl.is_running());
    Ok(())
}

#[tokio::test]
async fn endpoints_stream_with_their_facts() -> anyhow::Result<()> {
    let ctl = start().await?;
    let mut stream = watch_endpoints(&ctl, GLM_PATH).await?;
    let (first, _) = next_matching(&mut stream, "the glm endpoints", |_| true).await?;
    let mut eps = added(&first);
    eps.sort_by_key(|(a, _)| *a);
    assert_eq!(
        eps.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
        vec![local(8001), local(8002)]
    );
    let labels = &eps[0].1;
    assert_eq!(labels["model"], "glm-5.3");
    assert_eq!(labels["inferencepool"], "glm-5.3");
    assert_eq!(labels["pod"], "vllm-glm-5-3-0");

    // Removing one replica's slice removes its address.
    let text = ctl.read("endpointslices.yaml")?;
    let docs: Vec<&str> = text
        .split("\n---\n")
        .filter(|d| !d.contains("name: vllm-glm-5-3-1\n"))
        .collect();
    anyhow::ensure!(
        docs.len() + 1 == text.split("\n---\n").count(),
        "slice vllm-glm-5-3-1 not found"
    );
    ctl.write("endpointslices.yaml", &docs.join("\n---\n"))?;
    let (u, _) = next_matching(&mut stream, "a removal", |u| !removed(u).is_empty()).await?;
    assert_eq!(removed(&u), vec![local(8002)]);
    Ok(())
}

#[tokio::test]
async fn a_pool_with_no_ready_endpoints_has_no_endpoints() -> anyhow::Result<()> {
    let ctl = start().await?;
    let mut stream = watch_endpoints(&ctl, QWEN_PATH).await?;
    let (first, _) = next_matching(&mut stream, "the qwen endpoints", |_| true).await?;
    assert_eq!(added(&first).len(), 2);

    // Both qwen replicas become unready.
    let text = ctl.read("endpointslices.yaml")?;
    let docs: Vec<String> = text
        .split("\n---\n")
        .map(|d| {
            if d.contains("qwen-3.6-27b") {
                d.replace("ready: true", "ready: false")
            } else {
                d.to_string()
            }
        })
        .collect();
    ctl.write("endpointslices.yaml", &docs.join("\n---\n"))?;
    let (u, _) = next_matching(&mut stream, "no endpoints", |u| {
        matches!(u.update, Some(update::Update::NoEndpoints(_)))
    })
    .await?;
    assert_eq!(
        u.update,
        Some(update::Update::NoEndpoints(dst::NoEndpoints {
            exists: true
        }))
    );

    // A pool that does not exist: no endpoints, and it does not exist.
    let mut missing = watch_endpoints(&ctl, "nope.default.inferencepool.kinference.io").await?;
    let (u, _) = next_matching(&mut missing, "no endpoints", |_| true).await?;
    assert_eq!(
        u.update,
        Some(update::Update::NoEndpoints(dst::NoEndpoints {
            exists: false
        }))
    );
    Ok(())
}

#[tokio::test]
async fn admin_reports_health_and_streams() -> anyhow::Result<()> {
    let ctl = start().await?;
    assert_eq!(ctl.admin_get("/live").await?.0, 200);
    assert_eq!(ctl.admin_get("/ready").await?.0, 200);
    assert_eq!(ctl.admin_get("/nope").await?.0, 404);
    let mut stream = watch_inference(&ctl).await?;
    next_matching(&mut stream, "the served policy", |_| true).await?;
    let (status, metrics) = ctl.admin_get("/metrics").await?;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("kinference_policy_grpc_streams_open{api=\"inference\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kinference_policy_index_resources{kind=\"EndpointSlice\"} 4"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kinference_policy_index_watched_targets{api=\"inference\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kinference_policy_grpc_stream_updates_total{api=\"inference\"} 1"),
        "{metrics}"
    );
    drop(stream);
    Ok(())
}

#[tokio::test]
async fn bad_targets_are_rejected() -> anyhow::Result<()> {
    let ctl = start().await?;
    let mut client = InferencePoliciesClient::new(ctl.channel().await?);
    let bad = InferenceTarget {
        source_workload: String::new(),
        target: Some(inference_target::Target::Authority(
            "example.com:443".into(),
        )),
    };
    assert_eq!(
        client.get(bad).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    let none = InferenceTarget::default();
    assert_eq!(
        client.get(none).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
    let mut dst = DestinationClient::new(ctl.channel().await?);
    let err = dst
        .get(dst::GetDestination {
            scheme: "http:".into(),
            path: "example.com:80".into(),
            context_token: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    Ok(())
}
