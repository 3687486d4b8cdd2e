//! `kinfctl`: Kinference's command line, in the manner of `linkerd`: it prints the manifests that
//! install the control plane, and injects workloads' manifests, so that both work with nothing but
//! `kubectl apply`; it checks a cluster before and after the install, or a local system; and it
//! explains where a prompt would be routed and why; it shows a rollout against its thresholds and
//! promotes or aborts it; and it replays recorded traffic through a candidate policy.

mod check;
mod explain;
mod inject;
mod install;
mod replay;
mod rollout;
mod viz;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "kinfctl", version, about = "Kinference's command line")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the manifests that install Kinference (pipe them to `kubectl apply -f -`).
    Install(install::Args),
    /// Annotate workloads in manifests for proxy injection (pipe them to `kubectl apply -f -`).
    Inject(inject::Args),
    /// Check that the cluster can take Kinference (--pre), that the installation works, or
    /// (--local, --controller-addr, --proxy-admin) that a local system works.
    Check(check::Args),
    /// Explain where a prompt would be routed and why: tags, rules, candidates, predictions.
    Explain(explain::Args),
    /// Per-tenant stats, busiest routes and live decisions from kinference-viz.
    Viz(viz::Args),
    /// A policy's rollout: its status against the thresholds, and promote or abort it.
    Rollout(rollout::Args),
    /// Replay recorded traffic through the current and a candidate policy in the fleet
    /// simulation, side by side.
    Replay(replay::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Install(args) => install::run(args),
        Command::Inject(args) => inject::run(args),
        Command::Check(args) => check::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Viz(args) => viz::run(args),
        Command::Rollout(args) => rollout::run(args),
        Command::Replay(args) => replay::run(args),
    }
}
