//! `examples/` rewritten for the replicas of one run.
//!
//! The controller serves the manifests a cluster would hold; on loopback the replicas listen on
//! ports picked at start, so each run copies `examples/` to a temporary directory with one
//! EndpointSlice per replica (the model's first slice is the template) and each InferencePool's
//! `targetPorts` set to its model's ports. With KV events the pools also carry the annotations
//! that make the proxy subscribe to its replicas (docs/proxy.md, "KV events").

use anyhow::Context as _;
use serde_yaml::Value;
use std::{collections::BTreeMap, path::Path};

/// The offset of a replica's KV-event port from its serving port (the pools' annotation `+1`).
pub const KV_EVENTS_PORT_OFFSET: u16 = 1;

/// The tokenizer contract of the simulated fleet, for the pools' annotation (the default).
pub const KV_EVENTS_TOKENIZER: &str = "kinference-sim";

/// How the manifests are rewritten beyond the ports.
#[derive(Clone, Debug, Default)]
pub struct Rewrite {
    /// Annotate the pools of the models in `ports` to use their replicas' KV events.
    pub kv_events: bool,
    /// The pools' `kinference.io/kv-events-tokenizer` with `kv_events`: [`KV_EVENTS_TOKENIZER`]
    /// when unset, `hf:<model directory>` for real vLLM serving that model's tokenizer.
    pub kv_events_tokenizer: Option<String>,
    /// Fail when a model of the manifests has no port, so that a benchmark never runs
    /// half-configured (otherwise its slices are dropped and its pool is left as it is).
    pub every_model: bool,
}

/// The file in a manifests directory that makes it a scenario: one line naming, relative to the
/// directory, the manifests it is based on.
pub const BASE_FILE: &str = "BASE";

/// The manifest files (`.yaml`, `.yml`) of `dir` by name. A directory with a [`BASE_FILE`] is a
/// scenario: its base's files, with its own replacing those of the same name (a scenario states
/// only what it changes, and is never a stale copy of `examples/`).
pub fn files(dir: &Path) -> anyhow::Result<BTreeMap<String, std::path::PathBuf>> {
    let mut out = BTreeMap::new();
    let base = dir.join(BASE_FILE);
    if base.is_file() {
        let rel = std::fs::read_to_string(&base)
            .with_context(|| format!("reading {}", base.display()))?;
        let named = dir.join(rel.trim());
        let parent = named
            .canonicalize()
            .ok()
            .filter(|p| p.is_dir() && dir.canonicalize().ok().as_ref() != Some(p))
            .with_context(|| {
                format!(
                    "{} names {}, which is not a manifests directory",
                    base.display(),
                    named.display()
                )
            })?;
        out = files(&parent)?;
    }
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(".yaml") || name.ends_with(".yml") {
            out.insert(name.to_string(), path.clone());
        }
    }
    Ok(out)
}

/// Copies the manifests of `src` (see [`files`]) into `dst`, with one EndpointSlice on loopback per port of
/// `ports[model]` and each InferencePool's `targetPorts` set to its model's ports. `patch` is
/// called with every InferencePolicy and InferenceClassifier document (the kinference resources a
/// test may change) and tells them apart by `kind`.
pub fn rewrite(
    src: &Path,
    dst: &Path,
    ports: &BTreeMap<String, Vec<u16>>,
    how: Rewrite,
    patch: &dyn Fn(&mut Value),
) -> anyhow::Result<()> {
    for (name, path) in files(src)? {
        let mut out = Vec::new();
        let mut sliced: Vec<String> = Vec::new();
        for mut doc in docs(&path)? {
            match doc.get("kind").and_then(Value::as_str) {
                Some("EndpointSlice") => {
                    let Some(model) = model_label(&doc) else {
                        out.push(doc);
                        continue;
                    };
                    if sliced.contains(&model) {
                        continue;
                    }
                    for (i, port) in ports_of(ports, &model, &how)?.iter().enumerate() {
                        out.push(slice(&doc, &model, i, *port));
                    }
                    sliced.push(model);
                }
                Some("InferencePool") => {
                    let model = doc["spec"]["selector"]["matchLabels"]["kinference.io/model"]
                        .as_str()
                        .map(str::to_string);
                    let model = match model {
                        Some(m) => m,
                        None if how.every_model => {
                            anyhow::bail!("an InferencePool without a kinference.io/model selector")
                        }
                        None => {
                            out.push(doc);
                            continue;
                        }
                    };
                    let ps = ports_of(ports, &model, &how)?;
                    if !ps.is_empty() {
                        if how.kv_events {
                            let tokenizer = how
                                .kv_events_tokenizer
                                .as_deref()
                                .unwrap_or(KV_EVENTS_TOKENIZER);
                            annotate_kv_events(&mut doc, tokenizer);
                        }
                        doc["spec"]["targetPorts"] = Value::Sequence(
                            ps.iter()
                                .map(|p| {
                                    let mut m = serde_yaml::Mapping::new();
                                    m.insert("number".into(), Value::from(u64::from(*p)));
                                    Value::Mapping(m)
                                })
                                .collect(),
                        );
                    }
                    out.push(doc);
                }
                Some("InferencePolicy" | "InferenceClassifier") => {
                    patch(&mut doc);
                    out.push(doc);
                }
                _ => out.push(doc),
            }
        }
        write_docs(&dst.join(&name), &out)?;
    }
    Ok(())
}

/// [`rewrite`] without KV events.
pub fn write_manifests(
    src: &Path,
    dst: &Path,
    ports: &BTreeMap<String, Vec<u16>>,
    patch: &dyn Fn(&mut Value),
) -> anyhow::Result<()> {
    rewrite(src, dst, ports, Rewrite::default(), patch)
}

/// [`rewrite`] with every InferencePool of a model in `ports` annotated to use its replicas' KV
/// events (port + [`KV_EVENTS_PORT_OFFSET`], the [`KV_EVENTS_TOKENIZER`] contract).
pub fn write_manifests_with_kv_events(
    src: &Path,
    dst: &Path,
    ports: &BTreeMap<String, Vec<u16>>,
    patch: &dyn Fn(&mut Value),
) -> anyhow::Result<()> {
    let how = Rewrite {
        kv_events: true,
        ..Rewrite::default()
    };
    rewrite(src, dst, ports, how, patch)
}

/// The YAML documents of a file, empty ones skipped.
pub fn docs(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            serde::Deserialize::deserialize(d)
                .with_context(|| format!("parsing {}", path.display()))
        })
        .filter(|d| !matches!(d, Ok(Value::Null)))
        .collect()
}

fn write_docs(path: &Path, docs: &[Value]) -> anyhow::Result<()> {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(d)?);
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

fn model_label(doc: &Value) -> Option<String> {
    doc.get("metadata")?
        .get("labels")?
        .get("kinference.io/model")?
        .as_str()
        .map(str::to_string)
}

fn ports_of<'a>(
    ports: &'a BTreeMap<String, Vec<u16>>,
    model: &str,
    how: &Rewrite,
) -> anyhow::Result<&'a [u16]> {
    match ports.get(model).filter(|p| !p.is_empty()) {
        Some(p) => Ok(p),
        None if how.every_model => anyhow::bail!("no upstream port for model {model}"),
        None => Ok(&[]),
    }
}

/// The `i`th slice of `model`, from `template`: its own pod name, loopback and `port`.
fn slice(template: &Value, model: &str, i: usize, port: u16) -> Value {
    let mut slice = template.clone();
    let pod = format!("vllm-{}-{i}", model.replace('.', "-"));
    slice["metadata"]["name"] = Value::from(pod.clone());
    slice["ports"][0]["port"] = Value::from(u64::from(port));
    slice["endpoints"][0]["addresses"] = Value::Sequence(vec![Value::from("127.0.0.1")]);
    slice["endpoints"][0]["targetRef"]["name"] = Value::from(pod);
    slice
}

/// Adds the KV-event annotations (docs/proxy.md, "KV events") to an InferencePool document.
fn annotate_kv_events(pool: &mut Value, tokenizer: &str) {
    if !pool["metadata"]["annotations"].is_mapping() {
        pool["metadata"]["annotations"] = Value::Mapping(serde_yaml::Mapping::new());
    }
    let a = &mut pool["metadata"]["annotations"];
    a["kinference.io/kv-events-port"] = Value::from(format!("+{KV_EVENTS_PORT_OFFSET}"));
    a["kinference.io/kv-events-tokenizer"] = Value::from(tokenizer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::workspace_root;
    use std::sync::Mutex;

    fn pools(dir: &Path) -> Vec<Value> {
        docs(&dir.join("inferencepools.yaml")).unwrap()
    }

    #[test]
    fn a_scenario_is_its_base_with_its_own_files_replacing_theirs() {
        let root = workspace_root();
        let scenario = root.join("integration/local/scenarios/cheapest-within-slo");
        let got = files(&scenario).unwrap();
        let base = files(&root.join("examples")).unwrap();
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            base.keys().collect::<Vec<_>>()
        );
        assert_eq!(got["policy.yaml"], scenario.join("policy.yaml"));
        assert_eq!(got["classifier.yaml"], base["classifier.yaml"]);
        // A base that is not a directory is an error, not an empty scenario.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(BASE_FILE), "nowhere\n").unwrap();
        let e = files(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a manifests directory"), "{e}");
    }

    #[test]
    fn the_patch_sees_the_policy_and_the_classifier_and_nothing_else() {
        let ports = BTreeMap::from([("glm-5.3".to_string(), vec![9001, 9002])]);
        let dst = tempfile::tempdir().unwrap();
        let kinds = Mutex::new(Vec::new());
        write_manifests(
            &workspace_root().join("examples"),
            dst.path(),
            &ports,
            &|doc: &mut Value| {
                let kind = doc["kind"].as_str().unwrap_or_default().to_string();
                doc["metadata"]["labels"]["patched"] = Value::from(kind.clone());
                kinds.lock().unwrap().push(kind);
            },
        )
        .unwrap();
        let mut kinds = kinds.into_inner().unwrap();
        kinds.sort();
        kinds.dedup();
        assert_eq!(kinds, vec!["InferenceClassifier", "InferencePolicy"]);
        let classifier = docs(&dst.path().join("classifier.yaml")).unwrap();
        assert_eq!(
            classifier[0]["metadata"]["labels"]["patched"],
            "InferenceClassifier"
        );
        // No KV events unless asked for.
        assert!(
            pools(dst.path())
                .iter()
                .all(|p| p["metadata"]["annotations"].is_null())
        );
    }

    #[test]
    fn kv_events_annotate_the_pools_of_the_started_models() {
        let ports = BTreeMap::from([("glm-5.3".to_string(), vec![9001, 9002])]);
        let dst = tempfile::tempdir().unwrap();
        write_manifests_with_kv_events(
            &workspace_root().join("examples"),
            dst.path(),
            &ports,
            &|_| {},
        )
        .unwrap();
        let pools = pools(dst.path());
        let glm = pools
            .iter()
            .find(|p| p["metadata"]["name"] == "glm-5.3")
            .unwrap();
        let a = &glm["metadata"]["annotations"];
        assert_eq!(a["kinference.io/kv-events-port"], "+1");
        assert_eq!(a["kinference.io/kv-events-tokenizer"], "kinference-sim");
        assert_eq!(glm["spec"]["targetPorts"][1]["number"], 9002);
        let qwen = pools
            .iter()
            .find(|p| p["metadata"]["name"] == "qwen-3.6-27b")
            .unwrap();
        assert!(qwen["metadata"]["annotations"].is_null(), "{qwen:?}");
    }

    #[test]
    fn a_run_sets_its_own_tokenizer_contract() {
        let ports = BTreeMap::from([
            ("glm-5.3".to_string(), vec![9001]),
            ("qwen-3.6-27b".to_string(), vec![9003]),
        ]);
        let dst = tempfile::tempdir().unwrap();
        let how = Rewrite {
            kv_events: true,
            kv_events_tokenizer: Some("hf:/opt/tiny-model".into()),
            ..Rewrite::default()
        };
        rewrite(
            &workspace_root().join("examples"),
            dst.path(),
            &ports,
            how,
            &|_| {},
        )
        .unwrap();
        for pool in pools(dst.path()) {
            let a = &pool["metadata"]["annotations"];
            assert_eq!(a["kinference.io/kv-events-tokenizer"], "hf:/opt/tiny-model");
            assert_eq!(a["kinference.io/kv-events-port"], "+1");
        }
    }
}
