//! Evaluation of the shipped complexity and family tags, kept out of the runtime crate.
//!
//! `kinference-classify` runs on every request and holds only what scoring needs. Fitting the
//! weights is offline Python (`scripts/classify/evaluate.py`, which also runs the
//! leave-one-benchmark-out protocol, since that refits per fold); this crate measures what the
//! Rust classifier itself answers on the same labelled rows ([`rows`]) with the routing metrics
//! of [`metrics`], so the recorded numbers are the shipped code's, and checks that it answers as
//! the Python reference does. The `kinference-classify-eval` binary runs it (`just classify-eval`).

pub mod metrics;
pub mod rows;
