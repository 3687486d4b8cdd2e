//! Kinference's Kubernetes resources, the upstream InferencePool, and the inference discovery API.
