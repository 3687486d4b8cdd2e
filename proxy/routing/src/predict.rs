//! The TTFT predictor: how long until endpoint `e` would return the first token of request `r`.
//!
//! `ttft = wait × correction + (prefill + steps) × kv_pressure + overhead`, in
//! seconds, where the wait is the larger of the prefill-bound wait (queued prefill tokens over a
//! prefill rate in tokens per second) and the KV-capacity-bound wait (completions needed before
//! the prompt fits, paced by the running batch and a learned service time). Selection adds the
//! delay the request would impose on the requests queued behind it. Every formula, default and the
//! reasoning behind it is in `docs/ttft-model.md`; this module is that document in code, and
//! returns every input it used (with its age) so a decision can be explained.

use crate::{
    endpoint::{Observed, Signals},
    inflight::InFlight,
    prefix::PrefixSource,
    time::Time,
};
use std::time::Duration;

/// Per-model performance priors (from the controller), the starting point before anything is learned.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelPrior {
    /// Prompt tokens prefilled per second on one endpoint.
    pub prefill_tokens_per_second: f64,
    /// Time of one decode step at a small batch, in seconds (the model's time per output token).
    pub time_per_output_token_s: f64,
    /// Extra decode-step time per running sequence, in seconds.
    pub decode_step_per_seq_s: f64,
    /// vLLM's `max_num_batched_tokens`: tokens one engine step can carry (the chunked-prefill budget).
    pub max_num_batched_tokens: u32,
    /// Fixed per-request cost (HTTP, tokenization, scheduling, sampling the first token), in seconds.
    pub overhead_s: f64,
    /// Attention's cost per (query, key) token pair of prefill, in seconds: prefilling `u` new
    /// tokens after `c` cached ones computes about `u × c + u² / 2` pairs, which makes long
    /// prompts superlinear in their length. 0 treats prefill as linear.
    pub prefill_attention_pair_s: f64,
}

impl Default for ModelPrior {
    fn default() -> Self {
        Self {
            prefill_tokens_per_second: 10_000.0,
            time_per_output_token_s: 0.02,
            decode_step_per_seq_s: 0.000_1,
            max_num_batched_tokens: 8_192,
            overhead_s: 0.01,
            prefill_attention_pair_s: 0.0,
        }
    }
}

/// Tunables of the predictor (balancer settings from the controller).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PredictConfig {
    /// Reported signals older than this are not used.
    pub freshness_budget: Duration,
    /// KV-cache usage fraction above which preemption risk raises the estimate.
    pub kv_pressure_threshold: f64,
    /// How much the estimate rises at 100 % KV usage (`factor = 1 + gain` there).
    pub kv_pressure_gain: f64,
    /// Bounds of the correction of the wait (observed wait / predicted wait).
    pub correction_min: f64,
    pub correction_max: f64,
    /// A first token teaches the correction only when the wait was at least this fraction of the
    /// predicted TTFT (otherwise the observed wait is mostly noise of the prefill and overhead).
    pub correction_min_wait_fraction: f64,
    /// Decay time constant of the correction peak-EWMA.
    pub correction_tau: Duration,
    /// Weight of one new prefill-rate sample.
    pub rate_alpha: f64,
    /// Requests with fewer uncached tokens do not teach the prefill rate (too much noise).
    pub rate_min_sample_tokens: u32,
    /// Nor do requests whose predicted prefill is shorter than this many decode steps: a first
    /// token's time carries up to a step of unknown phase (the step in progress when the request
    /// arrived), so a shorter prefill is mostly that noise, and a mean of `tokens / noisy
    /// seconds` is biased high (the mean of a reciprocal exceeds the reciprocal of the mean).
    pub rate_min_sample_steps: f64,
    /// A sample is clamped to within this factor of the current rate.
    pub rate_max_step_factor: f64,
    /// Output tokens assumed per request before an endpoint has completed any of this proxy's
    /// requests: sets the prior service time of the capacity-bound wait.
    pub default_output_tokens: f64,
    /// Weight of one observed service time (first token to completion) in its running mean.
    pub service_alpha: f64,
    /// Weight of the queue cost in the selection cost (0 selects on predicted TTFT alone).
    pub queue_cost_weight: f64,
    /// Share of others' in-progress prefill (prompt tokens being prefilled at the scrape, less this
    /// proxy's own, discounted by the hit fraction) still left when a request arrives: the
    /// expected remainder of work that is known to be there. 0 ignores it.
    pub prefilling_remaining_fraction: f64,
    /// Weight of the duplicate-prefix cost in the selection cost: the prompt tokens another
    /// candidate of the same model has cached but this one would prefill again are charged once
    /// more at this endpoint's rate (`miss_cost_s = weight × duplicate_tokens / rate`), for the
    /// second copy of the prefix they put in the fleet's KV cache (which evicts other prefixes)
    /// and the KV a hit would have shared with the running requests. 0 turns it off.
    pub miss_cost_weight: f64,
    /// When the step in progress has already run longer than a decode step (a prefill chunk), the
    /// expected rest of it as a fraction of how long it has run.
    pub long_step_residual_fraction: f64,
    /// Weight of staleness in the selection cost: an endpoint whose scraped queue is older than
    /// the freshness budget is charged `weight ×` the time past it (`staleness_cost_s`), since
    /// what it holds now is unknown (a wedged endpoint's scrapes stop first). 0 turns it off.
    pub staleness_cost_weight: f64,
    /// Whether a proxy tells the others (step notices through the signal service) when an
    /// endpoint's engine step ended, from the tokens of its oldest stream there: what times a
    /// long step (a prefill chunk) for sidecars without a stream of their own there.
    pub step_notices: bool,
    /// How often, at most, it does.
    pub step_report_interval: Duration,
}

impl Default for PredictConfig {
    fn default() -> Self {
        Self {
            freshness_budget: Duration::from_millis(500),
            kv_pressure_threshold: 0.9,
            kv_pressure_gain: 1.0,
            correction_min: 0.5,
            correction_max: 4.0,
            correction_min_wait_fraction: 0.5,
            correction_tau: crate::ewma::DEFAULT_TAU,
            rate_alpha: 0.2,
            rate_min_sample_tokens: 64,
            rate_min_sample_steps: 2.0,
            rate_max_step_factor: 10.0,
            default_output_tokens: 256.0,
            service_alpha: 0.2,
            queue_cost_weight: 1.0,
            prefilling_remaining_fraction: 0.5,
            miss_cost_weight: 3.0,
            long_step_residual_fraction: 0.25,
            staleness_cost_weight: 1.0,
            step_notices: true,
            step_report_interval: Duration::from_millis(10),
        }
    }
}

/// An endpoint's prefill rate, learned online from its first tokens, starting from the model prior.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct PrefillRate {
    tokens_per_second: f64,
    samples: u64,
}

impl PrefillRate {
    /// Starts at the prior.
    pub fn new(prior: &ModelPrior) -> Self {
        Self {
            tokens_per_second: prior.prefill_tokens_per_second.max(1.0),
            samples: 0,
        }
    }

    /// The current estimate, in tokens per second.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens_per_second
    }

    /// Samples learned from so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Learns from one request: `uncached_tokens` were prefilled in `prefill_s` seconds (its TTFT less
    /// the wait and overhead predicted at dispatch). Returns whether the sample was used.
    pub fn observe(
        &mut self,
        uncached_tokens: u32,
        prefill_s: f64,
        config: &PredictConfig,
    ) -> bool {
        if uncached_tokens < config.rate_min_sample_tokens || prefill_s.is_nan() || prefill_s <= 0.0
        {
            return false;
        }
        let sample = f64::from(uncached_tokens) / prefill_s;
        let bound = config.rate_max_step_factor.max(1.0);
        let sample = sample.clamp(
            self.tokens_per_second / bound,
            self.tokens_per_second * bound,
        );
        self.tokens_per_second += config.rate_alpha * (sample - self.tokens_per_second);
        self.samples += 1;
        true
    }
}

/// How long one of this proxy's requests stays on an endpoint after its first token (decoding, and
/// so holding KV blocks), learned online from completions. With the reported running batch it gives
/// the endpoint's completion rate, which paces a KV-capacity-bound queue.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct ServiceTime {
    mean_s: f64,
    samples: u64,
}

impl ServiceTime {
    /// The learned mean, in seconds, once anything has been observed.
    pub fn mean_s(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.mean_s)
    }

    /// Samples learned from so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Learns from one request that decoded for `decode_s` seconds (first token to completion).
    /// The first sample is taken as is; later ones move the mean by `service_alpha`.
    pub fn observe(&mut self, decode_s: f64, config: &PredictConfig) -> bool {
        if !decode_s.is_finite() || decode_s <= 0.0 {
            return false;
        }
        self.mean_s = if self.samples == 0 {
            decode_s
        } else {
            self.mean_s + config.service_alpha * (decode_s - self.mean_s)
        };
        self.samples += 1;
        true
    }
}

/// One reported signal as the predictor saw it.
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize)]
pub struct SignalInput {
    pub value: f64,
    pub age_s: f64,
    /// Whether it was within the freshness budget and so used.
    pub used: bool,
}

impl SignalInput {
    fn of<T: Copy + Into<f64>>(o: &Observed<T>, now: Time, budget: Duration) -> Self {
        Self {
            value: o.value.into(),
            age_s: o.age(now).as_secs_f64(),
            used: o.is_fresh(now, budget),
        }
    }
}

/// What the predictor needs to know about one endpoint for one request.
#[derive(Copy, Clone, Debug)]
pub struct EndpointView<'a> {
    pub signals: &'a Signals,
    pub inflight: &'a InFlight,
    /// Other proxies' requests on the endpoint, from notices ([`crate::notice`];
    /// [`crate::inflight::NONE`] without them).
    pub foreign: &'a InFlight,
    pub prior: &'a ModelPrior,
    pub prefill_tokens_per_second: f64,
    /// The correction peak-EWMA at `now` (clamped here).
    pub correction: f64,
    /// Mean prompt tokens of requests this proxy has seen (stands in for other clients' requests).
    pub mean_prompt_tokens: f64,
    /// The endpoint's learned service time (first token to completion), if any completion has been
    /// observed; otherwise the prior `default_output_tokens × decode step` is used.
    pub mean_service_s: Option<f64>,
}

/// A prediction and every input it was made from.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Prediction {
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub uncached_tokens: u32,
    pub prefix_source: Option<PrefixSource>,
    pub own_queued_prefill_tokens: u64,
    pub own_awaiting_first_token: u32,
    pub own_decoding: u32,
    pub reported_waiting: Option<SignalInput>,
    pub reported_running: Option<SignalInput>,
    pub kv_cache_usage: Option<SignalInput>,
    /// `GET /load`: requests the endpoint's API server holds (counted on arrival).
    pub server_load: Option<SignalInput>,
    /// `server_load − waiting − running`: requests that arrived during the engine step in
    /// progress, which the scheduler's gauges show only once it ends (0 without a fresh load).
    pub unpublished_requests: u32,
    /// Reported waiting and unpublished requests that are not this proxy's own nor noticed.
    pub other_waiting_requests: u32,
    /// Estimated uncached tokens of each of those.
    pub other_request_tokens: f64,
    /// Others' uncached prompt tokens still to prefill from requests prefilling at the scrape
    /// (`prefilling_tokens` less own, × (1 − hit fraction) × `prefilling_remaining_fraction`).
    pub others_prefilling_tokens: f64,
    /// Others' waiting and prefilling tokens as of the scrape, less what the engine has prefilled
    /// since (scrape age × rate).
    pub others_queued_tokens: f64,
    /// Known queued tokens still to prefill (own and other proxies' noticed requests):
    /// `own_queued_prefill_tokens + foreign_queued_tokens` less what the engine has done of
    /// them, by the long step in progress or, without one, by the schedule predicted when each
    /// was sent.
    pub own_queued_left_tokens: f64,
    /// Other proxies' uncached tokens here awaiting their first token, from notices
    /// ([`crate::notice`]), counted in full as own ones are; 0 without them.
    pub foreign_queued_tokens: f64,
    pub running_seqs: u32,
    pub prefill_tokens_per_second: f64,
    /// KV tokens free at the endpoint (`(1 − usage) × capacity`), when usage and capacity are known.
    pub kv_free_tokens: Option<f64>,
    /// Seconds one running request stays after its first token (learned, or the prior).
    pub service_s: f64,
    pub prefill_s: f64,
    /// Attention's superlinear share of this request's prefill: `prefill_attention_pair_s ×
    /// (uncached × cached + uncached² / 2)`.
    pub attention_s: f64,
    /// How long the engine step in progress has run: the time since the latest token of this
    /// proxy's streams decoding on the endpoint (`None` without one).
    pub step_elapsed_s: Option<f64>,
    /// One decode step at the running batch: `time_per_output_token_s + running ×
    /// decode_step_per_seq_s`.
    pub decode_step_s: f64,
    pub overhead_s: f64,
    pub correction: f64,
    /// The wait and TTFT with the queue dated by what the engine has under way (see
    /// [`predict`]): `dated.predicted_ttft_s` is the prediction the proxy reports. Serialized
    /// flat, as the prediction's own fields.
    #[serde(flatten)]
    pub dated: QueueWait,
    /// Requests queued at the endpoint that this one joins (reported others and own awaiting a
    /// first token): in a steady queue, about as many will queue behind it.
    pub queue_depth_requests: u32,
    /// Requests expected to wait behind this one: the queue depth, or the running batch when the
    /// prompt does not fit in the free KV blocks.
    pub requests_behind: u32,
    /// The delay this request's own work adds to each request behind it, in seconds: its prefill
    /// (prefill-bound) or its share of the completions that free KV (capacity-bound).
    pub marginal_delay_s: f64,
    /// `queue_cost_weight × marginal_delay_s × requests_behind`: what sending it here costs
    /// the requests queued behind it.
    pub queue_cost_s: f64,
    /// Prompt tokens the best-cached candidate of the same model holds that this one does not.
    pub duplicate_tokens: u32,
    /// `miss_cost_weight × duplicate_tokens / rate`: what a duplicate prefix costs the fleet's cache.
    pub miss_cost_s: f64,
    /// For a candidate of a model other than the requested one: `substitute_margin ×
    /// (ranked_ttft_s + queue_cost_s + miss_cost_s)`, so a substitute wins only when clearly
    /// faster; else 0.
    pub substitute_cost_s: f64,
    /// For an endpoint whose scraped queue is past the freshness budget:
    /// `staleness_cost_weight ×` the time past it; else 0.
    pub staleness_cost_s: f64,
    /// What the endpoint's recent failures cost: the share of its recent attempts that failed
    /// times the TTFT a retry elsewhere would add (set by the router; 0 without failures).
    pub failure_cost_s: f64,
    /// `ranked_ttft_s + queue_cost_s + miss_cost_s + staleness_cost_s + failure_cost_s +
    /// substitute_cost_s` (the ranked TTFT is the undated reading's): what the selection
    /// minimises.
    pub selection_cost_s: f64,
    /// How long ago the engine published what the scrapes read (the middle of the bracket the
    /// scrapes put around it), when they tell publications apart (`vllm:generation_tokens_total`
    /// scraped, the latest scrape within the freshness budget); at most the longest step there
    /// can be (an idle engine publishes nothing new, and has nothing to date).
    pub published_age_s: Option<f64>,
    /// The same prediction with the queue as the scrape shows it: others' work less what the
    /// engine did since the scrape, own queued work in full, and a long step's rest (timed by an
    /// own stream) a fraction of its length. The selection ranks by it (`ranked_ttft_s`) and the
    /// prefill rate and the correction learn from it.
    pub undated: QueueWait,
    /// Whether the endpoint's scraped queue (`num_requests_waiting`) was within the freshness budget.
    pub signals_fresh: bool,
}

/// Predicts the TTFT of a request of `prompt_tokens` tokens, `cached_tokens` of them already in the
/// endpoint's prefix cache, at `now`.
pub fn predict(
    view: &EndpointView<'_>,
    prompt_tokens: u32,
    cached: Option<(u64, PrefixSource)>,
    now: Time,
    config: &PredictConfig,
) -> Prediction {
    let budget = config.freshness_budget;
    // vLLM always computes at least the prompt's last token.
    let cached_tokens = cached.map_or(0, |(t, _)| {
        u32::try_from(t)
            .unwrap_or(u32::MAX)
            .min(prompt_tokens.saturating_sub(1))
    });
    let uncached_tokens = prompt_tokens - cached_tokens;
    let s = view.signals;
    let own = view.inflight;
    // Other proxies' requests, from notices: known one by one like our own, and counted like
    // them (see `crate::notice`). Only work nobody announced is left to the gauges' estimate.
    let foreign = view.foreign;
    let known_awaiting_as_of =
        |at: Time| own.awaiting_first_token_as_of(at) + foreign.awaiting_first_token_as_of(at);

    // Reported waiting requests not already counted among our own (as of the scrape).
    let reported_waiting = s
        .num_requests_waiting
        .map(|o| SignalInput::of(&o, now, budget));
    // Requests the API server holds that the scheduler's gauges do not show yet: they arrived
    // during the engine step in progress (`GET /load` counts on arrival, the gauges at step end).
    let server_load = s.server_load.map(|o| SignalInput::of(&o, now, budget));
    let unpublished_requests = match (
        s.server_load,
        s.num_requests_waiting,
        s.num_requests_running,
    ) {
        (Some(l), Some(w), Some(r)) if l.is_fresh(now, budget) && l.at >= w.at && l.at >= r.at => {
            l.value.saturating_sub(w.value.saturating_add(r.value))
        }
        _ => 0,
    };
    // A stale reading is kept as it was, never taken as an empty queue: an endpoint whose scrapes
    // stopped (a wedged one does) must not look idle. It is not drained by the time since either
    // (below), and the selection charges its age (`staleness_cost_s`).
    let other_waiting_requests = match s.num_requests_waiting {
        Some(o) if o.is_fresh(now, budget) => {
            let as_of = s
                .server_load
                .filter(|_| unpublished_requests > 0)
                .map_or(o.at, |l| l.at);
            (o.value + unpublished_requests).saturating_sub(known_awaiting_as_of(as_of))
        }
        Some(o) => o.value.saturating_sub(known_awaiting_as_of(o.at)),
        None => 0,
    };
    let hit_fraction = s.prefix_hit_fraction.map_or(0.0, |o| o.value);
    let other_request_tokens = view.mean_prompt_tokens.max(0.0) * (1.0 - hit_fraction);
    let own_queued = own.queued_prefill_tokens();
    let foreign_queued_tokens = foreign.queued_prefill_tokens() as f64;
    let known_queued = own_queued as f64 + foreign_queued_tokens;
    let rate = view.prefill_tokens_per_second.max(1.0);
    let others_prefilling_tokens = match s.prefilling_tokens {
        Some(o) if o.is_fresh(now, budget) => {
            o.value.saturating_sub(
                own.prompt_tokens_awaiting_as_of(o.at) + foreign.prompt_tokens_awaiting_as_of(o.at),
            ) as f64
                * (1.0 - hit_fraction)
                * config.prefilling_remaining_fraction.clamp(0.0, 1.0)
        }
        _ => 0.0,
    };
    let reported_running = s
        .num_requests_running
        .map(|o| SignalInput::of(&o, now, budget));
    let own_decoding = own.decoding();
    let known_decoding = own_decoding + foreign.decoding();
    let running_seqs = match s.num_requests_running {
        Some(o) => o.value.max(known_decoding),
        None => known_decoding,
    };
    let budget_tokens = f64::from(view.prior.max_num_batched_tokens.max(1));
    let decode_step_s = view.prior.time_per_output_token_s
        + f64::from(running_seqs) * view.prior.decode_step_per_seq_s;
    // How long the step in progress has run, when one of this proxy's streams decodes on the
    // endpoint (it gets a token at every step end). Longer than the longest step there can be (a
    // full chunk of prefill) means the stream is not keeping up (a slow reader, a preemption):
    // not a step time.
    let longest_step_s = 2.0 * (budget_tokens / rate + decode_step_s);
    // Without a later own token, another proxy's stream may have seen one: its step notices (at
    // most one per `step_report_interval`, from the proxy with the oldest stream there, each
    // marking a token of one of its requests, which counts while that request decodes) time the
    // step as an own stream does, except that a silence shorter than a decode step plus twice
    // that interval may be notices held back (one interval by the sender, about one by the
    // service, which passes on each endpoint's newest once per load interval): neither a decode
    // step's time nor a long step.
    let own_step_end = own.last_step_end();
    let reported_step_end = foreign
        .last_step_end()
        .filter(|t| own_step_end.is_none_or(|o| *t > o));
    let last_step_end = reported_step_end.or(own_step_end);
    let report_slack_s =
        reported_step_end.map_or(0.0, |_| 2.0 * config.step_report_interval.as_secs_f64());
    let step_elapsed_s = last_step_end
        .map(|t| now.saturating_since(t).as_secs_f64())
        .filter(|e| *e <= longest_step_s)
        .filter(|e| *e < decode_step_s || *e >= decode_step_s + report_slack_s);

    // Others' work as of the scrape, less what the engine has prefilled since (it works through
    // its queue at `rate` whoever's it is).
    let others_at_scrape =
        f64::from(other_waiting_requests) * other_request_tokens + others_prefilling_tokens;
    let scrape_age_s = s
        .num_requests_waiting
        .filter(|o| o.is_fresh(now, budget))
        .map_or(0.0, |o| o.age(now).as_secs_f64());
    // Own and other proxies' requests (from notices) count in full until their first token,
    // whenever they were sent: the gauges' share of them was taken out of the others above.
    let undated_queued = known_queued + (others_at_scrape - scrape_age_s * rate).max(0.0);
    let known_scheduled_left = |at: Time| {
        own.scheduled_prefill_tokens_left(at, rate)
            + foreign.scheduled_prefill_tokens_left(at, rate)
    };

    // The queue dated by what the engine has under way. vLLM publishes its gauges and counters when
    // a step ends, so a scrape reads the queue as the last step end left it: the engine has been
    // working through it since. When that was, the scrapes bracket (the publication's estimate:
    // the middle between the last scrape that read the state before and the first that read this
    // one). A long step (a prefill chunk) in progress began at the latest token of an own stream,
    // or, without one, at that publication when scrapes have read it unchanged for longer than a
    // decode step. The long step has been working through the queue it began with (others' work
    // first, as it was reported first) and then what the schedule (below) had left, when it
    // began, of the own requests sent before it; own requests sent since wait in full. Without a
    // long step, others' work is dated from the publication and each own request by the schedule
    // predicted when it was sent: its prefill began when its predicted wait ran out and has gone
    // on at the endpoint's rate.
    let publication = s
        .publication
        .filter(|p| now.saturating_since(p.still) <= budget);
    let published_age_s = publication.map(|p| {
        now.saturating_since(p.estimate())
            .as_secs_f64()
            .min(longest_step_s)
    });
    let scraped_long_step = publication
        .filter(|p| running_seqs > 0 && p.unchanged_for().as_secs_f64() >= decode_step_s)
        .and_then(|p| published_age_s.map(|age| (age, p.estimate())));
    let long_step = step_elapsed_s
        .filter(|e| *e >= decode_step_s)
        .zip(last_step_end)
        .or(scraped_long_step);
    let (others_queued_tokens, own_queued_left_tokens, long_step_work_left) = match long_step {
        Some((elapsed_s, began)) => {
            let others_at_start =
                (others_at_scrape - (scrape_age_s - elapsed_s).max(0.0) * rate).max(0.0);
            let own_at_start = known_scheduled_left(began);
            let done = elapsed_s * rate;
            let others_left = (others_at_start - done).max(0.0);
            let own_left = (own_at_start - (done - others_at_start).max(0.0)).max(0.0);
            let own_since = known_queued
                - (own.queued_prefill_tokens_dispatched_by(began)
                    + foreign.queued_prefill_tokens_dispatched_by(began)) as f64;
            (
                others_left,
                own_left + own_since,
                others_left + own_left > 0.0,
            )
        }
        None => (
            (others_at_scrape - published_age_s.unwrap_or(0.0).max(scrape_age_s) * rate).max(0.0),
            known_scheduled_left(now),
            false,
        ),
    };
    let queued_prefill_tokens = others_queued_tokens + own_queued_left_tokens;
    // What the engine reports waiting, in tokens, less what it could have prefilled since the
    // scrape: the floor of the dated queue when the endpoint is short of KV (below).
    let waiting_floor_tokens = match s.num_requests_waiting {
        Some(o) if o.is_fresh(now, budget) => {
            (f64::from(o.value) * other_request_tokens - scrape_age_s * rate).max(0.0)
        }
        _ => 0.0,
    };

    let residual = |queued: f64, long_step_accounted: bool, elapsed: Option<f64>| match elapsed {
        _ if running_seqs == 0 && queued <= 0.0 => 0.0,
        Some(e) if e < decode_step_s => decode_step_s - e,
        // The rest of the long step is the work it is doing, still in the queue above.
        Some(_) if long_step_accounted => 0.0,
        Some(e) => config.long_step_residual_fraction.max(0.0) * e,
        None => 0.5 * decode_step_s,
    };
    let step_residual_s = residual(
        queued_prefill_tokens,
        long_step_work_left,
        step_elapsed_s.or(long_step.map(|(e, _)| e)),
    );

    let kv_cache_usage = s.kv_cache_usage.map(|o| SignalInput::of(&o, now, budget));
    let usage = kv_cache_usage.filter(|u| u.used).map(|u| u.value);

    // Capacity-bound wait: the prompts queued ahead and this one must fit in the free KV blocks;
    // each completion frees a running request's blocks, and completions come at
    // `running / service_s` per second.
    let service_s = view.mean_service_s.unwrap_or_else(|| {
        config.default_output_tokens.max(0.0)
            * (view.prior.time_per_output_token_s
                + f64::from(running_seqs) * view.prior.decode_step_per_seq_s)
    });
    let capacity_tokens = s
        .cache_config
        .map(|o| o.value.capacity_tokens() as f64)
        .filter(|c| *c > 0.0);
    let kv_free_tokens = usage.zip(capacity_tokens).map(|(u, cap)| (1.0 - u) * cap);
    let tokens_per_running = match (usage, capacity_tokens) {
        (Some(u), Some(cap)) if running_seqs > 0 && u > 0.0 && service_s > 0.0 => {
            u * cap / f64::from(running_seqs)
        }
        _ => 0.0,
    };
    let prefill_s = f64::from(uncached_tokens) / rate;
    let (u, c) = (f64::from(uncached_tokens), f64::from(cached_tokens));
    let attention_s = view.prior.prefill_attention_pair_s.max(0.0) * (u * c + u * u / 2.0);
    let correction = view
        .correction
        .clamp(config.correction_min, config.correction_max);
    let overhead_s = view.prior.overhead_s;
    let engine = Engine {
        rate,
        uncached_tokens: f64::from(uncached_tokens),
        budget_tokens,
        decode_step_s,
        running_seqs,
        service_s,
        kv_free_tokens,
        tokens_per_running,
        usage,
        prefill_s,
        attention_s,
        overhead_s,
        correction,
        config,
    };
    // The dated queue assumes the engine prefills what it was sent at its rate, each own request
    // from when its predicted wait ran out. An endpoint short of KV admits nothing until running
    // requests complete: what it reports waiting then has not begun, whoever sent it, and the
    // dated queue is at least that (without the floor it looks empty once the schedule's
    // predicted waits run out, however long the real queue; see docs/ttft-model.md).
    let dated_queued = match kv_free_tokens {
        Some(free) if waiting_floor_tokens > free => {
            queued_prefill_tokens.max(waiting_floor_tokens)
        }
        _ => queued_prefill_tokens,
    };
    let dated = engine.wait(dated_queued, step_residual_s);
    let undated = engine.wait(
        undated_queued,
        residual(undated_queued, false, step_elapsed_s),
    );

    // What this request costs the ones that will queue behind it. In a steady queue about as many
    // will queue behind it as are ahead of it now. When its prompt does not fit in the free KV
    // blocks, every request admitted while it holds its blocks (about as many as are running, by
    // Little's law) waits for them too.
    let queue_depth_requests = other_waiting_requests
        .saturating_add(own.awaiting_first_token())
        .saturating_add(foreign.awaiting_first_token());
    // Selection parts: read from the undated queue, as the selection ranks by it.
    let kv_bound = undated.completions_ahead > 0;
    let requests_behind = if kv_bound {
        queue_depth_requests.max(running_seqs)
    } else {
        queue_depth_requests
    };
    let completion_share_s = if tokens_per_running > 0.0 && running_seqs > 0 {
        f64::from(uncached_tokens) / tokens_per_running * service_s / f64::from(running_seqs)
    } else {
        0.0
    };
    let marginal_delay_s = if kv_bound {
        completion_share_s.max(prefill_s + attention_s)
    } else {
        (prefill_s + attention_s) * undated.kv_pressure_factor
    };
    let queue_cost_s =
        config.queue_cost_weight.max(0.0) * marginal_delay_s * f64::from(requests_behind);
    let staleness_cost_s = s
        .num_requests_waiting
        .filter(|o| !o.is_fresh(now, budget))
        .map_or(0.0, |o| {
            config.staleness_cost_weight.max(0.0) * o.age(now).saturating_sub(budget).as_secs_f64()
        });

    Prediction {
        prompt_tokens,
        cached_tokens,
        uncached_tokens,
        prefix_source: cached.map(|(_, src)| src),
        own_queued_prefill_tokens: own_queued,
        own_awaiting_first_token: own.awaiting_first_token(),
        own_decoding,
        reported_waiting,
        reported_running,
        kv_cache_usage,
        server_load,
        unpublished_requests,
        other_waiting_requests,
        other_request_tokens,
        others_prefilling_tokens,
        others_queued_tokens,
        own_queued_left_tokens,
        foreign_queued_tokens,
        running_seqs,
        prefill_tokens_per_second: rate,
        kv_free_tokens,
        service_s,
        prefill_s,
        attention_s,
        step_elapsed_s,
        decode_step_s,
        overhead_s,
        correction,
        dated,
        queue_depth_requests,
        requests_behind,
        marginal_delay_s,
        queue_cost_s,
        duplicate_tokens: 0,
        miss_cost_s: 0.0,
        substitute_cost_s: 0.0,
        published_age_s,
        staleness_cost_s,
        failure_cost_s: 0.0,
        selection_cost_s: undated.predicted_ttft_s + queue_cost_s + staleness_cost_s,
        undated,
        signals_fresh: s
            .num_requests_waiting
            .is_some_and(|o| o.is_fresh(now, budget)),
    }
}

/// What the wait and the TTFT come to for one reading of the queue at the endpoint (a
/// prediction has two: [`Prediction::dated`] and [`Prediction::undated`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct QueueWait {
    /// Uncached prompt tokens to prefill before this request's.
    pub queued_prefill_tokens: f64,
    /// `queued_prefill_tokens / rate`: the wait if the endpoint is prefill-bound.
    pub prefill_wait_s: f64,
    /// Running requests that must complete before this one's prompt fits in the KV cache.
    pub completions_ahead: u32,
    /// `completions_ahead × service_s / running_seqs`: the wait if the endpoint is KV-bound.
    pub capacity_wait_s: f64,
    /// Whether the capacity-bound wait was the larger (then the KV factor is 1: the shortage is
    /// modelled by the wait itself).
    pub capacity_bound: bool,
    /// The expected rest of the engine step in progress when the request arrives, on a busy
    /// endpoint (running, queued or prefilling; else 0): a decode step less the time it has run;
    /// past a decode step (a prefill chunk is running) nothing while the queue holds the work
    /// that step began with (dated reading), else `long_step_residual_fraction ×` the time it
    /// has run; without a stream or scrapes to time it, half a decode step. Part of the wait.
    pub step_residual_s: f64,
    /// `max(prefill_wait_s, capacity_wait_s) + step_residual_s`.
    pub wait_s: f64,
    /// The fixed and decode cost of the engine steps that carry the queued prefill and this
    /// one's: `ceil((queued + uncached) / max_num_batched_tokens) × (time_per_output_token_s +
    /// running × decode_step_per_seq_s)`, at least one step even on an idle endpoint.
    pub steps_s: f64,
    pub kv_pressure_factor: f64,
    /// Before correction.
    pub raw_ttft_s: f64,
    /// `raw_ttft_s + wait_s × (correction − 1)`.
    pub predicted_ttft_s: f64,
}

/// What one prediction knows of the endpoint apart from its queue: the wait and TTFT for any
/// reading of the queue follow from it.
struct Engine<'a> {
    rate: f64,
    uncached_tokens: f64,
    budget_tokens: f64,
    decode_step_s: f64,
    running_seqs: u32,
    service_s: f64,
    kv_free_tokens: Option<f64>,
    tokens_per_running: f64,
    usage: Option<f64>,
    prefill_s: f64,
    attention_s: f64,
    overhead_s: f64,
    correction: f64,
    config: &'a PredictConfig,
}

impl Engine<'_> {
    fn wait(&self, queued_prefill_tokens: f64, step_residual_s: f64) -> QueueWait {
        let config = self.config;
        let prefill_wait_s = queued_prefill_tokens / self.rate;
        let steps = ((queued_prefill_tokens + self.uncached_tokens) / self.budget_tokens)
            .ceil()
            .max(1.0);
        let steps_s = steps * self.decode_step_s;
        let mut completions_ahead = 0u32;
        let mut capacity_wait_s = 0.0;
        if let Some(free) = self.kv_free_tokens
            && self.tokens_per_running > 0.0
        {
            let shortfall = queued_prefill_tokens + self.uncached_tokens - free;
            if shortfall > 0.0 {
                let n = (shortfall / self.tokens_per_running).ceil();
                completions_ahead = if n >= f64::from(u32::MAX) {
                    u32::MAX
                } else {
                    n as u32
                };
                capacity_wait_s = n * self.service_s / f64::from(self.running_seqs);
            }
        }
        let capacity_bound = capacity_wait_s > prefill_wait_s;
        let wait_s = prefill_wait_s.max(capacity_wait_s) + step_residual_s;
        let kv_pressure_factor = match self.usage {
            Some(u) if !capacity_bound && u > config.kv_pressure_threshold => {
                let span = (1.0 - config.kv_pressure_threshold).max(f64::EPSILON);
                1.0 + config.kv_pressure_gain * ((u - config.kv_pressure_threshold) / span)
            }
            _ => 1.0,
        };
        let raw_ttft_s = wait_s
            + (self.prefill_s + self.attention_s + steps_s) * kv_pressure_factor
            + self.overhead_s;
        // The correction scales the wait only: the wait is what rests on signals the proxy sees
        // partly or late (other clients' queues, completions); its own prefill is known well.
        let predicted_ttft_s = raw_ttft_s + wait_s * (self.correction - 1.0);
        QueueWait {
            queued_prefill_tokens,
            prefill_wait_s,
            completions_ahead,
            capacity_wait_s,
            capacity_bound,
            step_residual_s,
            wait_s,
            steps_s,
            kv_pressure_factor,
            raw_ttft_s,
            predicted_ttft_s,
        }
    }
}

impl Prediction {
    /// The TTFT the selection ranks by: the undated reading's.
    pub fn ranked_ttft_s(&self) -> f64 {
        self.undated.predicted_ttft_s
    }

    /// Charges the prefix this endpoint would duplicate: `best_cached_tokens` is the most any
    /// candidate of the same model has cached for this prompt.
    pub fn charge_duplicate_prefix(&mut self, best_cached_tokens: u32, config: &PredictConfig) {
        self.duplicate_tokens = best_cached_tokens
            .min(self.prompt_tokens.saturating_sub(1))
            .saturating_sub(self.cached_tokens);
        self.miss_cost_s = config.miss_cost_weight.max(0.0) * f64::from(self.duplicate_tokens)
            / self.prefill_tokens_per_second.max(1.0);
        self.selection_cost_s = self.charged_s() + self.substitute_cost_s;
    }

    /// Charges the endpoint's recent failures: `failure_share ×` the TTFT a retry elsewhere adds.
    pub fn charge_failures(&mut self, failure_share: f64, retry_s: f64) {
        self.failure_cost_s = failure_share.clamp(0.0, 1.0) * retry_s.max(0.0);
        self.selection_cost_s = self.charged_s() + self.substitute_cost_s;
    }

    /// Charges a candidate of a substitute model (not the requested one) `margin` of its cost.
    pub fn charge_substitute(&mut self, margin: f64) {
        let base = self.charged_s();
        self.substitute_cost_s = margin.max(0.0) * base;
        self.selection_cost_s = base + self.substitute_cost_s;
    }

    /// The ranked TTFT and every charge but the substitute's.
    fn charged_s(&self) -> f64 {
        self.ranked_ttft_s()
            + self.queue_cost_s
            + self.miss_cost_s
            + self.staleness_cost_s
            + self.failure_cost_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        endpoint::{CacheConfig, Publication},
        inflight::InFlightRequest,
    };

    fn t(secs: f64) -> Time {
        Time::from_secs_f64(secs)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// The worked example of docs/ttft-model.md.
    fn example() -> (Signals, InFlight) {
        let mut own = InFlight::default();
        for (id, uncached) in [(1, 1_000), (2, 500)] {
            // Behind the queue they joined: not begun by the time of the example.
            own.dispatch(own_request(id, 0.9, uncached, 1.2));
        }
        let signals = Signals {
            num_requests_waiting: Some(Observed::new(5, t(1.0))),
            num_requests_running: Some(Observed::new(10, t(1.0))),
            kv_cache_usage: Some(Observed::new(0.95, t(1.0))),
            prefix_hit_fraction: Some(Observed::new(0.5, t(1.0))),
            ..Signals::default()
        };
        (signals, own)
    }

    /// An own request of `uncached` tokens sent at `sent`, its prefill predicted to begin at
    /// `begins`, no first token yet.
    fn own_request(id: u64, sent: f64, uncached: u32, begins: f64) -> InFlightRequest {
        InFlightRequest {
            predicted_wait_s: begins - sent,
            prefill_expected_at: t(begins),
            ..InFlightRequest::sent(id, t(sent), uncached)
        }
    }

    /// The example's 8,000-token prompt, nothing cached, predicted at `now` with the default
    /// prior and settings.
    fn predict_example(signals: &Signals, own: &InFlight, now: f64) -> Prediction {
        predict(
            &example_view(signals, own, &ModelPrior::default()),
            8_000,
            None,
            t(now),
            &PredictConfig::default(),
        )
    }

    /// The worked example's endpoint as the predictor sees it: 10,000 tokens/s, no correction,
    /// a 2,000-token mean prompt.
    fn example_view<'a>(
        signals: &'a Signals,
        own: &'a InFlight,
        prior: &'a ModelPrior,
    ) -> EndpointView<'a> {
        EndpointView {
            signals,
            inflight: own,
            foreign: &crate::inflight::NONE,
            prior,
            prefill_tokens_per_second: 10_000.0,
            correction: 1.0,
            mean_prompt_tokens: 2_000.0,
            mean_service_s: None,
        }
    }

    #[test]
    fn worked_example_arithmetic() {
        let (signals, own) = example();
        let prior = ModelPrior::default();
        let view = EndpointView {
            correction: 1.2,
            ..example_view(&signals, &own, &prior)
        };
        let p = predict(
            &view,
            8_000,
            Some((4_000, PrefixSource::Approximate)),
            t(1.05),
            &PredictConfig::default(),
        );
        assert_eq!((p.cached_tokens, p.uncached_tokens), (4_000, 4_000));
        assert_eq!(p.other_waiting_requests, 3); // 5 reported − 2 own counted in that scrape
        assert!(close(p.other_request_tokens, 1_000.0));
        assert_eq!(p.own_queued_prefill_tokens, 1_500);
        // 3,000 tokens of others' at the scrape, 0.05 s × 10,000 tokens/s of it done since.
        assert!(close(p.others_queued_tokens, 2_500.0));
        assert!(close(p.dated.queued_prefill_tokens, 4_000.0));
        assert_eq!(p.running_seqs, 10);
        assert!(close(p.dated.prefill_wait_s, 0.4));
        // No cache configuration scraped: no capacity-bound wait.
        assert_eq!((p.kv_free_tokens, p.dated.completions_ahead), (None, 0));
        // Half of a 21 ms step (20 ms + 10 × 0.1 ms) is in progress on a busy endpoint.
        assert!(close(p.dated.step_residual_s, 0.0105));
        assert!(!p.dated.capacity_bound && close(p.dated.wait_s, 0.4105));
        assert!(close(p.prefill_s, 0.4));
        assert!(close(p.dated.steps_s, 0.021)); // ceil(8,000 / 8,192) step of 21 ms
        assert!(close(p.dated.kv_pressure_factor, 1.5));
        // The KV factor scales this request's own prefill and steps, not the wait.
        let raw = 0.4105 + (0.4 + 0.021) * 1.5 + 0.01;
        assert!(close(p.dated.raw_ttft_s, raw));
        // The correction scales the wait.
        assert!(close(p.dated.predicted_ttft_s, raw + 0.4105 * 0.2));
        // 5 requests queued (3 others, 2 own): each waits 0.4 s × 1.5 longer behind this one.
        assert_eq!((p.queue_depth_requests, p.requests_behind), (5, 5));
        assert!(close(p.marginal_delay_s, 0.6));
        assert!(close(p.queue_cost_s, 3.0));
        assert!(close(p.selection_cost_s, raw + 0.4105 * 0.2 + 3.0));
        assert!(p.signals_fresh);
        let w = p.reported_waiting.unwrap();
        assert!(w.used && close(w.age_s, 0.05));
    }

    #[test]
    fn own_streams_time_the_step_in_progress() {
        let (signals, mut own) = example();
        let predict_at = |own: &InFlight, now: f64| predict_example(&signals, own, now);
        // No own stream decoding: half of the 21 ms decode step (20 ms + 10 running × 0.1 ms).
        let p = predict_at(&own, 1.05);
        assert_eq!(p.step_elapsed_s, None);
        assert!(close(p.dated.step_residual_s, 0.0105));
        // Request 1 streams; its latest token came at 1.044: the step under way has run 6 ms of
        // a 21 ms decode step.
        own.first_token(1, t(1.0));
        own.token(1, t(1.0));
        own.token(1, t(1.044));
        let p = predict_at(&own, 1.05);
        assert!(close(p.step_elapsed_s.unwrap(), 0.006));
        assert!(close(p.dated.step_residual_s, 0.015));
        // 200 ms without a token: a prefill chunk is running. Read as the scrape shows the queue,
        // a quarter of that again remains (the dated reading is the next test's).
        let p = predict_at(&own, 1.244);
        assert!(close(p.undated.step_residual_s, 0.25 * 0.2));
        // Longer than any step can be (2 × (8,192 / 10,000 + 0.021) s): not a step time. (The
        // scrape is stale by then, and kept: the running batch is still its 10, a 21 ms step.)
        let p = predict_at(&own, 1.044 + 2.0);
        assert_eq!(p.step_elapsed_s, None);
        assert!(close(p.dated.step_residual_s, 0.5 * 0.021));
    }

    #[test]
    fn a_long_step_dates_the_queue_it_is_working_through() {
        let (mut signals, mut own) = example();
        // Request 1 streams; its latest token came at 1.044 and none since: a long step (a
        // prefill chunk) began then. The scrape at 1.1 reads the gauges vLLM published at 1.044:
        // 5 waiting, one of them own request 2 (500 tokens), so 4 × 1,000 tokens of others'.
        own.first_token(1, t(1.0));
        own.token(1, t(1.044));
        signals.num_requests_waiting = Some(Observed::new(5, t(1.1)));
        signals.num_requests_running = Some(Observed::new(10, t(1.1)));
        let at = |own: &InFlight, now: f64| predict_example(&signals, own, now);
        let p = at(&own, 1.244);
        assert!(close(p.step_elapsed_s.unwrap(), 0.2));
        // The step has worked 0.2 s × 10,000 tokens/s through the 4,000 it began with, others'
        // first; own request 2 comes after them, none of it done yet.
        assert!(close(p.others_queued_tokens, 2_000.0));
        assert!(close(p.own_queued_left_tokens, 500.0));
        // The step's rest is that work: no residual on top.
        assert!(close(p.dated.step_residual_s, 0.0));
        assert!(close(p.dated.wait_s, 0.25));
        // Undated: others' 4,000 less only the 0.144 s since the scrape, own 500 in full, and a
        // quarter of the 200 ms step again.
        assert!(close(p.undated.queued_prefill_tokens, 2_560.0 + 500.0));
        assert!(close(p.undated.step_residual_s, 0.05));
        assert!(close(p.undated.wait_s, 0.356));
        // An own request sent after the step began waits in full.
        own.dispatch(own_request(3, 1.1, 700, 1.1));
        assert!(close(at(&own, 1.244).own_queued_left_tokens, 500.0 + 700.0));
        // At 1.5 the step (0.456 s) has done all it began with: the work it is on is unknown
        // again, and a quarter of its length is taken to remain.
        let p = at(&own, 1.5);
        assert!(close(p.others_queued_tokens, 0.0));
        assert!(close(p.own_queued_left_tokens, 700.0));
        assert!(close(p.dated.step_residual_s, 0.25 * 0.456));
    }

    #[test]
    fn a_long_step_begins_with_what_the_schedule_left_of_own_requests() {
        let (mut signals, mut own) = example();
        // Request 1 streams; its latest token came at 1.044: a long step began then. Request 3
        // (3,000 tokens) was sent at 0.9 and by its schedule began at 0.944, so 1,000 of it were
        // done when the step began; request 2's 500 had not begun. The scrape reads the two own
        // requests waiting and no one else's.
        own.first_token(1, t(1.0));
        own.token(1, t(1.044));
        own.dispatch(own_request(3, 0.9, 3_000, 0.944));
        signals.num_requests_waiting = Some(Observed::new(2, t(1.1)));
        signals.num_requests_running = Some(Observed::new(10, t(1.1)));
        let p = predict_example(&signals, &own, 1.144);
        assert!(close(p.step_elapsed_s.unwrap(), 0.1));
        // The step began with 2,000 + 500 own tokens and has done 0.1 s × 10,000 tokens/s of
        // them; the undated reading counts both requests in full.
        assert!(close(p.others_queued_tokens, 0.0));
        assert!(close(p.own_queued_left_tokens, 1_500.0));
        assert!(close(p.undated.queued_prefill_tokens, 3_500.0));
    }

    #[test]
    fn scrapes_that_read_one_publication_date_the_queue() {
        let (mut signals, own) = example();
        // The gauges of the example (scraped at 1.0) were published between a scrape at 0.95
        // that read the state before and the one at 1.0: at 0.975, expected.
        signals.publication = Some(Publication {
            after: t(0.95),
            by: t(1.0),
            still: t(1.0),
        });
        let at = |signals: &Signals, now: f64| predict_example(signals, &own, now);
        // No long step: others' 3,000 tokens less 0.075 s × 10,000 tokens/s since the
        // publication (the undated reading takes 0.05 s, since the scrape).
        let p = at(&signals, 1.05);
        assert!(close(p.published_age_s.unwrap(), 0.075));
        assert!(close(p.others_queued_tokens, 2_250.0));
        assert!(close(p.undated.queued_prefill_tokens, 1_500.0 + 2_500.0));
        assert!(close(p.dated.step_residual_s, 0.0105));
        // Scrapes have read the same state from 1.0 to 1.2, longer than a 21 ms decode step: no
        // step ended, a long one has run since 0.975. At 1.2 it has done 2,250 tokens, others'
        // first (3,000), then none of the own requests sent before it; its rest is that work.
        signals.publication = Some(Publication {
            after: t(0.95),
            by: t(1.0),
            still: t(1.2),
        });
        signals.num_requests_waiting = Some(Observed::new(5, t(1.2)));
        signals.num_requests_running = Some(Observed::new(10, t(1.2)));
        let p = at(&signals, 1.2);
        assert_eq!(p.step_elapsed_s, None);
        assert!(close(p.others_queued_tokens, 750.0));
        assert!(close(p.own_queued_left_tokens, 1_500.0));
        assert!(close(p.dated.step_residual_s, 0.0));
        // The undated reading knows no long step: others' 3,000 from the scrape just taken, half
        // a decode step.
        assert!(close(p.undated.queued_prefill_tokens, 1_500.0 + 3_000.0));
        assert!(close(p.undated.step_residual_s, 0.0105));
        // Stale scrapes (past the 500 ms budget) date nothing.
        assert_eq!(at(&signals, 1.8).published_age_s, None);
    }

    #[test]
    fn own_requests_without_a_long_step_are_dated_by_their_schedule() {
        let (signals, own) = example();
        let at = |now: f64| predict_example(&signals, &own, now);
        // Both own requests (1,000 and 500 tokens) were predicted to begin at 1.2: untouched
        // before, then worked through at 10,000 tokens/s each.
        assert!(close(at(1.15).own_queued_left_tokens, 1_500.0));
        assert!(close(at(1.23).own_queued_left_tokens, 700.0 + 200.0));
        assert!(close(at(1.3).own_queued_left_tokens, 0.0));
        // The undated reading counts them in full until their first tokens.
        assert!(close(at(1.3).undated.queued_prefill_tokens, 1_500.0));
    }

    #[test]
    fn other_proxies_requests_count_in_full_like_own_and_once() {
        let (signals, own) = example();
        let prior = ModelPrior::default();
        let alone = predict(
            &example_view(&signals, &own, &prior),
            1_000,
            None,
            t(1.05),
            &PredictConfig::default(),
        );
        // Another sidecar sent 3,000 uncached tokens after the scrape at 1.0 s (no gauge shows
        // them yet) and 5,000 before it (one of the scrape's 5 waiting). Both are known exactly,
        // as own requests are: the scrape's waiting count less own and noticed requests is what
        // is left to estimate by the mean prompt (5 − 2 own − 1 noticed = 2, not 3).
        let mut foreign = InFlight::default();
        foreign.dispatch(InFlightRequest::sent(1, t(1.02), 3_000));
        foreign.dispatch(InFlightRequest::sent(2, t(0.9), 5_000));
        let view = EndpointView {
            foreign: &foreign,
            ..example_view(&signals, &own, &prior)
        };
        let told = predict(&view, 1_000, None, t(1.05), &PredictConfig::default());
        assert_eq!(
            (alone.other_waiting_requests, told.other_waiting_requests),
            (3, 2)
        );
        assert!(close(told.foreign_queued_tokens, 8_000.0));
        // Undated: both in full, one mean-sized estimate fewer (the 5,000 counted once).
        assert!(close(
            told.undated.queued_prefill_tokens,
            alone.undated.queued_prefill_tokens - 1_000.0 + 8_000.0
        ));
        // Dated: each by the schedule its sender predicted (here: prefill from its dispatch, at
        // 10,000 tokens/s): 3,000 − 300 and 5,000 − 1,500 left at 1.05 s.
        assert!(close(
            told.dated.queued_prefill_tokens,
            alone.dated.queued_prefill_tokens - 1_000.0 + 2_700.0 + 3_500.0
        ));
        assert_eq!(told.queue_depth_requests, alone.queue_depth_requests + 1);
        assert!(told.ranked_ttft_s() > alone.ranked_ttft_s());
        // Once their first tokens are noticed, they have left the queue.
        foreign.first_token(1, t(1.04));
        foreign.first_token(2, t(1.04));
        let view = EndpointView {
            foreign: &foreign,
            ..example_view(&signals, &own, &prior)
        };
        let after = predict(&view, 1_000, None, t(1.05), &PredictConfig::default());
        assert!(close(after.foreign_queued_tokens, 0.0));
        // Request 2 had no first token at the scrape: still one of the waiting it reported.
        assert_eq!(after.other_waiting_requests, 2);
    }

    #[test]
    fn the_selection_ranks_by_the_undated_queue() {
        let (signals, mut own) = example();
        let prior = ModelPrior::default();
        own.first_token(1, t(1.0));
        own.token(1, t(1.044));
        let mut p = predict(
            &example_view(&signals, &own, &prior),
            8_000,
            None,
            t(1.244),
            &PredictConfig::default(),
        );
        assert!(p.undated.predicted_ttft_s > p.dated.predicted_ttft_s);
        assert!(close(p.ranked_ttft_s(), p.undated.predicted_ttft_s));
        assert!(close(
            p.selection_cost_s,
            p.undated.predicted_ttft_s + p.queue_cost_s
        ));
        p.charge_substitute(0.5);
        assert!(close(
            p.selection_cost_s,
            1.5 * (p.undated.predicted_ttft_s + p.queue_cost_s)
        ));
    }

    #[test]
    fn server_load_counts_arrivals_the_gauges_do_not_show_yet() {
        let (mut signals, own) = example();
        let at = |signals: &Signals| predict_example(signals, &own, 1.05);
        // Polled with the gauges at 1.0: 18 requests in the server, 5 waiting and 10 running in
        // the last published step, so 3 arrived during the step in progress. Others' waiting:
        // 5 + 3 − the 2 own awaiting a first token at 1.0.
        signals.server_load = Some(Observed::new(18, t(1.0)));
        let p = at(&signals);
        assert_eq!((p.unpublished_requests, p.other_waiting_requests), (3, 6));
        // 6 × 1,000 tokens (mean prompt × (1 − hit fraction)) less 0.05 s × 10,000 done since.
        assert!(close(p.others_queued_tokens, 5_500.0));
        let l = p.server_load.unwrap();
        assert!(l.used && close(l.value, 18.0));
        // A load below the gauges' sum (requests finished since the step's end) adds nothing.
        signals.server_load = Some(Observed::new(12, t(1.0)));
        assert_eq!(at(&signals).other_waiting_requests, 3);
        // A load older than the gauges, or past the freshness budget, is not used; stale gauges
        // are kept as they were read (5 waiting, none of them own by 0.5), never taken as empty.
        signals.server_load = Some(Observed::new(18, t(0.95)));
        assert_eq!(at(&signals).unpublished_requests, 0);
        signals.server_load = Some(Observed::new(18, t(0.5)));
        signals.num_requests_waiting = Some(Observed::new(5, t(0.5)));
        signals.num_requests_running = Some(Observed::new(10, t(0.5)));
        let p = at(&signals);
        assert_eq!((p.unpublished_requests, p.other_waiting_requests), (0, 5));
        assert!(!p.server_load.unwrap().used);
    }

    #[test]
    fn others_prefilling_now_add_their_expected_remainder_to_the_queue() {
        let (mut signals, own) = example();
        // 12,000 prompt tokens prefilling at the scrape at 1.0; the two own requests (1,000 and
        // 500 tokens, dispatched at 0.9) are among them: 10,500 are others'. The hit fraction is
        // 0.5 and half is expected to remain: 10,500 × 0.5 × 0.5 = 2,625 tokens.
        signals.prefilling_tokens = Some(Observed::new(12_000, t(1.0)));
        let prior = ModelPrior::default();
        let view = example_view(&signals, &own, &prior);
        let cfg = PredictConfig::default();
        let p = predict(&view, 8_000, None, t(1.05), &cfg);
        assert!(close(p.others_prefilling_tokens, 2_625.0));
        // Own 1,500 + 3 others waiting × 1,000 + 2,625 prefilling, less the 500 tokens prefilled
        // in the 50 ms since the scrape.
        assert!(close(p.others_queued_tokens, 3_000.0 + 2_625.0 - 500.0));
        assert!(close(p.dated.queued_prefill_tokens, 1_500.0 + 5_125.0));
        // Off, or past the freshness budget: not counted.
        let off = PredictConfig {
            prefilling_remaining_fraction: 0.0,
            ..cfg
        };
        assert_eq!(
            predict(&view, 8_000, None, t(1.2), &off).others_prefilling_tokens,
            0.0
        );
        assert_eq!(
            predict(&view, 8_000, None, t(5.0), &cfg).others_prefilling_tokens,
            0.0
        );
    }

    #[test]
    fn attention_makes_prefill_superlinear_in_context() {
        let (signals, own) = example();
        let prior = ModelPrior {
            prefill_attention_pair_s: 1e-9,
            ..ModelPrior::default()
        };
        let view = EndpointView {
            correction: 1.2,
            ..example_view(&signals, &own, &prior)
        };
        let cfg = PredictConfig::default();
        let cached = |c| Some((c, PrefixSource::Approximate));
        // 4,000 new tokens after 4,000 cached: 4,000 × 4,000 + 4,000² / 2 = 24e6 pairs = 24 ms.
        let p = predict(&view, 8_000, cached(4_000), t(1.05), &cfg);
        assert!(close(p.attention_s, 0.024));
        assert!(close(p.prefill_s, 0.4));
        let raw = 0.4105 + (0.4 + 0.024 + 0.021) * 1.5 + 0.01;
        assert!(close(p.dated.raw_ttft_s, raw));
        assert!(close(p.marginal_delay_s, (0.4 + 0.024) * 1.5));
        // Twice the new tokens with nothing cached: 8,000² / 2 = 32e6 pairs, and the linear part
        // doubles; the same 4,000 new tokens after 12,000 cached cost 56 ms of attention.
        let p = predict(&view, 8_000, None, t(1.2), &cfg);
        assert!(close(p.attention_s, 0.032));
        let p = predict(&view, 16_000, cached(12_000), t(1.2), &cfg);
        assert!(close(p.attention_s, 0.056));
        // Without the coefficient prefill is linear, as before.
        let linear = EndpointView {
            prior: &ModelPrior::default(),
            ..view
        };
        assert_eq!(
            predict(&linear, 16_000, cached(12_000), t(1.2), &cfg).attention_s,
            0.0
        );
    }

    /// The second worked example of docs/ttft-model.md: the same endpoint with a 16,000-token KV
    /// cache that is 95 % full, so the prompts queued ahead and this one do not fit.
    #[test]
    fn capacity_bound_wait_is_paced_by_completions() {
        let (mut signals, own) = example();
        signals.cache_config = Some(Observed::new(
            CacheConfig {
                block_size_tokens: 16,
                num_gpu_blocks: 1_000,
            },
            t(1.0),
        ));
        let prior = ModelPrior::default();
        let view = EndpointView {
            correction: 1.2,
            mean_service_s: Some(20.0),
            ..example_view(&signals, &own, &prior)
        };
        let p = predict(
            &view,
            8_000,
            Some((4_000, PrefixSource::Approximate)),
            t(1.05),
            &PredictConfig::default(),
        );
        // Free: 5 % of 16,000 = 800 tokens; each of the 10 running requests holds 1,520.
        assert!(close(p.kv_free_tokens.unwrap(), 800.0));
        // Short of KV, the engine admits nothing until a request completes, so the 5 requests it
        // reports waiting (× 2,000 × (1 − 0.5) tokens, less 0.05 s × 10,000 tokens/s since the
        // scrape) floor the dated queue at 4,500 tokens, above the 4,000 the schedule has left:
        // 4,500 + 4,000 own − 800 free = 7,700 tokens short: ceil(7,700 / 1,520) = 6 completions,
        // which come every 20 s / 10 running = 2 s.
        assert!(close(p.dated.queued_prefill_tokens, 4_500.0));
        assert_eq!(p.dated.completions_ahead, 6);
        assert!(close(p.service_s, 20.0));
        assert!(close(p.dated.capacity_wait_s, 12.0));
        assert!(p.dated.capacity_bound && close(p.dated.wait_s, 12.0 + 0.0105));
        // Capacity-bound: the shortage is the wait itself, so the KV factor is 1.
        assert!(close(p.dated.kv_pressure_factor, 1.0));
        // 8,500 tokens to prefill now take two engine steps of 0.021 s.
        let raw = 12.0105 + 0.4 + 2.0 * 0.021 + 0.01;
        assert!(close(p.dated.raw_ttft_s, raw));
        assert!(close(p.dated.predicted_ttft_s, raw + 12.0105 * 0.2));
        // Every request admitted while this one holds its 4,000 tokens (as many as are running,
        // 10) waits 4,000 / 1,520 completions × 2 s longer.
        assert_eq!(p.requests_behind, 10);
        let share = 4_000.0 / 1_520.0 * 2.0;
        assert!(close(p.marginal_delay_s, share));
        assert!(close(p.queue_cost_s, 10.0 * share));
        // The selection ranks by the undated reading, which the floor does not touch.
        assert!(close(
            p.selection_cost_s,
            p.undated.predicted_ttft_s + 10.0 * share
        ));

        // A prompt that fits in the free blocks waits for no completion; nor does anything
        // without a fresh KV usage.
        let small = predict(&view, 500, None, t(1.2), &PredictConfig::default());
        assert!(small.dated.completions_ahead > 0); // the 4,500 queued tokens still do not fit
        let (mut idle, none) = example();
        idle.num_requests_waiting = Some(Observed::new(0, t(1.0)));
        idle.cache_config = signals.cache_config;
        let idle_own = InFlight::default();
        let _ = none;
        let view = EndpointView {
            signals: &idle,
            inflight: &idle_own,
            foreign: &crate::inflight::NONE,
            ..view
        };
        let fits = predict(&view, 700, None, t(1.2), &PredictConfig::default());
        assert_eq!(fits.dated.completions_ahead, 0);
        assert!(close(fits.dated.capacity_wait_s, 0.0) && !fits.dated.capacity_bound);
        let stale = predict(&view, 8_000, None, t(1.6), &PredictConfig::default());
        assert_eq!(
            (stale.kv_free_tokens, stale.dated.completions_ahead),
            (None, 0)
        );
    }

    #[test]
    fn service_time_prior_then_learned() {
        let (mut signals, own) = example();
        signals.cache_config = Some(Observed::new(
            CacheConfig {
                block_size_tokens: 16,
                num_gpu_blocks: 1_000,
            },
            t(1.0),
        ));
        let prior = ModelPrior::default();
        let view = example_view(&signals, &own, &prior);
        let cfg = PredictConfig::default();
        let p = predict(&view, 8_000, None, t(1.2), &cfg);
        // 256 output tokens × (20 ms + 10 running × 0.1 ms).
        assert!(close(p.service_s, 256.0 * 0.021));
        let mut learned = ServiceTime::default();
        assert_eq!(learned.mean_s(), None);
        assert!(learned.observe(10.0, &cfg));
        assert_eq!(learned.mean_s(), Some(10.0));
        assert!(learned.observe(20.0, &cfg));
        assert!(close(learned.mean_s().unwrap(), 12.0)); // 10 + 0.2 × (20 − 10)
        assert!(!learned.observe(-1.0, &cfg) && !learned.observe(f64::NAN, &cfg));
        assert_eq!(learned.samples(), 2);
    }

    #[test]
    fn stale_signals_keep_their_last_reading_and_charge_their_age() {
        let (signals, own) = example();
        let prior = ModelPrior::default();
        let view = example_view(&signals, &own, &prior);
        // 600 ms after the scrape, beyond the 500 ms budget.
        let p = predict(
            &view,
            8_000,
            Some((4_000, PrefixSource::Approximate)),
            t(1.6),
            &PredictConfig::default(),
        );
        assert!(!p.signals_fresh);
        // The last reading stands, less the own requests it counted: never an empty queue.
        assert_eq!(p.other_waiting_requests, 3);
        assert_eq!(p.running_seqs, 10);
        // Not drained by the time since: the engine may not have moved (scrapes stop first when
        // it wedges). Own 1,500 tokens + 3 × 1,000 of others'.
        assert!(close(p.undated.queued_prefill_tokens, 4_500.0));
        // 100 ms past the budget, charged one for one in the selection.
        assert!(close(p.staleness_cost_s, 0.1));
        assert!(close(
            p.selection_cost_s,
            p.undated.predicted_ttft_s + p.queue_cost_s + 0.1
        ));
        let w = p.reported_waiting.unwrap();
        assert!(!w.used && close(w.age_s, 0.6));
        // Fresh, nothing is charged.
        let fresh = predict(
            &view,
            8_000,
            Some((4_000, PrefixSource::Approximate)),
            t(1.2),
            &PredictConfig::default(),
        );
        assert_eq!(fresh.staleness_cost_s, 0.0);
    }

    #[test]
    fn a_fully_cached_prompt_still_prefills_one_token_and_correction_is_clamped() {
        let signals = Signals::default();
        let own = InFlight::default();
        let prior = ModelPrior::default();
        let view = EndpointView {
            correction: 100.0,
            mean_prompt_tokens: 0.0,
            ..example_view(&signals, &own, &prior)
        };
        let p = predict(
            &view,
            1_000,
            Some((1_024, PrefixSource::Precise)),
            t(0.0),
            &PredictConfig::default(),
        );
        assert_eq!((p.cached_tokens, p.uncached_tokens), (999, 1));
        assert!(close(p.correction, 4.0));
        // Nothing queued: the correction (of the wait) changes nothing; one 20 ms step carries
        // the last token's prefill.
        assert!(close(p.dated.predicted_ttft_s, 0.0001 + 0.02 + 0.01));
        assert!(close(p.selection_cost_s, p.dated.predicted_ttft_s));
        assert!(!p.signals_fresh);
    }

    #[test]
    fn a_duplicate_prefix_is_charged_at_this_endpoints_rate() {
        let (signals, own) = example();
        let prior = ModelPrior::default();
        let view = EndpointView {
            prefill_tokens_per_second: 8_000.0,
            ..example_view(&signals, &own, &prior)
        };
        let cfg = PredictConfig::default();
        let mut p = predict(
            &view,
            8_000,
            Some((1_000, PrefixSource::Precise)),
            t(1.2),
            &cfg,
        );
        let before = p.selection_cost_s;
        assert!(close(p.miss_cost_s, 0.0));
        // Another candidate holds 6,000 tokens of this prompt: 5,000 would be prefilled again here,
        // charged `miss_cost_weight` (3) × 5,000 / 8,000 tok/s = 1.875 s.
        p.charge_duplicate_prefix(6_000, &cfg);
        assert_eq!(p.duplicate_tokens, 5_000);
        assert!(close(p.miss_cost_s, 3.0 * 5_000.0 / 8_000.0));
        assert!(close(p.selection_cost_s, before + 1.875));
        // The predicted TTFT itself is unchanged: the charge is for the fleet's cache, not this request.
        assert!(close(
            p.selection_cost_s - p.queue_cost_s - p.miss_cost_s,
            p.dated.predicted_ttft_s
        ));
        // The best candidate itself (or one holding more), and a prompt cached entirely elsewhere
        // but for its last token, pay at most for what it would prefill.
        p.charge_duplicate_prefix(1_000, &cfg);
        assert_eq!((p.duplicate_tokens, p.miss_cost_s), (0, 0.0));
        p.charge_duplicate_prefix(9_000, &cfg);
        assert_eq!(p.duplicate_tokens, 6_999);
        // Weight 0 turns it off.
        let off = PredictConfig {
            miss_cost_weight: 0.0,
            ..cfg
        };
        p.charge_duplicate_prefix(6_000, &off);
        assert!(close(p.miss_cost_s, 0.0) && close(p.selection_cost_s, before));
    }

    #[test]
    fn prefill_rate_learns_toward_observed_and_rejects_noise() {
        let prior = ModelPrior::default();
        let cfg = PredictConfig::default();
        let mut rate = PrefillRate::new(&prior);
        // 4,000 tokens in 0.8 s = 5,000 tok/s: one step of α = 0.2 from 10,000.
        assert!(rate.observe(4_000, 0.8, &cfg));
        assert!(close(rate.tokens_per_second(), 9_000.0));
        // Too few tokens, or a non-positive prefill time: ignored.
        assert!(!rate.observe(10, 0.001, &cfg));
        assert!(!rate.observe(4_000, -0.1, &cfg));
        // An absurd sample is clamped to 10× the current rate.
        assert!(rate.observe(4_000, 1e-9, &cfg));
        assert!(close(
            rate.tokens_per_second(),
            9_000.0 + 0.2 * (90_000.0 - 9_000.0)
        ));
        assert_eq!(rate.samples(), 2);
        for _ in 0..200 {
            rate.observe(5_000, 1.0, &cfg);
        }
        assert!((rate.tokens_per_second() - 5_000.0).abs() < 1.0);
    }
}
