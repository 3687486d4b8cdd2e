//! The policy controller's index: Kubernetes resources in, core policy out.
//!
//! Sources (the local manifest directory today, kube-rs watchers later) call
//! [`Index::apply`] and [`Index::delete`]; the index keeps the resources, translates
//! them into the core model and publishes the result per target through `watch`
//! channels that the gRPC layer streams. It does no I/O, so every translation rule is
//! tested here without a cluster or a socket.

mod endpoints;
pub mod index;
mod inference;
mod outbound;
pub mod resource;

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
