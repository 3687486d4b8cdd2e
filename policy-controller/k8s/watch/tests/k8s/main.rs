//! The Kubernetes source against an API server double over real HTTP: watchers into the
//! index, relists, reconnects, status writes and leader election.

mod api_server;
mod fixtures;
mod lease;
mod status;
mod watch;
