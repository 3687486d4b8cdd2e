//! An OpenAI- and vLLM-compatible HTTP server over the simulated engine, with metrics, KV events
//! and fault injection.
//!
//! Kinference's proxy, balancer and end-to-end tests need vLLM replicas that speak exactly what vLLM
//! speaks (OpenAI JSON and SSE, Prometheus `/metrics`, ZMQ KV events) and that behave like vLLM's
//! scheduler under load, without GPUs. Each [`Replica`] is one such server: a real hyper listener
//! (HTTP/1.1 and HTTP/2 cleartext on one port) over one `kinference_sim::Engine` driven in scaled
//! virtual time.

#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod driver;
pub mod error;
pub mod fault;
pub mod kv_events;
pub mod metrics;
pub mod openai;
pub mod server;
pub mod text;

pub use self::{
    config::ReplicaConfig,
    fault::FaultConfig,
    kv_events::KvEventsConfig,
    server::{Replica, ServeError, serve},
};
