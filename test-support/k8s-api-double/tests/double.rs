//! The double's own contract, through kube-rs's typed client: what the crates that use it
//! rely on (cluster-scoped objects, `/version`, generated names, injected failures).

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{Namespace, Pod},
};
use kinference_k8s_api_double::ApiServer;
use kube::{Api, api::PostParams};
use serde_json::json;

#[tokio::test]
async fn serves_preloaded_objects_namespaced_and_cluster_scoped() {
    let server = ApiServer::with_objects([
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "apps", "annotations": {"kinference.io/inject": "enabled"}}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "apps"},
               "spec": {"selector": {}, "template": {}},
               "status": {"readyReplicas": 2}}),
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "things.example.io"}, "spec": {"group": "example.io"}}),
    ])
    .await;
    let client = server.client("test");
    let ns = Api::<Namespace>::all(client.clone())
        .get("apps")
        .await
        .unwrap();
    assert_eq!(
        ns.metadata.annotations.unwrap()["kinference.io/inject"],
        "enabled"
    );
    let d = Api::<Deployment>::namespaced(client.clone(), "apps")
        .get("web")
        .await
        .unwrap();
    assert_eq!(d.status.unwrap().ready_replicas, Some(2));
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, "v1.34.0");

    // A raw GET of a CRD by name, as `kubectl get crd NAME` sends it.
    let crd = server
        .object(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "ignored",
            "things.example.io",
        )
        .unwrap();
    assert!(crd["metadata"].get("namespace").is_none());
    let req = http::Request::get(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/things.example.io",
    )
    .body(Vec::new())
    .unwrap();
    let got: serde_json::Value = client.request(req).await.unwrap();
    assert_eq!(got["spec"]["group"], "example.io");
}

#[tokio::test]
async fn creates_with_generated_names_and_fails_on_request() {
    let server = ApiServer::start().await;
    let pods = Api::<Pod>::namespaced(server.client("test"), "apps");
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"generateName": "web-"}, "spec": {"containers": []},
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(created.metadata.name.as_deref(), Some("web-00001"));
    pod.metadata.generate_name = None;
    pod.metadata.name = Some("web-00001".into());
    let conflict = pods.create(&PostParams::default(), &pod).await.unwrap_err();
    assert!(conflict.to_string().contains("AlreadyExists"), "{conflict}");

    // 500, not 503: kube-rs retries 429, 503 and 504.
    server.fail("/api/v1/namespaces/apps/pods/web-00001", 500);
    let err = pods.get("web-00001").await.unwrap_err();
    assert!(
        err.to_string().contains("500") || err.to_string().contains("injected"),
        "{err}"
    );
    assert_eq!(server.requests().len(), 3);
}
