//! Kinference's inference discovery API, generated from `proto/inference.proto`.
//!
//! The proto is the contract between the policy controller and the proxy; this crate
//! only compiles it, so both sides share one definition and a stock Linkerd proxy API
//! stays untouched.

#![allow(missing_debug_implementations, clippy::all)]

/// `io.kinference.proxy.inference.v1alpha1`.
pub mod inference {
    tonic::include_proto!("io.kinference.proxy.inference.v1alpha1");
}

/// `io.kinference.proxy.signals.v1alpha1`: engine readings streamed from the control plane
/// (`proto/signals.proto`).
pub mod signals {
    tonic::include_proto!("io.kinference.proxy.signals.v1alpha1");
}

pub use prost_types;

pub use inference::{
    inference_policies_client::InferencePoliciesClient,
    inference_policies_server::{InferencePolicies, InferencePoliciesServer},
};
