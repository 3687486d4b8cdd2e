//! Scenario tests: manifests in, discovery API out.
