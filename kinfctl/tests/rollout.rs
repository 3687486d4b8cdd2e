//! `kinfctl rollout status|promote|abort`: against the Kubernetes API server double (status read
//! from the policy's `status.rollout`, promote and abort as merge patches of
//! `spec.rollout.state`), against a local controller's admin API (`--admin`, `GET /rollouts`),
//! and on a manifest directory (`--manifests`: the state line rewritten, the rest kept).

use std::process::Output;

use kinference_k8s_api_double::ApiServer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const API: &str = "policy.kinference.io/v1alpha1";

async fn kinfctl(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .await
        .expect("kinfctl runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn rollout_status() -> Value {
    json!({
        "name": "spread", "phase": "RolledBack", "verdict": "Rollback", "crossed": "errorRate",
        "message": "rolled back: errorRate 0.2375 (interval 0.1700 to 0.3100, limit 0.0200)",
        "minSamples": 100, "proxies": 2,
        "cohort": {"requests": 160, "errors": 40, "fallbacks": 1, "timeouts": 0,
                   "ttftSamples": 160, "costUsd": 0.16, "tokens": 16000},
        "control": {"requests": 158, "errors": 2, "fallbacks": 0, "timeouts": 0,
                    "ttftSamples": 158, "costUsd": 0.15, "tokens": 15800},
        "thresholds": [{"threshold": "errorRate", "estimate": 0.2375, "low": 0.17, "high": 0.31,
                        "limit": 0.02, "closeness": 7.5, "crossed": true}],
    })
}

fn policy() -> Value {
    json!({"apiVersion": API, "kind": "InferencePolicy",
           "metadata": {"name": "llm", "namespace": "default"},
           "spec": {"targetRef": {"group": "", "kind": "Service", "name": "llm"},
                    "models": [{"name": "glm-5.3", "poolRef": {"name": "glm-5.3"},
                                "prior": {"prefillTokensPerSecond": 12000, "timePerOutputTokenMs": 30}}],
                    "rollout": {"name": "spread", "candidate": {"balancer": {"failureMode": "FailClose"}},
                                "cohortPercent": 10, "controlPercent": 10,
                                "thresholds": {"errorRate": 0.02}}},
           "status": {"rollout": rollout_status()}})
}

#[tokio::test(flavor = "multi_thread")]
async fn status_reads_the_resource_and_promote_and_abort_patch_its_state() {
    let server = ApiServer::with_objects(vec![policy()]).await;
    let url = server.url();
    let out = kinfctl(&["rollout", "status", "--api-server", &url]).await;
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.starts_with("default/llm rollout spread: RolledBack, verdict Rollback, crossed errorRate (declared Running)"),
        "{text}"
    );
    assert!(text.contains("control        158       2"), "{text}");
    assert!(text.contains("errorRate"), "{text}");
    assert!(text.contains("7.50  CROSSED"), "{text}");
    // A policy without a rollout is an error when asked for by name.
    let out = kinfctl(&["rollout", "status", "other", "--api-server", &url]).await;
    assert!(!out.status.success());

    let state = || {
        server
            .object(API, "InferencePolicy", "default", "llm")
            .unwrap()["spec"]["rollout"]["state"]
            .clone()
    };
    let out = kinfctl(&["rollout", "promote", "llm", "--api-server", &url]).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(state(), "Promoted");
    let kept = server
        .object(API, "InferencePolicy", "default", "llm")
        .unwrap();
    assert_eq!(
        kept["spec"]["rollout"]["cohortPercent"], 10,
        "a merge patch: the rest stays"
    );
    let out = kinfctl(&["rollout", "abort", "llm", "--api-server", &url]).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(state(), "Aborted");
    let out = kinfctl(&["rollout", "abort", "missing", "--api-server", &url]).await;
    assert!(!out.status.success());
}

#[tokio::test]
async fn status_reads_a_local_controllers_admin_api() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body =
        json!({"policies": [{"namespace": "default", "name": "llm", "rollout": rollout_status()}]})
            .to_string();
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = vec![0; 4096];
        let n = conn.read(&mut buf).await.unwrap();
        let request = String::from_utf8_lossy(&buf[..n]).into_owned();
        let rsp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(rsp.as_bytes()).await.unwrap();
        request
    });
    let out = kinfctl(&["rollout", "status", "--admin", &format!("http://{addr}")]).await;
    assert!(out.status.success(), "{out:?}");
    let request = server.await.unwrap();
    assert!(request.starts_with("GET /rollouts "), "{request}");
    let text = stdout(&out);
    assert!(
        text.starts_with(
            "default/llm rollout spread: RolledBack, verdict Rollback, crossed errorRate\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("(minimum 100 requests per arm, 2 proxies)"),
        "{text}"
    );
}

#[tokio::test]
async fn promote_rewrites_the_manifest_state_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = "\
# The policy, with a rollout.
apiVersion: policy.kinference.io/v1alpha1
kind: InferencePolicy
metadata:
  name: llm
spec:
  targetRef: {group: \"\", kind: Service, name: llm}
  rollout:
    name: spread  # salted
    candidate:
      balancer: {failureMode: FailClose}
    cohortPercent: 10
    controlPercent: 10
    thresholds: {errorRate: 0.02}
    state: Running
  models:
    - name: glm-5.3
      poolRef: {name: glm-5.3}
      prior: {prefillTokensPerSecond: 12000, timePerOutputTokenMs: 30}
";
    std::fs::write(dir.path().join("policy.yaml"), manifest).unwrap();
    std::fs::write(
        dir.path().join("service.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: llm}\n",
    )
    .unwrap();
    let d = dir.path().to_str().unwrap();
    let out = kinfctl(&["rollout", "promote", "llm", "--manifests", d]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("policy.yaml"), "{}", stdout(&out));
    let after = std::fs::read_to_string(dir.path().join("policy.yaml")).unwrap();
    assert_eq!(
        after,
        manifest.replace("    state: Running\n", "    state: Promoted\n")
    );
    let out = kinfctl(&["rollout", "abort", "llm", "-n", "prod", "--manifests", d]).await;
    assert!(!out.status.success(), "no such policy in prod");
}
