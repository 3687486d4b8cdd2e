//! `kinference-proxy`: the sidecar. Parses its configuration and runs the app until interrupted.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = kinference_proxy::Config::parse();
    kinference_proxy::app::run(config).await
}
