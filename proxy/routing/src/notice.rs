//! Notices of other proxies' requests: what the signal plane tells a sidecar that its scrapes
//! cannot yet.
//!
//! A sidecar knows its own requests exactly and at once ([`crate::inflight`]), and everyone
//! else's only through the engine's gauges, a scrape interval late. In a mesh, the requests other
//! sidecars sent in that interval are the largest error the prediction has left (issue 21): every
//! sidecar sees the same endpoint idle and sends to it in the same instant. A notice says, at
//! dispatch, first token and completion, what another proxy did; the router keeps them per
//! endpoint as a second in-flight ledger, and the prediction counts each noticed request as it
//! counts an own one: in full until its first token, and taken out of the gauges' estimate of
//! unknown clients' work when a reading already includes it (so it is counted once). A noticed
//! prompt still queued counts as pending prefix ([`crate::Router::observe_notice_prompt`]).

//!
//! A dispatch notice may also carry what the sender predicted ([`Notice::predicted`]); the first
//! token of such a request then teaches the receiver's prefill rate and correction exactly as one
//! of its own would. Each sidecar otherwise learns an endpoint only from its own share of the
//! requests, starting from the platform's (wrong) prior: with N sidecars, N times fewer samples.

use crate::{inflight::InFlightRequest, predict::PredictConfig, predict::Prediction, time::Time};

/// One thing another proxy did on an endpoint.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Notice {
    /// It sent a request (its `id` in the caller's key space: notices of two proxies never
    /// collide, see [`crate::Router::observe_notice`]); its uncached tokens are the work it
    /// queued, and its predicted figures, when it sent them, what its first token teaches.
    Dispatch(InFlightRequest),
    /// Request `id` had its first token at `at`.
    FirstToken { id: u64, at: Time },
    /// Request `id` completed (or failed) at `at`: one that had its first token teaches the
    /// endpoint's service time, as an own one does.
    Complete { id: u64, at: Time },
    /// An engine step of the endpoint ended at `at`, as a token of the sender's stream of
    /// request `id` showed ([`crate::Router::step_notice`]): while that request decodes, it
    /// times the step in progress for sidecars with no stream there (a long step is a prefill
    /// chunk working through the queue).
    Step { id: u64, at: Time },
}

impl Notice {
    /// A dispatch of `uncached_tokens` of `prompt_tokens` at `at`, without the sender's
    /// prediction (its first token teaches nothing).
    pub fn dispatch(id: u64, at: Time, prompt_tokens: u32, uncached_tokens: u32) -> Self {
        Self::Dispatch(InFlightRequest {
            id,
            dispatched_at: at,
            prompt_tokens,
            uncached_tokens,
            first_token_at: None,
            last_token_at: None,
            predicted_non_prefill_s: 0.0,
            kv_pressure_factor: 1.0,
            predicted_raw_ttft_s: 0.0,
            predicted_wait_s: 0.0,
            teaches_rate: false,
            prefill_expected_at: at,
        })
    }

    /// A dispatch at `at` with the sender's `prediction`, as the sender's own ledger holds it.
    pub fn predicted(id: u64, at: Time, prediction: &Prediction, config: &PredictConfig) -> Self {
        Self::Dispatch(InFlightRequest::of_prediction(id, at, prediction, config))
    }
}
