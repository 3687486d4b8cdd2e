//! The routing decision: per-endpoint TTFT prediction from cache overlap, queue and peak-EWMA, and
//! selection.
//!
//! A pure library: no I/O, no clock, no Kubernetes or protobuf types. The caller passes time in, so
//! the proxy (wall time), the fleet benchmark (virtual time) and the tests (a paused clock) drive the
//! same code. See `docs/ttft-model.md` for every formula.

#![forbid(unsafe_code)]

pub mod accrual;
pub mod affinity;
pub mod decision;
pub mod endpoint;
pub mod ewma;
pub mod fallback;
pub mod inflight;
pub mod notice;
pub mod predict;
pub mod prefix;
pub mod router;
pub mod select;
pub mod time;

pub use self::{
    decision::{Decision, Reason},
    endpoint::{CacheConfig, EndpointId, EndpointMeta, ModelName, Observed, Scrape, Signals},
    notice::Notice,
    predict::{ModelPrior, PredictConfig},
    prefix::{ApproxConfig, BlockHasher, KvEvent, PromptBlocks},
    router::{DispatchHandle, Request, Router, RouterConfig, RouterError},
    time::Time,
};
