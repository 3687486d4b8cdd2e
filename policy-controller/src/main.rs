//! `kinference-policy-controller`: serves inference policy to proxies.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = kinference_policy_controller::Args::parse();
    kinference_policy_controller::run(args).await
}
