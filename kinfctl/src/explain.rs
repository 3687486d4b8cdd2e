//! `kinfctl explain`: why a prompt would go where it goes.
//!
//! For one prompt, requested model and policy it prints the tags (with the features that drove
//! them), the rules that matched, the candidate models, each endpoint's predicted TTFT with every
//! input and its age, and the choice with its reason. The policy comes from a running proxy
//! (`--proxy`, whose admin listener runs the decision as a dry run), or is read as declared, from
//! a manifest directory (`--manifests`) or the cluster (`--cluster`), and evaluated here with the
//! proxy's own code; only a proxy knows the endpoints' live signals, so predictions need `--proxy`.
//!
//! The dry run itself is `kinference_decision::explain`, the same call the proxy's
//! `POST /debug/explain` makes, so what this prints is what the proxy computes, never a
//! re-implementation of it. The policy read here is converted by the proxy's own discovery edge
//! (`kinference_proxy_discovery::convert`) and its classifiers compiled by `kinference-classify`.

mod input;
mod report;
pub(crate) mod source;

use std::{io::Read as _, path::PathBuf, time::Duration};

use anyhow::Context as _;
use kinference_decision::{Input, Workload, explain::explain};
use kinference_openai::{Endpoint, InferenceRequest};
use kinference_proxy_discovery::convert;
use kinference_routing::{ApproxConfig, PromptBlocks};

pub use self::report::{Output, Report};

/// Arguments of `kinfctl explain`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The prompt, as plain text (otherwise --file, else stdin).
    #[arg(long, short = 'p', conflicts_with = "file")]
    prompt: Option<String>,

    /// A file holding the prompt: plain text, a JSON array of chat messages, or a whole chat or
    /// completion request body. `-` reads stdin.
    #[arg(long, short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,

    /// The model the request asks for (required unless the body names one; overrides it).
    #[arg(long, short = 'm')]
    model: Option<String>,

    /// The request's max_tokens.
    #[arg(long)]
    max_tokens: Option<u32>,

    /// A running proxy's admin URL, e.g. http://127.0.0.1:4191: its policy, unless --manifests
    /// or --cluster give one, and its live endpoint predictions.
    #[arg(long, value_name = "URL")]
    proxy: Option<String>,

    /// Read the policy from this directory of manifests (InferencePolicy, InferenceClassifier,
    /// InferencePool, HTTPRoute, Service), as the controller's manifest mode does.
    #[arg(long, value_name = "DIR", conflicts_with = "cluster")]
    manifests: Option<PathBuf>,

    /// Read the policy from the cluster of the current kubeconfig context.
    #[arg(long)]
    cluster: bool,

    /// With --cluster: the kubeconfig file (default: $KUBECONFIG or ~/.kube/config).
    #[arg(
        long,
        value_name = "FILE",
        requires = "cluster",
        conflicts_with = "api_server"
    )]
    kubeconfig: Option<PathBuf>,

    /// With --cluster: talk to this API server URL directly, without credentials.
    #[arg(long, value_name = "URL", requires = "cluster")]
    api_server: Option<String>,

    /// The target whose policy applies. With --manifests or --cluster: the authority the
    /// application calls, e.g. llm.default.svc.cluster.local:8000 (default: the only Service port
    /// with a policy). With --proxy: the proxy's default target (by that name) or a Service it
    /// captured traffic for, by the `clusterIP:port` its `/debug/targets` lists (default: its
    /// default target).
    #[arg(long)]
    target: Option<String>,

    /// With --manifests or --cluster: the calling workload, `namespace/name`, for rules that
    /// match workloads (a proxy uses its own).
    #[arg(long, default_value = "default/app")]
    workload: String,

    /// With --manifests or --cluster: the workload's labels, `key=value`.
    #[arg(long = "workload-label", value_delimiter = ',')]
    workload_labels: Vec<String>,

    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    output: Output,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.proxy.is_none() && args.manifests.is_none() && !args.cluster {
        anyhow::bail!(
            "say where the policy comes from: --proxy <admin URL>, --manifests <dir> or --cluster"
        );
    }
    let text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(path)) if path.as_os_str() != "-" => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
        _ => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from stdin")?;
            s
        }
    };
    let body = input::request_body(&text, args.model.as_deref(), args.max_tokens)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let value = runtime.block_on(explain_body(&args, &body))?;
    let report: Report =
        serde_json::from_value(value.clone()).context("reading the explanation")?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&value)?),
        Output::Table => print!("{}", report.render()),
    }
    Ok(())
}

/// The explanation as JSON: the proxy's dry run, or the declared policy's (with the proxy's
/// predictions over its candidates when a proxy is given too).
async fn explain_body(args: &Args, body: &serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .context("building the HTTP client")?;
    let declared = if let Some(dir) = &args.manifests {
        Some(source::from_manifests(dir, args.target.as_deref())?)
    } else if args.cluster {
        let client =
            source::cluster_client(args.kubeconfig.as_ref(), args.api_server.as_deref()).await?;
        Some(source::from_cluster(&client, args.target.as_deref()).await?)
    } else {
        None
    };
    let Some(declared) = declared else {
        let proxy = args.proxy.as_deref().unwrap_or_default();
        let mut v = ask_proxy(&http, proxy, body, None, args.target.as_deref()).await?;
        v["source"] = serde_json::json!({ "policy": format!("proxy {proxy}"), "predictions": format!("proxy {proxy}") });
        return Ok(v);
    };

    let policy = convert::policy(&declared.proto);
    let (definition, unavailable) = convert::classifiers(&declared.proto.classifiers);
    let compiled = kinference_classify::compile(definition, unavailable, &Default::default());
    let request = parse(body)?;
    let workload = Workload::parse(&args.workload, label_pairs(&args.workload_labels));
    let explanation = request.explain(&compiled.set).await;
    let tags = explanation.to_tags();
    let blocks = PromptBlocks::from_text(&request.prefix_text(), &ApproxConfig::default());
    let input = Input {
        requested: &request.model,
        tags: &tags,
        workload: &workload,
        prompt_tokens: request.estimated_prompt_tokens(),
        max_tokens: request.max_tokens,
        prompt_blocks: &blocks,
        block_hasher: None,
        // A dry run shows every endpoint in the order it would be tried.
        max_attempts: usize::MAX,
    };
    let e = explain(&policy, explanation, &input, None, None);
    let mut v = serde_json::to_value(&e)?;
    v["unavailable_tags"] = serde_json::to_value(&compiled.unavailable)?;
    v["source"] = serde_json::json!({
        "policy": declared.source,
        "target": declared.target,
        "predictions": args.proxy.as_ref().map(|p| format!("proxy {p}")),
    });
    if let Some(status) = &policy.status_message {
        anyhow::bail!("the policy for {} is not served: {status}", declared.target);
    }
    let Some(candidates) = &e.candidates else {
        return Ok(v);
    };
    if let Some(proxy) = &args.proxy {
        let live = ask_proxy(
            &http,
            proxy,
            body,
            Some(&candidates.models),
            args.target.as_deref(),
        )
        .await?;
        v["routing"] = live["routing"].clone();
        v["live_policy"] = live["policy"].clone();
    }
    Ok(v)
}

fn parse(body: &serde_json::Value) -> anyhow::Result<InferenceRequest> {
    let endpoint = if body.get("messages").is_some() {
        Endpoint::Chat
    } else {
        Endpoint::Completion
    };
    InferenceRequest::parse(endpoint, bytes::Bytes::from(body.to_string()))
        .map_err(|e| anyhow::anyhow!("the request is not valid: {}", e.message))
}

fn label_pairs(labels: &[String]) -> Vec<(String, String)> {
    labels
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// `POST /debug/explain` on the proxy's admin listener, for its default target or `target`.
async fn ask_proxy(
    http: &reqwest::Client,
    admin: &str,
    body: &serde_json::Value,
    models: Option<&[String]>,
    target: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    let url = format!("{}/debug/explain", admin.trim_end_matches('/'));
    let mut query: Vec<(&str, String)> = Vec::new();
    if let Some(models) = models {
        query.push(("models", models.join(",")));
    }
    if let Some(target) = target {
        query.push(("target", target.to_string()));
    }
    let rsp = http
        .post(&url)
        .query(&query)
        .json(body)
        .send()
        .await
        .with_context(|| format!("cannot reach the proxy's admin listener at {admin}"))?;
    let status = rsp.status();
    let v: serde_json::Value = rsp
        .json()
        .await
        .with_context(|| format!("reading {url}'s answer"))?;
    if !status.is_success() {
        let msg = v["error"]["message"].as_str().unwrap_or("(no message)");
        anyhow::bail!("the proxy at {admin} answered {status}: {msg}");
    }
    Ok(v)
}
