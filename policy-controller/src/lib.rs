//! Watches resources, serves policy over gRPC, validates at admission.
