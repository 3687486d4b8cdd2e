//! The policy controller, as the scenarios run it: the same `Args` and `run` as
//! `kinference-policy-controller`'s `main`.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kinference_policy_controller::run(kinference_policy_controller::Args::parse()).await
}
