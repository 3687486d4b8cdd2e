//! The webhook over real TLS on loopback, with a certificate generated for the test and
//! loaded from PEM files as a mounted Secret would provide them: `/validate`, and `/inject`
//! with the namespace read from, and the event written to, the API server double.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
use serde_json::{Value, json};
use std::{net::SocketAddr, sync::Arc, time::Duration};
use tokio::{net::TcpStream, sync::oneshot};
use tokio_rustls::TlsConnector;

const WAIT: Duration = Duration::from_secs(5);

struct Webhook {
    addr: SocketAddr,
    client: Arc<ClientConfig>,
    _stop: oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

async fn start() -> Webhook {
    start_with(None).await
}

async fn start_with(injector: Option<kinference_policy_admission::Injector>) -> Webhook {
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert_path = dir.path().join("tls.crt");
    let key_path = dir.path().join("tls.key");
    std::fs::write(&cert_path, key.cert.pem()).unwrap();
    std::fs::write(&key_path, key.signing_key.serialize_pem()).unwrap();
    let tls = kinference_policy_admission::load_tls(&cert_path, &key_path).unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(kinference_policy_admission::serve_with_injector(
        listener,
        tls,
        injector,
        async {
            let _ = stopped.await;
        },
    ));

    let mut roots = RootCertStore::empty();
    roots.add(key.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    Webhook {
        addr,
        client: Arc::new(client),
        _stop: stop,
        _dir: dir,
    }
}

impl Webhook {
    async fn post(&self, path: &str, body: Vec<u8>) -> (StatusCode, Bytes) {
        let exchange = async {
            let tcp = TcpStream::connect(self.addr).await.unwrap();
            let tls = TlsConnector::from(self.client.clone())
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .expect("TLS handshake with the test certificate");
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = Request::post(path)
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let resp = sender.send_request(req).await.unwrap();
            let status = resp.status();
            (status, resp.into_body().collect().await.unwrap().to_bytes())
        };
        tokio::time::timeout(WAIT, exchange)
            .await
            .expect("webhook answers")
    }

    /// Sends a CREATE review of `object`; returns the response part of the answer.
    async fn review(&self, uid: &str, object: Value) -> Value {
        let kind = object["kind"].as_str().unwrap().to_string();
        let resource = if kind == "InferencePolicy" {
            "inferencepolicies"
        } else {
            "inferenceclassifiers"
        };
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "policy.kinference.io", "version": "v1alpha1", "kind": kind},
                "resource": {"group": "policy.kinference.io", "version": "v1alpha1", "resource": resource},
                "requestKind": {"group": "policy.kinference.io", "version": "v1alpha1", "kind": kind},
                "requestResource": {"group": "policy.kinference.io", "version": "v1alpha1", "resource": resource},
                "name": object["metadata"]["name"],
                "namespace": "apps",
                "operation": "CREATE",
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
                "object": object,
                "oldObject": null,
                "dryRun": false,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        });
        let (status, body) = self
            .post("/validate", serde_json::to_vec(&review).unwrap())
            .await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(answer["kind"], "AdmissionReview");
        let response = answer["response"].clone();
        assert_eq!(response["uid"], uid);
        response
    }
}

fn policy(name: &str) -> Value {
    json!({
        "apiVersion": "policy.kinference.io/v1alpha1",
        "kind": "InferencePolicy",
        "metadata": {"name": name, "namespace": "apps"},
        "spec": {
            "targetRef": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llm"},
            "models": [
                {"name": "glm-5.3", "poolRef": {"name": "glm-5.3"},
                 "prior": {"prefillTokensPerSecond": 12000, "timePerOutputTokenMs": 30}},
                {"name": "qwen-3.6-27b", "poolRef": {"name": "qwen-3.6-27b"},
                 "prior": {"prefillTokensPerSecond": 6000, "timePerOutputTokenMs": 18}},
            ],
            "aliases": [{"name": "default", "target": "glm-5.3"}],
            "rules": [{"name": "low", "match": {"models": ["default"]},
                       "action": {"addModels": ["qwen-3.6-27b"]}}],
        },
    })
}

fn classifier(pattern: &str) -> Value {
    json!({
        "apiVersion": "policy.kinference.io/v1alpha1",
        "kind": "InferenceClassifier",
        "metadata": {"name": "tags", "namespace": "apps"},
        "spec": {"tags": [
            {"name": "complexity", "complexity": {"thresholds": {"low": 0.35, "high": 0.7}}},
            {"name": "code", "regex": {"patterns": [pattern], "weight": 0.9}},
        ]},
    })
}

#[tokio::test]
async fn a_valid_policy_is_allowed_even_before_its_pools_exist() {
    let webhook = start().await;
    let response = webhook.review("uid-1", policy("llm")).await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn an_invalid_policy_is_denied_with_every_field_path() {
    let webhook = start().await;
    let mut p = policy("llm");
    p["spec"]["rules"][0]["action"]["addModels"] = json!(["nope"]);
    p["spec"]["aliases"][0]["target"] = json!("missing");
    let response = webhook.review("uid-2", p.clone()).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("InferencePolicy apps/llm is invalid: "),
        "{message}"
    );
    assert!(
        message.contains("spec.rules[0].action.addModels[0]: "),
        "{message}"
    );
    assert!(message.contains("spec.aliases[0].target: "), "{message}");
    // Every problem the API's validation finds (none of them about other objects).
    let typed: kinference_api::InferencePolicy = serde_json::from_value(p).unwrap();
    let errors = kinference_api::validate_policy(&typed, &[], &[]).unwrap_err();
    let own: Vec<_> = errors
        .errors()
        .iter()
        .filter(|e| !e.field.ends_with("poolRef.name"))
        .collect();
    assert!(own.len() >= 2);
    assert!(
        message.contains(&format!("{} problems:", own.len())),
        "{message}"
    );
    for e in own {
        assert!(
            message.contains(&format!("- {e}")),
            "{e} missing from {message}"
        );
    }
}

#[tokio::test]
async fn a_classifier_with_a_bad_regex_is_denied() {
    let webhook = start().await;
    let response = webhook.review("uid-3", classifier("```")).await;
    assert_eq!(response["allowed"], true, "{response}");
    let response = webhook.review("uid-4", classifier("(unclosed")).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "InferenceClassifier apps/tags is invalid: spec.tags[1].regex.patterns[0]: \"(unclosed\" is not a valid regular expression"
        ),
        "{message}"
    );
}

#[tokio::test]
async fn a_classifier_with_a_bad_exemplars_or_external_tag_is_denied() {
    let webhook = start().await;
    let mut c = classifier("```");
    c["spec"]["tags"][1] = json!({"name": "topic", "exemplars": {"values": [
        {"value": "billing", "examples": ["charged twice"]},
        {"value": "billing", "examples": ["refund please"]},
    ]}});
    c["spec"]["tags"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "domain", "external": {
            "url": "http://classifier:8000/classify", "timeout": "2s",
            "values": ["legal", "general"], "fallback": "other",
        }}));
    let response = webhook.review("uid-5", c).await;
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(
        response["status"]["message"].as_str().unwrap(),
        "InferenceClassifier apps/tags is invalid: 3 problems:\n\
         - spec.tags[1].exemplars.values[1].value: value \"billing\" is already declared at \
         spec.tags[1].exemplars.values[0]; put all its examples there\n\
         - spec.tags[2].external.timeout: 2s is more than the largest budget, 1000ms: the \
         classifier runs before the request is routed, so its budget is latency every request \
         may pay\n\
         - spec.tags[2].external.fallback: fallback \"other\" is not one of the declared values \
         (legal, general)"
    );
}

#[tokio::test]
async fn a_malformed_review_gets_400_and_unknown_paths_404() {
    let webhook = start().await;
    let (status, body) = webhook.post("/validate", b"{not json".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("not an admission.k8s.io/v1 AdmissionReview"));
    let no_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    let (status, body) = webhook
        .post("/validate", serde_json::to_vec(&no_request).unwrap())
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("no request"));
    let (status, _) = webhook.post("/mutate", b"{}".to_vec()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn inject_over_tls_patches_the_pod_and_posts_an_event() {
    use kinference_k8s_api_double::ApiServer;
    use kinference_policy_admission::{InjectConfig, Injector, KubeEventRecorder, ProxyConfig};

    let api = ApiServer::with_objects([json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "apps", "annotations": {"kinference.io/inject": "enabled"}},
    })])
    .await;
    let config = InjectConfig {
        proxy: ProxyConfig::from_json(include_str!("fixtures/config.json")).unwrap(),
        control_plane_namespace: "kinference".into(),
    };
    let client = api.client("injector");
    let events = KubeEventRecorder::new(
        client.clone(),
        Some("kinference-policy-controller-0".into()),
    );
    let webhook = start_with(Some(Injector::new(config, client, Arc::new(events)))).await;

    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "chat", "namespace": "apps", "labels": {"app": "chat"}},
        "spec": {"containers": [{"name": "chat", "image": "ghcr.io/example/chat:1"}]},
    });
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "uid-inject", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "chat", "namespace": "apps", "operation": "CREATE",
            "userInfo": {"username": "alice"}, "object": pod, "oldObject": null, "dryRun": false,
        },
    });
    let (status, body) = webhook
        .post("/inject", serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    let response = &answer["response"];
    assert_eq!(response["uid"], "uid-inject");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes: Vec<u8> = response["patch"]
        .as_array()
        .expect("patch bytes")
        .iter()
        .map(|b| u8::try_from(b.as_u64().unwrap()).unwrap())
        .collect();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    let init: Vec<&str> = patched["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(init, ["kinference-proxy-init", "kinference-proxy"]);

    // The event, as kube's Recorder creates it, about the (bare) pod.
    let event = api
        .wait_for(WAIT, "an injection event", |s| {
            s.requests().into_iter().find(|r| {
                r.method == http::Method::POST
                    && r.path == "/apis/events.k8s.io/v1/namespaces/apps/events"
            })
        })
        .await;
    assert_eq!(event.body["reason"], "Injected");
    assert_eq!(event.body["type"], "Normal");
    assert_eq!(
        event.body["note"],
        "Injected kinference-proxy into pod apps/chat (Pod apps/chat)"
    );
    assert_eq!(event.body["regarding"]["kind"], "Pod");
    assert_eq!(event.body["regarding"]["name"], "chat");
    assert_eq!(
        event.body["reportingController"],
        "kinference-proxy-injector"
    );
    assert_eq!(
        event.body["reportingInstance"],
        "kinference-policy-controller-0"
    );

    // Without an injector, /inject is not served.
    let plain = start().await;
    let (status, _) = plain
        .post("/inject", serde_json::to_vec(&review).unwrap())
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_bad_rollout_is_denied_with_its_field_paths() {
    let webhook = start().await;
    let mut p = policy("llm");
    p["spec"]["rollout"] = json!({
        "name": "everything-to-qwen",
        "candidate": {"rules": [{"name": "all", "action": {"rewriteTo": "qwen-3.6-27b"}}]},
        "cohortPercent": 10, "controlPercent": 10,
        "thresholds": {"errorRate": 0.02},
    });
    let response = webhook.review("uid-r1", p.clone()).await;
    assert_eq!(response["allowed"], true, "{response}");
    p["spec"]["rollout"]["controlPercent"] = json!(95);
    p["spec"]["rollout"]["assignBy"] = json!("Cookie");
    p["spec"]["rollout"]["thresholds"] = json!({});
    p["spec"]["rollout"]["candidate"]["models"] = json!([{"name": "llama-4"}]);
    let response = webhook.review("uid-r2", p).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap();
    for field in [
        "spec.rollout.candidate.models: a candidate may change only routing",
        "spec.rollout.controlPercent: cohortPercent 10 + controlPercent 95 is more than 100",
        "spec.rollout.assignBy: \"Cookie\" is not a key",
        "spec.rollout.thresholds: declare at least one of",
    ] {
        assert!(message.contains(field), "{field} missing from {message}");
    }
}
