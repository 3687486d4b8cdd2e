//! The external classifier over real HTTP on loopback: an answer within budget, a slow answer, a
//! garbled answer, an error status and a closed port.

#![cfg(feature = "http")]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use kinference_classify::{
    ClassifierDefinition, ClassifierId, ClassifierSet, Limits, Prompt, TagDefinition, TagKind,
    tag::FallbackReason,
};
use std::{convert::Infallible, net::SocketAddr, time::Duration};
use tokio::net::TcpListener;

/// Serves on 127.0.0.1:0. Paths: `/fast` answers from the request, `/slow` answers after 2 s,
/// `/garbage` answers non-JSON, `/error` answers 500.
async fn serve() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let path = req.uri().path().to_string();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let rsp = match path.as_str() {
                        "/fast" => {
                            // Echo what was sent, to prove the request carried tag and prompt.
                            let value = format!(
                                "{}:{}",
                                v["tag"].as_str().unwrap(),
                                v["prompt"].as_str().unwrap().len()
                            );
                            Response::new(Full::new(Bytes::from(
                                serde_json::json!({"value": value, "confidence": 0.87}).to_string(),
                            )))
                        }
                        "/slow" => {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            Response::new(Full::new(Bytes::from(
                                r#"{"value":"late","confidence":1}"#,
                            )))
                        }
                        "/garbage" => Response::new(Full::new(Bytes::from("<html>nope</html>"))),
                        _ => Response::builder()
                            .status(500)
                            .body(Full::new(Bytes::from("{}")))
                            .unwrap(),
                    };
                    Ok::<_, Infallible>(rsp)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn set(url: &str, timeout: Duration) -> ClassifierSet {
    ClassifierSet::new(&ClassifierDefinition {
        detectors: vec![],
        tags: vec![TagDefinition {
            name: "domain".into(),
            kind: TagKind::External {
                url: url.into(),
                timeout,
                values: vec![],
                fallback_value: "general".into(),
                fallback_confidence: 0.25,
            },
        }],
        limits: Limits::default(),
    })
    .unwrap()
}

const PROMPT: &str = "Summarise the attached contract.";

#[tokio::test]
async fn answer_within_budget_is_used() {
    let addr = serve().await;
    let set = set(&format!("http://{addr}/fast"), Duration::from_secs(5));
    let tags = set.classify_all(Prompt::Completion(PROMPT)).await;
    let t = tags.get("domain").unwrap();
    assert_eq!(t.value, format!("domain:{}", PROMPT.len()));
    assert_eq!(t.confidence, 0.87);
    assert_eq!(t.source, ClassifierId::External);
    // Local classification never calls out.
    assert!(
        set.classify(Prompt::Completion(PROMPT))
            .get("domain")
            .is_none()
    );
}

#[tokio::test]
async fn slow_answer_falls_back_within_budget() {
    let addr = serve().await;
    let set = set(&format!("http://{addr}/slow"), Duration::from_millis(100));
    let started = tokio::time::Instant::now();
    let tags = set.classify_all(Prompt::Completion(PROMPT)).await;
    let t = tags.get("domain").unwrap();
    assert_eq!(t.value, "general");
    assert_eq!(t.confidence, 0.25);
    assert_eq!(
        t.source,
        ClassifierId::ExternalFallback(FallbackReason::Timeout)
    );
    // It returned on the budget, not on the server's 2 s answer.
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn garbage_error_and_refused_fall_back() {
    let addr = serve().await;
    let cases = [
        (
            format!("http://{addr}/garbage"),
            FallbackReason::InvalidResponse,
        ),
        (format!("http://{addr}/error"), FallbackReason::Unavailable),
    ];
    for (url, reason) in cases {
        let tags = set(&url, Duration::from_secs(5))
            .classify_all(Prompt::Completion(PROMPT))
            .await;
        let t = tags.get("domain").unwrap();
        assert_eq!(t.value, "general", "{url}");
        assert_eq!(t.source, ClassifierId::ExternalFallback(reason), "{url}");
    }
    // A port nobody listens on: bind one, note it, close it.
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    let tags = set(&format!("http://127.0.0.1:{port}/"), Duration::from_secs(5))
        .classify_all(Prompt::Completion(PROMPT))
        .await;
    assert_eq!(
        tags.get("domain").unwrap().source,
        ClassifierId::ExternalFallback(FallbackReason::Unavailable)
    );
}

/// An HTTPS classifier on loopback with a certificate from a private root: verified and used when
/// the client trusts that root, refused (the fallback's `Unavailable`) when it does not.
#[tokio::test]
async fn https_is_verified_against_the_given_roots() {
    use kinference_classify::external::{ExternalClassifier, ExternalError, http::HttpClassifier};
    use rustls::{
        RootCertStore, ServerConfig,
        pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer},
    };
    use std::sync::Arc;

    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = key.cert.der().clone();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.signing_key.serialize_der())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let svc = service_fn(|_req: Request<Incoming>| async move {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
                        r#"{"value":"legal","confidence":0.8}"#,
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });

    let url = format!("https://localhost:{port}/classify");
    let mut roots = RootCertStore::empty();
    roots.add(cert).unwrap();
    let trusted = HttpClassifier::with_roots(&url, roots).unwrap();
    let answer = trusted.classify("domain", "a contract").await.unwrap();
    assert_eq!((answer.value.as_str(), answer.confidence), ("legal", 0.8));

    let untrusted = HttpClassifier::with_roots(&url, RootCertStore::empty()).unwrap();
    let refused = untrusted.classify("domain", "a contract").await;
    assert!(
        matches!(refused, Err(ExternalError::Unavailable(_))),
        "{refused:?}"
    );
}
