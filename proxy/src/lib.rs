//! The Kinference sidecar proxy.
//!
//! Each OpenAI-compatible request the application sends is parsed once, classified, matched against
//! the inference policy the controller serves, and sent to the vLLM endpoint predicted to return its
//! first token soonest (see `docs/proxy.md`). The request path is a stack of tower layers, built in
//! one place ([`stack`]): the OpenAI front, route (classify and decide, with
//! `kinference-decision`), observe, retry and forward. [`target`] holds what discovery feeds each
//! target; [`server`] and [`admin`] own the listeners and [`app`] wires everything together.

pub mod admin;
pub mod admission;
pub mod app;
pub mod body;
pub mod budget;
pub mod classify;
pub mod clock;
pub mod config;
pub mod decisions;
pub mod endpoints;
pub mod forward;
pub mod front;
pub mod guard;
pub mod hasher;
pub mod metrics;
pub mod observe;
pub mod passthrough;
pub mod retry;
pub mod rollout;
pub mod route;
pub mod router;
pub mod server;
pub mod signals;
pub mod stack;
pub mod stream;
pub mod target;
pub mod traffic;

pub use self::config::Config;
