//! `kinference-viz`: serves the metrics API and dashboard (`serve`) over a Prometheus and the
//! proxies' admin listeners.

mod cli;

fn main() -> anyhow::Result<()> {
    cli::main()
}
