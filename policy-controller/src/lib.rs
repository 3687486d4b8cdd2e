//! The policy controller: sources feed the index, the index feeds the gRPC server.
//!
//! The binary is thin; this crate wires the pieces so tests and benchmarks can run the
//! same wiring: a source (a manifest directory, or the Kubernetes watchers of
//! `kinference-policy-k8s-watch`, both calling the same
//! [`kinference_policy_k8s_index::Index`] methods), the gRPC server, the admin server
//! with health and metrics, and in Kubernetes mode the admission webhooks.

pub mod admin;
pub mod manifests;
pub mod metrics;
pub mod peers;
pub mod runtime;

pub use self::runtime::{Args, run};
