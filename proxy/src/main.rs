//! `kinference-proxy`: the sidecar. Parses its configuration and runs the app until interrupted.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let config = kinference_proxy::Config::parse();
    kinference_proxy::app::runtime(&config)?.block_on(kinference_proxy::app::run(config))
}
