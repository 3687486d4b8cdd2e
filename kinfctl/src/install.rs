//! `kinfctl install`: the control plane's manifests (or, with `--crds`, the CRDs) for `kubectl
//! apply`, built from typed Kubernetes objects.
//!
//! The Helm charts are the reference: the defaults come from the charts' own `values.yaml` and
//! `Chart.yaml` (embedded at build time), `--set` works as Helm's does, and a test renders the
//! charts with real Helm and requires the same objects from this command.

mod control_plane;
mod crds;
mod tls;
mod values;

use std::io::Write as _;

use anyhow::Context as _;

/// Arguments of `kinfctl install`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the CustomResourceDefinitions (the kinference-crds chart) instead of the control plane.
    #[arg(long)]
    crds: bool,

    /// The control plane's namespace (Helm's release namespace). Create it first.
    #[arg(long, short = 'n', default_value = "kinference")]
    namespace: String,

    /// Override a chart value, as Helm's `--set` does: `key.path=value[,key=value]`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// Errors building the manifests.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Values(#[from] values::Error),
    #[error("failed to generate the webhook certificate: {0}")]
    Tls(#[from] rcgen::Error),
    #[error("failed to serialize {what}: {source}")]
    Serialize {
        what: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("invalid namespace {0:?}: it must be a DNS label (lower-case letters, digits, '-')")]
    Namespace(String),
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let docs = manifests(&args)?;
    let mut out = std::io::stdout().lock();
    for doc in docs {
        write!(out, "---\n{doc}").context("writing to stdout")?;
    }
    out.flush().context("writing to stdout")?;
    Ok(())
}

/// The YAML documents `kinfctl install` prints, one per object.
fn manifests(args: &Args) -> Result<Vec<String>, Error> {
    if args.crds {
        let values = values::crds(&args.set)?;
        return crds::manifests(&values);
    }
    if !is_dns_label(&args.namespace) {
        return Err(Error::Namespace(args.namespace.clone()));
    }
    let values = values::control_plane(&args.set)?;
    control_plane::manifests(&args.namespace, &values)
}

/// Serializes one object as a YAML document.
fn to_yaml(what: &str, object: &impl serde::Serialize) -> Result<String, Error> {
    serde_yaml::to_string(object).map_err(|source| Error::Serialize {
        what: what.to_string(),
        source,
    })
}

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_must_be_dns_labels() {
        assert!(is_dns_label("kinference"));
        assert!(is_dns_label("kinf-system-2"));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label("Kinference"));
        assert!(!is_dns_label("-kinference"));
        assert!(!is_dns_label("kinf.system"));
        assert!(!is_dns_label(&"a".repeat(64)));
    }
}
