//! Sidecar injection as a pure function: a pod as the API server sends it at CREATE, its
//! namespace's annotations and the proxy defaults in; a decision and a JSON patch out. No
//! sockets and no Kubernetes client, so every case is tested on real pod specs, and the
//! webhook ([`crate::Injector`]) only fetches the namespace and reports an event.

pub mod annotations;
mod config;
mod containers;
mod workload;

pub use self::{
    annotations::{AnnotationError, InjectMode},
    config::{ConfigError, ProxyConfig, ProxyPorts},
    containers::{Overrides, PROXY, PROXY_INIT},
    workload::{Workload, pod_name, workload},
};

use json_patch::{AddOperation, PatchOperation, jsonptr::PointerBuf};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use std::collections::BTreeMap;

/// Namespaces never injected, whatever their annotations say.
pub const SYSTEM_NAMESPACES: &[&str] = &["kube-system", "kube-public", "kube-node-lease"];

/// The value of `kinference.io/injected-by`.
pub const INJECTED_BY: &str = concat!("kinference-proxy-injector/", env!("CARGO_PKG_VERSION"));

/// What the injector needs besides the pod.
#[derive(Clone, Debug)]
pub struct Config {
    pub proxy: ProxyConfig,
    /// The control plane's namespace, never injected.
    pub control_plane_namespace: String,
}

/// Why a pod is left as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// kube-system, kube-public, kube-node-lease.
    SystemNamespace,
    ControlPlaneNamespace,
    /// A pod of the control plane itself (labelled `kinference.io/control-plane-component`).
    ControlPlanePod,
    /// `hostNetwork: true`: iptables rules would redirect the node's traffic.
    HostNetwork,
    /// The pod already has the proxy (or was injected before).
    AlreadyInjected,
    /// `kinference.io/inject: disabled` on the pod, or on the namespace with no pod value.
    Disabled,
    /// Neither the pod nor its namespace asks for injection.
    NotEnabled,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::SystemNamespace => "system namespace",
            Self::ControlPlaneNamespace => "the control plane's namespace",
            Self::ControlPlanePod => "a control-plane pod",
            Self::HostNetwork => "hostNetwork pod",
            Self::AlreadyInjected => "already injected",
            Self::Disabled => "injection disabled by annotation",
            Self::NotEnabled => "injection not enabled",
        })
    }
}

/// A pod to inject: the patch, and the workload it was computed for.
#[derive(Clone, Debug)]
pub struct Injection {
    pub patch: Vec<PatchOperation>,
    pub workload: Workload,
    pub overrides: Overrides,
}

#[derive(Clone, Debug)]
pub enum Decision {
    Inject(Box<Injection>),
    Skip(Skip),
}

impl Decision {
    /// The patch, if the pod is injected.
    pub fn patch(&self) -> Option<&[PatchOperation]> {
        match self {
            Self::Inject(i) => Some(&i.patch),
            Self::Skip(_) => None,
        }
    }
}

/// Why a pod asking for injection is refused: an annotation that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot inject the kinference proxy: {0}")]
pub struct InjectError(#[from] pub AnnotationError);

/// Decides whether `pod`, created in `namespace` whose annotations are `ns_annotations`,
/// gets the proxy, and returns the JSON patch that adds it.
pub fn inject(
    pod: &Pod,
    namespace: &str,
    ns_annotations: &BTreeMap<String, String>,
    config: &Config,
) -> Result<Decision, InjectError> {
    let empty = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let spec = pod.spec.clone().unwrap_or_default();

    if SYSTEM_NAMESPACES.contains(&namespace) {
        return Ok(Decision::Skip(Skip::SystemNamespace));
    }
    if namespace == config.control_plane_namespace {
        return Ok(Decision::Skip(Skip::ControlPlaneNamespace));
    }
    if labels.contains_key(annotations::CONTROL_PLANE_COMPONENT) {
        return Ok(Decision::Skip(Skip::ControlPlanePod));
    }
    if spec.host_network == Some(true) {
        return Ok(Decision::Skip(Skip::HostNetwork));
    }
    let has = |name: &str| {
        spec.containers.iter().any(|c| c.name == name)
            || spec
                .init_containers
                .iter()
                .flatten()
                .any(|c| c.name == name)
    };
    if annotations.contains_key(annotations::INJECTED_BY) || has(PROXY) || has(PROXY_INIT) {
        return Ok(Decision::Skip(Skip::AlreadyInjected));
    }
    // The pod's own value wins; a namespace value that cannot be read does not stop pods
    // that do not ask for injection themselves.
    let mode = match annotations::inject_mode(annotations)? {
        Some(mode) => Some(mode),
        None => annotations::inject_mode(ns_annotations).unwrap_or_default(),
    };
    match mode {
        Some(InjectMode::Enabled) => {}
        Some(InjectMode::Disabled) => return Ok(Decision::Skip(Skip::Disabled)),
        None => return Ok(Decision::Skip(Skip::NotEnabled)),
    }

    let overrides = overrides(annotations)?;
    let workload = workload::workload(pod, namespace);
    let init = containers::proxy_init(&config.proxy, &overrides);
    let proxy = containers::proxy(&config.proxy, &overrides, &workload, labels);

    let mut patch = Vec::new();
    // proxy-init first, then the proxy, then the pod's own init containers.
    match &spec.init_containers {
        None => patch.push(add(&["spec", "initContainers"], to_value(&[init, proxy]))),
        Some(_) => {
            patch.push(add(&["spec", "initContainers", "0"], to_value(&proxy)));
            patch.push(add(&["spec", "initContainers", "0"], to_value(&init)));
        }
    }
    let secrets: Vec<_> = config
        .proxy
        .image_pull_secrets
        .iter()
        .filter(|s| {
            !spec
                .image_pull_secrets
                .iter()
                .flatten()
                .any(|p| p.name == s.name)
        })
        .collect();
    if !secrets.is_empty() {
        match &spec.image_pull_secrets {
            None => patch.push(add(&["spec", "imagePullSecrets"], to_value(&secrets))),
            Some(_) => {
                for s in secrets {
                    patch.push(add(&["spec", "imagePullSecrets", "-"], to_value(s)));
                }
            }
        }
    }
    let ns = Value::String(config.control_plane_namespace.clone());
    match &pod.metadata.labels {
        None => patch.push(add(
            &["metadata", "labels"],
            serde_json::json!({ annotations::CONTROL_PLANE_NS: ns }),
        )),
        Some(_) => patch.push(add(
            &["metadata", "labels", annotations::CONTROL_PLANE_NS],
            ns,
        )),
    }
    match &pod.metadata.annotations {
        None => patch.push(add(
            &["metadata", "annotations"],
            serde_json::json!({ annotations::INJECTED_BY: INJECTED_BY }),
        )),
        Some(_) => patch.push(add(
            &["metadata", "annotations", annotations::INJECTED_BY],
            Value::String(INJECTED_BY.into()),
        )),
    }
    Ok(Decision::Inject(Box::new(Injection {
        patch,
        workload,
        overrides,
    })))
}

fn overrides(a: &BTreeMap<String, String>) -> Result<Overrides, AnnotationError> {
    use annotations as an;
    let get = |key: &str| a.get(key).map(String::as_str);
    let quantity = |key: &'static str| get(key).map(|v| an::quantity(key, v)).transpose();
    Ok(Overrides {
        log_level: get(an::PROXY_LOG_LEVEL).map(an::log_level).transpose()?,
        cpu_request: quantity(an::PROXY_CPU_REQUEST)?,
        memory_request: quantity(an::PROXY_MEMORY_REQUEST)?,
        cpu_limit: quantity(an::PROXY_CPU_LIMIT)?,
        memory_limit: quantity(an::PROXY_MEMORY_LIMIT)?,
        outbound_ports: get(an::OUTBOUND_PORTS)
            .map(|v| an::ports(an::OUTBOUND_PORTS, v))
            .transpose()?,
        skip_outbound_ports: get(an::SKIP_OUTBOUND_PORTS)
            .map(|v| an::ports(an::SKIP_OUTBOUND_PORTS, v))
            .transpose()?
            .unwrap_or_default(),
        skip_outbound_cidrs: get(an::SKIP_OUTBOUND_CIDRS)
            .map(|v| an::cidrs(an::SKIP_OUTBOUND_CIDRS, v))
            .transpose()?
            .unwrap_or_default(),
        target_idle_timeout: get(an::PROXY_TARGET_IDLE_TIMEOUT)
            .map(|v| an::duration(an::PROXY_TARGET_IDLE_TIMEOUT, v))
            .transpose()?,
        expose_admin: get(an::PROXY_EXPOSE_ADMIN)
            .map(|v| an::boolean(an::PROXY_EXPOSE_ADMIN, v))
            .transpose()?
            .unwrap_or(false),
    })
}

fn add(path: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(path.iter().copied()),
        value,
    })
}

/// Serializes Kubernetes types that always serialize.
fn to_value(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}
