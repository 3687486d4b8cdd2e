//! The CRDs in charts/kinference-crds are exactly what the Rust types generate, and they
//! describe the resources the way the API server needs them.

use std::path::PathBuf;

use kinference_api::crds::{self, GeneratedFile};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn assert_matches_chart(files: &[GeneratedFile], command: &str) {
    for file in files {
        let path = repo_root().join(&file.path);
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{} is missing ({e}); run `{command}`", file.path.display())
        });
        assert!(
            on_disk == file.contents,
            "{} differs from the CRD the Rust types generate; run `{command}`",
            file.path.display()
        );
    }
}

#[test]
fn chart_crds_match_the_types() {
    let files = crds::kinference_crds().unwrap();
    for file in &files {
        // Helm renders every file under templates/; a stray "{{" in a description would break it.
        assert!(!file.contents.contains("{{"), "{}", file.path.display());
    }
    assert_matches_chart(&files, crds::REGENERATE_COMMAND);
}

#[test]
fn chart_upstream_crds_match_the_types() {
    let files = crds::upstream_crds().unwrap();
    // Installed only when the chart is asked to.
    assert!(
        files[0]
            .contents
            .starts_with("{{- if .Values.upstream.inferencePool }}\n")
    );
    assert!(files[0].contents.ends_with("{{- end }}\n"));
    assert_matches_chart(&files, crds::REGENERATE_UPSTREAM_COMMAND);
}

#[test]
fn generated_paths_are_the_documented_ones() {
    let paths: Vec<String> = crds::kinference_crds()
        .unwrap()
        .into_iter()
        .chain(crds::upstream_crds().unwrap())
        .map(|f| f.path.display().to_string())
        .collect();
    assert_eq!(
        paths,
        [
            "charts/kinference-crds/templates/inferencepolicies.policy.kinference.io.yaml",
            "charts/kinference-crds/templates/inferenceclassifiers.policy.kinference.io.yaml",
            "charts/kinference-crds/templates/upstream/inferencepools.inference.networking.k8s.io.yaml",
        ]
    );
}

#[test]
fn policy_crd_has_status_printer_columns_and_duration_patterns() {
    use kube::CustomResourceExt;
    let crd = kinference_api::InferencePolicy::crd();
    assert_eq!(crd.spec.group, "policy.kinference.io");
    assert_eq!(crd.spec.names.kind, "InferencePolicy");
    assert_eq!(crd.spec.names.plural, "inferencepolicies");
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Target Kind",
            "Target",
            "Classifier",
            "Mode",
            "Accepted",
            "Age"
        ]
    );

    let schema = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap();
    let balancer = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["balancer"];
    for field in ["freshnessBudget", "tieWindow"] {
        assert_eq!(
            balancer["properties"][field]["pattern"],
            kinference_api::duration::PATTERN,
            "{field}"
        );
    }
    // Defaults are in the schema, so the API server fills them in and `kubectl get -o yaml`
    // shows them.
    assert_eq!(
        balancer["properties"]["freshnessBudget"]["default"],
        "500ms"
    );
    assert_eq!(balancer["properties"]["tieWindow"]["default"], "20ms");
    assert_eq!(balancer["properties"]["failureMode"]["default"], "FailOpen");
    assert_eq!(balancer["properties"]["mode"]["default"], "Enforce");
    assert!(
        balancer["properties"]["freshnessBudget"]["description"]
            .as_str()
            .unwrap()
            .contains("Defaults to 500ms"),
        "doc comments become descriptions for kubectl explain"
    );
}

#[test]
fn classifier_crd_is_a_one_of_union() {
    use kube::CustomResourceExt;
    let crd = kinference_api::InferenceClassifier::crd();
    let schema = serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap()).unwrap();
    let tag = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["tags"]["items"];
    let one_of: Vec<&str> = tag["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["required"][0].as_str().unwrap())
        .collect();
    assert_eq!(
        one_of,
        [
            "complexity",
            "keywords",
            "regex",
            "exemplars",
            "external",
            "family"
        ]
    );
    for variant in one_of {
        assert_eq!(tag["properties"][variant]["type"], "object", "{variant}");
    }
}

#[test]
fn crdgen_writes_the_chart() {
    let root = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_kinference-crdgen"))
        .arg("--upstream")
        .arg("--root")
        .arg(root.path())
        .status()
        .unwrap();
    assert!(status.success());
    for file in crds::kinference_crds()
        .unwrap()
        .into_iter()
        .chain(crds::upstream_crds().unwrap())
    {
        let written = std::fs::read_to_string(root.path().join(&file.path)).unwrap();
        assert_eq!(written, file.contents, "{}", file.path.display());
    }

    // Without --upstream, the InferencePool CRD is not written.
    let root = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_kinference-crdgen"))
        .arg("--root")
        .arg(root.path())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        !root
            .path()
            .join("charts/kinference-crds/templates/upstream")
            .exists()
    );
    assert!(
        root.path()
            .join(&crds::kinference_crds().unwrap()[0].path)
            .exists()
    );
}
