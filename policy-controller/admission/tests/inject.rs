//! The injector end to end without TLS: AdmissionReviews of pods as the API server sends
//! them at CREATE, the answer's JSON patch applied to the pod with `json_patch::patch`, the
//! resulting spec checked, and the patched pod reviewed again (no second patch). The
//! namespace comes from the API server double; events go to a recording fake.

use json_patch::PatchOperation;
use kinference_k8s_api_double::ApiServer;
use kinference_policy_admission::{
    EventRecorder, InjectConfig, InjectionEvent, Injector, ProxyConfig,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::Mutex;

/// `config.json` as the chart and `kinfctl install` render it from the default values.
pub const CONFIG_JSON: &str = include_str!("fixtures/config.json");

#[derive(Debug, Default)]
struct Recording(Mutex<Vec<InjectionEvent>>);

impl EventRecorder for Recording {
    fn record(&self, event: InjectionEvent) {
        self.0.lock().unwrap().push(event);
    }
}

struct Harness {
    server: ApiServer,
    injector: Injector,
    events: Arc<Recording>,
}

async fn harness() -> Harness {
    let server = ApiServer::with_objects([
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}),
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "batch", "annotations": {"kinference.io/inject": "enabled"}}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kinference"}}),
    ])
    .await;
    let config = InjectConfig {
        proxy: ProxyConfig::from_json(CONFIG_JSON).unwrap(),
        control_plane_namespace: "kinference".into(),
    };
    let events = Arc::new(Recording::default());
    let injector = Injector::new(config, server.client("injector"), events.clone());
    Harness {
        server,
        injector,
        events,
    }
}

/// The AdmissionReview the API server sends for creating `pod` in `namespace`.
fn review_of(pod: &Value, namespace: &str, operation: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod["metadata"]["name"].as_str().unwrap_or(""),
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    })
}

/// The patch bytes of a response: kube-rs writes `[]byte` as a JSON array of numbers, which
/// the API server's Go decoder reads as it reads Go's own base64 string; accept both.
pub fn patch_bytes(patch: &Value) -> Option<Vec<u8>> {
    match patch {
        Value::String(b64) => Some(base64_decode(b64)),
        Value::Array(bytes) => Some(
            bytes
                .iter()
                .map(|b| u8::try_from(b.as_u64().expect("a byte")).expect("a byte"))
                .collect(),
        ),
        _ => None,
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = ALPHABET.iter().position(|a| *a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

impl Harness {
    /// Reviews `pod`; returns the response and the decoded patch, if any.
    async fn review(&self, pod: &Value, namespace: &str) -> (Value, Option<Vec<PatchOperation>>) {
        self.review_op(pod, namespace, "CREATE").await
    }

    async fn review_op(
        &self,
        pod: &Value,
        namespace: &str,
        operation: &str,
    ) -> (Value, Option<Vec<PatchOperation>>) {
        let body = serde_json::to_vec(&review_of(pod, namespace, operation)).unwrap();
        let answer = self.injector.review(&body).await.unwrap();
        let answer = serde_json::to_value(answer).unwrap();
        assert_eq!(answer["kind"], "AdmissionReview");
        let response = answer["response"].clone();
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        let patch = patch_bytes(&response["patch"]).map(|bytes| {
            assert_eq!(response["patchType"], "JSONPatch");
            serde_json::from_slice(&bytes).unwrap()
        });
        (response, patch)
    }

    /// Reviews `pod`, requires a patch, applies it; then requires that the patched pod
    /// gets no second patch.
    async fn injected(&self, pod: &Value, namespace: &str) -> Value {
        let (response, patch) = self.review(pod, namespace).await;
        assert_eq!(response["allowed"], true, "{response}");
        let patch = patch.unwrap_or_else(|| panic!("no patch: {response}"));
        let mut patched = pod.clone();
        json_patch::patch(&mut patched, &patch).unwrap();
        let (again, second) = self.review(&patched, namespace).await;
        assert_eq!(again["allowed"], true);
        assert!(second.is_none(), "injected twice: {again}");
        patched
    }

    async fn not_injected(&self, pod: &Value, namespace: &str) {
        let (response, patch) = self.review(pod, namespace).await;
        assert_eq!(response["allowed"], true, "{response}");
        assert!(patch.is_none(), "patched: {response}");
    }
}

/// The service-account volume and defaults the API server has added before webhooks run.
fn defaults(mut spec: Value) -> Value {
    let fields = json!({
        "dnsPolicy": "ClusterFirst", "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0, "restartPolicy": "Always", "schedulerName": "default-scheduler",
        "securityContext": {}, "serviceAccount": "default", "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "tolerations": [
            {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300},
            {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 300},
        ],
        "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ]}}],
    });
    for (k, v) in fields.as_object().unwrap() {
        if spec.get(k).is_none() {
            spec[k] = v.clone();
        }
    }
    spec
}

fn container(name: &str, image: &str) -> Value {
    json!({
        "name": name, "image": image, "imagePullPolicy": "IfNotPresent",
        "resources": {}, "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
    })
}

/// A pod of Deployment `web`, as its ReplicaSet creates it.
fn deployment_pod(annotations: Value) -> Value {
    let mut app = container("web", "ghcr.io/example/web:1.4");
    app["ports"] = json!([{"containerPort": 8080, "protocol": "TCP"}]);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "web-7d4b9c8f6d-",
            "namespace": "apps",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d"},
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f6d",
                                 "uid": "b1e3c2a0-0000-4000-8000-000000000001",
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": defaults(json!({"containers": [app]})),
    })
}

/// A pod of Job `backfill`, in namespace `batch` (annotated for injection).
fn job_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "backfill-",
            "namespace": "batch",
            "labels": {"batch.kubernetes.io/controller-uid": "c0ffee00-0000-4000-8000-000000000002",
                       "batch.kubernetes.io/job-name": "backfill", "job-name": "backfill",
                       "controller-uid": "c0ffee00-0000-4000-8000-000000000002"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "backfill",
                                 "uid": "c0ffee00-0000-4000-8000-000000000002",
                                 "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": defaults(json!({
            "containers": [container("backfill", "ghcr.io/example/backfill:2")],
            "restartPolicy": "Never",
        })),
    })
}

/// A pod with an init container, a native sidecar and a classic sidecar of its own.
fn pod_with_sidecars() -> Value {
    let mut shipper = container("log-shipper", "fluent/fluent-bit:3");
    shipper["restartPolicy"] = json!("Always");
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "worker", "namespace": "apps",
            "annotations": {"kinference.io/inject": "enabled", "team": "ml"},
        },
        "spec": defaults(json!({
            "initContainers": [container("migrate", "ghcr.io/example/migrate:1"), shipper],
            "containers": [container("worker", "ghcr.io/example/worker:3"),
                           container("envoy", "envoyproxy/envoy:v1.31")],
        })),
    })
}

fn names(containers: &Value) -> Vec<&str> {
    containers
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect()
}

fn env(container: &Value) -> std::collections::BTreeMap<String, Value> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let value = e
                .get("value")
                .cloned()
                .unwrap_or_else(|| e["valueFrom"].clone());
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect()
}

fn by_name<'a>(containers: &'a Value, name: &str) -> &'a Value {
    containers
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {containers}"))
}

#[tokio::test]
async fn a_deployments_pod_gets_proxy_init_then_the_proxy_as_a_native_sidecar() {
    let h = harness().await;
    let pod = deployment_pod(json!({"kinference.io/inject": "enabled"}));
    let patched = h.injected(&pod, "apps").await;
    let config = ProxyConfig::from_json(CONFIG_JSON).unwrap();

    let init = &patched["spec"]["initContainers"];
    assert_eq!(names(init), ["kinference-proxy-init", "kinference-proxy"]);
    // The app's containers, volumes and everything else are untouched.
    assert_eq!(patched["spec"]["containers"], pod["spec"]["containers"]);
    assert_eq!(patched["spec"]["volumes"], pod["spec"]["volumes"]);
    assert_eq!(
        patched["metadata"]["annotations"]["kinference.io/injected-by"],
        format!("kinference-proxy-injector/{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        patched["metadata"]["annotations"]["kinference.io/inject"],
        "enabled"
    );
    // The label the chart's NetworkPolicy admits to the controller's gRPC port; the pod's own
    // labels stay.
    assert_eq!(
        patched["metadata"]["labels"]["kinference.io/control-plane-ns"],
        "kinference"
    );
    assert_eq!(patched["metadata"]["labels"]["app"], "web");

    let proxy = &init[1];
    assert_eq!(proxy["restartPolicy"], "Always");
    assert_eq!(proxy["image"], config.image);
    assert_eq!(proxy["imagePullPolicy"], "IfNotPresent");
    assert_eq!(proxy["securityContext"]["runAsUser"], config.uid);
    assert_eq!(proxy["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        proxy["ports"],
        json!([{"name": "kinf-metrics", "containerPort": 4192, "protocol": "TCP"}])
    );
    assert_eq!(proxy["readinessProbe"]["httpGet"]["path"], "/ready");
    // The kubelet probes the read-only listener; the admin listener is not on the pod's IP.
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(proxy[probe]["httpGet"]["port"], "kinf-metrics", "{probe}");
    }
    assert_eq!(
        proxy["resources"],
        serde_json::to_value(&config.resources).unwrap()
    );
    let e = env(proxy);
    assert_eq!(e["KINFERENCE_PROXY_WORKLOAD"], "apps/web");
    assert_eq!(e["KINFERENCE_PROXY_WORKLOAD_KIND"], "Deployment");
    assert_eq!(
        e["KINFERENCE_PROXY_CONTROLLER_ADDR"],
        config.controller_addr
    );
    assert_eq!(e["KINFERENCE_PROXY_LISTEN_ADDR"], "127.0.0.1:4140");
    assert_eq!(e["KINFERENCE_PROXY_ADMIN_ADDR"], "127.0.0.1:4191");
    assert_eq!(e["KINFERENCE_PROXY_METRICS_ADDR"], "0.0.0.0:4192");
    assert_eq!(e["KINFERENCE_PROXY_LOG_FORMAT"], "json");
    assert_eq!(e["RUST_LOG"], "info");
    // The workload's labels, without the revision hash.
    assert_eq!(e["KINFERENCE_PROXY_WORKLOAD_LABELS"], "app=web");
    assert_eq!(
        e["KINFERENCE_PROXY_POD_NAME"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );

    let init = &init[0];
    assert_eq!(init["image"], config.init_image);
    assert_eq!(init["securityContext"]["runAsUser"], 0);
    assert_eq!(
        init["securityContext"]["capabilities"]["add"],
        json!(["NET_ADMIN", "NET_RAW"])
    );
    assert_eq!(
        init["resources"],
        serde_json::to_value(&config.init_resources).unwrap()
    );
    let e = env(init);
    assert_eq!(e["KINFERENCE_PROXY_PORT"], "4140");
    assert_eq!(e["KINFERENCE_PROXY_UID"], "2102");
    assert_eq!(e["KINFERENCE_OUTBOUND_PORTS"], "80,8000");
    assert_eq!(e["KINFERENCE_SKIP_OUTBOUND_PORTS"], "");
    assert_eq!(e["KINFERENCE_SKIP_OUTBOUND_CIDRS"], "");

    // One event, on the ReplicaSet, saying what was done (the second review added none).
    let events = h.events.0.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, "Injected");
    assert_eq!(
        events[0].note,
        "Injected kinference-proxy into pod apps/web-7d4b9c8f6d-* (Deployment apps/web)"
    );
    assert_eq!(events[0].regarding.kind.as_deref(), Some("ReplicaSet"));
    assert_eq!(events[0].regarding.name.as_deref(), Some("web-7d4b9c8f6d"));
    // The namespace was read from the API server.
    assert!(
        h.server
            .requests()
            .iter()
            .any(|r| r.path == "/api/v1/namespaces/apps")
    );
}

#[tokio::test]
async fn a_jobs_pod_is_injected_through_its_namespace_annotation() {
    let h = harness().await;
    let patched = h.injected(&job_pod(), "batch").await;
    let init = &patched["spec"]["initContainers"];
    assert_eq!(names(init), ["kinference-proxy-init", "kinference-proxy"]);
    let e = env(&init[1]);
    assert_eq!(e["KINFERENCE_PROXY_WORKLOAD"], "batch/backfill");
    assert_eq!(e["KINFERENCE_PROXY_WORKLOAD_KIND"], "Job");
    assert_eq!(
        e["KINFERENCE_PROXY_WORKLOAD_LABELS"],
        "batch.kubernetes.io/job-name=backfill,job-name=backfill"
    );
    // The pod had no annotations: the patch created the map.
    assert_eq!(
        patched["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["kinference.io/injected-by"]
    );
    // A Job's pods do not restart, but the native sidecar does; the Job still completes
    // because sidecars stop when the app's containers have finished.
    assert_eq!(patched["spec"]["restartPolicy"], "Never");
    assert_eq!(init[1]["restartPolicy"], "Always");
}

#[tokio::test]
async fn existing_init_containers_and_sidecars_keep_their_order_after_the_proxy() {
    let h = harness().await;
    let pod = pod_with_sidecars();
    let patched = h.injected(&pod, "apps").await;
    assert_eq!(
        names(&patched["spec"]["initContainers"]),
        [
            "kinference-proxy-init",
            "kinference-proxy",
            "migrate",
            "log-shipper"
        ]
    );
    assert_eq!(
        by_name(&patched["spec"]["initContainers"], "log-shipper")["restartPolicy"],
        "Always"
    );
    assert_eq!(names(&patched["spec"]["containers"]), ["worker", "envoy"]);
    assert_eq!(patched["metadata"]["annotations"]["team"], "ml");
    let e = env(by_name(
        &patched["spec"]["initContainers"],
        "kinference-proxy",
    ));
    assert_eq!(e["KINFERENCE_PROXY_WORKLOAD"], "apps/worker");
    assert_eq!(e["KINFERENCE_PROXY_WORKLOAD_KIND"], "Pod");
    assert!(!e.contains_key("KINFERENCE_PROXY_WORKLOAD_LABELS"));
}

#[tokio::test]
async fn annotations_override_log_level_resources_and_interception() {
    let h = harness().await;
    let pod = deployment_pod(json!({
        "kinference.io/inject": "enabled",
        "kinference.io/proxy-log-level": "info,kinference=debug",
        "kinference.io/proxy-cpu-request": "250m",
        "kinference.io/proxy-memory-request": "128Mi",
        "kinference.io/proxy-cpu-limit": "1",
        "kinference.io/proxy-memory-limit": "1Gi",
        "kinference.io/outbound-ports": "8000, 8443, 9000",
        "kinference.io/skip-outbound-ports": "9000",
        "kinference.io/skip-outbound-cidrs": "10.96.0.0/12,fd00::/8",
        "kinference.io/proxy-target-idle-timeout": "90s",
        "kinference.io/proxy-expose-admin": "true",
    }));
    let patched = h.injected(&pod, "apps").await;
    let init = &patched["spec"]["initContainers"];
    let proxy = by_name(init, "kinference-proxy");
    assert_eq!(env(proxy)["RUST_LOG"], "info,kinference=debug");
    assert_eq!(env(proxy)["KINFERENCE_PROXY_ADMIN_ADDR"], "0.0.0.0:4191");
    assert_eq!(
        env(proxy)["KINFERENCE_PROXY_TARGET_IDLE_TIMEOUT_MS"],
        "90000"
    );
    assert_eq!(
        proxy["resources"],
        json!({"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}})
    );
    let e = env(by_name(init, "kinference-proxy-init"));
    assert_eq!(e["KINFERENCE_OUTBOUND_PORTS"], "8000,8443");
    assert_eq!(e["KINFERENCE_SKIP_OUTBOUND_PORTS"], "9000");
    assert_eq!(e["KINFERENCE_SKIP_OUTBOUND_CIDRS"], "10.96.0.0/12,fd00::/8");
    // Only the memory limit given overrides the default; the rest stay the chart's.
    let pod = deployment_pod(json!({
        "kinference.io/inject": "enabled",
        "kinference.io/proxy-memory-limit": "512Mi",
    }));
    let patched = h.injected(&pod, "apps").await;
    let proxy = by_name(&patched["spec"]["initContainers"], "kinference-proxy");
    assert_eq!(
        proxy["resources"],
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}})
    );
    // Without the annotation, the chart's `proxy.targetIdleTimeout` (10m).
    assert_eq!(
        env(proxy)["KINFERENCE_PROXY_TARGET_IDLE_TIMEOUT_MS"],
        "600000"
    );
}

#[tokio::test]
async fn invalid_overrides_are_denied_with_the_annotation_named() {
    let h = harness().await;
    for (key, value, reason) in [
        (
            "kinference.io/proxy-cpu-request",
            "lots",
            "not a Kubernetes quantity",
        ),
        (
            "kinference.io/outbound-ports",
            "8000,http",
            "\"http\" is not a port",
        ),
        (
            "kinference.io/skip-outbound-cidrs",
            "10.0.0.0/40",
            "is not a CIDR",
        ),
        (
            "kinference.io/inject",
            "yes",
            "expected enabled or disabled",
        ),
        (
            "kinference.io/proxy-target-idle-timeout",
            "600",
            "has no unit",
        ),
        (
            "kinference.io/proxy-expose-admin",
            "yes",
            "must be `true` or `false`",
        ),
    ] {
        let mut annotations = json!({"kinference.io/inject": "enabled"});
        annotations[key] = json!(value);
        let (response, patch) = h.review(&deployment_pod(annotations), "apps").await;
        assert_eq!(response["allowed"], false, "{key}={value}: {response}");
        assert!(patch.is_none());
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!(
                "cannot inject the kinference proxy: annotation {key}="
            )),
            "{message}"
        );
        assert!(message.contains(reason), "{message}");
    }
    assert!(h.events.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn exclusions_and_opt_outs_get_no_patch() {
    let h = harness().await;
    let enabled = json!({"kinference.io/inject": "enabled"});
    // System and control-plane namespaces, even when the pod asks.
    let mut pod = deployment_pod(enabled.clone());
    pod["metadata"]["namespace"] = json!("kube-system");
    h.not_injected(&pod, "kube-system").await;
    pod["metadata"]["namespace"] = json!("kinference");
    h.not_injected(&pod, "kinference").await;
    // Host-network pods.
    let mut pod = deployment_pod(enabled.clone());
    pod["spec"]["hostNetwork"] = json!(true);
    h.not_injected(&pod, "apps").await;
    // The control plane's own pods, wherever they run.
    let mut pod = deployment_pod(enabled.clone());
    pod["metadata"]["labels"]["kinference.io/control-plane-component"] = json!("policy-controller");
    h.not_injected(&pod, "apps").await;
    // Nobody asked.
    h.not_injected(&deployment_pod(json!({})), "apps").await;
    // The pod opts out of its namespace's injection.
    let mut pod = job_pod();
    pod["metadata"]["annotations"] = json!({"kinference.io/inject": "disabled"});
    h.not_injected(&pod, "batch").await;
    // A pod that already carries the proxy (injected by hand or by an earlier version).
    let mut pod = pod_with_sidecars();
    pod["spec"]["containers"][1]["name"] = json!("kinference-proxy");
    h.not_injected(&pod, "apps").await;
    // Only CREATE is mutated.
    let (response, patch) = h
        .review_op(&deployment_pod(enabled.clone()), "apps", "UPDATE")
        .await;
    assert_eq!(response["allowed"], true);
    assert!(patch.is_none());
    assert!(h.events.0.lock().unwrap().is_empty());
    // The same pod in an ordinary namespace is injected: the exclusions above were real.
    h.injected(&deployment_pod(enabled), "apps").await;
}

#[tokio::test]
async fn a_namespace_that_cannot_be_read_is_an_error_not_a_silent_skip() {
    let h = harness().await;
    h.server.fail("/api/v1/namespaces/apps", 500);
    let body =
        serde_json::to_vec(&review_of(&deployment_pod(json!({})), "apps", "CREATE")).unwrap();
    let err = h.injector.review(&body).await.unwrap_err();
    assert!(
        err.to_string().starts_with("looking up namespace apps: "),
        "{err}"
    );
}
