//! The charts' values, typed: the defaults are the charts' own `values.yaml` files, embedded at
//! build time so that `kinfctl install` and `helm install` cannot drift apart, and `--set`
//! overrides them with Helm's rules before the result is checked against the typed structure
//! (unknown keys are errors, as the charts' strict `values.schema.json` makes them for Helm).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements, Toleration};
use serde::{Deserialize, Serialize};
use serde_json::Value;

const CONTROL_PLANE_VALUES: &str = include_str!("../../../charts/kinference/values.yaml");
const CONTROL_PLANE_CHART: &str = include_str!("../../../charts/kinference/Chart.yaml");
const CRDS_VALUES: &str = include_str!("../../../charts/kinference-crds/values.yaml");

/// Errors reading values.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the embedded chart file {file} is not valid YAML: {source}")]
    Embedded {
        file: &'static str,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("invalid --set {arg:?}: {reason}")]
    Set { arg: String, reason: &'static str },
    #[error("invalid values after --set: {0}")]
    Invalid(#[source] serde_json::Error),
    #[error(
        "invalid signals.shards[{index}].name {name:?}: it must be 1 to 32 lower-case letters, \
         digits and '-', starting and ending with a letter or digit"
    )]
    ShardName { index: usize, name: String },
    #[error("invalid signals.shards[{index}].replicas {replicas}: it must be at least 1")]
    ShardReplicas { index: usize, replicas: i32 },
}

/// The `kinference-crds` chart's values.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Crds {
    pub upstream: Upstream,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Upstream {
    pub inference_pool: bool,
}

/// The `kinference` chart's values, and the chart's appVersion (the default image tag).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControlPlane {
    pub cluster_domain: String,
    pub image_pull_secrets: Vec<LocalObjectReference>,
    pub controller: Controller,
    pub webhook: Webhook,
    pub injector: Injector,
    pub proxy: Proxy,
    pub proxy_init: ProxyInit,
    pub network_policy: NetworkPolicy,
    pub signals: Signals,
    #[serde(skip)]
    pub app_version: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Image {
    pub repository: String,
    pub tag: String,
    pub pull_policy: PullPolicy,
}

impl Image {
    /// `repository:tag`; an empty tag is the chart's appVersion, as in the chart's helper.
    pub fn reference(&self, app_version: &str) -> String {
        let tag = if self.tag.is_empty() {
            app_version
        } else {
            &self.tag
        };
        format!("{}:{tag}", self.repository)
    }
}

#[derive(Copy, Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

#[derive(Copy, Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Plain,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Plain => "plain",
        }
    }
}

#[derive(Copy, Clone, Debug, Deserialize, PartialEq, Eq)]
pub enum FailurePolicy {
    Fail,
    Ignore,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "Fail",
            Self::Ignore => "Ignore",
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Controller {
    pub replicas: i32,
    pub image: Image,
    pub log_level: String,
    pub log_format: LogFormat,
    pub leader_election: LeaderElection,
    pub resources: ResourceRequirements,
    pub pod_disruption_budget: PodDisruptionBudget,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
}

/// The engine-signals service (`docs/signals.md`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Signals {
    pub enabled: bool,
    pub port: i32,
    pub interval_ms: u64,
    pub load_interval_ms: u64,
    /// Sharding by pool (docs/signals.md, "Sharding"); values.yaml leaves it unset: no shards.
    #[serde(default)]
    pub shards: Vec<SignalShard>,
}

/// One signal shard: a Deployment and Service `kinference-signals-<name>` serving the
/// InferencePools annotated `kinference.io/signals-shard: <name>`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignalShard {
    pub name: String,
    /// Unset: 1.
    pub replicas: Option<i32>,
    /// Unset (or empty): the controller's.
    pub resources: Option<ResourceRequirements>,
}

impl Signals {
    /// What the schema requires of each shard: its name (pattern
    /// `^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$`, so that `kinference-signals-<name>` stays a DNS
    /// label) and at least one replica.
    fn validate(&self) -> Result<(), Error> {
        for (index, shard) in self.shards.iter().enumerate() {
            if shard.name.len() > 32 || !super::is_dns_label(&shard.name) {
                return Err(Error::ShardName {
                    index,
                    name: shard.name.clone(),
                });
            }
            if let Some(replicas) = shard.replicas.filter(|r| *r < 1) {
                return Err(Error::ShardReplicas { index, replicas });
            }
        }
        Ok(())
    }
}

/// The controller's NetworkPolicy.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicy {
    pub enabled: bool,
    /// Where the API server calls the webhooks from; empty: anywhere.
    #[serde(rename = "apiServerCIDRs")]
    pub api_server_cidrs: Vec<String>,
    /// Who may reach the admin port (/metrics).
    pub metrics_from: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaderElection {
    pub lease_name: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodDisruptionBudget {
    pub min_available: i32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Webhook {
    pub failure_policy: FailurePolicy,
    pub timeout_seconds: i32,
    pub tls: Tls,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tls {
    pub auto: bool,
    pub validity_days: u32,
    pub certificate: String,
    pub key: String,
    pub ca_bundle: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Injector {
    pub failure_policy: FailurePolicy,
    pub timeout_seconds: i32,
    pub exclude_namespaces: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Proxy {
    pub image: Image,
    pub log_level: String,
    pub log_format: LogFormat,
    pub ports: ProxyPorts,
    pub uid: i64,
    pub resources: ResourceRequirements,
    /// `10m`: an integer and `ms`, `s`, `m` or `h`, as the schema's pattern says.
    pub target_idle_timeout: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyPorts {
    pub outbound: u16,
    /// On the pod's loopback: every admin path, `/debug/*` included.
    pub admin: u16,
    /// On the pod's IP, read-only: `GET /metrics`, `/ready`, `/live`.
    pub metrics: u16,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxyInit {
    pub image: Image,
    pub resources: ResourceRequirements,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChartMeta {
    app_version: String,
}

/// The control-plane chart's defaults with `sets` applied.
pub fn control_plane(sets: &[String]) -> Result<ControlPlane, Error> {
    let tree = with_sets(CONTROL_PLANE_VALUES, "charts/kinference/values.yaml", sets)?;
    let mut values: ControlPlane = serde_json::from_value(tree).map_err(Error::Invalid)?;
    values.signals.validate()?;
    let chart: ChartMeta =
        serde_yaml::from_str(CONTROL_PLANE_CHART).map_err(|source| Error::Embedded {
            file: "charts/kinference/Chart.yaml",
            source,
        })?;
    values.app_version = chart.app_version;
    Ok(values)
}

/// The CRD chart's defaults with `sets` applied.
pub fn crds(sets: &[String]) -> Result<Crds, Error> {
    let tree = with_sets(CRDS_VALUES, "charts/kinference-crds/values.yaml", sets)?;
    serde_json::from_value(tree).map_err(Error::Invalid)
}

fn with_sets(defaults: &str, file: &'static str, sets: &[String]) -> Result<Value, Error> {
    let mut tree: Value =
        serde_yaml::from_str(defaults).map_err(|source| Error::Embedded { file, source })?;
    if tree.is_null() {
        tree = Value::Object(Default::default());
    }
    for arg in sets {
        for (path, value) in parse_set(arg)? {
            assign(&mut tree, &path, value);
        }
    }
    Ok(tree)
}

/// One step of a `--set` key: a map key or a list index.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// Parses one `--set` argument, Helm's way: comma-separated `key.path=value` pairs, `\.` for a
/// dot inside a key, `name[0]` for a list element, `{a,b}` for a list, and
/// `true`/`false`/`null`/integers typed.
fn parse_set(arg: &str) -> Result<Vec<(Vec<Segment>, Value)>, Error> {
    let err = |reason| Error::Set {
        arg: arg.to_string(),
        reason,
    };
    let mut out = Vec::new();
    for pair in split_top_level(arg) {
        let (key, raw) = pair
            .split_once('=')
            .ok_or_else(|| err("expected key=value"))?;
        let path = parse_key(key).ok_or_else(|| err("malformed key"))?;
        let value = match raw.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            Some("") => Value::Array(Vec::new()),
            Some(items) => Value::Array(items.split(',').map(typed).collect()),
            None => typed(raw),
        };
        out.push((path, value));
    }
    Ok(out)
}

/// `a.b\.c[1].d` into its segments; `None` when malformed (empty segments, bad indexes).
fn parse_key(key: &str) -> Option<Vec<Segment>> {
    let mut path = Vec::new();
    let mut current = String::new();
    // Whether the segment just closed was an index (so `.` or `[` may follow with no key).
    let mut after_index = false;
    let mut chars = key.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => current.push(chars.next()?),
            '.' => {
                if !current.is_empty() {
                    path.push(Segment::Key(std::mem::take(&mut current)));
                } else if !after_index {
                    return None;
                }
                after_index = false;
            }
            '[' => {
                if !current.is_empty() {
                    path.push(Segment::Key(std::mem::take(&mut current)));
                } else if !after_index {
                    return None;
                }
                let digits: String = chars.by_ref().take_while(|c| *c != ']').collect();
                // A bound keeps a hostile index from allocating a huge list.
                let index = digits.parse::<usize>().ok().filter(|i| *i < 65_536)?;
                path.push(Segment::Index(index));
                after_index = true;
            }
            c => {
                if after_index {
                    return None;
                }
                current.push(c);
            }
        }
    }
    if !current.is_empty() {
        path.push(Segment::Key(current));
    } else if !after_index {
        return None;
    }
    Some(path)
}

/// Splits on commas outside `{...}`.
fn split_top_level(arg: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in arg.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&arg[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&arg[start..]);
    parts
}

/// Helm's typing of `--set` values.
fn typed(raw: &str) -> Value {
    match raw {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        "null" => Value::Null,
        _ => {
            let leading_zero = raw.len() > 1 && (raw.starts_with('0') || raw.starts_with("-0"));
            match raw.parse::<i64>() {
                Ok(n) if !leading_zero => Value::from(n),
                _ => Value::String(raw.to_string()),
            }
        }
    }
}

/// Sets `path` in `tree`, creating maps and lists on the way; `null` removes a map key, as in Helm.
fn assign(tree: &mut Value, path: &[Segment], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        *tree = value;
        return;
    };
    match first {
        Segment::Key(key) => {
            if !tree.is_object() {
                *tree = Value::Object(Default::default());
            }
            let Value::Object(map) = tree else { return };
            if rest.is_empty() && value.is_null() {
                map.remove(key);
                return;
            }
            assign(map.entry(key.clone()).or_insert(Value::Null), rest, value);
        }
        Segment::Index(index) => {
            if !tree.is_array() {
                *tree = Value::Array(Vec::new());
            }
            let Value::Array(items) = tree else { return };
            if items.len() <= *index {
                items.resize(index + 1, Value::Null);
            }
            assign(&mut items[*index], rest, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_charts() {
        let v = control_plane(&[]).unwrap();
        assert_eq!(v.controller.replicas, 2);
        assert_eq!(v.controller.pod_disruption_budget.min_available, 1);
        assert_eq!(v.app_version, "0.1.0");
        assert_eq!(
            v.proxy.image.reference(&v.app_version),
            "ghcr.io/kinference/proxy:0.1.0"
        );
        assert!(v.webhook.tls.auto);
        assert!(!crds(&[]).unwrap().upstream.inference_pool);
    }

    #[test]
    fn set_overrides_with_helm_typing() {
        let v = control_plane(&[
            "controller.replicas=3,proxy.logLevel=debug".to_string(),
            "proxy.image.tag=v2".to_string(),
            "injector.excludeNamespaces={a,b}".to_string(),
            r"controller.nodeSelector.kubernetes\.io/arch=arm64".to_string(),
            "imagePullSecrets[1].name=second,imagePullSecrets[0].name=first".to_string(),
        ])
        .unwrap();
        assert_eq!(v.controller.replicas, 3);
        assert_eq!(v.proxy.log_level, "debug");
        assert_eq!(
            v.proxy.image.reference("0.1.0"),
            "ghcr.io/kinference/proxy:v2"
        );
        assert_eq!(v.injector.exclude_namespaces, ["a", "b"]);
        assert_eq!(
            v.controller
                .node_selector
                .get("kubernetes.io/arch")
                .map(String::as_str),
            Some("arm64")
        );
        assert!(
            crds(&["upstream.inferencePool=true".into()])
                .unwrap()
                .upstream
                .inference_pool
        );
    }

    #[test]
    fn shards_are_unset_by_default_and_checked_as_the_schema_checks_them() {
        assert!(control_plane(&[]).unwrap().signals.shards.is_empty());
        let v = control_plane(&[
            "signals.shards[0].name=a,signals.shards[0].replicas=2,signals.shards[1].name=b-2"
                .to_string(),
        ])
        .unwrap();
        let shards = &v.signals.shards;
        assert_eq!(
            (shards[0].name.as_str(), shards[0].replicas),
            ("a", Some(2))
        );
        assert_eq!((shards[1].name.as_str(), shards[1].replicas), ("b-2", None));
        assert!(control_plane(&[format!("signals.shards[0].name={}", "a".repeat(32))]).is_ok());
        for bad in [
            "Bad_Name".to_string(),
            "-a".to_string(),
            "a-".to_string(),
            "a.b".to_string(),
            "a".repeat(33),
        ] {
            let set = format!("signals.shards[0].name={bad}");
            assert!(
                matches!(
                    control_plane(&[set]),
                    Err(Error::ShardName { index: 0, .. })
                ),
                "{bad} accepted"
            );
        }
        assert!(matches!(
            control_plane(&["signals.shards[0].name=a,signals.shards[1].name=b,\
                             signals.shards[1].replicas=0"
                .to_string()]),
            Err(Error::ShardReplicas {
                index: 1,
                replicas: 0
            })
        ));
        // A shard needs its name, and takes no other key.
        for bad in [
            "signals.shards[0].replicas=2",
            "signals.shards[0].name=a,signals.shards[0].zone=z",
        ] {
            assert!(
                matches!(control_plane(&[bad.to_string()]), Err(Error::Invalid(_))),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn keys_parse_like_helms() {
        use Segment::{Index, Key};
        assert_eq!(
            parse_key(r"a.b\.c[1].d").unwrap(),
            [
                Key("a".into()),
                Key("b.c".into()),
                Index(1),
                Key("d".into())
            ]
        );
        assert_eq!(
            parse_key("a[0][2]").unwrap(),
            [Key("a".into()), Index(0), Index(2)]
        );
        assert_eq!(parse_key(".a"), None);
        assert_eq!(parse_key("a."), None);
    }

    #[test]
    fn typing_follows_helm() {
        assert_eq!(typed("42"), Value::from(42));
        assert_eq!(typed("007"), Value::String("007".into()));
        assert_eq!(typed("true"), Value::Bool(true));
        assert_eq!(typed("v1.2"), Value::String("v1.2".into()));
    }

    #[test]
    fn bad_sets_are_errors() {
        for bad in [
            "controller.replicas",
            "controller..replicas=1",
            "a[x]=1",
            "a[0]b=1",
            "a[99999999]=1",
        ] {
            assert!(
                matches!(control_plane(&[bad.to_string()]), Err(Error::Set { .. })),
                "{bad} accepted"
            );
        }
        // Unknown keys and wrong types are rejected, as the strict schema rejects them in Helm.
        for bad in [
            "controller.replicaz=3",
            "controller.replicas=three",
            "webhook.failurePolicy=Maybe",
        ] {
            assert!(
                matches!(control_plane(&[bad.to_string()]), Err(Error::Invalid(_))),
                "{bad} accepted"
            );
        }
        // null removes a key, and a required key removed is an error.
        assert!(matches!(
            control_plane(&["controller.replicas=null".to_string()]),
            Err(Error::Invalid(_))
        ));
    }
}
