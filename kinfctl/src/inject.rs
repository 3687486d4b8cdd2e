//! `kinfctl inject`: adds `kinference.io/inject: enabled` to the pod templates of workloads in
//! manifests, as `linkerd inject` does, so that the cluster's injector adds the proxy when the
//! pods are created. It reads a file or stdin, writes the manifests to stdout and one line per
//! object to stderr, leaves other kinds untouched, and is idempotent.

use std::io::{Read as _, Write as _};

use anyhow::Context as _;
use serde::Deserialize as _;
use serde_yaml::{Mapping, Value};

/// The annotation the injector acts on.
pub const ANNOTATION: &str = "kinference.io/inject";
/// Its value that asks for injection.
pub const ENABLED: &str = "enabled";

/// Arguments of `kinfctl inject`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A file of manifests, or `-` for stdin (the default).
    #[arg(value_name = "FILE", conflicts_with = "filename")]
    input: Option<String>,

    /// A file of manifests, or `-` for stdin.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    filename: Option<String>,
}

/// Errors injecting manifests.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("document {index} is not valid YAML: {source}")]
    Parse {
        index: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{kind} {name:?}: {path} is missing or not a mapping")]
    NoPodTemplate {
        kind: String,
        name: String,
        path: &'static str,
    },
    #[error("failed to write YAML: {0}")]
    Serialize(#[source] serde_yaml::Error),
}

/// What happened to one object, for the summary on stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub kind: String,
    pub name: String,
    pub injected: bool,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.injected { "injected" } else { "skipped" };
        write!(f, "{} {:?} {what}", self.kind.to_lowercase(), self.name)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let source = args.filename.or(args.input).unwrap_or_else(|| "-".into());
    let mut input = String::new();
    if source == "-" {
        std::io::stdin()
            .read_to_string(&mut input)
            .context("reading stdin")?;
    } else {
        input = std::fs::read_to_string(&source).with_context(|| format!("reading {source}"))?;
    }
    let (output, reports) = inject(&input)?;
    std::io::stdout()
        .lock()
        .write_all(output.as_bytes())
        .context("writing to stdout")?;
    let mut err = std::io::stderr().lock();
    for report in reports {
        writeln!(err, "{report}").context("writing to stderr")?;
    }
    Ok(())
}

/// Annotates every workload in the multi-document YAML `input`; returns the documents and a
/// report per object (a `List`'s items each get one).
pub fn inject(input: &str) -> Result<(String, Vec<Report>), Error> {
    let mut output = String::new();
    let mut reports = Vec::new();
    for (index, doc) in serde_yaml::Deserializer::from_str(input).enumerate() {
        let mut value = Value::deserialize(doc).map_err(|source| Error::Parse { index, source })?;
        if value.is_null() {
            continue;
        }
        inject_object(&mut value, &mut reports)?;
        output.push_str("---\n");
        output.push_str(&serde_yaml::to_string(&value).map_err(Error::Serialize)?);
    }
    Ok((output, reports))
}

fn inject_object(object: &mut Value, reports: &mut Vec<Report>) -> Result<(), Error> {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if kind == "List" {
        if let Some(items) = object.get_mut("items").and_then(Value::as_sequence_mut) {
            for item in items {
                inject_object(item, reports)?;
            }
        }
        return Ok(());
    }
    let name = object
        .get("metadata")
        .and_then(|m| m.get("name").or_else(|| m.get("generateName")))
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>")
        .to_string();
    let path: &[&str] = match kind.as_str() {
        "Pod" => &[],
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => &["spec", "template"],
        "CronJob" => &["spec", "jobTemplate", "spec", "template"],
        _ => {
            reports.push(Report {
                kind: if kind.is_empty() {
                    "object".into()
                } else {
                    kind
                },
                name,
                injected: false,
            });
            return Ok(());
        }
    };
    let mut template = &mut *object;
    for key in path {
        template = match template.get_mut(*key) {
            Some(next) if next.is_mapping() => next,
            _ => {
                return Err(Error::NoPodTemplate {
                    kind,
                    name,
                    path: if path.len() == 2 {
                        "spec.template"
                    } else {
                        "spec.jobTemplate.spec.template"
                    },
                });
            }
        };
    }
    let annotations = child_mapping(child_mapping(template, "metadata"), "annotations");
    if let Value::Mapping(map) = annotations {
        map.insert(ANNOTATION.into(), ENABLED.into());
    }
    reports.push(Report {
        kind,
        name,
        injected: true,
    });
    Ok(())
}

/// The mapping at `key` of `parent`, created (or replacing a null) when absent.
fn child_mapping<'a>(parent: &'a mut Value, key: &str) -> &'a mut Value {
    if !parent.is_mapping() {
        *parent = Value::Mapping(Mapping::new());
    }
    let Value::Mapping(map) = parent else {
        unreachable!("parent was just made a mapping")
    };
    let child = map.entry(key.into()).or_insert(Value::Null);
    if !child.is_mapping() {
        *child = Value::Mapping(Mapping::new());
    }
    child
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_read_like_linkerds() {
        let r = Report {
            kind: "Deployment".into(),
            name: "web".into(),
            injected: true,
        };
        assert_eq!(r.to_string(), r#"deployment "web" injected"#);
    }

    #[test]
    fn null_annotations_are_replaced() {
        let (out, _) = inject("kind: Pod\nmetadata:\n  name: p\n  annotations: ~\n").unwrap();
        let v: Value = serde_yaml::from_str(out.trim_start_matches("---\n")).unwrap();
        assert_eq!(v["metadata"]["annotations"][ANNOTATION], ENABLED);
    }
}
