//! A model of one vLLM v1 engine, with no sockets and no wall clock.
//!
//! Every performance number Kinference publishes is measured against this model, so it schedules the
//! way vLLM v1 does (continuous batching, chunked prefill under a token budget, a paged KV cache with
//! automatic prefix caching and LRU reuse of freed blocks, recompute preemption) and charges each step
//! with a cost model whose constants come from public vLLM measurements ([`profile`]).
//!
//! Time is virtual: the caller owns the clock and calls [`Engine::step`] at the instant the previous
//! step ended. The HTTP simulator (`kinference-vllm-sim`) drives it from a tokio timer scaled to wall
//! time; the fleet benchmark drives many engines from one discrete-event queue.

#![forbid(unsafe_code)]

pub mod cost;
pub mod engine;
pub mod kv;
pub mod metrics;
pub mod profile;
pub mod tokenizer;
pub mod workload;

pub use self::{
    cost::CostModel,
    engine::{
        Engine, EngineConfig, EngineEvent, EngineRequest, RequestId, StepOutput, SubmitError,
    },
    kv::KvEvent,
    metrics::EngineStats,
    profile::Profile,
    tokenizer::PseudoTokenizer,
};

/// Virtual time: the offset from the engine's epoch. Nanosecond resolution, deterministic.
pub type SimTime = std::time::Duration;
