//! The policy controller's index: Kubernetes resources in, core policy out.
//!
//! Sources (the manifest directory, or the kube-rs watchers) call
//! [`Index::apply`] and [`Index::delete`]; the index keeps the resources, translates
//! them into the core model and publishes the result per target through `watch`
//! channels that the gRPC layer streams. A parent whose policy's newest version is rejected
//! keeps its last good policy (`last_good`). It does no I/O, so every translation rule is
//! tested here without a cluster or a socket.

mod endpoints;
#[doc(hidden)]
pub mod fuzzing;
pub mod index;
mod inference;
mod last_good;
mod outbound;
pub mod resource;
pub mod rollout;
mod store;

pub use self::{
    index::{Index, IndexSizes, SharedIndex},
    resource::{Resource, ResourceKey, ResourceKind},
};

/// Labels on pods (or EndpointSlices) that carry an endpoint's static facts.
pub mod labels {
    /// The model the pod serves.
    pub const MODEL: &str = "kinference.io/model";
    /// Comma-separated LoRA adapters the pod serves.
    pub const LORA_ADAPTERS: &str = "kinference.io/lora-adapters";
    /// The pod's accelerator, e.g. `nvidia-h200`.
    pub const ACCELERATOR: &str = "kinference.io/accelerator";
}
