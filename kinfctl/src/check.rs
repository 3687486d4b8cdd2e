//! `kinfctl check`: whether a cluster can take Kinference (`--pre`) and whether an
//! installation works, one pass/fail line per check, as `linkerd check` prints them. Every
//! fact comes from the Kubernetes API, so the same command runs on a laptop against any
//! cluster, and a failed check says what to run to fix it. Exits non-zero on any failure.
//!
//! With `--local` (or `--controller-addr` / `--proxy-admin`) it checks a running system reached
//! directly instead, a local one by default: through the controller's discovery API and the
//! proxies' admin listeners, without the Kubernetes API ([`direct`]).

mod direct;

use std::{collections::BTreeMap, fmt, path::PathBuf};

use anyhow::Context as _;
use k8s_openapi::api::{
    admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
    },
    apps::v1::Deployment,
    core::v1::{ConfigMap, Namespace, Pod},
    discovery::v1::EndpointSlice,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinference_api::{InferenceClassifier, InferencePolicy};
use kinference_policy_admission::{ProxyConfig, inject};
use kube::{Api, CustomResourceExt, api::ListParams};

/// The controller's Deployment, Service and the injector's ConfigMap, as the chart names them.
const CONTROLLER: &str = "kinference-policy-controller";
const PROXY_CONFIG: &str = "kinference-proxy-config";
/// Native sidecars (init containers with `restartPolicy: Always`) are on by default from 1.29;
/// 1.30 is the oldest release Kinference supports (docs/install.md).
const MIN_MINOR_VERSION: u32 = 30;
/// The CRD of the upstream InferencePool, which Kinference's pools are.
const INFERENCE_POOL_CRD: &str = "inferencepools.inference.networking.k8s.io";

/// Arguments of `kinfctl check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Check that the cluster can take Kinference, before installing it.
    #[arg(long)]
    pre: bool,

    /// The kubeconfig file to use (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, value_name = "FILE", conflicts_with = "api_server")]
    kubeconfig: Option<PathBuf>,

    /// Talk to this API server URL directly, without credentials (e.g. `kubectl proxy`'s).
    #[arg(long, value_name = "URL")]
    api_server: Option<String>,

    /// The control plane's namespace.
    #[arg(long, short = 'n', default_value = "kinference")]
    namespace: String,

    /// Check a local system (controller and proxy on loopback) instead of a cluster: the
    /// controller at --controller-addr and each --proxy-admin (defaults: the binaries' defaults).
    #[arg(long, conflicts_with_all = ["pre", "kubeconfig", "api_server"])]
    local: bool,

    /// The policy controller's gRPC URL (a local check).
    #[arg(long, value_name = "URL", conflicts_with_all = ["pre", "kubeconfig", "api_server"])]
    controller_addr: Option<String>,

    /// A proxy's admin URL; repeat for several proxies (a local check).
    #[arg(long = "proxy-admin", value_name = "URL", conflicts_with_all = ["pre", "kubeconfig", "api_server"])]
    proxy_admin: Vec<String>,

    /// The authority the proxies serve, whose policy the controller must serve (a local check).
    #[arg(long, default_value = "llm.default.svc.cluster.local:8000")]
    target: String,
}

impl Args {
    /// The controller and proxies to check directly, when they were asked for.
    fn direct(&self) -> Option<direct::Targets> {
        if !self.local && self.controller_addr.is_none() && self.proxy_admin.is_empty() {
            return None;
        }
        let proxies = if self.proxy_admin.is_empty() {
            vec!["http://127.0.0.1:4191".to_string()]
        } else {
            self.proxy_admin.clone()
        };
        Some(direct::Targets {
            controller: self
                .controller_addr
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:8090".into()),
            proxies,
            target: self.target.clone(),
        })
    }
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub ok: bool,
    pub line: String,
}

impl Outcome {
    fn pass(line: impl Into<String>) -> Self {
        Self {
            ok: true,
            line: line.into(),
        }
    }

    fn fail(line: impl Into<String>) -> Self {
        Self {
            ok: false,
            line: line.into(),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = if self.ok { '√' } else { '×' };
        write!(f, "{mark} {}", self.line)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let print = |o: &Outcome| println!("{o}");
        let outcomes = match args.direct() {
            Some(t) => direct::checks(&t, print).await,
            None => {
                let client = client(&args).await?;
                checks(&client, &args.namespace, args.pre, print).await
            }
        };
        let failed = outcomes.iter().filter(|o| !o.ok).count();
        println!();
        if failed == 0 {
            println!("Status check results are √");
            Ok(())
        } else {
            println!("Status check results are ×");
            anyhow::bail!("{failed} check(s) failed")
        }
    })
}

async fn client(args: &Args) -> anyhow::Result<kube::Client> {
    crate::explain::source::cluster_client(args.kubeconfig.as_ref(), args.api_server.as_deref())
        .await
}

/// Runs the checks in order, calling `report` on each result as it is known. A cluster
/// that cannot be reached ends the run there.
pub async fn checks(
    client: &kube::Client,
    ns: &str,
    pre: bool,
    mut report: impl FnMut(&Outcome),
) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut push = |o: Outcome, out: &mut Vec<Outcome>| {
        report(&o);
        out.push(o);
    };
    let version = match client.apiserver_version().await {
        Ok(v) => {
            push(Outcome::pass("can reach the Kubernetes API"), &mut out);
            v
        }
        Err(e) => {
            push(
                Outcome::fail(format!("cannot reach the Kubernetes API: {e}")),
                &mut out,
            );
            return out;
        }
    };
    push(check_version(&version.major, &version.minor), &mut out);
    if pre {
        push(check_namespace(client, ns).await, &mut out);
        return out;
    }
    for crd in [InferencePolicy::crd(), InferenceClassifier::crd()] {
        push(check_crd(client, &crd).await, &mut out);
    }
    push(check_pool_crd(client).await, &mut out);
    push(check_controller(client, ns).await, &mut out);
    push(check_validating_webhook(client, ns).await, &mut out);
    push(check_mutating_webhook(client, ns).await, &mut out);
    push(check_endpoints(client, ns).await, &mut out);
    push(check_proxy_config(client, ns).await, &mut out);
    push(check_proxies(client).await, &mut out);
    out
}

fn leading_number(s: &str) -> Option<u32> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn check_version(major: &str, minor: &str) -> Outcome {
    match (leading_number(major), leading_number(minor)) {
        (Some(1), Some(m)) if m >= MIN_MINOR_VERSION => Outcome::pass(format!(
            "Kubernetes 1.{m} runs native sidecars (1.{MIN_MINOR_VERSION} or later)"
        )),
        _ => Outcome::fail(format!(
            "Kubernetes {major}.{minor} is too old: the proxy is a native sidecar, which needs 1.{MIN_MINOR_VERSION} or later"
        )),
    }
}

async fn check_namespace(client: &kube::Client, ns: &str) -> Outcome {
    match Api::<Namespace>::all(client.clone()).get_opt(ns).await {
        Ok(Some(_)) => Outcome::pass(format!("namespace {ns} exists")),
        Ok(None) => Outcome::fail(format!(
            "namespace {ns} does not exist (run kubectl create namespace {ns})"
        )),
        Err(e) => Outcome::fail(format!("cannot read namespace {ns}: {e}")),
    }
}

const CRD_FIX: &str = "run kinfctl install --crds | kubectl apply -f -";

/// Present, and serving every version `kinference_api` generates with the same schema.
async fn check_crd(client: &kube::Client, want: &CustomResourceDefinition) -> Outcome {
    let name = want.metadata.name.clone().unwrap_or_default();
    let have = match Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(&name)
        .await
    {
        Ok(Some(have)) => have,
        Ok(None) => return Outcome::fail(format!("CRD {name} is missing ({CRD_FIX})")),
        Err(e) => return Outcome::fail(format!("cannot read CRD {name}: {e}")),
    };
    let schemas = |crd: &CustomResourceDefinition| -> BTreeMap<String, serde_json::Value> {
        crd.spec
            .versions
            .iter()
            .map(|v| {
                let schema = serde_json::to_value(&v.schema).unwrap_or_default();
                (
                    v.name.clone(),
                    serde_json::json!([v.served, v.storage, schema]),
                )
            })
            .collect()
    };
    if schemas(&have) == schemas(want) {
        Outcome::pass(format!("CRD {name} is installed and current"))
    } else {
        Outcome::fail(format!("CRD {name} is out of date ({CRD_FIX})"))
    }
}

async fn check_pool_crd(client: &kube::Client) -> Outcome {
    let fix = "run kinfctl install --crds --set upstream.inferencePool=true | kubectl apply -f -, or install the Gateway API Inference Extension";
    match Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(INFERENCE_POOL_CRD)
        .await
    {
        Ok(Some(crd)) if crd.spec.versions.iter().any(|v| v.name == "v1" && v.served) => {
            Outcome::pass(format!("CRD {INFERENCE_POOL_CRD} serves v1"))
        }
        Ok(Some(_)) => Outcome::fail(format!(
            "CRD {INFERENCE_POOL_CRD} does not serve v1 ({fix})"
        )),
        Ok(None) => Outcome::fail(format!("CRD {INFERENCE_POOL_CRD} is missing ({fix})")),
        Err(e) => Outcome::fail(format!("cannot read CRD {INFERENCE_POOL_CRD}: {e}")),
    }
}

async fn check_controller(client: &kube::Client, ns: &str) -> Outcome {
    match Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt(CONTROLLER)
        .await
    {
        Ok(Some(d)) => {
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let ready = d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0);
            if ready >= 1 {
                Outcome::pass(format!(
                    "the policy controller is ready ({ready}/{want} replicas)"
                ))
            } else {
                Outcome::fail(format!(
                    "the policy controller has no ready replica (0/{want}; see kubectl -n {ns} describe deployment {CONTROLLER})"
                ))
            }
        }
        Ok(None) => Outcome::fail(format!(
            "the policy controller Deployment {ns}/{CONTROLLER} is missing (run kinfctl install | kubectl apply -f -)"
        )),
        Err(e) => Outcome::fail(format!("cannot read Deployment {ns}/{CONTROLLER}: {e}")),
    }
}

/// What a webhook configuration must hold: a CA bundle, and the controller's Service.
fn webhook_problem(
    ns: &str,
    name: &str,
    ca_bundle: Option<&[u8]>,
    service: Option<(&str, &str)>,
) -> Option<String> {
    if ca_bundle.is_none_or(<[u8]>::is_empty) {
        return Some(format!("webhook {name} has no caBundle"));
    }
    if service != Some((ns, CONTROLLER)) {
        return Some(format!(
            "webhook {name} does not call Service {ns}/{CONTROLLER}"
        ));
    }
    None
}

async fn check_validating_webhook(client: &kube::Client, ns: &str) -> Outcome {
    let name = format!("kinference-{ns}-policy-validator");
    let found = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get_opt(&name)
        .await
        .map(|c| {
            c.map(|c| {
                let webhooks = c.webhooks.unwrap_or_default().into_iter();
                webhooks.map(|w| (w.name, w.client_config)).collect()
            })
        });
    webhook_outcome(
        "ValidatingWebhookConfiguration",
        &name,
        "the validating webhook",
        ns,
        found,
    )
}

async fn check_mutating_webhook(client: &kube::Client, ns: &str) -> Outcome {
    let name = format!("kinference-{ns}-proxy-injector");
    let found = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get_opt(&name)
        .await
        .map(|c| {
            c.map(|c| {
                let webhooks = c.webhooks.unwrap_or_default().into_iter();
                webhooks.map(|w| (w.name, w.client_config)).collect()
            })
        });
    webhook_outcome(
        "MutatingWebhookConfiguration",
        &name,
        "the proxy injector webhook",
        ns,
        found,
    )
}

/// The outcome for the webhook configuration `kind`/`name` as read (`found`: its webhooks' names
/// and client configurations): present, with every webhook passing [`webhook_problem`].
fn webhook_outcome(
    kind: &str,
    name: &str,
    what: &str,
    ns: &str,
    found: Result<Option<Vec<(String, WebhookClientConfig)>>, kube::Error>,
) -> Outcome {
    const FIX: &str = "run kinfctl install | kubectl apply -f -";
    match found {
        Ok(Some(webhooks)) => {
            let problem = if webhooks.is_empty() {
                Some(format!("{kind} {name} has no webhook"))
            } else {
                webhooks.iter().find_map(|(webhook, cc)| {
                    let svc = cc
                        .service
                        .as_ref()
                        .map(|s| (s.namespace.as_str(), s.name.as_str()));
                    webhook_problem(
                        ns,
                        webhook,
                        cc.ca_bundle.as_ref().map(|b| b.0.as_slice()),
                        svc,
                    )
                })
            };
            match problem {
                None => Outcome::pass(format!("{what} {name} is configured")),
                Some(p) => Outcome::fail(format!("{p} ({FIX})")),
            }
        }
        Ok(None) => Outcome::fail(format!("{kind} {name} is missing ({FIX})")),
        Err(e) => Outcome::fail(format!("cannot read {kind} {name}: {e}")),
    }
}

/// The webhooks' Service must have a ready endpoint with the `webhook` port, or the API
/// server has nowhere to send reviews.
async fn check_endpoints(client: &kube::Client, ns: &str) -> Outcome {
    let selector = format!("kubernetes.io/service-name={CONTROLLER}");
    let slices = match Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
    {
        Ok(list) => list.items,
        Err(e) => return Outcome::fail(format!("cannot list EndpointSlices in {ns}: {e}")),
    };
    let ready: usize = slices
        .iter()
        .filter(|s| {
            let labels = s.metadata.labels.as_ref();
            labels
                .and_then(|l| l.get("kubernetes.io/service-name"))
                .map(String::as_str)
                == Some(CONTROLLER)
                && s.ports
                    .iter()
                    .flatten()
                    .any(|p| p.name.as_deref() == Some("webhook"))
        })
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .map(|e| e.addresses.len())
        .sum();
    if ready > 0 {
        Outcome::pass(format!(
            "the webhooks' Service {ns}/{CONTROLLER} has {ready} ready endpoint(s)"
        ))
    } else {
        Outcome::fail(format!(
            "the webhooks' Service {ns}/{CONTROLLER} has no ready endpoints: the API server cannot reach the webhooks"
        ))
    }
}

async fn check_proxy_config(client: &kube::Client, ns: &str) -> Outcome {
    let cm = match Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(PROXY_CONFIG)
        .await
    {
        Ok(Some(cm)) => cm,
        Ok(None) => {
            return Outcome::fail(format!(
                "ConfigMap {ns}/{PROXY_CONFIG} is missing (run kinfctl install | kubectl apply -f -)"
            ));
        }
        Err(e) => return Outcome::fail(format!("cannot read ConfigMap {ns}/{PROXY_CONFIG}: {e}")),
    };
    let text = cm.data.as_ref().and_then(|d| d.get("config.json"));
    match text.map(|t| ProxyConfig::from_json(t)) {
        Some(Ok(config)) => Outcome::pass(format!(
            "the injector's proxy configuration is valid (proxy {})",
            config.image
        )),
        Some(Err(e)) => Outcome::fail(format!(
            "ConfigMap {ns}/{PROXY_CONFIG} has an invalid config.json: {e}"
        )),
        None => Outcome::fail(format!("ConfigMap {ns}/{PROXY_CONFIG} has no config.json")),
    }
}

/// Injected pods whose proxy is ready: the proxy is ready once it holds policy from the
/// controller, so a ready proxy is a connected one.
async fn check_proxies(client: &kube::Client) -> Outcome {
    let pods = match Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => return Outcome::fail(format!("cannot list pods: {e}")),
    };
    let injected: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(inject::annotations::INJECTED_BY))
        })
        .collect();
    let not_ready: Vec<String> = injected
        .iter()
        .filter(|p| {
            let status = p.status.as_ref();
            let statuses = status
                .and_then(|s| s.init_container_statuses.as_ref())
                .into_iter()
                .flatten()
                .chain(
                    status
                        .and_then(|s| s.container_statuses.as_ref())
                        .into_iter()
                        .flatten(),
                );
            !statuses
                .filter(|c| c.name == inject::PROXY)
                .any(|c| c.ready)
        })
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    let total = injected.len();
    if not_ready.is_empty() {
        Outcome::pass(format!("{total} of {total} injected proxies are connected"))
    } else {
        let shown: Vec<&str> = not_ready.iter().take(5).map(String::as_str).collect();
        let more = not_ready.len().saturating_sub(shown.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        Outcome::fail(format!(
            "{} of {total} injected proxies are not connected: {}{more}",
            not_ready.len(),
            shown.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn local(argv: &[&str]) -> Option<direct::Targets> {
        let mut all = vec!["check"];
        all.extend_from_slice(argv);
        Cli::try_parse_from(all).unwrap().args.direct()
    }

    #[test]
    fn local_checks_are_asked_for_by_flag_and_default_to_the_binaries_addresses() {
        assert!(local(&[]).is_none(), "a cluster check by default");
        let l = local(&["--local"]).unwrap();
        assert_eq!(l.controller, "http://127.0.0.1:8090");
        assert_eq!(l.proxies, vec!["http://127.0.0.1:4191"]);
        assert_eq!(l.target, "llm.default.svc.cluster.local:8000");
        let l = local(&["--proxy-admin", "http://a:1", "--proxy-admin", "http://b:2"]).unwrap();
        assert_eq!(l.proxies, vec!["http://a:1", "http://b:2"]);
        assert!(Cli::try_parse_from(["check", "--local", "--pre"]).is_err());
    }

    #[test]
    fn versions_from_1_30_run_native_sidecars() {
        assert!(check_version("1", "30").ok);
        assert!(!check_version("1", "29").ok);
        assert!(check_version("1", "31+").ok);
        let old = check_version("1", "28");
        assert!(!old.ok);
        assert_eq!(
            old.to_string(),
            "× Kubernetes 1.28 is too old: the proxy is a native sidecar, which needs 1.30 or later"
        );
        assert!(!check_version("x", "y").ok);
    }
}
