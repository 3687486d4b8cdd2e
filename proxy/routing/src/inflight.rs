//! The proxy's own requests on each endpoint, known exactly and at once.
//!
//! Scraped metrics lag by a scrape interval; the proxy's own dispatches do not. Recording each
//! request at dispatch, first token and completion means the very next decision already sees the
//! prefill work this sidecar just queued, which is what keeps one sidecar from piling a burst onto
//! one endpoint between scrapes.

use crate::time::Time;
use std::time::Duration;

/// One of this proxy's requests on an endpoint.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct InFlightRequest {
    pub id: u64,
    pub dispatched_at: Time,
    pub prompt_tokens: u32,
    /// Prompt tokens the endpoint was predicted to prefill (not in its prefix cache).
    pub uncached_tokens: u32,
    /// When the first token arrived, once it has.
    pub first_token_at: Option<Time>,
    /// When the latest streamed token arrived (see [`InFlight::token`]); `None` for a request whose
    /// tokens the proxy does not see one by one (a non-stream answer).
    pub last_token_at: Option<Time>,
    /// The part of the TTFT predicted at dispatch that was not this request's own prefill (queue
    /// wait, decode interference and overhead), in seconds; used to learn the prefill rate.
    pub predicted_non_prefill_s: f64,
    /// The KV-pressure factor applied at dispatch.
    pub kv_pressure_factor: f64,
    /// The uncorrected TTFT predicted at dispatch, in seconds (used to learn the correction).
    pub predicted_raw_ttft_s: f64,
    /// The uncorrected wait predicted at dispatch, in seconds (the part the correction scales).
    pub predicted_wait_s: f64,
    /// Whether this request's TTFT may teach the prefill rate: only when nothing was predicted at
    /// dispatch to queue ahead of it, the wait was not capacity-bound, and its predicted prefill
    /// was at least `rate_min_sample_steps` decode steps. Otherwise the TTFT is dominated by a
    /// wait the rate does not explain, or by the phase of the step it arrived in, and either would
    /// be read as a (wrong) prefill rate.
    pub teaches_rate: bool,
    /// When its prefill was predicted (at dispatch) to begin: after the predicted wait.
    pub prefill_expected_at: Time,
}

impl InFlightRequest {
    /// The ledger entry of request `id` sent at `now` on `p`, the prediction it was sent on.
    pub fn of_prediction(
        id: u64,
        now: Time,
        p: &crate::predict::Prediction,
        config: &crate::predict::PredictConfig,
    ) -> Self {
        Self {
            id,
            dispatched_at: now,
            prompt_tokens: p.prompt_tokens,
            uncached_tokens: p.uncached_tokens,
            first_token_at: None,
            last_token_at: None,
            // Learning reads the undated queue, as the selection does (`Prediction::undated`).
            predicted_non_prefill_s: p.undated.raw_ttft_s
                - p.prefill_s * p.undated.kv_pressure_factor,
            kv_pressure_factor: p.undated.kv_pressure_factor,
            predicted_raw_ttft_s: p.undated.raw_ttft_s,
            predicted_wait_s: p.undated.wait_s,
            teaches_rate: !p.undated.capacity_bound
                && p.undated.queued_prefill_tokens == 0.0
                && p.prefill_s >= config.rate_min_sample_steps * p.decode_step_s,
            prefill_expected_at: now
                + Duration::try_from_secs_f64(p.dated.wait_s * p.correction).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
impl InFlightRequest {
    /// A request of `uncached` prompt tokens (none cached) sent at `at`, its prefill predicted to
    /// begin then, no first token yet.
    pub(crate) fn sent(id: u64, at: Time, uncached: u32) -> Self {
        Self {
            id,
            dispatched_at: at,
            prompt_tokens: uncached,
            uncached_tokens: uncached,
            first_token_at: None,
            last_token_at: None,
            predicted_non_prefill_s: 0.0,
            kv_pressure_factor: 1.0,
            predicted_raw_ttft_s: 0.1,
            predicted_wait_s: 0.0,
            teaches_rate: true,
            prefill_expected_at: at,
        }
    }
}

/// What the tracker learned when a request's first token arrived.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct FirstToken {
    pub request: InFlightRequest,
    pub ttft: Duration,
}

/// An empty ledger to borrow where no notices are kept.
pub static NONE: InFlight = InFlight {
    requests: Vec::new(),
    queued_prefill_tokens: 0,
    awaiting_first_token: 0,
};

/// The in-flight requests of one endpoint.
#[derive(Clone, Debug, Default)]
pub struct InFlight {
    requests: Vec<InFlightRequest>,
    queued_prefill_tokens: u64,
    awaiting_first_token: u32,
}

impl InFlight {
    /// Records a dispatched request; its uncached tokens join the queued prefill work at once.
    pub fn dispatch(&mut self, request: InFlightRequest) {
        if request.first_token_at.is_none() {
            self.queued_prefill_tokens += u64::from(request.uncached_tokens);
            self.awaiting_first_token += 1;
        }
        self.requests.push(request);
    }

    /// Records the first token of request `id` at `at`: its prefill work leaves the queue. Returns
    /// `None` if the request is unknown or already had its first token.
    pub fn first_token(&mut self, id: u64, at: Time) -> Option<FirstToken> {
        let r = self.requests.iter_mut().find(|r| r.id == id)?;
        if r.first_token_at.is_some() {
            return None;
        }
        r.first_token_at = Some(at);
        self.queued_prefill_tokens -= u64::from(r.uncached_tokens);
        self.awaiting_first_token -= 1;
        Some(FirstToken {
            request: *r,
            ttft: at.saturating_since(r.dispatched_at),
        })
    }

    /// Records that a streamed token of request `id` (the first included) arrived at `at`. vLLM
    /// emits every running request's token when an engine step ends, so the latest such time over
    /// the requests still decoding is when the endpoint's last step ended. Returns whether `id` is
    /// known.
    pub fn token(&mut self, id: u64, at: Time) -> bool {
        let Some(r) = self.requests.iter_mut().find(|r| r.id == id) else {
            return false;
        };
        if r.last_token_at.is_none_or(|t| t < at) {
            r.last_token_at = Some(at);
        }
        true
    }

    /// When the endpoint's latest engine step ended, as the streams of this proxy's requests still
    /// decoding there saw it: `None` when none of them is streaming tokens.
    pub fn last_step_end(&self) -> Option<Time> {
        self.requests
            .iter()
            .filter(|r| r.first_token_at.is_some())
            .filter_map(|r| r.last_token_at)
            .max()
    }

    /// When the oldest request here that has had its first token was dispatched, among those
    /// whose tokens are seen one by one (`streaming`) or all of them.
    pub fn oldest_decoding_dispatch(&self, streaming: bool) -> Option<Time> {
        self.requests
            .iter()
            .filter(|r| r.first_token_at.is_some() && (!streaming || r.last_token_at.is_some()))
            .map(|r| r.dispatched_at)
            .min()
    }

    /// Forgets every request dispatched before `at` (other proxies' requests whose completion
    /// notice was lost).
    pub fn retain_since(&mut self, at: Time) {
        let stale: Vec<u64> = self
            .requests
            .iter()
            .filter(|r| r.dispatched_at < at)
            .map(|r| r.id)
            .collect();
        for id in stale {
            self.complete(id);
        }
    }

    /// Forgets request `id` (finished, failed or cancelled). Returns it, or `None` if unknown.
    pub fn complete(&mut self, id: u64) -> Option<InFlightRequest> {
        let ix = self.requests.iter().position(|r| r.id == id)?;
        let r = self.requests.swap_remove(ix);
        if r.first_token_at.is_none() {
            self.queued_prefill_tokens -= u64::from(r.uncached_tokens);
            self.awaiting_first_token -= 1;
        }
        Some(r)
    }

    /// Uncached prompt tokens of own requests still waiting for their first token.
    pub fn queued_prefill_tokens(&self) -> u64 {
        self.queued_prefill_tokens
    }

    /// Own requests still waiting for their first token.
    pub fn awaiting_first_token(&self) -> u32 {
        self.awaiting_first_token
    }

    /// Own requests past their first token (decoding).
    pub fn decoding(&self) -> u32 {
        self.pending() - self.awaiting_first_token
    }

    /// All own requests not yet complete.
    pub fn pending(&self) -> u32 {
        u32::try_from(self.requests.len()).unwrap_or(u32::MAX)
    }

    /// Own requests that the endpoint would have counted as waiting or prefilling at `at`: dispatched
    /// by then and without a first token by then. A scrape taken at `at` already includes these, so
    /// they must not be counted twice.
    pub fn awaiting_first_token_as_of(&self, at: Time) -> u32 {
        let n = self
            .requests
            .iter()
            .filter(|r| r.dispatched_at <= at && r.first_token_at.is_none_or(|t| t > at))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Prompt tokens (cached ones included) of the own requests awaiting their first token at `at`.
    pub fn prompt_tokens_awaiting_as_of(&self, at: Time) -> u64 {
        self.requests
            .iter()
            .filter(|r| r.dispatched_at <= at && r.first_token_at.is_none_or(|t| t > at))
            .map(|r| u64::from(r.prompt_tokens))
            .sum()
    }

    /// Uncached prompt tokens of the own requests still awaiting their first token that were
    /// dispatched by `at`.
    pub fn queued_prefill_tokens_dispatched_by(&self, at: Time) -> u64 {
        self.requests
            .iter()
            .filter(|r| r.dispatched_at <= at && r.first_token_at.is_none())
            .map(|r| u64::from(r.uncached_tokens))
            .sum()
    }

    /// Uncached prompt tokens of the own requests dispatched by `at` and awaiting their first
    /// token that were still to prefill at `at` by the schedule predicted at dispatch: each one's
    /// prefill began at its `prefill_expected_at` and has gone on at `tokens_per_second` since.
    pub fn scheduled_prefill_tokens_left(&self, at: Time, tokens_per_second: f64) -> f64 {
        self.requests
            .iter()
            .filter(|r| r.dispatched_at <= at && r.first_token_at.is_none())
            .map(|r| {
                let done =
                    at.saturating_since(r.prefill_expected_at).as_secs_f64() * tokens_per_second;
                (f64::from(r.uncached_tokens) - done).max(0.0)
            })
            .sum()
    }

    /// Own requests that were decoding at `at`.
    pub fn decoding_as_of(&self, at: Time) -> u32 {
        let n = self
            .requests
            .iter()
            .filter(|r| r.first_token_at.is_some_and(|t| t <= at))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The requests, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &InFlightRequest> {
        self.requests.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: u64, at: f64, uncached: u32) -> InFlightRequest {
        InFlightRequest {
            prompt_tokens: uncached + 100,
            prefill_expected_at: Time::ZERO,
            ..InFlightRequest::sent(id, Time::from_secs_f64(at), uncached)
        }
    }

    #[test]
    fn queued_work_follows_dispatch_first_token_and_completion() {
        let mut f = InFlight::default();
        f.dispatch(req(1, 0.0, 500));
        f.dispatch(req(2, 0.1, 300));
        assert_eq!(f.queued_prefill_tokens(), 800);
        assert_eq!(
            (f.awaiting_first_token(), f.decoding(), f.pending()),
            (2, 0, 2)
        );

        let ft = f.first_token(1, Time::from_secs_f64(0.4)).unwrap();
        assert_eq!(ft.ttft, Duration::from_millis(400));
        assert_eq!(f.queued_prefill_tokens(), 300);
        assert_eq!((f.awaiting_first_token(), f.decoding()), (1, 1));
        assert_eq!(f.first_token(1, Time::from_secs_f64(0.5)), None);

        // Request 2 fails before its first token: its queued work leaves too.
        assert_eq!(f.complete(2).map(|r| r.id), Some(2));
        assert_eq!(f.queued_prefill_tokens(), 0);
        assert_eq!(f.complete(1).map(|r| r.id), Some(1));
        assert_eq!((f.pending(), f.complete(1)), (0, None));
    }

    #[test]
    fn the_last_step_end_is_the_latest_token_of_a_stream_still_decoding() {
        let t = Time::from_secs_f64;
        let mut f = InFlight::default();
        f.dispatch(req(1, 0.0, 10));
        f.dispatch(req(2, 0.0, 10));
        f.dispatch(req(3, 0.0, 10));
        assert_eq!(f.last_step_end(), None);
        // Request 1 streams: its first token and a later one; an older report changes nothing.
        f.first_token(1, t(0.2));
        assert!(f.token(1, t(0.2)) && f.token(1, t(0.22)) && f.token(1, t(0.21)));
        assert_eq!(f.last_step_end(), Some(t(0.22)));
        // Request 2 is a non-stream answer: decoding, but never reports a token.
        f.first_token(2, t(0.3));
        assert_eq!(f.last_step_end(), Some(t(0.22)));
        f.first_token(3, t(0.3));
        f.token(3, t(0.3));
        assert_eq!(f.last_step_end(), Some(t(0.3)));
        // Once the streams end, nothing says when the endpoint's steps end.
        f.complete(1);
        f.complete(3);
        assert_eq!(f.last_step_end(), None);
        assert!(!f.token(9, t(1.0)));
    }

    #[test]
    fn as_of_counts_only_what_a_scrape_at_that_time_saw() {
        let mut f = InFlight::default();
        f.dispatch(req(1, 0.0, 10));
        f.dispatch(req(2, 1.0, 10));
        f.first_token(1, Time::from_secs_f64(0.5));
        // At 0.2 s: request 1 waiting, request 2 not yet sent.
        assert_eq!(f.awaiting_first_token_as_of(Time::from_secs_f64(0.2)), 1);
        assert_eq!(f.decoding_as_of(Time::from_secs_f64(0.2)), 0);
        // At 1.5 s: request 1 decoding, request 2 waiting.
        assert_eq!(f.awaiting_first_token_as_of(Time::from_secs_f64(1.5)), 1);
        assert_eq!(f.decoding_as_of(Time::from_secs_f64(1.5)), 1);
    }

    #[test]
    fn queued_work_can_be_dated_by_dispatch_and_by_schedule() {
        let t = Time::from_secs_f64;
        let mut f = InFlight::default();
        f.dispatch(InFlightRequest {
            prefill_expected_at: t(0.2),
            ..req(1, 0.0, 1_000)
        });
        f.dispatch(InFlightRequest {
            prefill_expected_at: t(0.3),
            ..req(2, 0.1, 500)
        });
        f.dispatch(req(3, 0.2, 40));
        f.first_token(3, t(0.25));
        // Sent by 0.05 and still waiting: request 1 only (3 has its first token).
        assert_eq!(f.queued_prefill_tokens_dispatched_by(t(0.05)), 1_000);
        assert_eq!(f.queued_prefill_tokens_dispatched_by(t(0.2)), 1_500);
        // At 0.35 s and 10,000 tokens/s by the schedule: request 1 began at 0.2 (1,500 done, so
        // none left), request 2 at 0.3 (500 done, none left); at 0.25, 500 of 1 and all of 2.
        assert_eq!(
            f.scheduled_prefill_tokens_left(t(0.25), 10_000.0),
            500.0 + 500.0
        );
        assert_eq!(f.scheduled_prefill_tokens_left(t(0.35), 10_000.0), 0.0);
        // As of a time, only the requests sent by then count: at 0.05, request 1 alone.
        assert_eq!(f.scheduled_prefill_tokens_left(t(0.05), 10_000.0), 1_000.0);
    }
}
