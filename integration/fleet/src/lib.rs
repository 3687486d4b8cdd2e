//! The fleet benchmark: many simulated vLLM replicas, many sidecars, one virtual clock.
//!
//! Every claim Kinference makes about routing quality has to come from a side-by-side run of its
//! own balancing code against the strategies of the other systems in this field, on the same
//! replicas, the same prompts and the same arrival times. This crate is that run: a discrete-event
//! simulation in which replicas are `kinference-sim` engines, routers see metrics only as a scraper
//! would (stale by up to one scrape interval) and KV events only after a delivery delay, and each
//! sidecar keeps its own view of the fleet.

#![forbid(unsafe_code)]

pub mod arm;
pub mod des;
pub mod fleet;
pub mod priors;
pub mod report;
pub mod run;
pub mod sidecar;
pub mod strategy;
pub mod suite;
pub mod tune;
pub mod workload;

pub use self::{
    arm::Arm,
    report::CellResult,
    run::{RunConfig, run_cell},
    strategy::{Pick, Router, StrategyKind},
    workload::{Workload, WorkloadKind},
};
