//! Measures the time from a manifest change to the update arriving on a watching client.
//!
//! It starts the controller on a copy of `examples/`, watches the example parent's
//! inference policy and the glm-5.3 pool's endpoints, then repeatedly rewrites a file
//! (atomically) and times how long until the stream delivers the change. The time
//! includes the file watch, the controller's debounce, parsing, indexing and gRPC.
//!
//! Run: `cargo build --release -p kinference-policy-test && target/release/kinference-policy-latency`

use anyhow::Context as _;
use clap::Parser;
use kinference_policy_test::{Controller, examples_dir, next_matching};
use kinference_proxy_api::{
    InferencePoliciesClient,
    inference::{InferenceTarget, inference_target},
};
use linkerd2_proxy_api::destination::{self as dst, destination_client::DestinationClient};
use std::path::PathBuf;
use tokio::time::Instant;

#[derive(Debug, Parser)]
struct Args {
    /// Changes measured per kind.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// The controller's debounce, in milliseconds.
    #[arg(long, default_value_t = 20)]
    debounce_ms: u64,
}

fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    let rank = (p / 100.0 * sorted_ms.len() as f64).ceil() as usize;
    sorted_ms[rank.clamp(1, sorted_ms.len()) - 1]
}

fn report(what: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    println!(
        "| {what} | {} | {:.2} | {:.2} | {:.2} |",
        ms.len(),
        percentile(&ms, 50.0),
        percentile(&ms, 99.0),
        ms[ms.len() - 1]
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin: PathBuf = std::env::current_exe()?
        .parent()
        .context("no directory")?
        .join("kinference-policy-controller-under-test");
    let ctl = Controller::start_with(&bin, &examples_dir(), args.debounce_ms).await?;

    let mut inference = InferencePoliciesClient::new(ctl.channel().await?)
        .watch(InferenceTarget {
            source_workload: String::new(),
            target: Some(inference_target::Target::Authority(
                "llm.default.svc.cluster.local:8000".into(),
            )),
        })
        .await?
        .into_inner();
    next_matching(&mut inference, "the first policy", |_| true).await?;
    let policy = ctl.read("policy.yaml")?;
    anyhow::ensure!(policy.contains("minConfidence: 0.5"));
    let mut policy_ms = Vec::with_capacity(args.samples);
    for i in 0..args.samples {
        let value = if i % 2 == 0 { 0.8 } else { 0.5 };
        let text = policy.replace("minConfidence: 0.5", &format!("minConfidence: {value}"));
        let start = Instant::now();
        ctl.write("policy.yaml", &text)?;
        next_matching(&mut inference, "the policy change", |p| {
            p.rules
                .first()
                .and_then(|r| r.r#match.as_ref())
                .and_then(|m| m.tags.first())
                .is_some_and(|t| t.min_confidence == value)
        })
        .await?;
        policy_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }

    let mut endpoints = DestinationClient::new(ctl.channel().await?)
        .get(dst::GetDestination {
            scheme: "http:".into(),
            path: "glm-5.3.default.inferencepool.kinference.io".into(),
            context_token: String::new(),
        })
        .await?
        .into_inner();
    next_matching(&mut endpoints, "the first endpoints", |_| true).await?;
    let slices = ctl.read("endpointslices.yaml")?;
    let unready = slices.replacen("ready: true", "ready: false", 1);
    anyhow::ensure!(unready != slices);
    let mut endpoint_ms = Vec::with_capacity(args.samples);
    for i in 0..args.samples {
        let removing = i % 2 == 0;
        let start = Instant::now();
        ctl.write(
            "endpointslices.yaml",
            if removing { &unready } else { &slices },
        )?;
        next_matching(&mut endpoints, "the endpoint change", |u| match &u.update {
            Some(dst::update::Update::Remove(_)) => removing,
            Some(dst::update::Update::Add(_)) => !removing,
            _ => false,
        })
        .await?;
        endpoint_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }

    println!("debounce: {} ms", args.debounce_ms);
    println!("| change | samples | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    report("InferencePolicy rule -> InferencePolicies.Watch", policy_ms);
    report("EndpointSlice ready -> Destination.Get", endpoint_ms);
    Ok(())
}
