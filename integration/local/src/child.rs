//! The stack's components as subcommands of this binary: `kinference-local controller|proxy|vllm-sim
//! ARGS` is `kinference-policy-controller|kinference-proxy|vllm-sim ARGS`, the same code with the
//! same flags, in a process of its own.

use clap::Parser as _;
use kinference_local::program::PARENT_PID_ENV;
use std::{ffi::OsString, time::Duration};

#[derive(Debug, clap::Subcommand)]
pub enum Child {
    /// Run the policy controller (`kinference-policy-controller`'s flags).
    #[command(disable_help_flag = true)]
    Controller(Args),
    /// Run the proxy (`kinference-proxy`'s flags).
    #[command(disable_help_flag = true)]
    Proxy(Args),
    /// Run simulated vLLM replicas (`vllm-sim`'s subcommands and flags).
    #[command(name = "vllm-sim", disable_help_flag = true)]
    VllmSim(Args),
}

/// A component's own arguments, passed through to its parser.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

impl Args {
    /// `args` after `name`, as the component's own binary would see them.
    fn argv(self, name: &str) -> impl Iterator<Item = OsString> {
        std::iter::once(OsString::from(name)).chain(self.args)
    }
}

/// Runs one component until it stops (or its parent does).
pub fn run(child: Child) -> anyhow::Result<()> {
    watch_parent();
    let runtime = || tokio::runtime::Runtime::new();
    match child {
        Child::Controller(a) => runtime()?.block_on(kinference_policy_controller::run(
            kinference_policy_controller::Args::parse_from(a.argv("kinference-policy-controller")),
        )),
        // The proxy runs on the runtime its configuration asks for (`--cores`).
        Child::Proxy(a) => {
            let config = kinference_proxy::Config::parse_from(a.argv("kinference-proxy"));
            kinference_proxy::app::runtime(&config)?.block_on(kinference_proxy::app::run(config))
        }
        Child::VllmSim(a) => runtime()?.block_on(kinference_vllm_sim::cli::run(
            kinference_vllm_sim::cli::Cli::parse_from(a.argv("vllm-sim")),
        )),
    }
}

/// Exits when the local run that started this process is gone. A stack that is stopped kills its
/// children itself; this covers the run dying without stopping them (SIGKILL, a panic, a signal
/// during start-up), which would otherwise leave orphan simulators holding their ports.
fn watch_parent() {
    let Some(parent) = std::env::var(PARENT_PID_ENV)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    else {
        return;
    };
    std::thread::spawn(move || {
        loop {
            if std::os::unix::process::parent_id() != parent {
                eprintln!("kinference-local: the local run (pid {parent}) is gone: exiting");
                std::process::exit(1);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
}
