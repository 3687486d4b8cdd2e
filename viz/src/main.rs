//! `kinference-viz`: serves the metrics API and dashboard (`serve`), or runs the whole local
//! system with Prometheus and viz beside it (`local`).

mod cli;

fn main() -> anyhow::Result<()> {
    cli::main()
}
