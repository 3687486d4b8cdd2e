//! `kinference-local`: the whole system on loopback, for trying it with any OpenAI client.
//!
//! Starts the policy controller on `examples/`' manifests, a simulated fleet (two glm-5.3 and two
//! qwen-3.6-27b replicas, publishing vLLM KV events for the proxy's precise prefix index) and the
//! proxy, prints the base URL and where the metrics are, and serves until interrupted.
//! `KINFERENCE_LOCAL_LOGS=1` shows the children's logs.

use anyhow::Context as _;
use clap::Parser;
use kinference_proxy::local::{Stack, StackOptions, target_dir, workspace_root};
use std::process::Command;

#[derive(Debug, Parser)]
#[command(
    name = "kinference-local",
    about = "Controller, simulated vLLM fleet and proxy on loopback"
)]
struct Args {
    /// Replicas per model.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// Simulated seconds per wall second.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Run the replicas without vLLM KV events (the proxy then uses its approximate prefix index).
    #[arg(long)]
    no_kv_events: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Make sure the three binaries are current (fast when they are). Tests that run this binary
    // set KINFERENCE_LOCAL_NO_BUILD: the test build already made the binaries, and a `cargo build`
    // of three packages resolves features differently from the workspace's test build, so it would
    // rebuild much of the dependency graph.
    if std::env::var_os("KINFERENCE_LOCAL_NO_BUILD").is_none() {
        build_binaries()?;
    }

    let quiet = std::env::var_os("KINFERENCE_LOCAL_LOGS").is_none();
    let opts = StackOptions {
        replicas: vec![
            ("glm-5.3".into(), args.replicas),
            ("qwen-3.6-27b".into(), args.replicas),
        ],
        time_scale: args.time_scale,
        kv_events: !args.no_kv_events,
        quiet,
        ..StackOptions::default()
    };
    let stack = Stack::start(&target_dir().join("kinference-proxy"), &opts, &|_| {})?;
    println!();
    println!("Kinference is running on loopback.");
    println!("  OpenAI base URL:  http://{}/v1", stack.proxy.listen);
    println!("  metrics:          http://{}/metrics", stack.proxy.admin);
    println!(
        "  decisions:        http://{}/debug/decisions",
        stack.proxy.admin
    );
    println!(
        "  endpoints:        http://{}/debug/endpoints",
        stack.proxy.admin
    );
    println!("  controller gRPC:  {}", stack.controller.grpc);
    for s in &stack.sims {
        println!("  {} replica:   http://{}", s.model, s.addr);
    }
    if opts.kv_events {
        // Not a `replica:` line: kinference-viz reads those for the replicas' URLs.
        println!(
            "  KV events:        published on each replica's port + 1, followed by the proxy's precise prefix index"
        );
    }
    println!();
    println!(
        "Try: curl http://{}/v1/chat/completions -H 'content-type: application/json' \\",
        stack.proxy.listen
    );
    println!(
        "       -d '{{\"model\":\"glm-5.3\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hi!\"}}]}}'"
    );
    println!("Press Ctrl-C to stop.");
    let (tx, rx) = std::sync::mpsc::channel();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        rt.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        let _ = tx.send(());
    });
    let _ = rx.recv();
    drop(stack);
    Ok(())
}

/// `cargo build`s the proxy, the controller and the simulator.
fn build_binaries() -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .args([
            "build",
            "-p",
            "kinference-proxy",
            "--bin",
            "kinference-proxy",
            "-p",
            "kinference-policy-controller",
            "--bin",
            "kinference-policy-controller",
            "-p",
            "kinference-vllm-sim",
            "--bin",
            "vllm-sim",
        ])
        .status()
        .context("running cargo build")?;
    anyhow::ensure!(status.success(), "cargo build failed");
    Ok(())
}
