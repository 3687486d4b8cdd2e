//! The images the charts deploy can be built from this repository: every `ghcr.io/kinference/*`
//! repository in the charts' values has a Dockerfile under `docker/` that builds a binary this
//! workspace has (checked with `cargo metadata`), installs it where its ENTRYPOINT runs it, and
//! is built by `just images`. No Docker daemon is needed: the images themselves are built by
//! hand or in a release job (docs/install.md).

use serde_json::Value;
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `ghcr.io/kinference/NAME` repositories in the charts' values.
fn chart_images() -> BTreeSet<String> {
    [
        "charts/kinference/values.yaml",
        "charts/kinference-viz/values.yaml",
    ]
    .iter()
    .flat_map(|f| {
        read(f)
            .lines()
            .filter_map(|l| l.trim().strip_prefix("repository: ghcr.io/kinference/"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    })
    .collect()
}

/// (package, binary) pairs of the workspace.
fn workspace_bins() -> BTreeSet<(String, String)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut bins = BTreeSet::new();
    for p in meta["packages"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            if t["kind"].as_array().unwrap().iter().any(|k| k == "bin") {
                bins.insert((
                    p["name"].as_str().unwrap().to_string(),
                    t["name"].as_str().unwrap().to_string(),
                ));
            }
        }
    }
    bins
}

/// The word after `flag` in `text`.
fn after<'a>(text: &'a str, flag: &str) -> Option<&'a str> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == flag)?;
    words.next()
}

#[test]
fn every_chart_image_has_a_dockerfile_that_builds_a_workspace_binary() {
    let images = chart_images();
    assert_eq!(
        images,
        ["policy-controller", "proxy", "proxy-init", "viz"]
            .map(String::from)
            .into(),
        "the charts deploy these images"
    );
    let bins = workspace_bins();
    let justfile = read("justfile");
    let mut dockerfiles: Vec<PathBuf> = std::fs::read_dir(root().join("docker"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "Dockerfile"))
        .collect();
    dockerfiles.sort();
    for image in &images {
        let tag = format!("ghcr.io/kinference/{image}:");
        let (path, text) = dockerfiles
            .iter()
            .map(|p| (p, std::fs::read_to_string(p).unwrap()))
            .find(|(_, t)| t.contains(&tag))
            .unwrap_or_else(|| panic!("no Dockerfile under docker/ builds {tag}"));
        let file = path.file_name().unwrap().to_str().unwrap();
        let package = after(&text, "-p").unwrap_or_else(|| panic!("{file}: no -p PACKAGE"));
        let bin = after(&text, "--bin").unwrap_or_else(|| panic!("{file}: no --bin BIN"));
        assert!(
            bins.contains(&(package.to_string(), bin.to_string())),
            "{file} builds {package}'s {bin}, which the workspace does not have"
        );
        assert!(text.contains("cargo build --locked --release"), "{file}");
        assert!(
            text.contains(&format!("ENTRYPOINT [\"/usr/local/bin/{bin}\"]")),
            "{file}: the entrypoint runs {bin}"
        );
        let ignore = path.with_file_name(format!("{file}.dockerignore"));
        assert!(
            std::fs::read_to_string(&ignore).is_ok_and(|t| t.lines().any(|l| l == "target/")),
            "{file}: a .dockerignore that leaves target/ out of the context"
        );
        let stem = file.trim_end_matches(".Dockerfile");
        assert!(
            justfile.contains(&format!("{image}:{stem}")),
            "`just images` does not build {image} from {file}"
        );
    }
}
