//! `vllm-sim`: simulated vLLM replicas on loopback, one (`serve`) or a fleet (`fleet`); the command
//! line is the library's [`kinference_vllm_sim::cli`].

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kinference_vllm_sim::cli::run(kinference_vllm_sim::cli::Cli::parse()).await
}
