//! The Kinference sidecar proxy.
//!
//! Each OpenAI-compatible request the application sends is parsed once, classified, matched against
//! the inference policy the controller serves, and sent to the vLLM endpoint predicted to return its
//! first token soonest (see `docs/proxy.md`). The inference layer ([`inference`]) is a
//! `tower::Service` that knows nothing about sockets; [`server`] and [`admin`] own the listeners and
//! [`app`] wires everything together.

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod balance;
pub mod classify;
pub mod config;
pub mod decisions;
pub mod dispatch;
pub mod inference;
pub mod local;
pub mod metrics;
pub mod openai;
pub mod policy;
pub mod server;
pub mod signals;
pub mod stream;

pub use self::config::Config;
