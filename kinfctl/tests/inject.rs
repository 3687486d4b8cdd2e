//! `kinfctl inject` over real files and stdin: every workload kind gets
//! `kinference.io/inject: enabled` on its pod template, nothing else changes, other kinds pass
//! through untouched, a second pass changes nothing, and stderr reports each object as
//! `linkerd inject` does.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use serde::Deserialize as _;
use serde_json::Value;

const ANNOTATION: &str = "kinference.io/inject";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn kinfctl(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kinfctl"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kinfctl starts");
    {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(stdin.unwrap_or_default())
            .expect("write stdin");
    }
    child.wait_with_output().expect("kinfctl runs")
}

fn ok(output: Output) -> (String, String) {
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "kinfctl failed: {stderr}");
    (String::from_utf8(output.stdout).unwrap(), stderr)
}

fn docs(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// The pod template's metadata of a workload, by kind.
fn pod_meta(object: &Value) -> &Value {
    match object["kind"].as_str().unwrap() {
        "Pod" => &object["metadata"],
        "CronJob" => &object["spec"]["jobTemplate"]["spec"]["template"]["metadata"],
        _ => &object["spec"]["template"]["metadata"],
    }
}

/// `object` with its pod template's `kinference.io/inject` removed, and absent or null
/// metadata and annotations made empty maps, so that before and after compare equal when
/// nothing else changed.
fn without_inject_annotation(object: &Value) -> Value {
    let mut object = object.clone();
    let kind = object["kind"].as_str().unwrap().to_string();
    let template = match kind.as_str() {
        "Pod" => &mut object,
        "CronJob" => &mut object["spec"]["jobTemplate"]["spec"]["template"],
        _ => &mut object["spec"]["template"],
    };
    if !template["metadata"].is_object() {
        template["metadata"] = Value::Object(Default::default());
    }
    let meta = &mut template["metadata"];
    if !meta["annotations"].is_object() {
        meta["annotations"] = Value::Object(Default::default());
    }
    meta["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(ANNOTATION);
    object
}

#[test]
fn every_workload_kind_is_annotated_and_nothing_else_changes() {
    let path = fixture("workloads.yaml");
    let input = docs(&std::fs::read_to_string(&path).unwrap());
    let (stdout, stderr) = ok(kinfctl(&["inject", "-f", path.to_str().unwrap()], None));
    let output = docs(&stdout);
    assert_eq!(output.len(), input.len(), "objects were lost or added");

    let workloads = [
        "Deployment",
        "StatefulSet",
        "DaemonSet",
        "ReplicaSet",
        "Job",
        "CronJob",
        "Pod",
    ];
    for (before, after) in input.iter().zip(&output) {
        let kind = before["kind"].as_str().unwrap();
        if !workloads.contains(&kind) {
            assert_eq!(before, after, "{kind} was changed");
            continue;
        }
        assert_eq!(
            pod_meta(after)["annotations"][ANNOTATION],
            "enabled",
            "{kind} not annotated"
        );
        // Apart from the annotation (and the empty maps made to hold it), nothing changed.
        assert_eq!(
            without_inject_annotation(before),
            without_inject_annotation(after),
            "{kind}: more than the annotation changed"
        );
    }

    let expected = "\
deployment \"web\" injected
statefulset \"db\" injected
daemonset \"agent\" injected
replicaset \"rs\" injected
job \"batch\" injected
cronjob \"nightly\" injected
pod \"bare\" injected
service \"web\" skipped
configmap \"settings\" skipped
";
    assert_eq!(stderr, expected);
    // Strings that look like other YAML types stay strings.
    let config = output.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    assert_eq!(config["data"]["mode"], "on");
    assert_eq!(config["data"]["count"], "007");
}

#[test]
fn injecting_twice_changes_nothing() {
    let path = fixture("workloads.yaml");
    let (once, _) = ok(kinfctl(&["inject", path.to_str().unwrap()], None));
    let (twice, stderr) = ok(kinfctl(&["inject", "-"], Some(once.as_bytes())));
    assert_eq!(once, twice);
    assert_eq!(stderr.matches(" injected").count(), 7, "{stderr}");
}

#[test]
fn stdin_gives_the_same_output_as_a_file() {
    let path = fixture("workloads.yaml");
    let input = std::fs::read(&path).unwrap();
    let from_file = ok(kinfctl(&["inject", "-f", path.to_str().unwrap()], None));
    let from_dash = ok(kinfctl(&["inject", "-"], Some(&input)));
    let from_default = ok(kinfctl(&["inject"], Some(&input)));
    assert_eq!(from_file, from_dash);
    assert_eq!(from_file, from_default);
}

#[test]
fn list_items_are_injected() {
    let path = fixture("list.yaml");
    let (stdout, stderr) = ok(kinfctl(&["inject", "-f", path.to_str().unwrap()], None));
    let out = docs(&stdout);
    assert_eq!(out.len(), 1);
    let items = out[0]["items"].as_array().unwrap();
    assert_eq!(pod_meta(&items[0])["annotations"][ANNOTATION], "enabled");
    assert!(items[1]["metadata"].get("annotations").is_none());
    assert_eq!(
        stderr,
        "deployment \"chat\" injected\nservice \"chat\" skipped\n"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let no_template =
        b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: broken}\nspec: {}\n";
    let out = kinfctl(&["inject", "-"], Some(no_template));
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Deployment \"broken\": spec.template is missing"),
        "{stderr}"
    );

    let not_yaml = b"kind: Pod\nmetadata: [unclosed\n";
    let out = kinfctl(&["inject", "-"], Some(not_yaml));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("document 0 is not valid YAML"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = kinfctl(&["inject", "-f", "/nonexistent/manifests.yaml"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reading /nonexistent/manifests.yaml"));
}
