//! The policy controller: sources feed the index, the index feeds the gRPC server.
//!
//! The binary is thin; this crate wires the pieces so tests and benchmarks can run the
//! same wiring: a source (today the local manifest directory; the Kubernetes watch
//! source will call the same [`kinference_policy_k8s_index::Index`] methods), the
//! gRPC server, and the admin server with health and metrics.

pub mod admin;
pub mod local;
pub mod metrics;
pub mod runtime;

pub use self::runtime::{Args, run};
