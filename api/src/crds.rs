//! CRD YAML generated from the Rust types, so that the schema the API server enforces is the
//! schema the controller reads.
//!
//! `kinference-crdgen` writes these files into the Helm chart, and a test regenerates them in
//! memory and fails when the chart has drifted from the types.

use std::path::{Path, PathBuf};

use kube::CustomResourceExt;

use crate::{InferenceClassifier, InferencePolicy, InferencePool};

/// The command that regenerates the chart's CRDs.
pub const REGENERATE_COMMAND: &str = "cargo run -p kinference-api --bin kinference-crdgen";

/// The command that regenerates the chart's CRDs, including the upstream InferencePool.
pub const REGENERATE_UPSTREAM_COMMAND: &str =
    "cargo run -p kinference-api --bin kinference-crdgen -- --upstream";

/// The chart's folder, relative to the repository root.
pub const CHART_DIR: &str = "charts/kinference-crds";

/// One generated file: where it goes, relative to the repository root, and its contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedFile {
    /// Path relative to the repository root.
    pub path: PathBuf,
    /// The file's full contents.
    pub contents: String,
}

/// Errors generating the CRDs.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("failed to render the {name} CRD as YAML: {source}")]
    Yaml {
        name: String,
        #[source]
        source: serde_yaml::Error,
    },
}

/// Kinference's own CRDs, always generated.
pub fn kinference_crds() -> Result<Vec<GeneratedFile>, CrdError> {
    Ok(vec![
        render(
            InferencePolicy::crd(),
            Path::new("templates"),
            REGENERATE_COMMAND,
        )?,
        render(
            InferenceClassifier::crd(),
            Path::new("templates"),
            REGENERATE_COMMAND,
        )?,
    ])
}

/// The upstream InferencePool CRD, for clusters that do not install the Inference Extension's.
///
/// The file is a Helm template installed only when the chart's `upstream.inferencePool` value is
/// true, so that the chart does not fight the Inference Extension's own CRD.
pub fn upstream_crds() -> Result<Vec<GeneratedFile>, CrdError> {
    let mut file = render(
        InferencePool::crd(),
        Path::new("templates/upstream"),
        REGENERATE_UPSTREAM_COMMAND,
    )?;
    file.contents = format!(
        "{{{{- if .Values.upstream.inferencePool }}}}\n{}{{{{- end }}}}\n",
        file.contents
    );
    Ok(vec![file])
}

fn render(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    dir: &Path,
    command: &str,
) -> Result<GeneratedFile, CrdError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let yaml = serde_yaml::to_string(&crd).map_err(|source| CrdError::Yaml {
        name: name.clone(),
        source,
    })?;
    let contents =
        format!("# Generated from the Rust types in api/ by `{command}`. Do not edit.\n{yaml}");
    Ok(GeneratedFile {
        path: Path::new(CHART_DIR).join(dir).join(format!("{name}.yaml")),
        contents,
    })
}
