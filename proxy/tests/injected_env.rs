//! The injector and the proxy agree: every environment variable the injector sets on the
//! `kinference-proxy` container is one the proxy reads, with a value it accepts. The pod is
//! injected by the real injector (the pure `inject` function) with the chart's default proxy
//! config, and the container's environment is fed to the proxy's own config parser.

use kinference_policy_admission::inject::{self, Decision};
use kinference_proxy::Config;
use serde_json::{Value, json};
use std::{collections::BTreeMap, time::Duration};

/// The chart's default proxy config, as the injector's tests use it.
const CONFIG_JSON: &str =
    include_str!("../../policy-controller/admission/tests/fixtures/config.json");

fn injected(pod: Value, annotations: &[(&str, &str)]) -> Value {
    let config = inject::Config {
        proxy: inject::ProxyConfig::from_json(CONFIG_JSON).unwrap(),
        control_plane_namespace: "kinference".into(),
    };
    let mut pod = pod;
    for (k, v) in annotations {
        pod["metadata"]["annotations"][*k] = json!(v);
    }
    let typed = serde_json::from_value(pod.clone()).unwrap();
    let Decision::Inject(injection) =
        inject::inject(&typed, "apps", &BTreeMap::new(), &config).unwrap()
    else {
        panic!("the pod was not injected");
    };
    json_patch::patch(&mut pod, &injection.patch).unwrap();
    pod
}

/// The proxy container's environment; values from the downward API get a sample value.
fn proxy_env(pod: &Value) -> Vec<(String, String)> {
    let proxy = pod["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "kinference-proxy")
        .expect("the proxy container");
    proxy["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_string();
            let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
                (Value::String(v), _) => v.clone(),
                (_, Value::String(path)) => format!("sample-{}", path.replace('.', "-")),
                other => panic!("{name} has neither a value nor a fieldRef: {other:?}"),
            };
            (name, value)
        })
        .collect()
}

fn deployment_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-7d4b9c8f6d-",
            "namespace": "apps",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d"},
            "annotations": {"kinference.io/inject": "enabled"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "web-7d4b9c8f6d", "uid": "1", "controller": true}],
        },
        "spec": {"containers": [{"name": "web", "image": "web:1"}]},
    })
}

#[test]
fn every_variable_the_injector_sets_is_read_by_the_proxy() {
    for (annotations, idle_timeout) in [
        (&[][..], Duration::from_secs(600)),
        (
            &[
                ("kinference.io/proxy-log-level", "info,kinference=debug"),
                ("kinference.io/proxy-target-idle-timeout", "90s"),
            ][..],
            Duration::from_secs(90),
        ),
    ] {
        let env = proxy_env(&injected(deployment_pod(), annotations));
        assert!(
            env.iter()
                .any(|(n, _)| n == "KINFERENCE_PROXY_CONTROLLER_ADDR")
        );
        let config = Config::from_env_vars(env.iter().map(|(n, v)| (n.as_str(), v.as_str())))
            .unwrap_or_else(|e| panic!("the proxy refuses the injected environment: {e}"));
        // What the injector meant is what the proxy understood.
        assert_eq!(config.workload, "apps/web");
        assert_eq!(config.workload_kind.as_deref(), Some("Deployment"));
        assert_eq!(config.listen_addr.to_string(), "127.0.0.1:4140");
        assert_eq!(config.admin_addr.to_string(), "127.0.0.1:4191");
        assert_eq!(
            config.metrics_addr.map(|a| a.to_string()).as_deref(),
            Some("0.0.0.0:4192")
        );
        assert_eq!(
            config.controller_addr.to_string(),
            "http://kinference-policy-controller.kinference.svc.cluster.local:8090/"
        );
        assert_eq!(
            config.workload_label_pairs(),
            vec![("app".to_string(), "web".to_string())]
        );
        assert_eq!(config.pod_name.as_deref(), Some("sample-metadata-name"));
        assert_eq!(
            config.pod_namespace.as_deref(),
            Some("sample-metadata-namespace")
        );
        assert_eq!(
            config.service_account.as_deref(),
            Some("sample-spec-serviceAccountName")
        );
        // The chart's idle timeout of redirected targets, or the pod's annotation.
        assert_eq!(config.target_idle_timeout(), idle_timeout);
        // The injector sets no target: direct use goes to the documented default, and
        // redirected connections are looked up by their original destination.
        assert_eq!(config.target, "llm.default.svc.cluster.local:8000");
    }
}

#[test]
fn the_check_fails_for_a_variable_the_proxy_does_not_read() {
    let mut env = proxy_env(&injected(deployment_pod(), &[]));
    env.push(("KINFERENCE_PROXY_NOT_A_SETTING".into(), "1".into()));
    let e = Config::from_env_vars(env.iter().map(|(n, v)| (n.as_str(), v.as_str()))).unwrap_err();
    assert!(
        e.to_string().contains("KINFERENCE_PROXY_NOT_A_SETTING"),
        "{e}"
    );
}

/// A local address other than loopback (the pod's IP, as it were), if this machine has one.
fn non_loopback_ipv4() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // No packet is sent: connecting a UDP socket only picks the route's source address.
    s.connect("10.255.255.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// The real proxy binary with the environment the injector sets (the ports made free ones):
/// its admin listener, with the debug views, is on loopback only; the read-only listener on every
/// address serves `GET /metrics`, `/ready` and `/live` and nothing else.
#[tokio::test]
async fn the_injected_proxy_serves_only_metrics_and_probes_off_loopback() {
    let env = proxy_env(&injected(deployment_pod(), &[]));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kinference-proxy"));
    for (name, value) in &env {
        let value = match name.as_str() {
            "KINFERENCE_PROXY_LISTEN_ADDR" => "127.0.0.1:0".to_string(),
            "KINFERENCE_PROXY_ADMIN_ADDR" => value.replace(":4191", ":0"),
            "KINFERENCE_PROXY_METRICS_ADDR" => value.replace(":4192", ":0"),
            // Nothing answers there: the proxy serves its admin views without a policy.
            "KINFERENCE_PROXY_CONTROLLER_ADDR" => format!(
                "http://127.0.0.1:{}",
                kinference_local::process::free_port().unwrap()
            ),
            _ => value.clone(),
        };
        cmd.env(name, value);
    }
    let (_proxy, line) = kinference_local::process::Proc::spawn(
        "kinference-proxy",
        cmd,
        "kinference-proxy ",
        Duration::from_secs(30),
        true,
    )
    .unwrap();
    let admin = kinference_local::process::addr_field(&line, "admin").unwrap();
    let metrics = kinference_local::process::addr_field(&line, "metrics").unwrap();
    assert!(admin.ip().is_loopback(), "{line}");
    assert!(metrics.ip().is_unspecified(), "{line}");

    let client = reqwest::Client::new();
    let status = |method: reqwest::Method, url: String| {
        let client = client.clone();
        async move {
            client
                .request(method, &url)
                .send()
                .await
                .unwrap_or_else(|e| panic!("{url}: {e}"))
                .status()
                .as_u16()
        }
    };
    let on = |port: u16, path: &str| format!("http://127.0.0.1:{port}{path}");
    use reqwest::Method;
    for path in ["/metrics", "/live"] {
        assert_eq!(
            status(Method::GET, on(metrics.port(), path)).await,
            200,
            "{path}"
        );
    }
    // Not ready without a policy, on either listener alike.
    assert_eq!(status(Method::GET, on(metrics.port(), "/ready")).await, 503);
    for path in ["/debug/decisions", "/debug/targets", "/debug/endpoints"] {
        assert_eq!(
            status(Method::GET, on(metrics.port(), path)).await,
            404,
            "{path}"
        );
        assert_eq!(
            status(Method::GET, on(admin.port(), path)).await,
            200,
            "{path}"
        );
    }
    for path in ["/debug/explain", "/debug/classify", "/metrics"] {
        assert_eq!(
            status(Method::POST, on(metrics.port(), path)).await,
            404,
            "{path}"
        );
    }

    // From the pod's IP, as the pod network reaches it: the read-only listener only.
    match non_loopback_ipv4() {
        Some(ip) => {
            let url = format!("http://{ip}:{}/metrics", metrics.port());
            assert_eq!(status(Method::GET, url).await, 200);
            let refused = std::net::TcpStream::connect((ip, admin.port()));
            assert!(refused.is_err(), "the admin listener answers on {ip}");
        }
        None => eprintln!("no address besides loopback here: the pod-IP part is not checked"),
    }
}
