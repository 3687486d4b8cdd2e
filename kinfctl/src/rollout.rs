//! `kinfctl rollout status|promote|abort`: where each rollout stands, and the explicit steps that
//! end one.
//!
//! `status` prints each rollout's phase, the last verdict, both arms' counts and every threshold
//! with how close the cohort is to it, from the resource's `status.rollout` in a cluster (what the
//! leading controller wrote), or from a controller's admin API (`--admin`, `GET /rollouts`) in
//! local mode, where there is no status. `promote` and `abort` set `spec.rollout.state`, the only
//! thing the user changes: a merge patch in a cluster, or in local mode an edit of the manifest
//! file that declares the policy (`--manifests`), touching that one line so comments and layout
//! stay; the controller watching the directory serves the change. Promotion never happens by
//! itself: a threshold only ever rolls a cohort back.

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use kinference_api::{
    InferencePolicy,
    policy::{RolloutState, RolloutStatus},
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde::Deserialize as _;

/// Arguments of `kinfctl rollout`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Each rollout's phase, arms and thresholds, with how close the cohort is to each.
    Status(StatusArgs),
    /// Give every request the candidate (spec.rollout.state: Promoted).
    Promote(StepArgs),
    /// Give every request the current policy (spec.rollout.state: Aborted).
    Abort(StepArgs),
}

/// Where the rollouts are: a cluster (the default) or a local controller.
#[derive(Debug, clap::Args)]
struct Cluster {
    /// The kubeconfig file (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "FILE", conflicts_with = "api_server")]
    kubeconfig: Option<PathBuf>,

    /// Talk to this API server URL directly, without credentials (e.g. `kubectl proxy`'s).
    #[arg(long, value_name = "URL")]
    api_server: Option<String>,

    /// The policy's namespace.
    #[arg(long, short = 'n', default_value = "default")]
    namespace: String,
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    /// Only this InferencePolicy's rollout.
    policy: Option<String>,

    /// Read a local controller's admin API (e.g. http://127.0.0.1:9990, kinference-local's
    /// controller) instead of the cluster.
    #[arg(long, value_name = "URL", conflicts_with_all = ["kubeconfig", "api_server"])]
    admin: Option<String>,

    /// In a cluster: every namespace.
    #[arg(long, short = 'A')]
    all_namespaces: bool,

    #[command(flatten)]
    cluster: Cluster,
}

#[derive(Debug, clap::Args)]
struct StepArgs {
    /// The InferencePolicy whose rollout it is.
    policy: String,

    /// Local mode: rewrite `spec.rollout.state` in the manifest under this directory that
    /// declares the policy (the controller's `--manifests` directory) instead of patching the
    /// cluster.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["kubeconfig", "api_server"])]
    manifests: Option<PathBuf>,

    #[command(flatten)]
    cluster: Cluster,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        match args.command {
            Command::Status(a) => status(a).await,
            Command::Promote(a) => step(a, RolloutState::Promoted).await,
            Command::Abort(a) => step(a, RolloutState::Aborted).await,
        }
    })
}

/// A client for the current kubeconfig context, another kubeconfig, or a bare API URL.
async fn client(c: &Cluster) -> anyhow::Result<kube::Client> {
    crate::explain::source::cluster_client(c.kubeconfig.as_ref(), c.api_server.as_deref()).await
}

/// One policy's rollout as `status` prints it.
#[derive(Debug)]
struct Row {
    namespace: String,
    policy: String,
    declared: Option<RolloutState>,
    /// `None`: declared, but no status yet.
    status: Option<RolloutStatus>,
    name: String,
}

async fn status(a: StatusArgs) -> anyhow::Result<()> {
    let rows = match &a.admin {
        Some(url) => from_admin(url).await?,
        None => {
            let client = client(&a.cluster).await?;
            let api: Api<InferencePolicy> = if a.all_namespaces {
                Api::all(client)
            } else {
                Api::namespaced(client, &a.cluster.namespace)
            };
            let policies = api
                .list(&ListParams::default())
                .await
                .context("listing InferencePolicies")?
                .items;
            from_policies(&policies)
        }
    };
    let rows: Vec<Row> = rows
        .into_iter()
        .filter(|r| a.policy.as_ref().is_none_or(|p| *p == r.policy))
        .collect();
    if rows.is_empty() {
        match &a.policy {
            Some(p) => bail!("no rollout found for InferencePolicy {p}"),
            None => println!("no rollouts"),
        }
    }
    for r in &rows {
        print!("{}", render(r));
    }
    Ok(())
}

/// The rollouts a local controller's `GET /rollouts` lists.
async fn from_admin(url: &str) -> anyhow::Result<Vec<Row>> {
    #[derive(serde::Deserialize)]
    struct View {
        policies: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        namespace: String,
        name: String,
        rollout: RolloutStatus,
    }
    let url = format!("{}/rollouts", url.trim_end_matches('/'));
    let view: View = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?
        .error_for_status()
        .with_context(|| format!("GET {url}"))?
        .json()
        .await
        .with_context(|| format!("reading {url}"))?;
    Ok(view
        .policies
        .into_iter()
        .map(|e| Row {
            namespace: e.namespace,
            policy: e.name,
            declared: None,
            name: e.rollout.name.clone(),
            status: Some(e.rollout),
        })
        .collect())
}

fn from_policies(policies: &[InferencePolicy]) -> Vec<Row> {
    policies
        .iter()
        .filter_map(|p| {
            let r = p.spec.rollout.as_ref()?;
            let status = p
                .status
                .as_ref()
                .and_then(|s| s.rollout.clone())
                .filter(|s| s.name == r.name);
            Some(Row {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                policy: p.metadata.name.clone().unwrap_or_default(),
                declared: Some(r.state),
                status,
                name: r.name.clone(),
            })
        })
        .collect()
}

/// What `status` prints for one rollout.
fn render(r: &Row) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let declared = r
        .declared
        .map(|d| format!(" (declared {d:?})"))
        .unwrap_or_default();
    let Some(s) = &r.status else {
        let _ = writeln!(
            out,
            "{}/{} rollout {}: no status yet{declared}\n",
            r.namespace, r.policy, r.name
        );
        return out;
    };
    let verdict = s
        .verdict
        .as_deref()
        .map(|v| format!(", verdict {v}"))
        .unwrap_or_default();
    let crossed = s
        .crossed
        .as_deref()
        .map(|c| format!(", crossed {c}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{}/{} rollout {}: {}{verdict}{crossed}{declared}",
        r.namespace,
        r.policy,
        s.name,
        s.phase.as_str()
    );
    if let Some(m) = &s.message {
        let _ = writeln!(out, "  {m}");
    }
    let _ = writeln!(
        out,
        "  {:<8} {:>9} {:>7} {:>9} {:>8} {:>9} {:>10}   (minimum {} requests per arm, {} proxies)",
        "arm",
        "requests",
        "errors",
        "fallbacks",
        "timeouts",
        "ttft n",
        "cost usd",
        s.min_samples,
        s.proxies
    );
    for (arm, a) in [("cohort", &s.cohort), ("control", &s.control)] {
        let _ = writeln!(
            out,
            "  {arm:<8} {:>9} {:>7} {:>9} {:>8} {:>9} {:>10.4}",
            a.requests, a.errors, a.fallbacks, a.timeouts, a.ttft_samples, a.cost_usd
        );
    }
    if s.thresholds.is_empty() {
        let _ = writeln!(
            out,
            "  thresholds: not judged yet (too few requests in an arm)"
        );
    } else {
        let _ = writeln!(
            out,
            "  {:<13} {:>9} {:>21} {:>8} {:>9}",
            "threshold", "estimate", "interval", "limit", "closeness"
        );
        for t in &s.thresholds {
            let interval = format!("{:.4} to {:.4}", t.low, t.high);
            let mark = if t.crossed { "  CROSSED" } else { "" };
            let _ = writeln!(
                out,
                "  {:<13} {:>9.4} {:>21} {:>8.4} {:>9.2}{mark}",
                t.threshold, t.estimate, interval, t.limit, t.closeness
            );
        }
    }
    out.push('\n');
    out
}

fn state_name(state: RolloutState) -> &'static str {
    match state {
        RolloutState::Running => "Running",
        RolloutState::Promoted => "Promoted",
        RolloutState::Aborted => "Aborted",
    }
}

async fn step(a: StepArgs, state: RolloutState) -> anyhow::Result<()> {
    let ns = &a.cluster.namespace;
    let name = &a.policy;
    let word = state_name(state);
    match &a.manifests {
        Some(dir) => {
            let path = set_state_in_manifests(dir, ns, name, state)?;
            println!(
                "InferencePolicy {ns}/{name}: spec.rollout.state set to {word} in {}",
                path.display()
            );
        }
        None => {
            let api: Api<InferencePolicy> = Api::namespaced(client(&a.cluster).await?, ns);
            let policy = api
                .get(name)
                .await
                .with_context(|| format!("reading InferencePolicy {ns}/{name}"))?;
            let Some(rollout) = &policy.spec.rollout else {
                bail!("InferencePolicy {ns}/{name} declares no rollout");
            };
            let patch = serde_json::json!({ "spec": { "rollout": { "state": word } } });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("patching InferencePolicy {ns}/{name}"))?;
            println!(
                "InferencePolicy {ns}/{name}: rollout {} set to {word}",
                rollout.name
            );
        }
    }
    Ok(())
}

/// Sets the rollout state of InferencePolicy `ns/name` in the manifest under `dir` that
/// declares it (a document without a namespace is in `default`, as the controller reads it);
/// returns the file written.
fn set_state_in_manifests(
    dir: &std::path::Path,
    ns: &str,
    name: &str,
    state: RolloutState,
) -> anyhow::Result<PathBuf> {
    for path in crate::explain::source::manifest_paths(dir)
        .with_context(|| format!("reading {}", dir.display()))?
    {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        if let Some(updated) =
            set_state(&text, ns, name, state).with_context(|| format!("{}", path.display()))?
        {
            std::fs::write(&path, updated)
                .with_context(|| format!("writing {}", path.display()))?;
            return Ok(path);
        }
    }
    bail!(
        "no manifest under {} declares InferencePolicy {ns}/{name}",
        dir.display()
    )
}

/// Splits a multi-document YAML text into its documents' line ranges (separators excluded).
fn documents(lines: &[&str]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, l) in lines.iter().enumerate() {
        if l.trim_end() == "---" || l.starts_with("--- ") {
            out.push(start..i);
            start = i + 1;
        }
    }
    out.push(start..lines.len());
    out
}

fn indent(l: &str) -> usize {
    l.len() - l.trim_start().len()
}

fn is_content(l: &str) -> bool {
    let t = l.trim_start();
    !t.is_empty() && !t.starts_with('#')
}

/// `text` with InferencePolicy `ns/name`'s `spec.rollout.state` set, `Ok(None)` when no
/// document of it declares that policy. Only the `state` line changes (or is added under
/// `rollout:`); when the rollout is not written in block style, the document is re-serialized
/// (its comments then go). Either way the result is read back and must differ from the original
/// in the state alone.
pub fn set_state(
    text: &str,
    ns: &str,
    name: &str,
    state: RolloutState,
) -> anyhow::Result<Option<String>> {
    let lines: Vec<&str> = text.split('\n').collect();
    for range in documents(&lines) {
        let doc = lines[range.clone()].join("\n");
        let Ok(value) = serde_yaml::Value::deserialize(serde_yaml::Deserializer::from_str(&doc))
        else {
            continue;
        };
        let is_it = value["kind"].as_str() == Some("InferencePolicy")
            && value["metadata"]["name"].as_str() == Some(name)
            && value["metadata"]["namespace"].as_str().unwrap_or("default") == ns;
        if !is_it {
            continue;
        }
        if value["spec"]["rollout"].is_null() {
            bail!("InferencePolicy {ns}/{name} declares no rollout");
        }
        let mut wanted = value.clone();
        wanted["spec"]["rollout"]["state"] = serde_yaml::Value::from(state_name(state));
        let edited = edit_block(&lines[range.clone()], state_name(state))
            .filter(|d| serde_yaml::from_str::<serde_yaml::Value>(d).is_ok_and(|v| v == wanted))
            .map_or_else(|| serde_yaml::to_string(&wanted), Ok)?;
        let mut out: Vec<String> = lines[..range.start].iter().map(|l| l.to_string()).collect();
        out.push(edited.trim_end_matches('\n').to_string());
        let rest = &lines[range.end..];
        if !rest.is_empty() {
            out.extend(rest.iter().map(|l| l.to_string()));
        } else if text.ends_with('\n') {
            out.push(String::new());
        }
        return Ok(Some(out.join("\n")));
    }
    Ok(None)
}

/// The document with `spec.rollout.state` set by editing its block-style lines, when they are
/// block style.
fn edit_block(doc: &[&str], state: &str) -> Option<String> {
    fn key<'l>(l: &'l str, k: &str) -> Option<&'l str> {
        let t = l.trim_start();
        t.strip_prefix(k)
            .and_then(|r| r.strip_prefix(':'))
            .map(|r| r.trim())
    }
    let spec = doc
        .iter()
        .position(|l| indent(l) == 0 && key(l, "spec") == Some(""))?;
    let block_end = |from: usize, parent: usize| {
        (from + 1..doc.len())
            .find(|&i| is_content(doc[i]) && indent(doc[i]) <= parent)
            .unwrap_or(doc.len())
    };
    let spec_end = block_end(spec, 0);
    let child = (spec + 1..spec_end).find(|&i| is_content(doc[i]))?;
    let spec_indent = indent(doc[child]);
    let rollout = (spec + 1..spec_end).find(|&i| {
        indent(doc[i]) == spec_indent
            && key(doc[i], "rollout").is_some_and(|r| r.is_empty() || r.starts_with('#'))
    })?;
    let rollout_end = block_end(rollout, spec_indent);
    let first = (rollout + 1..rollout_end).find(|&i| is_content(doc[i]))?;
    let inner = indent(doc[first]);
    let mut out: Vec<String> = doc.iter().map(|l| l.to_string()).collect();
    match (rollout + 1..rollout_end)
        .find(|&i| indent(doc[i]) == inner && key(doc[i], "state").is_some())
    {
        Some(i) => {
            let comment = doc[i].find(" #").map(|c| &doc[i][c..]).unwrap_or("");
            out[i] = format!("{}state: {state}{comment}", " ".repeat(inner));
        }
        None => out.insert(rollout_end, format!("{}state: {state}", " ".repeat(inner))),
    }
    // Lines inserted at the end of the rollout block go before trailing blank lines.
    Some(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "\
apiVersion: v1
kind: Service
metadata: {name: llm}
---
# The policy under test.
apiVersion: policy.kinference.io/v1alpha1
kind: InferencePolicy
metadata:
  name: llm
spec:
  targetRef: {group: \"\", kind: Service, name: llm}
  rollout:
    name: spread # the one we try
    candidate:
      balancer: {failureMode: FailClose}
    cohortPercent: 10
    controlPercent: 10
    thresholds: {errorRate: 0.02}
  models: []
";

    #[test]
    fn promote_adds_the_state_line_and_keeps_everything_else() {
        let out = set_state(MANIFEST, "default", "llm", RolloutState::Promoted)
            .unwrap()
            .unwrap();
        let expected = MANIFEST.replace(
            "    thresholds: {errorRate: 0.02}\n",
            "    thresholds: {errorRate: 0.02}\n    state: Promoted\n",
        );
        assert_eq!(out, expected);
        // Again, now replacing the line.
        let again = set_state(&out, "default", "llm", RolloutState::Aborted)
            .unwrap()
            .unwrap();
        assert_eq!(
            again,
            MANIFEST.replace(
                "    thresholds: {errorRate: 0.02}\n",
                "    thresholds: {errorRate: 0.02}\n    state: Aborted\n",
            )
        );
    }

    #[test]
    fn another_namespace_or_no_rollout_is_refused_and_flow_style_is_reserialized() {
        assert_eq!(
            set_state(MANIFEST, "prod", "llm", RolloutState::Promoted).unwrap(),
            None
        );
        let bare = MANIFEST.replace("  rollout:\n", "  other:\n");
        assert!(set_state(&bare, "default", "llm", RolloutState::Promoted).is_err());
        let flow = "kind: InferencePolicy\nmetadata: {name: llm}\nspec: {rollout: {name: x, state: Running}}\n";
        let out = set_state(flow, "default", "llm", RolloutState::Aborted)
            .unwrap()
            .unwrap();
        let v: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        assert_eq!(v["spec"]["rollout"]["state"], "Aborted");
        assert_eq!(v["spec"]["rollout"]["name"], "x");
    }

    #[test]
    fn status_shows_arms_and_how_close_each_threshold_is() {
        let status: RolloutStatus = serde_json::from_value(serde_json::json!({
            "name": "spread", "phase": "RolledBack", "verdict": "Rollback",
            "crossed": "errorRate", "message": "rolled back: errorRate ...",
            "minSamples": 100, "proxies": 2,
            "cohort": {"requests": 160, "errors": 40, "fallbacks": 0, "timeouts": 0,
                       "ttftSamples": 160, "costUsd": 0.16, "tokens": 16000},
            "control": {"requests": 160, "errors": 2, "fallbacks": 0, "timeouts": 0,
                        "ttftSamples": 160, "costUsd": 0.16, "tokens": 16000},
            "thresholds": [{"threshold": "errorRate", "estimate": 0.2375, "low": 0.17,
                            "high": 0.31, "limit": 0.02, "closeness": 8.5, "crossed": true}],
        }))
        .unwrap();
        let out = render(&Row {
            namespace: "default".into(),
            policy: "llm".into(),
            declared: Some(RolloutState::Running),
            name: "spread".into(),
            status: Some(status),
        });
        assert!(out.starts_with("default/llm rollout spread: RolledBack, verdict Rollback, crossed errorRate (declared Running)"), "{out}");
        assert!(out.contains("cohort         160      40"), "{out}");
        assert!(
            out.contains(
                "errorRate        0.2375      0.1700 to 0.3100   0.0200      8.50  CROSSED"
            ),
            "{out}"
        );
    }
}
