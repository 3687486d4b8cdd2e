//! The issuer against the Kubernetes API server double: a proxy's CSR is signed when its pod's
//! projected token passes a TokenReview, and refused for every way a token can be wrong. The
//! issuer serves over TLS as in the controller, and the client is the proxy's own.

#![cfg(feature = "kube")]

use kinference_identity::{
    PeerIdentity, TOKEN_AUDIENCE,
    certify::{CertifyConfig, certify_once},
    connect::TlsConnector,
    issuer::{Issuer, generate_ca},
    review::TokenReviewer,
    service::{IdentityMetrics, IdentityService},
    tls,
};
use kinference_k8s_api_double::{ApiServer, ServiceAccountToken};
use linkerd2_proxy_api::identity::identity_client::IdentityClient;
use serde_json::json;
use std::{sync::Arc, time::Duration};

const POD_UID: &str = "6f1c0b1e-0000-4000-8000-000000000001";

fn pod() -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web-7d9f8-abcde", "namespace": "apps", "uid": POD_UID,
                        "labels": {"pod-template-hash": "7d9f8"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                             "name": "web-7d9f8", "uid": "rs-uid", "controller": true}]},
           "spec": {"serviceAccountName": "web-sa", "containers": [{"name": "app", "image": "app"}]}})
}

fn token(sa: &str, audience: &str, pod: Option<(&str, &str)>) -> ServiceAccountToken {
    ServiceAccountToken {
        namespace: "apps".into(),
        service_account: sa.into(),
        audiences: vec![audience.into()],
        pod: pod.map(|(n, u)| (n.into(), u.into())),
    }
}

struct Setup {
    _api: ApiServer,
    client: IdentityClient<tonic::transport::Channel>,
    roots: Arc<rustls::RootCertStore>,
    dir: tempfile::TempDir,
    metrics: IdentityMetrics,
}

async fn setup() -> Setup {
    let api = ApiServer::with_objects([pod()]).await;
    let pod = Some(("web-7d9f8-abcde", POD_UID));
    api.add_token("good", token("web-sa", TOKEN_AUDIENCE, pod));
    api.add_token(
        "other-audience",
        token("web-sa", "https://kubernetes.default.svc", pod),
    );
    api.add_token("unbound", token("web-sa", TOKEN_AUDIENCE, None));
    api.add_token(
        "replaced-pod",
        token(
            "web-sa",
            TOKEN_AUDIENCE,
            Some(("web-7d9f8-abcde", "old-uid")),
        ),
    );
    api.add_token(
        "gone-pod",
        token("web-sa", TOKEN_AUDIENCE, Some(("web-gone", "x"))),
    );
    api.add_token("wrong-sa", token("admin", TOKEN_AUDIENCE, pod));

    let (ca, key) = generate_ca("test-ca").unwrap();
    let issuer = Arc::new(
        Issuer::from_pem(
            ca.as_bytes(),
            key.as_bytes(),
            ca.as_bytes(),
            "cluster.local",
        )
        .unwrap(),
    );
    let serving = tls::Credentials::new();
    let run = kinference_identity::service::serve_certificate(
        issuer.clone(),
        vec!["localhost".into()],
        None,
        Duration::from_secs(3600),
        serving.clone(),
    )
    .await
    .unwrap();
    tokio::spawn(run);
    let metrics = IdentityMetrics::default();
    let service = IdentityService::new(
        issuer.clone(),
        TokenReviewer::new(api.client("issuer"), TOKEN_AUDIENCE),
        Duration::from_secs(3600),
        metrics.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server_tls = tls::server_config(serving).unwrap();
    tokio::spawn(kinference_identity::service::serve(
        listener,
        server_tls,
        service,
        std::future::pending(),
    ));
    let roots = tls::roots(issuer.anchors()).unwrap();
    let connector = TlsConnector::new(tls::client_config(roots.clone(), None).unwrap(), None);
    let channel = connector.channel(
        tonic::transport::Endpoint::from_shared(format!("https://localhost:{port}")).unwrap(),
    );
    Setup {
        _api: api,
        client: IdentityClient::new(channel),
        roots,
        dir: tempfile::tempdir().unwrap(),
        metrics,
    }
}

fn config(s: &Setup, token: &str, spiffe: &str) -> CertifyConfig {
    let path = s.dir.path().join(format!("token-{token}"));
    std::fs::write(&path, token).unwrap();
    CertifyConfig {
        identity_addr: "https://localhost".parse().unwrap(),
        token_file: path,
        spiffe_id: spiffe.into(),
        roots: s.roots.clone(),
    }
}

const WEB: &str = "spiffe://cluster.local/ns/apps/sa/web-sa";

#[tokio::test]
async fn a_pod_bound_token_is_certified_as_its_workload() {
    let mut s = setup().await;
    let cfg = config(&s, "good", WEB);
    let certified = certify_once(&mut s.client, &cfg).await.unwrap();
    let leaf = &certified.key.cert[0];
    let peer = PeerIdentity::from_leaf(leaf).unwrap();
    assert_eq!(peer.spiffe_id, WEB);
    // The Deployment, from the ReplicaSet the pod belongs to.
    assert_eq!(peer.workload, "apps/web");
    assert_eq!(s.metrics.certified("issued"), 1);
}

#[tokio::test]
async fn tokens_that_do_not_establish_the_identity_are_refused() {
    let mut s = setup().await;
    for (token, spiffe, code) in [
        ("nobody-knows-this", WEB, tonic::Code::Unauthenticated),
        ("other-audience", WEB, tonic::Code::Unauthenticated),
        ("unbound", WEB, tonic::Code::Unauthenticated),
        ("replaced-pod", WEB, tonic::Code::Unauthenticated),
        ("gone-pod", WEB, tonic::Code::Unauthenticated),
        // The token is valid, but its service account is not the pod's.
        (
            "wrong-sa",
            "spiffe://cluster.local/ns/apps/sa/admin",
            tonic::Code::Unauthenticated,
        ),
        // A valid token, asking for another identity than its own.
        (
            "good",
            "spiffe://cluster.local/ns/apps/sa/admin",
            tonic::Code::PermissionDenied,
        ),
        (
            "good",
            "spiffe://cluster.local/ns/kube-system/sa/web-sa",
            tonic::Code::PermissionDenied,
        ),
    ] {
        let cfg = config(&s, token, spiffe);
        let e = certify_once(&mut s.client, &cfg).await.unwrap_err();
        match e {
            kinference_identity::certify::CertifyError::Refused(status) => {
                assert_eq!(status.code(), code, "{token}: {status:?}");
            }
            other => panic!("{token}: {other}"),
        }
    }
    assert_eq!(s.metrics.certified("issued"), 0);
    assert_eq!(s.metrics.certified("rejected"), 6);
    assert_eq!(s.metrics.certified("denied"), 2);
}
