//! The controller binary in Kubernetes mode (no `--manifests`) against the API server
//! double: objects preloaded in the double arrive on the gRPC APIs, `/ready` waits for
//! the initial sync, the replica takes the Lease and writes status, and the admission
//! webhooks (validating and injecting) answer over TLS.

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use kinference_k8s_api_double::ApiServer;
use kinference_policy_test::{
    Controller, EVENT_TIMEOUT, KubeSetup, controller_binary, next_matching,
};
use kinference_proxy_api::{
    InferencePoliciesClient,
    inference::{
        ArmReport, GuardReport, GuardStatus, InferenceTarget, RolloutReport,
        guard_status::State as GuardState, inference_target,
    },
};
use linkerd2_proxy_api::destination::{self as dst, destination_client::DestinationClient, update};
use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
use serde_json::{Value, json};
use std::{net::SocketAddr, sync::Arc};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

const NS: &str = "default";
const CONTROL_PLANE_NS: &str = "kinference";
const POD: &str = "kinference-policy-controller-0";
const LEASE: &str = "test-lease";
const AUTHORITY: &str = "llm.default.svc.cluster.local:8000";
const POOL_PATH: &str = "glm-5.3.default.inferencepool.kinference.io";
const POLICY_API: &str = "policy.kinference.io/v1alpha1";

/// The injector's config.json as the chart renders it.
const PROXY_CONFIG: &str = r#"{"controllerAddr":"http://kinference-policy-controller.kinference.svc.cluster.local:8090","image":"ghcr.io/kinference/proxy:0.1.0","imagePullPolicy":"IfNotPresent","imagePullSecrets":[],"initImage":"ghcr.io/kinference/proxy-init:0.1.0","initImagePullPolicy":"IfNotPresent","initResources":{"limits":{"memory":"64Mi"},"requests":{"cpu":"10m","memory":"16Mi"}},"logFormat":"json","logLevel":"info","ports":{"admin":4191,"outbound":4140},"resources":{"limits":{"memory":"256Mi"},"requests":{"cpu":"100m","memory":"64Mi"}},"uid":2102}"#;

fn objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "apps", "annotations": {"kinference.io/inject": "enabled"}}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "llm", "namespace": NS},
               "spec": {"clusterIP": "10.0.0.10", "ports": [{"name": "http", "port": 8000}]}}),
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "llm", "namespace": NS},
               "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "llm", "port": 8000}],
                        "rules": [{"backendRefs": [{"group": "inference.networking.k8s.io",
                                                    "kind": "InferencePool", "name": "glm-5.3"}]}]}}),
        json!({"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
               "metadata": {"name": "glm-5.3", "namespace": NS},
               "spec": {"selector": {"matchLabels": {"app": "vllm"}},
                        "targetPorts": [{"number": 8001}]}}),
        // A pool's slice (selected by label) and the Service's slice (named by the
        // EndpointSlice controller's label, on the Service port's name).
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "vllm-1", "namespace": NS,
                            "labels": {"app": "vllm", "kinference.io/model": "glm-5.3"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.0.1.1"]}],
               "ports": [{"port": 8001}]}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "llm-x7k2p", "namespace": NS,
                            "labels": {"kubernetes.io/service-name": "llm"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.0.2.1"]}],
               "ports": [{"name": "http", "port": 8080}]}),
        json!({"apiVersion": POLICY_API, "kind": "InferencePolicy",
               "metadata": {"name": "llm", "namespace": NS, "generation": 1},
               "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llm"},
                        "models": [{"name": "glm-5.3", "poolRef": {"name": "glm-5.3"},
                                    "prior": {"prefillTokensPerSecond": 12000, "timePerOutputTokenMs": 30}}]}}),
    ]
}

struct Tls {
    cert_pem: String,
    key_pem: String,
    client: Arc<ClientConfig>,
}

fn tls() -> Tls {
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(key.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    Tls {
        cert_pem: key.cert.pem(),
        key_pem: key.signing_key.serialize_pem(),
        client: Arc::new(client),
    }
}

async fn start(server: &ApiServer, tls: &Tls) -> Controller {
    let bin = controller_binary(env!(
        "CARGO_BIN_EXE_kinference-policy-controller-under-test"
    ));
    let setup = KubeSetup {
        kubeconfig: server.kubeconfig(),
        tls_cert_pem: tls.cert_pem.clone(),
        tls_key_pem: tls.key_pem.clone(),
        proxy_config: Some(PROXY_CONFIG.to_string()),
        pod_name: POD.into(),
        pod_namespace: CONTROL_PLANE_NS.into(),
        lease_name: LEASE.into(),
    };
    Controller::start_kubernetes(&bin, &setup)
        .await
        .expect("the controller starts in Kubernetes mode")
}

/// POSTs an AdmissionReview over TLS, verifying the server with the test CA.
async fn review(addr: SocketAddr, tls: &Tls, path: &str, review: &Value) -> Value {
    let exchange = async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let stream = TlsConnector::from(tls.client.clone())
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .expect("TLS handshake with the test certificate");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::post(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(review).unwrap())))
            .unwrap();
        let rsp = sender.send_request(req).await.unwrap();
        assert_eq!(rsp.status(), 200);
        let body = rsp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice::<Value>(&body).unwrap()["response"].clone()
    };
    tokio::time::timeout(EVENT_TIMEOUT, exchange)
        .await
        .expect("the webhook answers")
}

fn admission_review(
    uid: &str,
    group: &str,
    kind: &str,
    resource: &str,
    ns: &str,
    object: Value,
) -> Value {
    let version = if group.is_empty() { "v1" } else { "v1alpha1" };
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": object["metadata"]["name"], "namespace": ns, "operation": "CREATE",
            "userInfo": {"username": "alice"}, "object": object, "oldObject": null,
            "dryRun": false,
        },
    })
}

async fn destination(ctl: &Controller, path: &str) -> tonic::Streaming<dst::Update> {
    let mut client = DestinationClient::new(ctl.channel().await.unwrap());
    let req = dst::GetDestination {
        scheme: "http:".into(),
        path: path.into(),
        context_token: String::new(),
    };
    client.get(req).await.expect("a stream").into_inner()
}

fn added(u: &dst::Update) -> Vec<SocketAddr> {
    match &u.update {
        Some(update::Update::Add(set)) => set
            .addrs
            .iter()
            .filter_map(|a| a.addr.and_then(|a| SocketAddr::try_from(a).ok()))
            .collect(),
        _ => vec![],
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubernetes_mode_serves_the_clusters_objects_writes_status_and_answers_webhooks() {
    let server = ApiServer::with_objects(objects()).await;
    let tls = tls();
    let ctl = start(&server, &tls).await;
    let admission = ctl
        .admission_addr
        .expect("the admission address is printed");

    // Ready once every kind is listed.
    ctl.wait_admin_status("/ready", 200).await.unwrap();

    // The InferencePolicy in the double is served to proxies.
    let mut client = InferencePoliciesClient::new(ctl.channel().await.unwrap());
    let target = InferenceTarget {
        source_workload: "apps:chat".into(),
        target: Some(inference_target::Target::Authority(AUTHORITY.into())),
    };
    let mut stream = client.watch(target).await.unwrap().into_inner();
    let (policy, _) = next_matching(&mut stream, "the cluster's policy", |p| {
        !p.models.is_empty()
    })
    .await
    .unwrap();
    let models: Vec<_> = policy
        .models
        .iter()
        .map(|m| {
            (
                m.name.as_str(),
                m.prior.as_ref().map(|p| p.prefill_tokens_per_second),
            )
        })
        .collect();
    assert_eq!(models, vec![("glm-5.3", Some(12000.0))]);

    // The pool's endpoints come from its EndpointSlice...
    let mut pool = destination(&ctl, POOL_PATH).await;
    let (first, _) = next_matching(&mut pool, "the pool's endpoint", |u| !added(u).is_empty())
        .await
        .unwrap();
    assert_eq!(
        added(&first),
        vec!["10.0.1.1:8001".parse::<SocketAddr>().unwrap()]
    );
    // ...and the Service's from the slice the EndpointSlice controller labels with it.
    let mut svc = destination(&ctl, AUTHORITY).await;
    let (first, _) = next_matching(&mut svc, "the Service's endpoint", |u| !added(u).is_empty())
        .await
        .unwrap();
    assert_eq!(
        added(&first),
        vec!["10.0.2.1:8080".parse::<SocketAddr>().unwrap()]
    );

    // A change in the cluster reaches the stream.
    server.put(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "vllm-2", "namespace": NS,
                     "labels": {"app": "vllm", "kinference.io/model": "glm-5.3"}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.1.2"]}], "ports": [{"port": 8001}]}));
    let (next, _) = next_matching(&mut pool, "the new endpoint", |u| !added(u).is_empty())
        .await
        .unwrap();
    assert_eq!(
        added(&next),
        vec!["10.0.1.2:8001".parse::<SocketAddr>().unwrap()]
    );

    // The replica takes the Lease named on its command line, in POD_NAMESPACE, as POD_NAME...
    let holder = server
        .wait_for(EVENT_TIMEOUT, "the lease", |s| {
            s.object("coordination.k8s.io/v1", "Lease", CONTROL_PLANE_NS, LEASE)
                .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
        })
        .await;
    assert_eq!(holder, POD);
    // ...and, leading, writes the policy's status.
    let accepted = server
        .wait_for(EVENT_TIMEOUT, "the policy's Accepted condition", |s| {
            let p = s.object(POLICY_API, "InferencePolicy", NS, "llm")?;
            let conditions = p["status"]["conditions"].as_array()?.clone();
            conditions.into_iter().find(|c| c["type"] == "Accepted")
        })
        .await;
    assert_eq!(accepted["status"], "True", "{accepted}");

    // The validating webhook denies an invalid policy over TLS, saying why.
    let bad = json!({"apiVersion": POLICY_API, "kind": "InferencePolicy",
        "metadata": {"name": "bad", "namespace": "apps"},
        "spec": {"targetRef": {"group": "", "kind": "Service", "name": "llm"},
                 "models": [{"name": "m", "poolRef": {"name": "p"},
                             "prior": {"prefillTokensPerSecond": -1, "timePerOutputTokenMs": 30}}]}});
    let answer = review(
        admission,
        &tls,
        "/validate",
        &admission_review(
            "u-1",
            "policy.kinference.io",
            "InferencePolicy",
            "inferencepolicies",
            "apps",
            bad,
        ),
    )
    .await;
    assert_eq!(answer["uid"], "u-1");
    assert_eq!(answer["allowed"], false, "{answer}");
    let message = answer["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("prefillTokensPerSecond"), "{message}");

    // The injector, configured from --proxy-config, patches a pod of an enabled namespace.
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "chat-0", "namespace": "apps"},
        "spec": {"containers": [{"name": "app", "image": "chat:1"}]}});
    let answer = review(
        admission,
        &tls,
        "/inject",
        &admission_review("u-2", "", "Pod", "pods", "apps", pod),
    )
    .await;
    assert_eq!(answer["allowed"], true, "{answer}");
    assert_eq!(answer["patchType"], "JSONPatch", "{answer}");
    // kube-core sends the patch bytes as a JSON array (Go's decoder takes either form).
    let patch: Value = {
        let raw: Vec<u8> = match &answer["patch"] {
            Value::String(b64) => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap()
            }
            other => serde_json::from_value(other.clone())
                .unwrap_or_else(|e| panic!("no patch ({e}): {answer}")),
        };
        serde_json::from_slice(&raw).unwrap()
    };
    assert!(
        patch.to_string().contains("ghcr.io/kinference/proxy:0.1.0"),
        "{patch}"
    );

    // A proxy reports that a quality guard suspended the policy's rule for a family: the
    // policy's QualityGuard condition says so, and a Warning Event is published on it.
    let guard = |state: GuardState, gap: f64| GuardStatus {
        tenant: "apps/chat".into(),
        rule: "low".into(),
        family: "math".into(),
        state: state as i32,
        samples: 50,
        min_samples: 50,
        gap: Some(gap),
        tolerance: 0.05,
    };
    let report = |g: GuardStatus| GuardReport {
        target: Some(InferenceTarget {
            source_workload: "apps:chat".into(),
            target: Some(inference_target::Target::Authority(AUTHORITY.into())),
        }),
        revision: policy.revision.clone(),
        guards: vec![g],
    };
    client
        .report_guards(report(guard(GuardState::Suspended, 0.3)))
        .await
        .expect("the report is accepted");
    let condition = |status: &'static str| {
        let server = &server;
        async move {
            server
                .wait_for(EVENT_TIMEOUT, "the policy's QualityGuard condition", |s| {
                    let p = s.object(POLICY_API, "InferencePolicy", NS, "llm")?;
                    let conditions = p["status"]["conditions"].as_array()?.clone();
                    conditions
                        .into_iter()
                        .find(|c| c["type"] == "QualityGuard" && c["status"] == status)
                })
                .await
        }
    };
    let suspended = condition("False").await;
    assert_eq!(suspended["reason"], "RuleSuspended", "{suspended}");
    let message = suspended["message"].as_str().unwrap();
    assert!(
        message.contains("rule \"low\" for tenant apps/chat family math: gap 0.30 over 50 samples"),
        "{message}"
    );
    // Accepted stays as it was.
    let p = server
        .object(POLICY_API, "InferencePolicy", NS, "llm")
        .unwrap();
    assert!(
        p["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Accepted" && c["status"] == "True")
    );
    let event = |reason: &'static str| {
        let server = &server;
        async move {
            server
                .wait_for(EVENT_TIMEOUT, reason, |s| {
                    s.objects("events.k8s.io/v1", "Event")
                        .into_iter()
                        .find(|e| e["reason"] == reason && e["regarding"]["name"] == "llm")
                })
                .await
        }
    };
    let warning = event("QualityGuardSuspended").await;
    assert_eq!(warning["type"], "Warning", "{warning}");
    assert_eq!(warning["regarding"]["kind"], "InferencePolicy", "{warning}");
    assert!(
        warning["note"].as_str().unwrap().contains("family math"),
        "{warning}"
    );

    // Back within tolerance: True, and a Normal event.
    client
        .report_guards(report(guard(GuardState::Trusted, 0.0)))
        .await
        .expect("the report is accepted");
    let within = condition("True").await;
    assert_eq!(within["reason"], "WithinTolerance", "{within}");
    let normal = event("QualityGuardWithinTolerance").await;
    assert_eq!(normal["type"], "Normal", "{normal}");
}

/// The policy of [`objects`] with a running rollout: a candidate that fails closed, judged on
/// the error rate over at least 100 requests per arm.
fn objects_with_rollout() -> Vec<Value> {
    let mut objects = objects();
    let policy = objects
        .iter_mut()
        .find(|o| o["kind"] == "InferencePolicy")
        .unwrap();
    policy["spec"]["rollout"] = json!({
        "name": "fail-closed",
        "candidate": {"balancer": {"failureMode": "FailClose"}},
        "cohortPercent": 10, "controlPercent": 10,
        "window": "5m", "minSamples": 100,
        "thresholds": {"errorRate": 0.02},
    });
    objects
}

/// One arm's deltas: `requests` with `errors` errors, TTFTs under 100 ms.
fn arm(requests: u64, errors: u64) -> ArmReport {
    ArmReport {
        requests,
        errors,
        ttft_bounds_s: vec![0.1, f64::INFINITY],
        ttft_counts: vec![requests, requests],
        saturation: 0.3,
        cost_usd: 0.001 * requests as f64,
        tokens: 100 * requests,
        ..ArmReport::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_cohort_is_rolled_back_into_status_and_a_promoted_one_is_the_policy() {
    let server = ApiServer::with_objects(objects_with_rollout()).await;
    let tls = tls();
    let ctl = start(&server, &tls).await;
    ctl.wait_admin_status("/ready", 200).await.unwrap();
    let mut client = InferencePoliciesClient::new(ctl.channel().await.unwrap());
    let target = InferenceTarget {
        source_workload: "apps:chat".into(),
        target: Some(inference_target::Target::Authority(AUTHORITY.into())),
    };
    let mut stream = client.watch(target.clone()).await.unwrap().into_inner();
    let (policy, _) = next_matching(&mut stream, "the policy with its rollout", |p| {
        p.rollout.is_some()
    })
    .await
    .unwrap();
    let rollout = policy.rollout.clone().unwrap();
    assert_eq!(rollout.name, "fail-closed");
    assert_eq!(
        (rollout.cohort_basis_points, rollout.control_basis_points),
        (1000, 1000)
    );

    // Two proxies report: the cohort errs on a quarter of its requests, control on 1%.
    for (proxy, cohort, control) in [
        ("proxy-a", arm(80, 20), arm(80, 1)),
        ("proxy-b", arm(80, 20), arm(80, 1)),
    ] {
        client
            .report_rollout(RolloutReport {
                target: Some(target.clone()),
                revision: policy.revision.clone(),
                rollout: "fail-closed".into(),
                proxy: proxy.into(),
                cohort: Some(cohort),
                control: Some(control),
                interval: None,
            })
            .await
            .expect("the report is accepted");
    }

    // The controller rolls the cohort back: proxies are served the policy without it...
    let (back, _) = next_matching(&mut stream, "the policy without its rollout", |p| {
        p.rollout.is_none()
    })
    .await
    .unwrap();
    assert_eq!(back.revision, policy.revision);
    // ...the status says which threshold, by how much, over what...
    let status = server
        .wait_for(EVENT_TIMEOUT, "status.rollout RolledBack", |s| {
            let p = s.object(POLICY_API, "InferencePolicy", NS, "llm")?;
            (p["status"]["rollout"]["phase"] == "RolledBack").then(|| p["status"].clone())
        })
        .await;
    let r = &status["rollout"];
    assert_eq!(r["name"], "fail-closed", "{r}");
    assert_eq!(r["crossed"], "errorRate", "{r}");
    assert_eq!(
        (&r["cohort"]["requests"], &r["control"]["requests"]),
        (&json!(160), &json!(160)),
        "{r}"
    );
    let t = &r["thresholds"][0];
    assert_eq!(
        (&t["threshold"], &t["limit"], &t["crossed"]),
        (&json!("errorRate"), &json!(0.02), &json!(true)),
        "{t}"
    );
    assert!(
        t["low"].as_f64().unwrap() > 0.02 && t["closeness"].as_f64().unwrap() > 1.0,
        "{t}"
    );
    let condition = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Rollout")
        .cloned()
        .expect("a Rollout condition");
    assert_eq!(
        (&condition["status"], &condition["reason"]),
        (&json!("False"), &json!("ThresholdCrossed")),
        "{condition}"
    );
    assert!(
        condition["message"].as_str().unwrap().contains("errorRate"),
        "{condition}"
    );
    // ...and a Warning Event.
    let event = server
        .wait_for(EVENT_TIMEOUT, "RolloutRolledBack", |s| {
            s.objects("events.k8s.io/v1", "Event")
                .into_iter()
                .find(|e| e["reason"] == "RolloutRolledBack" && e["regarding"]["name"] == "llm")
        })
        .await;
    assert_eq!(event["type"], "Warning", "{event}");
    assert!(
        event["note"].as_str().unwrap().contains("errorRate"),
        "{event}"
    );

    // A restarted controller reads the rollback back from status: not served again.
    drop(stream);
    drop(ctl);
    let ctl = start(&server, &tls).await;
    ctl.wait_admin_status("/ready", 200).await.unwrap();
    let mut client = InferencePoliciesClient::new(ctl.channel().await.unwrap());
    let served = client.get(target.clone()).await.unwrap().into_inner();
    assert!(!served.models.is_empty());
    assert_eq!(
        served.rollout, None,
        "a rolled-back rollout is not served again"
    );

    // Promoted: the candidate's balancer is the policy's own, and no rollout travels.
    let mut p = server
        .object(POLICY_API, "InferencePolicy", NS, "llm")
        .unwrap();
    p["spec"]["rollout"]["name"] = json!("fail-closed-2");
    p["spec"]["rollout"]["state"] = json!("Promoted");
    server.put(p);
    let mut stream = client.watch(target).await.unwrap().into_inner();
    let (promoted, _) = next_matching(&mut stream, "the promoted policy", |p| {
        p.balancer.as_ref().is_some_and(|b| b.failure_mode == 2)
    })
    .await
    .unwrap();
    assert_eq!(promoted.rollout, None);
    let phase = server
        .wait_for(EVENT_TIMEOUT, "status.rollout Promoted", |s| {
            let p = s.object(POLICY_API, "InferencePolicy", NS, "llm")?;
            (p["status"]["rollout"]["phase"] == "Promoted").then(|| p["status"]["rollout"].clone())
        })
        .await;
    assert_eq!(phase["name"], "fail-closed-2", "{phase}");
}

#[tokio::test(flavor = "multi_thread")]
async fn not_ready_until_every_kind_is_listed() {
    let server = ApiServer::with_objects(objects()).await;
    // Pods cannot be listed: the watcher retries, and the index never has the cluster.
    server.fail("/api/v1/pods", 500);
    let tls = tls();
    let ctl = start(&server, &tls).await;
    // Other kinds are served meanwhile...
    let mut pool = destination(&ctl, POOL_PATH).await;
    next_matching(&mut pool, "the pool's endpoint", |u| !added(u).is_empty())
        .await
        .unwrap();
    // ...and the pod list has been refused at least once...
    server
        .wait_for(EVENT_TIMEOUT, "a refused pod list", |s| {
            s.requests()
                .iter()
                .any(|r| r.path == "/api/v1/pods")
                .then_some(())
        })
        .await;
    // ...but the controller does not claim to be ready.
    let (status, _) = ctl.admin_get("/ready").await.unwrap();
    assert_eq!(status, 503);
    let (status, _) = ctl.admin_get("/live").await.unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn kubernetes_mode_without_pod_identity_fails_with_a_clear_error() {
    let bin = controller_binary(env!(
        "CARGO_BIN_EXE_kinference-policy-controller-under-test"
    ));
    let out = tokio::process::Command::new(bin)
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .env_remove("KINFERENCE_MANIFESTS")
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("POD_NAME"), "{stderr}");
}
