//! Kinference's Kubernetes resources: `InferencePolicy` and `InferenceClassifier`
//! (`policy.kinference.io/v1alpha1`), the upstream `InferencePool`
//! (`inference.networking.k8s.io/v1`), and the Gateway API's HTTPRoute, re-exported.
//!
//! The policy controller, the proxy's tests and the CRD generator all read resources through
//! these types, so that the YAML a user writes, the CRD the API server enforces and the policy
//! the proxy applies cannot disagree.

pub mod classifier;
pub mod crds;
pub mod duration;
pub mod policy;
pub mod pool;
pub mod validate;

/// The Gateway API's HTTPRoute, whose backendRefs may point at InferencePools.
pub mod httproute {
    pub use gateway_api::apis::standard::httproutes::*;

    /// The API group of HTTPRoute.
    pub const GROUP: &str = "gateway.networking.k8s.io";

    /// The kind of HTTPRoute.
    pub const KIND: &str = "HTTPRoute";
}

pub use self::{
    classifier::{InferenceClassifier, InferenceClassifierSpec},
    duration::GatewayDuration,
    policy::{InferencePolicy, InferencePolicySpec},
    pool::{InferencePool, InferencePoolSpec},
    validate::{
        ValidationError, ValidationErrors, validate_classifier, validate_policy,
        validate_policy_document,
    },
};
pub use gateway_api;
