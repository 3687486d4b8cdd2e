//! The Kubernetes source against an API server double over real HTTP: watchers into the
//! index, relists, reconnects, status writes and leader election. The double is the shared
//! `kinference-k8s-api-double` crate.

mod fixtures;
mod lease;
mod status;
mod watch;
