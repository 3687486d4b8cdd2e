//! The declared policy: resources from a manifest directory or the cluster, put through the
//! controller's own index and wire conversion, so the policy evaluated here is the message the
//! controller would serve a proxy of the target.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Service;
use kinference_api::{InferenceClassifier, InferencePolicy, InferencePool, httproute::HttpRoute};
use kinference_policy_core::{InferencePolicyState, ParentTarget};
use kinference_policy_k8s_index::{Index, Resource};
use kinference_proxy_api::inference as api;
use kube::{Api, api::ListParams};
use serde::Deserialize as _;

/// The namespace of manifests that name none (as the controller's manifest mode).
const DEFAULT_NAMESPACE: &str = "default";

/// A policy as the controller would serve it to a proxy of `target`.
#[derive(Debug)]
pub struct Declared {
    pub proto: api::InferencePolicy,
    pub target: String,
    /// Where it was read, for the report.
    pub source: String,
}

/// Reads every `.yaml`/`.yml` file under `dir` (hidden ones skipped, as the controller does).
pub fn from_manifests(dir: &Path, target: Option<&str>) -> anyhow::Result<Declared> {
    let mut resources = Vec::new();
    for path in manifest_paths(dir).with_context(|| format!("reading {}", dir.display()))? {
        resources.extend(resources_of(&path)?);
    }
    declared(resources, target, format!("manifests {}", dir.display()))
}

/// The manifests of `dir` with their InferencePolicies replaced by those of `policy_file` (a
/// what-if replay's policy: the same routes, pools and classifiers, another policy).
pub fn with_policy_file(
    dir: &Path,
    policy_file: &Path,
    target: Option<&str>,
) -> anyhow::Result<Declared> {
    let mut resources = Vec::new();
    for path in manifest_paths(dir).with_context(|| format!("reading {}", dir.display()))? {
        resources.extend(
            resources_of(&path)?
                .into_iter()
                .filter(|r| !matches!(r, Resource::InferencePolicy(_))),
        );
    }
    let policies: Vec<Resource> = resources_of(policy_file)?
        .into_iter()
        .filter(|r| matches!(r, Resource::InferencePolicy(_)))
        .collect();
    anyhow::ensure!(
        !policies.is_empty(),
        "{} holds no InferencePolicy",
        policy_file.display()
    );
    resources.extend(policies);
    declared(
        resources,
        target,
        format!("{} over manifests {}", policy_file.display(), dir.display()),
    )
}

/// The resources of one manifest file.
fn resources_of(path: &Path) -> anyhow::Result<Vec<Resource>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .with_context(|| format!("{}: invalid YAML", path.display()))?;
        if value.is_null() {
            continue;
        }
        match Resource::from_yaml(value, DEFAULT_NAMESPACE) {
            Ok(Some(r)) => out.push(r),
            Ok(None) => {}
            Err(e) => anyhow::bail!("{} (document {i}): {e}", path.display()),
        }
    }
    Ok(out)
}

/// The `.yaml`/`.yml` files under `dir`, hidden ones skipped, in order.
pub fn manifest_paths(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_none_or(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            if path.is_dir() {
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

/// A client for the current kubeconfig context, another kubeconfig, or a bare API URL.
pub async fn cluster_client(
    kubeconfig: Option<&PathBuf>,
    api_server: Option<&str>,
) -> anyhow::Result<kube::Client> {
    let mut config = match (api_server, kubeconfig) {
        (Some(url), _) => kube::Config::new(
            url.parse()
                .with_context(|| format!("--api-server {url:?} is not a URL"))?,
        ),
        (None, Some(path)) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("using {}", path.display()))?
        }
        (None, None) => kube::Config::infer()
            .await
            .context("finding a kubeconfig (set --kubeconfig or KUBECONFIG)")?,
    };
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(15));
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Lists the kinds a policy is built from, in every namespace.
pub async fn from_cluster(client: &kube::Client, target: Option<&str>) -> anyhow::Result<Declared> {
    async fn list<K>(client: &kube::Client) -> anyhow::Result<Vec<K>>
    where
        K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    {
        let kind = K::kind(&());
        Ok(Api::<K>::all(client.clone())
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing {kind}s"))?
            .items)
    }
    let mut resources: Vec<Resource> = Vec::new();
    resources.extend(
        list::<Service>(client)
            .await?
            .into_iter()
            .map(|r| Resource::Service(Box::new(r))),
    );
    resources.extend(
        list::<HttpRoute>(client)
            .await?
            .into_iter()
            .map(|r| Resource::HttpRoute(Box::new(r))),
    );
    resources.extend(
        list::<InferencePool>(client)
            .await?
            .into_iter()
            .map(|r| Resource::InferencePool(Box::new(r))),
    );
    resources.extend(
        list::<InferencePolicy>(client)
            .await?
            .into_iter()
            .map(|r| Resource::InferencePolicy(Box::new(r))),
    );
    resources.extend(
        list::<InferenceClassifier>(client)
            .await?
            .into_iter()
            .map(|r| Resource::InferenceClassifier(Box::new(r))),
    );
    declared(resources, target, "cluster".into())
}

/// Indexes `resources` and takes the policy of `target`, or of the only Service port that has
/// one.
pub fn declared(
    resources: Vec<Resource>,
    target: Option<&str>,
    source: String,
) -> anyhow::Result<Declared> {
    let mut ports: Vec<ParentTarget> = Vec::new();
    for r in &resources {
        if let Resource::Service(svc) = r {
            let m = &svc.metadata;
            for p in svc.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
                ports.push(ParentTarget {
                    namespace: m.namespace.clone().unwrap_or_default(),
                    name: m.name.clone().unwrap_or_default(),
                    port: u16::try_from(p.port).unwrap_or_default(),
                });
            }
        }
    }
    let index = Index::shared();
    {
        let mut w = index.write();
        for r in resources {
            w.apply(r);
        }
    }
    let index = index.read();
    let target = match target {
        Some(t) => ParentTarget::from_authority(t).with_context(|| format!("--target {t:?}"))?,
        None => {
            let with_policy: Vec<&ParentTarget> = ports
                .iter()
                .filter(|t| {
                    !matches!(
                        index.inference_policy(t),
                        InferencePolicyState::NotFound { .. }
                    )
                })
                .collect();
            match with_policy.as_slice() {
                [one] => (*one).clone(),
                [] => anyhow::bail!(
                    "no Service port in the {source} has an InferencePolicy (through an HTTPRoute)"
                ),
                many => anyhow::bail!(
                    "several Service ports have an InferencePolicy; pick one with --target: {}",
                    many.iter()
                        .map(|t| t.authority())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
    };
    let state = index.inference_policy(&target);
    if let InferencePolicyState::NotFound { .. } = state {
        anyhow::bail!("no InferencePolicy applies to {}", target.authority());
    }
    Ok(Declared {
        proto: kinference_policy_grpc::inference::to_proto(&state),
        target: target.authority(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
    }

    #[test]
    fn the_examples_policy_is_found_for_the_llm_service() {
        let d = from_manifests(&examples(), None).unwrap();
        assert_eq!(d.target, "llm.default.svc.cluster.local:8000");
        let models: Vec<&str> = d.proto.models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(models, vec!["glm-5.3", "qwen-3.6-27b"]);
        assert!(!d.proto.classifiers.is_empty());
        let e =
            from_manifests(&examples(), Some("other.default.svc.cluster.local:80")).unwrap_err();
        assert!(e.to_string().contains("no InferencePolicy applies"), "{e}");
    }
}
