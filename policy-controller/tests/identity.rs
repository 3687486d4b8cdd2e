//! The controller's identity and mutual TLS, as real processes: the controller binary in
//! Kubernetes mode against the API server double, with an issuer; the clients are the proxy's
//! own (`kinference-identity`'s certify and TLS connector).
//!
//! - Without a certificate from the issuer's trust anchors, no client reads policy: plaintext,
//!   TLS without a client certificate and a certificate from another authority all fail.
//! - The engine-signals service (`--signals-addr`) follows the same rule: no such client watches
//!   a pool's readings or sends notices, and a certified one does.
//! - A certificate names one workload: a request that names another is refused.
//! - The issuer certifies a pod's projected token only when the API server's TokenReview
//!   accepts it, for the identity it asks.
//! - Certificates rotate: a proxy refreshes its own before it expires, and a connection made with
//!   an expired one is closed, so policy is read on the refreshed one.

use kinference_identity::{
    Credentials, TOKEN_AUDIENCE,
    certify::{CertifyConfig, CertifyError, certify_once},
    connect::TlsConnector,
    issuer::{Issuer, generate_ca},
    tls,
};
use kinference_k8s_api_double::{ApiServer, ServiceAccountToken};
use kinference_proxy_api::{
    InferencePoliciesClient,
    inference::{InferenceTarget, inference_target},
    signals::{self as signals_api, engine_signals_client::EngineSignalsClient},
};
use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use serde_json::{Value, json};
use std::{error::Error as _, net::SocketAddr, process::Stdio, sync::Arc, time::Duration};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
};

const BIN: &str = env!("CARGO_BIN_EXE_kinference-policy-controller");
const AUTHORITY: &str = "llm.default.svc.cluster.local:8000";
/// The fixture's InferencePool, as a signal-service watch names it.
const POOL_PATH: &str = "glm-5.3.default.inferencepool.kinference.io";
const WEB_SPIFFE: &str = "spiffe://cluster.local/ns/apps/sa/web-sa";
const BATCH_SPIFFE: &str = "spiffe://cluster.local/ns/apps/sa/batch-sa";
const WEB_UID: &str = "11111111-0000-4000-8000-000000000001";
const BATCH_UID: &str = "11111111-0000-4000-8000-000000000002";
const TIMEOUT: Duration = Duration::from_secs(20);

fn objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "llm", "namespace": "default"},
               "spec": {"clusterIP": "10.0.0.10", "ports": [{"name": "http", "port": 8000}]}}),
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "llm", "namespace": "default"},
               "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "llm", "port": 8000}],
                        "rules": [{"backendRefs": [{"group": "inference.networking.k8s.io",
                                                    "kind": "InferencePool", "name": "glm-5.3"}]}]}}),
        json!({"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
               "metadata": {"name": "glm-5.3", "namespace": "default"},
               "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8001}]}}),
        json!({"apiVersion": "policy.kinference.io/v1alpha1", "kind": "InferencePolicy",
               "metadata": {"name": "llm", "namespace": "default", "generation": 1},
               "spec": {"targetRef": {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "llm"},
                        "models": [{"name": "glm-5.3", "poolRef": {"name": "glm-5.3"},
                                    "prior": {"prefillTokensPerSecond": 20000, "timePerOutputTokenMs": 15}}]}}),
        // Two workloads in one namespace: a Deployment's pod and a bare pod.
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "web-7d9f8-abcde", "namespace": "apps", "uid": WEB_UID,
                            "labels": {"pod-template-hash": "7d9f8"},
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                 "name": "web-7d9f8", "uid": "rs", "controller": true}]},
               "spec": {"serviceAccountName": "web-sa", "containers": [{"name": "app", "image": "app"}]}}),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "batch", "namespace": "apps", "uid": BATCH_UID},
               "spec": {"serviceAccountName": "batch-sa", "containers": [{"name": "app", "image": "app"}]}}),
    ]
}

fn token(sa: &str, pod: Option<(&str, &str)>) -> ServiceAccountToken {
    ServiceAccountToken {
        namespace: "apps".into(),
        service_account: sa.into(),
        audiences: vec![TOKEN_AUDIENCE.into()],
        pod: pod.map(|(n, u)| (n.into(), u.into())),
    }
}

/// The double, the issuer's files and the controller using them.
struct Cluster {
    api: ApiServer,
    dir: tempfile::TempDir,
    roots: Arc<rustls::RootCertStore>,
    grpc: SocketAddr,
    admin: SocketAddr,
    identity: SocketAddr,
    signals: SocketAddr,
    _controller: Child,
}

async fn start(lifetime: &str) -> Cluster {
    let api = ApiServer::with_objects(objects()).await;
    api.add_token(
        "web-token",
        token("web-sa", Some(("web-7d9f8-abcde", WEB_UID))),
    );
    api.add_token("batch-token", token("batch-sa", Some(("batch", BATCH_UID))));
    api.add_token("unbound-token", token("web-sa", None));
    let dir = tempfile::tempdir().unwrap();
    let (ca, key) = generate_ca("kinference-identity-test").unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let (kubeconfig, cert, key, anchors) = (
        write("kubeconfig", &api.kubeconfig()),
        write("issuer.crt", &ca),
        write("issuer.key", &key),
        write("ca.crt", &ca),
    );
    let roots = tls::roots(
        &kinference_identity::issuer::certificates_from_pem(ca.as_bytes(), "ca").unwrap(),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args([
            "--identity-addr",
            "127.0.0.1:0",
            "--identity-server-name",
            "localhost",
            "--signals-addr",
            "127.0.0.1:0",
        ])
        .args([
            "--identity-cert-lifetime",
            lifetime,
            "--log-format",
            "plain",
        ])
        .arg("--identity-issuer-cert")
        .arg(&cert)
        .arg("--identity-issuer-key")
        .arg(&key)
        .arg("--identity-trust-anchors")
        .arg(&anchors)
        .env("KUBECONFIG", &kubeconfig)
        .env("POD_NAME", "kinference-policy-controller-0")
        .env("POD_NAMESPACE", "kinference")
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KINFERENCE_MANIFESTS")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the controller starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(TIMEOUT, lines.next_line())
        .await
        .expect("the controller prints its addresses")
        .unwrap()
        .expect("the controller exited before printing its addresses (does it know --identity-*?)");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let field = |name: &str| -> SocketAddr {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .parse()
            .unwrap()
    };
    assert!(line.contains("tls=mtls"), "{line}");
    let cluster = Cluster {
        grpc: field("grpc="),
        admin: field("admin="),
        identity: field("identity="),
        signals: field("signals="),
        api,
        dir,
        roots,
        _controller: child,
    };
    cluster.wait_ready().await;
    cluster
}

impl Cluster {
    async fn wait_ready(&self) {
        let url = format!("http://{}/ready", self.admin);
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while reqwest::get(&url).await.map(|r| r.status().as_u16()).ok() != Some(200) {
            assert!(tokio::time::Instant::now() < deadline, "never ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.admin))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    fn certify_config(&self, token: &str, spiffe: &str) -> CertifyConfig {
        let path = self.dir.path().join(format!("{token}.jwt"));
        std::fs::write(&path, token).unwrap();
        CertifyConfig {
            identity_addr: format!("https://localhost:{}", self.identity.port())
                .parse()
                .unwrap(),
            token_file: path,
            spiffe_id: spiffe.into(),
            roots: self.roots.clone(),
        }
    }

    /// One certificate, as a proxy's first request gets it.
    async fn certify(&self, token: &str, spiffe: &str) -> Result<Arc<Credentials>, CertifyError> {
        let config = self.certify_config(token, spiffe);
        let connector =
            TlsConnector::new(tls::client_config(self.roots.clone(), None).unwrap(), None);
        let channel = connector.channel(tonic::transport::Endpoint::from(
            config.identity_addr.clone(),
        ));
        let certified = certify_once(&mut IdentityClient::new(channel), &config).await?;
        let credentials = Credentials::new();
        credentials.set(certified.key, certified.not_after);
        Ok(credentials)
    }

    /// A channel to the discovery APIs over TLS, presenting `credentials` (none if `None`).
    fn channel(&self, credentials: Option<Arc<Credentials>>) -> tonic::transport::Channel {
        self.channel_to(self.grpc, credentials)
    }

    /// A channel to the signal service over TLS, presenting `credentials` (none if `None`).
    fn signals_channel(&self, credentials: Option<Arc<Credentials>>) -> tonic::transport::Channel {
        self.channel_to(self.signals, credentials)
    }

    fn channel_to(
        &self,
        addr: SocketAddr,
        credentials: Option<Arc<Credentials>>,
    ) -> tonic::transport::Channel {
        let config = tls::client_config(self.roots.clone(), credentials).unwrap();
        TlsConnector::new(config, None).channel(
            tonic::transport::Endpoint::from_shared(format!("https://localhost:{}", addr.port()))
                .unwrap()
                .connect_timeout(Duration::from_secs(5)),
        )
    }
}

/// A workload certificate for `apps/web` from another authority than the issuer's.
fn forged_credentials() -> Arc<Credentials> {
    let (other_ca, other_key) = generate_ca("someone-else").unwrap();
    let other = Issuer::from_pem(
        other_ca.as_bytes(),
        other_key.as_bytes(),
        other_ca.as_bytes(),
        "cluster.local",
    )
    .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(&key)
        .unwrap();
    let issued = other
        .issue_workload(
            csr.der(),
            &kinference_identity::WorkloadIdentity {
                namespace: "apps".into(),
                service_account: "web-sa".into(),
                workload: "web".into(),
            },
            kinference_identity::clock::calendar_now(),
            Duration::from_secs(3600),
        )
        .unwrap();
    let forged = Credentials::new();
    forged.set(
        tls::certified_key(vec![issued.leaf], key.serialize_der()).unwrap(),
        issued.not_after,
    );
    forged
}

fn target(source_workload: &str) -> InferenceTarget {
    InferenceTarget {
        source_workload: source_workload.into(),
        target: Some(inference_target::Target::Authority(AUTHORITY.into())),
    }
}

async fn get(
    channel: tonic::transport::Channel,
    source_workload: &str,
) -> Result<kinference_proxy_api::inference::InferencePolicy, tonic::Status> {
    let mut client = InferencePoliciesClient::new(channel);
    let call = client.get(target(source_workload));
    tokio::time::timeout(TIMEOUT, call)
        .await
        .expect("answered")
        .map(|r| r.into_inner())
}

/// A call whose TLS handshake the controller refused: tonic reports the closed connection as
/// Unavailable or Cancelled depending on when it closes, never as an answer or a policy error.
fn refused_in_handshake(e: &tonic::Status) -> bool {
    matches!(
        e.code(),
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown
    )
}

#[tokio::test]
async fn no_certificate_from_the_issuer_no_policy() {
    let cluster = start("1h").await;
    // Plaintext, as every client could before.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.grpc))
        .unwrap()
        .connect_lazy();
    let e = get(plain, "apps/web").await.unwrap_err();
    assert_ne!(e.code(), tonic::Code::Ok, "{e:?}");
    // TLS without a client certificate.
    // The handshake fails, so the call ends as a transport error (tonic says Unavailable or
    // Cancelled depending on when the connection closes), never as an answer.
    let e = get(cluster.channel(None), "apps/web").await.unwrap_err();
    assert!(refused_in_handshake(&e), "{e:?}");
    // A workload certificate from another authority, naming a real workload.
    let e = get(cluster.channel(Some(forged_credentials())), "apps/web")
        .await
        .unwrap_err();
    assert!(refused_in_handshake(&e), "{e:?}");

    // The issuer's certificate reads it.
    let web = cluster.certify("web-token", WEB_SPIFFE).await.unwrap();
    let policy = get(cluster.channel(Some(web)), "apps/web").await.unwrap();
    assert_eq!(policy.models.len(), 1, "{policy:?}");
}

/// The first message of a watch of `path` (the pool's snapshot), or why there is none.
async fn watch(
    channel: tonic::transport::Channel,
    path: &str,
) -> Result<signals_api::SignalsUpdate, tonic::Status> {
    let mut client = EngineSignalsClient::new(channel);
    let target = signals_api::SignalsTarget {
        path: path.into(),
        ..Default::default()
    };
    let first = async move {
        let mut stream = client.watch(target).await?.into_inner();
        stream
            .message()
            .await?
            .ok_or_else(|| tonic::Status::aborted("the stream ended before its snapshot"))
    };
    tokio::time::timeout(TIMEOUT, first)
        .await
        .expect("answered")
}

/// One notice sent on `Notify`, and its acknowledgement.
async fn notify(channel: tonic::transport::Channel) -> Result<(), tonic::Status> {
    let batch = signals_api::NoticeBatch {
        notices: vec![signals_api::Notice {
            path: POOL_PATH.into(),
            addr: "10.1.0.1:8001".into(),
            sender: "identity-test".into(),
            ..Default::default()
        }],
    };
    let mut client = EngineSignalsClient::new(channel);
    let call = client.notify(tokio_stream::iter([batch]));
    tokio::time::timeout(TIMEOUT, call)
        .await
        .expect("answered")
        .map(|_| ())
}

#[tokio::test]
async fn no_certificate_from_the_issuer_no_signals() {
    let cluster = start("1h").await;
    // Plaintext, as every sidecar could in local mode.
    let plain = || {
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.signals))
            .unwrap()
            .connect_lazy()
    };
    // The server's answer to an HTTP/2 preface is a TLS alert, which h2 reads as a broken frame
    // (Internal) or a closed connection: never an answer of the service.
    let plaintext_refused = |e: &tonic::Status| {
        refused_in_handshake(e) || e.code() == tonic::Code::Internal && e.source().is_some()
    };
    let e = watch(plain(), POOL_PATH).await.unwrap_err();
    assert!(plaintext_refused(&e), "{e:?}");
    let e = notify(plain()).await.unwrap_err();
    assert!(plaintext_refused(&e), "{e:?}");
    // TLS without a client certificate.
    let e = watch(cluster.signals_channel(None), POOL_PATH)
        .await
        .unwrap_err();
    assert!(refused_in_handshake(&e), "{e:?}");
    let e = notify(cluster.signals_channel(None)).await.unwrap_err();
    assert!(refused_in_handshake(&e), "{e:?}");
    // A workload certificate from another authority.
    let forged = forged_credentials();
    let e = watch(cluster.signals_channel(Some(forged.clone())), POOL_PATH)
        .await
        .unwrap_err();
    assert!(refused_in_handshake(&e), "{e:?}");
    let e = notify(cluster.signals_channel(Some(forged)))
        .await
        .unwrap_err();
    assert!(refused_in_handshake(&e), "{e:?}");

    // The issuer's certificate is served: the pool's snapshot, the service's own refusal of a
    // path that names no pool (not the handshake's), and an acknowledged notice.
    let web = cluster.certify("web-token", WEB_SPIFFE).await.unwrap();
    let channel = cluster.signals_channel(Some(web));
    let snapshot = watch(channel.clone(), POOL_PATH).await.unwrap();
    assert!(
        snapshot.full && snapshot.version == 1,
        "the first message is the pool's snapshot: {snapshot:?}"
    );
    let e = watch(channel.clone(), "llm.default.svc.cluster.local")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    notify(channel).await.unwrap();
}

#[tokio::test]
async fn a_certificate_for_one_workload_cannot_read_as_another() {
    let cluster = start("1h").await;
    let web = cluster.certify("web-token", WEB_SPIFFE).await.unwrap();
    let channel = cluster.channel(Some(web));
    assert_eq!(
        get(channel.clone(), "apps/web").await.unwrap().models.len(),
        1
    );
    // An empty claim is served as the certificate's workload.
    assert_eq!(get(channel.clone(), "").await.unwrap().models.len(), 1);
    let e = get(channel.clone(), "apps/batch").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("apps/web"), "{e:?}");
    // The stock API too.
    use linkerd2_proxy_api::outbound::{
        TrafficSpec, outbound_policies_client::OutboundPoliciesClient, traffic_spec,
    };
    let spec = |w: &str| TrafficSpec {
        source_workload: w.into(),
        target: Some(traffic_spec::Target::Authority(AUTHORITY.into())),
    };
    let mut outbound = OutboundPoliciesClient::new(channel.clone());
    assert!(outbound.get(spec("apps/web")).await.is_ok());
    let e = outbound.get(spec("apps/batch")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

    // The bare pod's certificate names its own workload, and reads as it only.
    let batch = cluster.certify("batch-token", BATCH_SPIFFE).await.unwrap();
    let channel = cluster.channel(Some(batch));
    assert_eq!(
        get(channel.clone(), "apps/batch")
            .await
            .unwrap()
            .models
            .len(),
        1
    );
    let e = get(channel, "apps/web").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

    let metrics = cluster.metrics().await;
    assert!(
        metrics.contains(
            r#"kinference_policy_grpc_refused_total{api="inference",reason="source_workload"} 2"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_issuer_certifies_only_tokens_the_api_server_accepts() {
    let cluster = start("1h").await;
    assert!(cluster.certify("web-token", WEB_SPIFFE).await.is_ok());
    let reviews = cluster
        .api
        .requests()
        .iter()
        .filter(|r| r.path == "/apis/authentication.k8s.io/v1/tokenreviews")
        .map(|r| r.body["spec"].clone())
        .collect::<Vec<_>>();
    assert_eq!(
        reviews,
        vec![json!({"token": "web-token", "audiences": [TOKEN_AUDIENCE]})]
    );
    for (token, spiffe, code) in [
        ("forged-token", WEB_SPIFFE, tonic::Code::Unauthenticated),
        ("unbound-token", WEB_SPIFFE, tonic::Code::Unauthenticated),
        ("web-token", BATCH_SPIFFE, tonic::Code::PermissionDenied),
    ] {
        match cluster.certify(token, spiffe).await {
            Err(CertifyError::Refused(status)) => {
                assert_eq!(status.code(), code, "{token}: {status:?}")
            }
            Err(other) => panic!("{token}: {other}"),
            Ok(_) => panic!("{token} was certified as {spiffe}"),
        }
    }
    let metrics = cluster.metrics().await;
    for line in [
        r#"kinference_policy_identity_certify_total{result="issued"} 1"#,
        r#"kinference_policy_identity_certify_total{result="rejected"} 2"#,
        r#"kinference_policy_identity_certify_total{result="denied"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
}

#[tokio::test]
async fn certificates_rotate_and_a_connection_ends_with_its_certificate() {
    let cluster = start("3s").await;
    // The proxy's own refresh loop.
    let credentials =
        kinference_identity::certify::spawn(cluster.certify_config("web-token", WEB_SPIFFE))
            .unwrap();
    tokio::time::timeout(TIMEOUT, credentials.ready())
        .await
        .expect("certified");
    let first_expiry = credentials.not_after().unwrap();

    // A stream on a connection made with the first certificate.
    let channel = cluster.channel(Some(credentials.clone()));
    let mut stream = InferencePoliciesClient::new(channel.clone())
        .watch(target("apps/web"))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    // The controller closes the connection once its certificate expires (3 s at most).
    let ended = tokio::time::timeout(TIMEOUT, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return "ended",
                Err(_) => return "failed",
            }
        }
    })
    .await
    .expect("the stream outlived its certificate");
    assert!(matches!(ended, "ended" | "failed"));
    let now = kinference_identity::clock::calendar_now();
    assert!(
        now + Duration::from_secs(1) >= first_expiry,
        "cut off before the certificate expired"
    );

    // Meanwhile the certificate was refreshed before it expired, and the channel reconnects
    // with the current one.
    let current = credentials.not_after().unwrap();
    assert!(current > first_expiry, "refreshed");
    assert!(current > now, "the current certificate is valid");
    // The first call on the channel may still meet the closed connection; as the proxy's watch
    // does, it tries again, and a new connection is made with the current certificate.
    let policy = tokio::time::timeout(TIMEOUT, async {
        loop {
            match get(channel.clone(), "apps/web").await {
                Ok(policy) => return policy,
                Err(e) if e.code() == tonic::Code::PermissionDenied => panic!("{e:?}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .expect("policy read on the refreshed certificate");
    assert_eq!(policy.models.len(), 1);
    let metrics = cluster.metrics().await;
    let issued: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"kinference_policy_identity_certify_total{result="issued"} "#)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(issued >= 2, "{metrics}");
}
