//! Kinference on loopback: the tooling that runs the whole system as separate processes, kept out of
//! the production crates.
//!
//! Developers run `cargo run -p kinference-local` to try Kinference with any OpenAI client; the
//! end-to-end tests of the proxy, viz and kinfctl start the same [`stack`], so what they prove is
//! what a developer runs; the proxy benchmark starts its children with the same [`process`]
//! harness. The binary links the controller, the proxy and the simulator and runs each as a
//! subcommand of itself ([`program`]), so a first run is one build. With the `binary` feature (the
//! default) it also runs a real Prometheus and the viz dashboard beside the stack (`prometheus`,
//! `dashboard`).

pub mod banner;
#[cfg(feature = "binary")]
pub mod dashboard;
pub mod manifests;
pub mod poll;
pub mod process;
pub mod program;
#[cfg(feature = "binary")]
pub mod prometheus;
pub mod reaper;
pub mod relay;
pub mod stack;
pub mod vllm;

pub use self::{
    program::{Program, Programs, target_dir, workspace_binary, workspace_root},
    stack::{Addrs, Controller, Engine, Proxy, Sim, Stack, StackOptions, VllmEngine, VllmReplica},
};
