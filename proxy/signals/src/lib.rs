//! The proxy's signal collectors: an engine's `/metrics` (vLLM's or SGLang's) and vLLM's KV
//! events.
//!
//! The routing core predicts time to first token from what each endpoint reports: its queue and
//! KV-cache usage (scraped from Prometheus text, read by one adapter per engine, [`engine`]) and, in precise mode, the blocks its prefix cache
//! holds (from KV events over ZMQ). This crate turns those wire formats into the routing core's
//! inputs, tolerating the metric renames across vLLM versions, and reports every failure as a typed
//! error so the caller can age or clear that endpoint's signals. [`tokenizer`] computes a prompt's
//! block hashes in a pool's own hash space, so the blocks KV events report can be matched.

#![forbid(unsafe_code)]

pub mod engine;
#[doc(hidden)]
pub mod fuzzing;
pub mod kv_events;
pub mod metrics;
pub mod scrape;
pub mod tokenizer;

pub use self::{
    engine::{Engine, EngineAdapter, EngineMetrics, UnknownEngine, parse_metrics},
    kv_events::{KvEventError, KvEventsConfig, subscribe_kv_events, subscribe_kv_events_with},
    metrics::{ParseError, VllmMetrics, parse_vllm_metrics},
    scrape::{ScrapeError, Scraper},
    tokenizer::{PromptRef, Tokenizer},
};
