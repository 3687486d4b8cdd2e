//! `kinference-local`: the whole system on loopback, for trying it with any OpenAI client.
//!
//! Without a subcommand it starts the policy controller on `examples/`' manifests, a simulated
//! fleet (two glm-5.3 and two qwen-3.6-27b replicas, publishing vLLM KV events for the proxy's
//! precise prefix index), the proxy and, with Prometheus installed, Prometheus and the viz
//! dashboard; prints where everything is and serves until SIGINT, SIGTERM or SIGHUP. Each component
//! runs as this same binary with a subcommand (`controller`, `proxy`, `vllm-sim`), so one
//! `cargo run` builds everything. `KINFERENCE_LOCAL_LOGS=1` shows the children's logs.

mod child;
mod cli;

fn main() -> anyhow::Result<()> {
    cli::main()
}
