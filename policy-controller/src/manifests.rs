//! The manifest-directory source: the same YAML manifests a cluster would hold, read from
//! a directory and re-read when it changes, for running without a cluster.
//!
//! Each reload computes the desired set of resources and applies only the difference to
//! the index, under one lock, so watchers see one consistent update per change.
//!
//! A file with an error deletes nothing: a file that is not YAML (for example while an
//! editor is writing it), a document that does not parse as its kind (a schema error, or a
//! file truncated mid-document) and a file emptied of every document each keep the last good
//! version of the resources the file held, and the index is told which resources' newest
//! versions were rejected (`Index::set_source_rejections`), so that their parents report a
//! last good version. Deleting the file, or a document from a file that reads cleanly,
//! deletes its resources (docs/reliability.md, "Bad configuration").

use crate::metrics::Metrics;
use anyhow::Context as _;
use kinference_policy_core::inference::Rejection;
use kinference_policy_k8s_index::{Resource, ResourceKey, SharedIndex};
use notify::{RecursiveMode, Watcher};
use serde::Deserialize;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    time::Duration,
};

/// The namespace of resources that do not name one.
pub const DEFAULT_NAMESPACE: &str = "default";

#[derive(Debug)]
pub struct ManifestSource {
    dir: PathBuf,
    index: SharedIndex,
    metrics: Metrics,
    /// The last good documents of each file.
    files: BTreeMap<PathBuf, Vec<(ResourceKey, serde_yaml::Value, Resource)>>,
    /// What the index holds from this source.
    applied: HashMap<ResourceKey, serde_yaml::Value>,
    /// The resources whose newest version could not be read, as of the last reload.
    rejected: BTreeMap<ResourceKey, Rejection>,
}

/// What one reload changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reload {
    pub applied: usize,
    pub deleted: usize,
    pub errors: usize,
}

impl ManifestSource {
    pub fn new(dir: PathBuf, index: SharedIndex, metrics: Metrics) -> Self {
        Self {
            dir,
            index,
            metrics,
            files: BTreeMap::new(),
            applied: HashMap::new(),
            rejected: BTreeMap::new(),
        }
    }

    /// Re-reads the directory and applies what changed.
    pub fn reload(&mut self) -> anyhow::Result<Reload> {
        let mut stats = Reload::default();
        let paths =
            manifest_paths(&self.dir).with_context(|| format!("reading {}", self.dir.display()))?;
        // A deleted file deletes its resources: that is how they are deleted.
        self.files.retain(|p, _| paths.contains(p));
        let mut rejected = BTreeMap::new();
        for path in paths {
            let read = outcome(self.files.get(&path), read_file(&path));
            let file = path.display().to_string();
            for _ in 0..read.errors {
                stats.errors += 1;
                self.metrics.manifest_error();
            }
            for (document, reason, error) in &read.unnamed {
                tracing::warn!(%file, document, reason, %error, "skipping a manifest document that names no resource");
            }
            for r in read.rejected {
                let rejection = Rejection {
                    kind: r.key.kind.as_str().to_string(),
                    namespace: r.key.namespace.clone(),
                    name: r.key.name.clone(),
                    reason: r.reason.to_string(),
                    message: format!("{file}: {}", r.error),
                };
                // Logged when it first appears, not on every reload.
                if self.rejected.get(&r.key) != Some(&rejection) {
                    let (resource, reason, error) = (&r.key, r.reason, &r.error);
                    if r.kept {
                        tracing::warn!(%file, %resource, reason, %error, "keeping the last good version of a resource whose newest version could not be read");
                    } else {
                        tracing::warn!(%file, %resource, reason, %error, "skipping a resource that could not be read (no earlier version to keep)");
                    }
                }
                rejected.insert(r.key, rejection);
            }
            self.files.insert(path, read.docs);
        }
        for key in self.rejected.keys().filter(|k| !rejected.contains_key(*k)) {
            tracing::info!(resource = %key, "a resource that could not be read reads again");
        }

        let mut desired: HashMap<&ResourceKey, (&serde_yaml::Value, &Resource)> = HashMap::new();
        for (path, docs) in &self.files {
            for (key, value, res) in docs {
                if desired.insert(key, (value, res)).is_some() {
                    tracing::warn!(file = %path.display(), resource = %key, "resource defined twice; the last file wins");
                }
            }
        }

        let start = tokio::time::Instant::now();
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
            index.set_source_rejections(rejected.clone());
            self.metrics.set_sizes(&index.sizes());
        }
        self.rejected = rejected;
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

/// A file's documents as read.
struct File {
    /// The documents that read as resources.
    docs: Docs,
    /// Each document that did not: its index, the resource it names (when it names one the
    /// index uses), and the error.
    errors: Vec<(usize, Option<ResourceKey>, String)>,
}

/// Reads a file's documents; an error when it is not YAML.
fn read_file(path: &Path) -> anyhow::Result<File> {
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
        let named = ResourceKey::of_yaml(&value, DEFAULT_NAMESPACE);
        match Resource::from_yaml(value.clone(), DEFAULT_NAMESPACE) {
            Ok(Some(res)) => docs.push((res.key(), value, res)),
            Ok(None) => {}
            Err(error) => errors.push((i, named, error.to_string())),
        }
    }
    Ok(File { docs, errors })
}

/// A resource whose newest version in a file could not be read.
#[derive(Debug, PartialEq)]
struct Rejected {
    key: ResourceKey,
    /// `yaml` (the file is not YAML), `schema` (its document does not parse as its kind, or
    /// is gone from a file with such a document) or `empty` (the file has no documents).
    reason: &'static str,
    error: String,
    /// Whether its last good version is kept (else it never read).
    kept: bool,
}

/// What one read of a file means for its resources.
#[derive(Debug)]
struct Outcome {
    /// What the file holds now: the documents read and, when the read had an error, the last
    /// good version of every resource the file held that it no longer reads.
    docs: Docs,
    rejected: Vec<Rejected>,
    /// Errors that name no resource: (document, reason, error).
    unnamed: Vec<(Option<usize>, &'static str, String)>,
    /// How many problems the read had.
    errors: usize,
}

/// Decides what a file holds after a read, from what it held (`last`): a clean read replaces
/// it; a read with an error deletes nothing (see the module docs).
fn outcome(last: Option<&Docs>, read: anyhow::Result<File>) -> Outcome {
    let last: &[_] = last.map_or(&[], Vec::as_slice);
    let keep_all = |reason: &'static str, error: &str| {
        last.iter()
            .map(|(key, ..)| Rejected {
                key: key.clone(),
                reason,
                error: error.to_string(),
                kept: true,
            })
            .collect::<Vec<_>>()
    };
    match read {
        Err(error) => {
            let error = format!("{error:#}");
            let unnamed = if last.is_empty() {
                vec![(None, "yaml", error.clone())]
            } else {
                vec![]
            };
            Outcome {
                docs: last.to_vec(),
                rejected: keep_all("yaml", &error),
                unnamed,
                errors: 1,
            }
        }
        // Emptied, most likely truncated: deleting the file is how its resources are deleted.
        Ok(file) if file.errors.is_empty() && file.docs.is_empty() && !last.is_empty() => Outcome {
            docs: last.to_vec(),
            rejected: keep_all("empty", "the file has no documents"),
            unnamed: vec![],
            errors: 1,
        },
        Ok(file) if file.errors.is_empty() => Outcome {
            docs: file.docs,
            rejected: vec![],
            unnamed: vec![],
            errors: 0,
        },
        Ok(File { mut docs, errors }) => {
            let read: BTreeSet<ResourceKey> = docs.iter().map(|(k, ..)| k.clone()).collect();
            let named: BTreeMap<&ResourceKey, String> = errors
                .iter()
                .filter_map(|(i, k, e)| Some((k.as_ref()?, format!("document {i}: {e}"))))
                .collect();
            let first = errors
                .first()
                .map(|(i, _, e)| format!("document {i}: {e}"))
                .unwrap_or_default();
            let mut rejected = Vec::new();
            for (key, value, res) in last {
                if read.contains(key) {
                    continue;
                }
                docs.push((key.clone(), value.clone(), res.clone()));
                rejected.push(Rejected {
                    key: key.clone(),
                    reason: "schema",
                    error: named.get(key).cloned().unwrap_or_else(|| first.clone()),
                    kept: true,
                });
            }
            for (key, error) in named {
                if !last.iter().any(|(k, ..)| k == key) {
                    rejected.push(Rejected {
                        key: key.clone(),
                        reason: "schema",
                        error,
                        kept: false,
                    });
                }
            }
            let unnamed = errors
                .iter()
                .filter(|(_, k, _)| k.is_none())
                .map(|(i, _, e)| (Some(*i), "schema", e.clone()))
                .collect();
            Outcome {
                docs,
                rejected,
                unnamed,
                errors: errors.len(),
            }
        }
    }
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
        let mut source = ManifestSource::new(dir.path().into(), index.clone(), Metrics::new());
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

    use kinference_policy_core::{DiscoverInferencePolicy, InferencePolicyState, ParentTarget};

    /// `examples/` in a temporary directory, loaded, with the example parent watched.
    fn examples() -> (
        tempfile::TempDir,
        ManifestSource,
        SharedIndex,
        tokio::sync::watch::Receiver<InferencePolicyState>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        for path in manifest_paths(&examples).unwrap() {
            let to = dir.path().join(path.strip_prefix(&examples).unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&path, to).unwrap();
        }
        let index = kinference_policy_k8s_index::Index::shared();
        let mut source = ManifestSource::new(dir.path().into(), index.clone(), Metrics::new());
        assert_eq!(source.reload().unwrap().errors, 0);
        let rx = index
            .watch_inference_policy(&ParentTarget {
                namespace: "default".into(),
                name: "llm".into(),
                port: 8000,
            })
            .unwrap();
        assert!(matches!(*rx.borrow(), InferencePolicyState::Served(_)));
        (dir, source, index, rx)
    }

    /// The reason the parent is served a last good version, and the rejected resource.
    fn rejected(
        rx: &tokio::sync::watch::Receiver<InferencePolicyState>,
    ) -> Option<(String, String)> {
        rx.borrow()
            .rejected()
            .map(|r| (format!("{} {}", r.kind, r.name), r.reason.clone()))
    }

    fn policy_rejected(reason: &str) -> Option<(String, String)> {
        Some(("InferencePolicy llm".into(), reason.into()))
    }

    #[test]
    fn a_truncated_document_keeps_the_resource_and_is_rejected_as_schema() {
        let (dir, mut source, index, rx) = examples();
        let path = dir.path().join("policy.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let revision = rx.borrow().policy().unwrap().revision.clone();
        // Cut at the line before the models: still YAML, a policy without its required models.
        let cut = text[..text.find("  models:").unwrap()].len();
        std::fs::write(&path, &text[..cut]).unwrap();
        let r = source.reload().unwrap();
        assert_eq!((r.deleted, r.errors), (0, 1));
        assert_eq!(rx.borrow().policy().unwrap().revision, revision);
        assert_eq!(rejected(&rx), policy_rejected("schema"));
        let message = rx.borrow().rejected().unwrap().message.clone();
        assert!(
            message.contains("policy.yaml") && message.contains("models"),
            "{message}"
        );
        // Counted once, however often the directory is reloaded.
        source.reload().unwrap();
        let sizes = index.read().sizes();
        let key = (
            kinference_policy_k8s_index::ResourceKind::InferencePolicy,
            "schema".to_string(),
        );
        assert_eq!(sizes.rejections[&key], 1);
        assert_eq!(sizes.last_good_parents, 1);
        // Written out again: current.
        std::fs::write(&path, &text).unwrap();
        source.reload().unwrap();
        assert!(matches!(*rx.borrow(), InferencePolicyState::Served(_)));
        assert_eq!(index.read().sizes().last_good_parents, 0);
    }

    #[test]
    fn a_schema_error_keeps_the_resource_and_the_fix_is_applied() {
        let (dir, mut source, _index, rx) = examples();
        let path = dir.path().join("policy.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let revision = rx.borrow().policy().unwrap().revision.clone();
        std::fs::write(
            &path,
            text.replace("timePerOutputTokenMs: 15", "timePerOutputTokenMs: twelve"),
        )
        .unwrap();
        assert_eq!(source.reload().unwrap().errors, 1);
        assert_eq!(rx.borrow().policy().unwrap().revision, revision);
        assert_eq!(rejected(&rx), policy_rejected("schema"));
        std::fs::write(
            &path,
            text.replace("timePerOutputTokenMs: 15", "timePerOutputTokenMs: 13"),
        )
        .unwrap();
        assert_eq!(source.reload().unwrap().applied, 1);
        assert!(matches!(*rx.borrow(), InferencePolicyState::Served(_)));
        assert_ne!(rx.borrow().policy().unwrap().revision, revision);
    }

    #[test]
    fn a_file_that_is_not_yaml_or_is_emptied_keeps_its_resources() {
        let (dir, mut source, _index, rx) = examples();
        let path = dir.path().join("policy.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &text[..text.find("aliases:").unwrap() + 3]).unwrap();
        let r = source.reload().unwrap();
        assert_eq!((r.deleted, r.errors), (0, 1));
        assert!(rx.borrow().policy().is_some());
        assert_eq!(rejected(&rx), policy_rejected("yaml"));
        std::fs::write(&path, "").unwrap();
        let r = source.reload().unwrap();
        assert_eq!((r.deleted, r.errors), (0, 1));
        assert_eq!(rejected(&rx), policy_rejected("empty"));
        // The classifier's file emptied: the policy's classifier is rejected.
        std::fs::write(&path, &text).unwrap();
        std::fs::write(dir.path().join("classifier.yaml"), "# nothing\n").unwrap();
        source.reload().unwrap();
        assert_eq!(
            rejected(&rx),
            Some(("InferenceClassifier llm".into(), "empty".into()))
        );
    }

    #[test]
    fn deleting_a_file_deletes_its_resources() {
        let (dir, mut source, _index, rx) = examples();
        std::fs::remove_file(dir.path().join("policy.yaml")).unwrap();
        assert_eq!(source.reload().unwrap().deleted, 1);
        assert!(matches!(
            *rx.borrow(),
            InferencePolicyState::NotFound { .. }
        ));
    }

    #[test]
    fn a_new_document_that_does_not_read_is_rejected_with_nothing_kept() {
        let (dir, mut source, index, rx) = examples();
        std::fs::write(
            dir.path().join("other.yaml"),
            "apiVersion: policy.kinference.io/v1alpha1\nkind: InferencePolicy\nmetadata: {name: other}\nspec: {models: 3}\n",
        )
        .unwrap();
        assert_eq!(source.reload().unwrap().errors, 1);
        let key = ResourceKey {
            kind: kinference_policy_k8s_index::ResourceKind::InferencePolicy,
            namespace: "default".into(),
            name: "other".into(),
        };
        assert_eq!(index.read().rejections()[&key].reason, "schema");
        // Nothing of the example parent's depends on it.
        assert!(matches!(*rx.borrow(), InferencePolicyState::Served(_)));
    }
}
