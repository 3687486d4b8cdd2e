//! Writes the CRDs generated from `kinference-api`'s types into the Helm chart.
//!
//! The chart must never be edited by hand: this binary is the only writer, and a test fails when
//! the chart and the types disagree.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use kinference_api::crds;

/// Generate Kinference's CRDs into charts/kinference-crds.
#[derive(Debug, Parser)]
struct Args {
    /// Also write the upstream InferencePool CRD into templates/upstream/.
    #[arg(long)]
    upstream: bool,

    /// The repository root. Defaults to the root this binary was built from.
    #[arg(long)]
    root: Option<PathBuf>,

    /// Write nothing; print the generated files to stdout instead.
    #[arg(long)]
    stdout: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let root = args
        .root
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."));
    let mut files = crds::kinference_crds()?;
    if args.upstream {
        files.extend(crds::upstream_crds()?);
    }
    for file in files {
        if args.stdout {
            print!("---\n{}", file.contents);
            continue;
        }
        let path = root.join(&file.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, &file.contents)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", file.path.display());
    }
    Ok(())
}
