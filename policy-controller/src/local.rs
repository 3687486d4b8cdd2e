//! The local-directory source: the same YAML manifests a cluster would hold, read from
//! a directory and re-read when it changes, for running without a cluster.
//!
//! Each reload computes the desired set of resources and applies only the difference to
//! the index, under one lock, so watchers see one consistent update per change. A file
//! that fails to parse (for example while an editor is writing it) keeps its last good
//! contents rather than deleting its resources.

use crate::metrics::Metrics;
use anyhow::Context as _;
use kinference_policy_k8s_index::{Resource, ResourceKey, SharedIndex};
use notify::{RecursiveMode, Watcher};
use serde::Deserialize;
use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// The namespace of resources that do not name one.
pub const DEFAULT_NAMESPACE: &str = "default";

#[derive(Debug)]
pub struct LocalSource {
    dir: PathBuf,
    index: SharedIndex,
    metrics: Metrics,
    /// The last good documents of each file.
    files: BTreeMap<PathBuf, Vec<(ResourceKey, serde_yaml::Value, Resource)>>,
    /// What the index holds from this source.
    applied: HashMap<ResourceKey, serde_yaml::Value>,
}

/// What one reload changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reload {
    pub applied: usize,
    pub deleted: usize,
    pub errors: usize,
}

impl LocalSource {
    pub fn new(dir: PathBuf, index: SharedIndex, metrics: Metrics) -> Self {
        Self {
            dir,
            index,
            metrics,
            files: BTreeMap::new(),
            applied: HashMap::new(),
        }
    }

    /// Re-reads the directory and applies what changed.
    pub fn reload(&mut self) -> anyhow::Result<Reload> {
        let mut stats = Reload::default();
        let paths =
            manifest_paths(&self.dir).with_context(|| format!("reading {}", self.dir.display()))?;
        self.files.retain(|p, _| paths.contains(p));
        for path in paths {
            match read_file(&path) {
                Ok((docs, doc_errors)) => {
                    for (i, error) in doc_errors {
                        stats.errors += 1;
                        self.metrics.manifest_error();
                        tracing::warn!(file = %path.display(), document = i, %error, "skipping manifest");
                    }
                    self.files.insert(path, docs);
                }
                Err(error) => {
                    stats.errors += 1;
                    self.metrics.manifest_error();
                    tracing::warn!(file = %path.display(), error = %format!("{error:#}"), "keeping the file's last good contents");
                }
            }
        }

        let mut desired: HashMap<&ResourceKey, (&serde_yaml::Value, &Resource)> = HashMap::new();
        for (path, docs) in &self.files {
            for (key, value, res) in docs {
                if desired.insert(key, (value, res)).is_some() {
                    tracing::warn!(file = %path.display(), resource = %key, "resource defined twice; the last file wins");
                }
            }
        }

        let start = Instant::now();
        {
            let mut index = self.index.write();
            let stale: Vec<ResourceKey> = self
                .applied
                .keys()
                .filter(|k| !desired.contains_key(k))
                .cloned()
                .collect();
            for key in stale {
                index.delete(&key);
                self.applied.remove(&key);
                self.metrics.event(key.kind, "delete");
                stats.deleted += 1;
            }
            for (key, (value, res)) in desired {
                if self.applied.get(key) == Some(value) {
                    continue;
                }
                index.apply(res.clone());
                self.applied.insert(key.clone(), value.clone());
                self.metrics.event(key.kind, "apply");
                stats.applied += 1;
            }
            self.metrics.set_sizes(&index.sizes());
        }
        if stats.applied + stats.deleted > 0 {
            self.metrics.observe_update(start.elapsed().as_secs_f64());
        }
        if stats == Reload::default() {
            tracing::debug!("manifests reloaded; nothing changed");
        } else {
            tracing::info!(
                applied = stats.applied,
                deleted = stats.deleted,
                errors = stats.errors,
                "manifests reloaded"
            );
        }
        Ok(stats)
    }

    /// Reloads whenever the directory changes, once it has been quiet for `debounce`.
    pub async fn watch(mut self, debounce: Duration) -> anyhow::Result<()> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut watcher = notify::recommended_watcher(move |event| {
            let _ = tx.send(event);
        })
        .context("starting the file watcher")?;
        watcher
            .watch(&self.dir, RecursiveMode::Recursive)
            .with_context(|| format!("watching {}", self.dir.display()))?;
        // Changes made between the first load and the watch starting.
        self.reload()?;
        while let Some(event) = rx.recv().await {
            if !is_change(&event) {
                continue;
            }
            loop {
                match tokio::time::timeout(debounce, rx.recv()).await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return Ok(()),
                    Err(_) => break,
                }
            }
            if let Err(error) = self.reload() {
                tracing::warn!(error = %format!("{error:#}"), "reload failed");
            }
        }
        Ok(())
    }
}

/// Reading the manifests opens them; only changes call for a reload.
fn is_change(event: &notify::Result<notify::Event>) -> bool {
    match event {
        Ok(event) => !event.kind.is_access() && !event.kind.is_other(),
        Err(error) => {
            tracing::warn!(%error, "file watch error");
            true
        }
    }
}

fn manifest_paths(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_none_or(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            let ty = entry.file_type()?;
            if ty.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

type Docs = Vec<(ResourceKey, serde_yaml::Value, Resource)>;

/// Reads a file's documents: the good ones, and the index and error of each bad one.
fn read_file(path: &Path) -> anyhow::Result<(Docs, Vec<(usize, String)>)> {
    let text = std::fs::read_to_string(path)?;
    let mut values = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc).context("invalid YAML")?;
        values.push(value);
    }
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for (i, value) in values.into_iter().enumerate() {
        if value.is_null() {
            continue;
        }
        match Resource::from_yaml(value.clone(), DEFAULT_NAMESPACE) {
            Ok(Some(res)) => docs.push((res.key(), value, res)),
            Ok(None) => {}
            Err(error) => errors.push((i, error.to_string())),
        }
    }
    Ok((docs, errors))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinference_policy_core::{DiscoverEndpoints, PoolRef};

    const POOL: &str = "apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata: {name: p}
spec:
  selector: {matchLabels: {app: vllm}}
  targetPorts: [{number: 8001}]
";

    const SLICE: &str = "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s, labels: {app: vllm}}
addressType: IPv4
endpoints: [{addresses: [127.0.0.1]}]
ports: [{port: 8001}]
";

    #[test]
    fn reload_applies_only_differences_and_deletes_what_disappeared() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pool.yaml"), POOL).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/slice.yml"), SLICE).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a manifest").unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "{ bad").unwrap();
        let index = kinference_policy_k8s_index::Index::shared();
        let mut source = LocalSource::new(dir.path().into(), index.clone(), Metrics::new());
        assert_eq!(
            source.reload().unwrap(),
            Reload {
                applied: 2,
                deleted: 0,
                errors: 0
            }
        );
        let rx = index
            .watch_endpoints(&PoolRef::new("default", "p"))
            .unwrap();
        assert_eq!(rx.borrow().endpoints.len(), 1);
        assert_eq!(source.reload().unwrap(), Reload::default());

        // A file that stops parsing keeps its resources.
        std::fs::write(dir.path().join("sub/slice.yml"), "endpoints: [unclosed").unwrap();
        assert_eq!(source.reload().unwrap().errors, 1);
        assert_eq!(rx.borrow().endpoints.len(), 1);

        // A removed file deletes its resources.
        std::fs::remove_file(dir.path().join("sub/slice.yml")).unwrap();
        assert_eq!(source.reload().unwrap().deleted, 1);
        assert!(rx.borrow().endpoints.is_empty());

        // A document of the wrong shape is skipped and counted; others in the file load.
        std::fs::write(
            dir.path().join("two.yaml"),
            format!("{SLICE}---\napiVersion: v1\nkind: Service\nmetadata: {{name: x}}\nspec: {{ports: 3}}\n"),
        )
        .unwrap();
        let r = source.reload().unwrap();
        assert_eq!((r.applied, r.errors), (1, 1));
        assert_eq!(rx.borrow().endpoints.len(), 1);
    }
}
