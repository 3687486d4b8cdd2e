//! The policy controller's pure model and discovery traits.
//!
//! This crate exists so the gRPC layer and the index agree on one model without either
//! knowing the other: the index (Kubernetes types in) produces these values, the gRPC
//! layer (proto types out) reads them, and neither sees the other's types, as in
//! Linkerd's policy-controller core.

pub mod endpoints;
pub mod guard;
pub mod inference;
pub mod outbound;
pub mod rollout;
pub mod target;

pub use self::{
    endpoints::{DiscoverEndpoints, Endpoint, PoolEndpoints},
    inference::{DiscoverInferencePolicy, InferencePolicy, InferencePolicyState},
    outbound::{DiscoverOutboundPolicy, OutboundPolicy},
    target::{ParentTarget, PoolRef, ResourceRef},
};
