//! What the injector adds, as the chart renders it: the `config.json` key of the
//! `kinference-proxy-config` ConfigMap, which `kinfctl install` writes field for field too.
//! One typed struct, strict about unknown keys, so that a chart, CLI and injector that
//! disagree fail loudly at start instead of injecting something half-configured.

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The proxy defaults (`proxy.*`, `proxyInit.*` and the controller address of the chart).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyConfig {
    /// The proxy image reference, `repository:tag`.
    pub image: String,
    pub image_pull_policy: String,
    /// Added to injected pods that lack them, so the proxy images can be pulled.
    #[serde(default)]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// The tracing filter of the proxy (`RUST_LOG` syntax).
    pub log_level: String,
    /// `json` or `plain`.
    pub log_format: String,
    pub ports: ProxyPorts,
    /// The proxy's user ID, which proxy-init exempts from redirection.
    pub uid: i64,
    pub resources: ResourceRequirements,
    /// The policy controller's gRPC address, e.g.
    /// `http://kinference-policy-controller.kinference.svc.cluster.local:8090`.
    pub controller_addr: String,
    /// The engine-signals service's address (`signals.enabled` in the chart), e.g.
    /// `http://kinference-policy-controller.kinference.svc.cluster.local:8092`; absent, each
    /// proxy scrapes the engines itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signals_addr: Option<String>,
    /// The proxy-init image reference.
    pub init_image: String,
    pub init_image_pull_policy: String,
    pub init_resources: ResourceRequirements,
    /// Destination ports redirected to the proxy unless a pod's
    /// `kinference.io/outbound-ports` says otherwise. The chart does not set it yet;
    /// absent, it is 80 (a Service's usual port) and 8000 (vLLM's).
    #[serde(default = "default_outbound_ports")]
    pub outbound_ports: Vec<u16>,
    /// How long the proxy keeps a redirected target's stack without a connection (`10m`); absent,
    /// the proxy's own default (10 minutes). A pod's `kinference.io/proxy-target-idle-timeout`
    /// overrides it.
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_idle_timeout: Option<std::time::Duration>,
}

/// `Option<Duration>` as the chart writes it: a string such as `10m` (see
/// [`super::annotations::parse_duration`]).
mod opt_duration {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&format!("{}ms", d.as_millis())),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| super::super::annotations::parse_duration(&t).map_err(D::Error::custom))
            .transpose()
    }
}

/// The proxy's listening ports.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyPorts {
    /// Where the redirected application traffic arrives (on 127.0.0.1).
    pub outbound: u16,
    /// The admin listener, on 127.0.0.1: `/metrics`, `/ready`, `/live` and the `/debug/*` views
    /// (decision records, endpoints, policy), which `kubectl port-forward` reaches and the pod
    /// network does not.
    pub admin: u16,
    /// The read-only listener on the pod's IP: `GET /metrics`, `/ready` and `/live` only, for
    /// Prometheus and the kubelet's probes.
    #[serde(default = "default_metrics_port")]
    pub metrics: u16,
}

fn default_metrics_port() -> u16 {
    4192
}

fn default_outbound_ports() -> Vec<u16> {
    vec![80, 8000]
}

/// Why the proxy configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading the proxy config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the proxy config {path} is invalid: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ProxyConfig {
    /// Reads the mounted `config.json`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })
    }

    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}
