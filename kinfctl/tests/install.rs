//! `kinfctl install` prints the objects that Helm renders from the charts.
//!
//! `helm/render.py` lints and renders every chart with real Helm (the `helm-python-sdk` package,
//! Helm's Go SDK) and validates the objects against Kubernetes' schemas and our CRDs; this test
//! then runs the `kinfctl` binary with the same namespace and `--set` overrides and requires the
//! same objects, field for field. Only Helm's own labels (`helm.sh/chart`,
//! `app.kubernetes.io/managed-by`) and the generated certificate bytes are set aside; the
//! certificates are instead checked with `openssl` on both sides: the serving certificate is
//! signed by the CA that the webhooks trust, matches its key, and names the controller's Service.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize as _;
use serde_json::Value;

const HELM_ONLY_LABELS: [&str; 2] = ["helm.sh/chart", "app.kubernetes.io/managed-by"];
const TLS_SECRET: &str = "kinference-policy-controller-tls";
const PEERS_SERVICE: &str = "kinference-policy-controller-peers";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

kinference_test_prereqs::ci_guard!();

/// Runs render.py into `out`.
fn render_charts(out: &Path) {
    let script = repo_root().join("kinfctl/tests/helm/render.py");
    let result = Command::new("python3")
        .arg(&script)
        .arg("--out")
        .arg(out)
        .current_dir(repo_root())
        .output();
    let output = result.expect("python3 runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(output.status.success(), "render.py failed:\n{stderr}");
}

fn parse_docs(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn kinfctl(args: &[String]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .args(args)
        .output()
        .expect("kinfctl runs");
    assert!(
        output.status.success(),
        "kinfctl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

fn key(object: &Value) -> String {
    let meta = &object["metadata"];
    format!(
        "{} {} {}/{}",
        object["apiVersion"].as_str().unwrap_or(""),
        object["kind"].as_str().unwrap_or(""),
        meta["namespace"].as_str().unwrap_or("-"),
        meta["name"].as_str().unwrap_or("")
    )
}

/// Removes Helm's own labels wherever labels appear (objects and pod templates).
fn strip_helm_labels(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Object(labels)) = map.get_mut("labels") {
                for label in HELM_ONLY_LABELS {
                    labels.remove(label);
                }
            }
            map.values_mut().for_each(strip_helm_labels);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_helm_labels),
        _ => {}
    }
}

fn openssl(args: &[&str], dir: &Path) -> String {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Checks the webhook certificate of one rendering and redacts its bytes; returns the number of
/// webhook configurations whose caBundle was checked.
fn check_and_redact_tls(objects: &mut [Value], namespace: &str, side: &str) -> usize {
    let secret_value = objects
        .iter()
        .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == TLS_SECRET)
        .unwrap_or_else(|| panic!("{side}: no Secret {TLS_SECRET}"))
        .clone();
    let secret: Secret = serde_json::from_value(secret_value).expect("a valid Secret");
    let data = secret.data.expect("Secret data");
    let pem = |k: &str| String::from_utf8(data[k].0.clone()).expect("PEM is UTF-8");
    let (crt, key, ca) = (pem("tls.crt"), pem("tls.key"), pem("ca.crt"));
    assert!(
        crt.starts_with("-----BEGIN CERTIFICATE-----"),
        "{side}: {crt}"
    );
    assert!(
        ca.starts_with("-----BEGIN CERTIFICATE-----"),
        "{side}: {ca}"
    );
    assert!(key.contains("PRIVATE KEY-----"), "{side}: a key");

    let dir = tempfile::tempdir().expect("tempdir");
    for (file, contents) in [("tls.crt", &crt), ("tls.key", &key), ("ca.crt", &ca)] {
        std::fs::write(dir.path().join(file), contents).expect("write PEM");
    }
    let verified = openssl(&["verify", "-CAfile", "ca.crt", "tls.crt"], dir.path());
    assert_eq!(verified.trim(), "tls.crt: OK", "{side}");
    let sans = openssl(
        &["x509", "-in", "tls.crt", "-noout", "-ext", "subjectAltName"],
        dir.path(),
    );
    let host = format!("DNS:kinference-policy-controller.{namespace}.svc");
    assert!(
        sans.split([',', '\n', ' ']).any(|s| s.trim() == host),
        "{side}: {host} not in {sans}"
    );
    let cert_pub = openssl(&["x509", "-in", "tls.crt", "-noout", "-pubkey"], dir.path());
    let key_pub = openssl(&["pkey", "-in", "tls.key", "-pubout"], dir.path());
    assert_eq!(
        cert_pub, key_pub,
        "{side}: the key is not the certificate's"
    );

    let redacted = Value::String("<redacted>".into());
    let mut bundles = 0;
    for object in objects.iter_mut() {
        if object["kind"] == "Secret" && object["metadata"]["name"] == TLS_SECRET {
            for k in ["tls.crt", "tls.key", "ca.crt"] {
                object["data"][k] = redacted.clone();
            }
        }
        let kind = object["kind"].as_str().unwrap_or("").to_string();
        if kind.ends_with("WebhookConfiguration") {
            for hook in object["webhooks"].as_array_mut().into_iter().flatten() {
                let bundle: k8s_openapi::ByteString =
                    serde_json::from_value(hook["clientConfig"]["caBundle"].clone())
                        .expect("caBundle is base64");
                assert_eq!(bundle.0, ca.as_bytes(), "{side}: {kind} trusts another CA");
                hook["clientConfig"]["caBundle"] = redacted.clone();
                bundles += 1;
            }
        }
    }
    bundles
}

/// The controller's replicas as Helm rendered its Deployment.
fn controller_replicas(case: &str, helm: &[Value]) -> u64 {
    helm.iter()
        .find(|o| {
            o["kind"] == "Deployment" && o["metadata"]["name"] == "kinference-policy-controller"
        })
        .and_then(|d| d["spec"]["replicas"].as_u64())
        .unwrap_or_else(|| panic!("{case}: no controller Deployment with replicas"))
}

/// The rollout peers as Helm rendered them (docs/rollout.md, "Several replicas"): with more than
/// one replica, a headless Service of every replica's admin port, not-ready ones included, and
/// the controller's `KINFERENCE_ROLLOUT_PEERS` naming it; with one, neither.
fn rollout_peers(case: &str, ns: &str, replicas: u64, helm: &[Value]) {
    let services: Vec<&Value> = helm
        .iter()
        .filter(|o| o["kind"] == "Service" && o["metadata"]["name"] == PEERS_SERVICE)
        .collect();
    let deployment = helm
        .iter()
        .find(|o| {
            o["kind"] == "Deployment" && o["metadata"]["name"] == "kinference-policy-controller"
        })
        .unwrap_or_else(|| panic!("{case}: no controller Deployment"));
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let env: Vec<&Value> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "KINFERENCE_ROLLOUT_PEERS")
        .collect();
    if replicas <= 1 {
        assert!(
            services.is_empty(),
            "{case}: one replica has no peers: {services:?}"
        );
        assert!(env.is_empty(), "{case}: one replica has no peers: {env:?}");
        return;
    }
    assert_eq!(services.len(), 1, "{case}: one peers Service");
    let spec = &services[0]["spec"];
    assert_eq!(
        spec["clusterIP"], "None",
        "{case}: the peers Service is headless"
    );
    assert_eq!(spec["publishNotReadyAddresses"], true, "{case}");
    assert_eq!(
        spec["selector"],
        serde_json::json!({"kinference.io/control-plane-component": "policy-controller",
                           "kinference.io/control-plane-ns": ns}),
        "{case}: the peers Service selects the controller's pods"
    );
    assert_eq!(
        spec["ports"],
        serde_json::json!([{"name": "admin", "port": 9990, "targetPort": "admin",
                            "protocol": "TCP"}]),
        "{case}: the peers Service exposes the admin port"
    );
    assert!(
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "admin" && p["containerPort"] == 9990),
        "{case}: the controller's admin port is 9990"
    );
    assert_eq!(
        env,
        [&serde_json::json!({
            "name": "KINFERENCE_ROLLOUT_PEERS",
            "value": format!("{PEERS_SERVICE}.{ns}.svc.cluster.local:9990"),
        })],
        "{case}: the replicas fetch each other's windows"
    );
}

/// The controller's NetworkPolicy as Helm rendered it: ingress only, gRPC from pods the injector
/// labels, the webhooks from the API server's CIDRs (anywhere by default), the admin port from
/// monitoring and, with more than one replica, from the controller's own pods (the rollout
/// peers); none when the values turn it off.
fn network_policy(case: &str, values: &Value, ns: &str, replicas: u64, helm: &[Value]) {
    let all: Vec<&Value> = helm
        .iter()
        .filter(|o| o["kind"] == "NetworkPolicy")
        .collect();
    if values["networkPolicy"]["enabled"] == false {
        assert!(all.is_empty(), "{case}: {all:?}");
        return;
    }
    let found: Vec<&Value> = all
        .into_iter()
        .filter(|o| o["metadata"]["name"] == "kinference-policy-controller")
        .collect();
    assert_eq!(found.len(), 1, "{case}: one controller NetworkPolicy");
    let spec = &found[0]["spec"];
    assert_eq!(
        spec["podSelector"]["matchLabels"]["kinference.io/control-plane-component"],
        "policy-controller"
    );
    assert_eq!(spec["policyTypes"], serde_json::json!(["Ingress"]));
    let rules = spec["ingress"].as_array().unwrap();
    let ports: Vec<&Value> = rules.iter().map(|r| &r["ports"][0]["port"]).collect();
    let peers = replicas > 1;
    if peers {
        assert_eq!(ports, ["grpc", "webhook", "admin", "admin"], "{case}");
    } else {
        assert_eq!(ports, ["grpc", "webhook", "admin"], "{case}");
    }
    assert_eq!(
        rules[0]["from"],
        serde_json::json!([{"namespaceSelector": {},
                            "podSelector": {"matchLabels": {"kinference.io/control-plane-ns": ns}}}]),
        "{case}: gRPC from injected pods"
    );
    let api_server = &rules[1]["from"];
    if case == "control-plane-overrides" {
        assert_eq!(
            api_server,
            &serde_json::json!([{"ipBlock": {"cidr": "172.18.0.0/16"}},
                                {"ipBlock": {"cidr": "fd00:18::/64"}}])
        );
    } else {
        assert!(api_server.is_null(), "{case}: webhooks from anywhere");
    }
    assert!(
        !rules[2]["from"].as_array().unwrap().is_empty(),
        "{case}: metrics from monitoring only"
    );
    if peers {
        let own_pods = serde_json::json!([{"podSelector": {"matchLabels": {
            "kinference.io/control-plane-component": "policy-controller",
            "kinference.io/control-plane-ns": ns,
        }}}]);
        assert_eq!(
            rules[3]["from"], own_pods,
            "{case}: the admin port from the controller's own pods (rollout peers)"
        );
        assert_eq!(
            rules[3]["from"][0]["podSelector"], spec["podSelector"],
            "{case}: the peers are the pods the policy guards"
        );
    }
}

/// The signal shards as Helm rendered them (docs/signals.md, "Sharding"): with signals on, each
/// shard of the values a Deployment and Service `kinference-signals-<name>`, the Service selecting
/// the Deployment's pods, the pods serving that shard on the Service's port, the controller naming
/// the Service as the shard's address, and (with NetworkPolicies) a NetworkPolicy of those pods;
/// otherwise none of these. Returns the number of shards.
fn signal_shards(case: &str, values: &Value, ns: &str, helm: &[Value]) -> usize {
    let named = |kind: &str, name: &str| -> Option<&Value> {
        helm.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    };
    let controller = named("Deployment", "kinference-policy-controller")
        .unwrap_or_else(|| panic!("{case}: no controller Deployment"));
    let controller_args: Vec<&str> =
        controller["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .filter(|a| a.starts_with("--signals-shard-addr="))
            .collect();
    let signals = &values["signals"];
    let shards: Vec<&str> = if signals["enabled"] == true {
        signals["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| s["name"].as_str().unwrap())
            .collect()
    } else {
        Vec::new()
    };
    let rendered = helm
        .iter()
        .filter(|o| {
            o["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("kinference-signals-"))
        })
        .count();
    let policies = values["networkPolicy"]["enabled"] != false;
    assert_eq!(
        rendered,
        shards.len() * if policies { 3 } else { 2 },
        "{case}: the shards' objects"
    );
    assert_eq!(
        controller_args.len(),
        shards.len(),
        "{case}: {controller_args:?}"
    );
    for (shard, arg) in shards.iter().zip(&controller_args) {
        let name = format!("kinference-signals-{shard}");
        let deployment = named("Deployment", &name).unwrap_or_else(|| panic!("{case}: {name}"));
        let service = named("Service", &name).unwrap_or_else(|| panic!("{case}: {name}"));
        let port = &service["spec"]["ports"][0];
        assert_eq!(port["name"], "signals", "{case}: {name}");
        assert_eq!(
            *arg,
            format!(
                "--signals-shard-addr={shard}=http://{name}.{ns}.svc.cluster.local:{}",
                port["port"]
            ),
            "{case}: the controller names shard {shard}'s Service"
        );
        let selector = &service["spec"]["selector"];
        assert_eq!(selector["kinference.io/signals-shard"], *shard, "{case}");
        assert_eq!(
            &deployment["spec"]["selector"]["matchLabels"], selector,
            "{case}: {name}'s Service selects its pods"
        );
        let pod = &deployment["spec"]["template"];
        for (k, v) in selector.as_object().unwrap() {
            assert_eq!(&pod["metadata"]["labels"][k], v, "{case}: {name}: {k}");
        }
        let container = &pod["spec"]["containers"][0];
        let args = container["args"].as_array().unwrap();
        assert!(
            args.contains(&Value::from(format!("--signals-shard={shard}"))),
            "{case}: {name}: {args:?}"
        );
        assert!(
            container["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "signals" && p["containerPort"] == port["port"]),
            "{case}: {name} serves the Service's port"
        );
        if policies {
            let policy = named("NetworkPolicy", &name).unwrap_or_else(|| panic!("{case}: {name}"));
            assert_eq!(
                &policy["spec"]["podSelector"]["matchLabels"], selector,
                "{case}: {name}'s NetworkPolicy guards its pods"
            );
        }
    }
    shards.len()
}

#[test]
#[cfg_attr(
    not(has_helm_sdk),
    ignore = "needs Helm's Python SDK and openssl (pip install helm-python-sdk kubernetes-validate jsonschema; apt-get install openssl)"
)]
fn install_prints_what_helm_renders() {
    let out = tempfile::tempdir().expect("tempdir");
    render_charts(out.path());
    let cases: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("cases.json")).unwrap())
            .expect("cases.json");
    let names: Vec<&str> = cases.iter().filter_map(|c| c["name"].as_str()).collect();
    for want in [
        "crds-default",
        "crds-upstream",
        "control-plane-default",
        "control-plane-overrides",
        "control-plane-no-network-policy",
        "control-plane-one-replica",
        "control-plane-signals",
        "control-plane-signal-shards",
        "control-plane-signal-shards-no-network-policy",
    ] {
        assert!(
            names.contains(&want),
            "render.py has no case {want}: {names:?}"
        );
    }

    let mut replica_counts = Vec::new();
    let mut shard_counts = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let args: Vec<String> = serde_json::from_value(case["kinfctl"].clone()).unwrap();
        let helm_yaml = std::fs::read_to_string(case["file"].as_str().unwrap()).unwrap();
        let mut helm = parse_docs(&helm_yaml);
        let mut ours = parse_docs(&kinfctl(&args));
        assert_eq!(
            helm.len() as u64,
            case["objects"].as_u64().unwrap(),
            "{name}: the Helm YAML was not read back whole"
        );
        helm.iter_mut().for_each(strip_helm_labels);

        if case["chart"] == "kinference" {
            let ns = case["namespace"].as_str().unwrap();
            assert_eq!(check_and_redact_tls(&mut helm, ns, "helm"), 2, "{name}");
            assert_eq!(check_and_redact_tls(&mut ours, ns, "kinfctl"), 2, "{name}");
        }

        if case["chart"] == "kinference" {
            let ns = case["namespace"].as_str().unwrap();
            let replicas = controller_replicas(name, &helm);
            replica_counts.push((name, replicas));
            network_policy(name, &case["values"], ns, replicas, &helm);
            rollout_peers(name, ns, replicas, &helm);
            shard_counts.push((name, signal_shards(name, &case["values"], ns, &helm)));
        }
        let helm: BTreeMap<String, Value> = helm.into_iter().map(|o| (key(&o), o)).collect();
        let ours: BTreeMap<String, Value> = ours.into_iter().map(|o| (key(&o), o)).collect();
        assert_eq!(
            helm.keys().collect::<Vec<_>>(),
            ours.keys().collect::<Vec<_>>(),
            "{name}: Helm and kinfctl render different objects"
        );
        assert!(!helm.is_empty(), "{name}: nothing rendered");
        for (k, want) in &helm {
            let got = &ours[k];
            assert!(
                want == got,
                "{name}: {k} differs\n--- helm\n{}\n--- kinfctl\n{}",
                serde_yaml::to_string(want).unwrap(),
                serde_yaml::to_string(got).unwrap()
            );
        }
        eprintln!("{name}: {} objects equal", helm.len());
    }
    // Both sides of the peers gate were compared: the default's 2 replicas and one alone.
    for (want, replicas) in [
        ("control-plane-default", 2),
        ("control-plane-one-replica", 1),
    ] {
        assert!(
            replica_counts.contains(&(want, replicas)),
            "{want}: not {replicas} replicas: {replica_counts:?}"
        );
    }
    // The shards were rendered and compared, with and without NetworkPolicies.
    for want in [
        ("control-plane-signal-shards", 2),
        ("control-plane-signal-shards-no-network-policy", 1),
    ] {
        assert!(shard_counts.contains(&want), "{want:?}: {shard_counts:?}");
    }
}

#[test]
fn install_rejects_bad_values_and_namespaces() {
    for args in [
        &["install", "--set", "controller.replicaz=3"][..],
        &["install", "--set", "webhook.failurePolicy=Sometimes"],
        &["install", "--set", "signals.shards[0].name=Bad_Name"],
        &[
            "install",
            "--set",
            "signals.shards[0].name=a,signals.shards[0].replicas=0",
        ],
        &["install", "--namespace", "Not_A_Label"],
        &["install", "--crds", "--set", "upstream.inferencePool=maybe"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_kinfctl"))
            .args(args)
            .output()
            .expect("kinfctl runs");
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(output.stdout.is_empty(), "{args:?} printed manifests");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("Error"), "{args:?}: {stderr}");
    }
}
