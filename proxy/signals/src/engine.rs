//! One `/metrics` reader per model-server engine, behind one trait.
//!
//! The routing core predicts time to first token from a handful of engine-neutral signals (queue,
//! running requests, KV usage, prefix-cache counters); where they come from differs by engine:
//! vLLM says `vllm:num_requests_waiting`, SGLang `sglang:num_queue_reqs`, and their counters are
//! counted at different moments. Each engine's adapter maps its own names and meanings onto the
//! one struct the core reads ([`EngineMetrics`], the former `VllmMetrics`) and leaves `None`
//! where the engine has no counterpart, so that a missing signal degrades the prediction instead
//! of feeding it a number that means something else. The Prometheus line reader is shared
//! ([`crate::metrics`]).
//!
//! Adding an engine is one file here (its adapter, with its names and their source), one
//! [`Engine`] variant and one arm in [`Engine::adapter`]. A pool that names the wrong engine is
//! visible, not silently wrong: no adapter reads another engine's families, so its scrape fails
//! with [`ParseError::NoVllmMetrics`] or [`ParseError::NoEngineMetrics`] and the endpoint's
//! signals age as for any failed scrape.
//!
//! Which engine an endpoint runs is not yet carried from the InferencePool through the controller
//! to the proxy's scraper; until it is, the proxy reads every endpoint as vLLM.

pub mod sglang;
pub mod vllm;

pub use self::{sglang::Sglang, vllm::Vllm};
use crate::metrics::{ParseError, VllmMetrics};
use std::{fmt, str::FromStr};

/// What one scrape says about an endpoint, whatever its engine.
pub type EngineMetrics = VllmMetrics;

/// Reads one engine's `/metrics` exposition into the router's engine-neutral fields.
pub trait EngineAdapter: Send + Sync {
    /// The engine this adapter reads.
    fn engine(&self) -> Engine;

    /// Reads Prometheus text (format 0.0.4) or OpenMetrics text. Fields the exposition does not
    /// carry, or that the engine has no counterpart for, are `None` (or empty). Text with none of
    /// the engine's families is an error, so that a wrong port or a wrong engine shows.
    fn parse_metrics(&self, text: &str) -> Result<EngineMetrics, ParseError>;
}

/// A model-server engine the proxy can read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Engine {
    /// vLLM (the default: every endpoint so far).
    #[default]
    Vllm,
    /// SGLang (`--enable-metrics`).
    Sglang,
}

impl Engine {
    /// Every engine, in declaration order.
    pub const ALL: [Engine; 2] = [Engine::Vllm, Engine::Sglang];

    /// The engine named `name` (`"vllm"` or `"sglang"`, ASCII case ignored), or `None`.
    pub fn parse(name: &str) -> Option<Engine> {
        Engine::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(name))
    }

    /// The engine's name as [`Engine::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        }
    }

    /// The engine's adapter.
    pub fn adapter(self) -> &'static dyn EngineAdapter {
        match self {
            Engine::Vllm => &Vllm,
            Engine::Sglang => &Sglang,
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no engine the proxy reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine {name:?} (known: vllm, sglang)")]
pub struct UnknownEngine {
    pub name: String,
}

impl FromStr for Engine {
    type Err = UnknownEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Engine::parse(s).ok_or_else(|| UnknownEngine { name: s.into() })
    }
}

/// Reads `text` as `engine`'s `/metrics` exposition.
pub fn parse_metrics(engine: Engine, text: &str) -> Result<EngineMetrics, ParseError> {
    engine.adapter().parse_metrics(text)
}
