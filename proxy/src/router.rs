//! One target's routing state, shared by the layers that decide and the ones that feed it.
//!
//! [`kinference_routing::Router`] is pure and clock-free; [`RouterHandle`] owns one behind a mutex
//! and drives it with tokio's clock. The route layer asks it for a plan (the decision runs under
//! the lock, on the state as it is at that instant); the retry layer tells it what was dispatched
//! where; the observe layer feeds it first tokens, streamed tokens and completions; the signals
//! tasks feed it scrapes and KV events. Every caller holds a clone, never the router itself.
//!
//! # First-token feedback from non-stream responses
//!
//! A non-stream response arrives whole, so the proxy never sees its first token. It estimates it:
//! TTFT ≈ end-to-end time − (completion tokens − 1) × the endpoint's time per output token,
//! learned from its streams' inter-token gaps (before any stream, the model's prior; the larger of
//! the two is used, so an error under-states TTFT, the safe side for a peak-EWMA). The estimate
//! feeds the router only when the estimated decode is at most half the end-to-end time
//! (`docs/proxy.md`, "First-token feedback from non-stream answers").

use crate::clock::Clock;
use kinference_decision::{
    Candidates, Input, Passthrough, Plan, Policy, UnknownModel,
    explain::{Explain, Live},
};
use kinference_routing::{
    Decision, DispatchHandle, EndpointId, EndpointMeta, KvEvent, ModelName, Notice, PromptBlocks,
    Router, RouterConfig, Scrape, Time,
};
use parking_lot::Mutex;
use rand::{SeedableRng, rngs::SmallRng};
use std::{collections::HashMap, sync::Arc, time::Duration};
use tokio::time::Instant;

/// Weight of one stream in the learned time per output token.
const TPOT_ALPHA: f64 = 0.2;
/// The most of a non-stream response's end-to-end time the estimated decode may take for the
/// estimated TTFT to be trusted.
const MAX_DECODE_SHARE: f64 = 0.5;

/// The TTFT of a non-stream response of `completion_tokens` tokens that took `e2e_s` end to end,
/// given `tpot_s` seconds per output token after the first; `None` when the decode would take
/// more than [`MAX_DECODE_SHARE`] of it (the estimate would be mostly the decode's error).
pub fn estimate_ttft_s(e2e_s: f64, completion_tokens: u64, tpot_s: f64) -> Option<f64> {
    if !(e2e_s.is_finite() && e2e_s > 0.0 && tpot_s.is_finite() && tpot_s >= 0.0) {
        return None;
    }
    let decode_s = completion_tokens.saturating_sub(1) as f64 * tpot_s;
    (decode_s <= MAX_DECODE_SHARE * e2e_s).then_some(e2e_s - decode_s)
}

/// A shared handle on one target's router.
#[derive(Clone, Debug)]
pub struct RouterHandle {
    inner: Arc<Mutex<State>>,
    clock: Clock,
}

#[derive(Debug)]
struct State {
    router: Router,
    /// The proxy's own settings (failure accrual); a policy sets the rest.
    base: RouterConfig,
    config: RouterConfig,
    rng: SmallRng,
    /// Learned seconds per output token, per endpoint (from streams).
    tpot: HashMap<EndpointId, f64>,
    /// The policy's prior seconds per output token, per model.
    prior_tpot: HashMap<ModelName, f64>,
    /// Non-stream responses whose estimated first token fed the predictor, per endpoint.
    estimated_first_tokens: HashMap<EndpointId, u64>,
    /// Where this proxy's own dispatches, first tokens and completions are told, with a signal
    /// service (`crate::signals::service`): never waited on, a full tap drops the notice.
    notices: Option<tokio::sync::mpsc::Sender<OwnNotice>>,
}

impl State {
    /// The endpoint of `handle` when this router's notices are told (else nothing is looked up).
    fn told_endpoint(&self, handle: DispatchHandle) -> Option<EndpointId> {
        self.notices.as_ref()?;
        self.router.endpoint_of(handle).cloned()
    }

    /// Taps `notice` on `endpoint` for the signal service: never waited on, a full tap drops it.
    fn tell(&self, endpoint: EndpointId, notice: Notice, at: Time) {
        if let Some(tap) = &self.notices {
            let _ = tap.try_send(OwnNotice {
                endpoint,
                notice,
                at,
                prompt: None,
            });
        }
    }

    /// A streamed token arrived at `at`: an engine step of its endpoint ended then, which times
    /// the step in progress for this router and, when this proxy reports the endpoint's steps
    /// (`kinference_routing::Router::step_notice`), for the others. `endpoint`: the request's,
    /// when notices are told.
    fn token(&mut self, handle: DispatchHandle, at: Time, endpoint: Option<&EndpointId>) {
        let _ = self.router.observe_token(handle, at);
        if let Some(endpoint) = endpoint
            && let Some(notice) = self.router.step_notice(handle, at)
        {
            self.tell(endpoint.clone(), notice, at);
        }
    }
}

/// One of this proxy's own notices, for the signal service.
#[derive(Clone, Debug)]
pub struct OwnNotice {
    pub endpoint: EndpointId,
    pub notice: Notice,
    /// When it was taken (a completion carries no time of its own).
    pub at: Time,
    /// A dispatch's prompt, as this router's prefix index cut it.
    pub prompt: Option<NoticePrompt>,
}

/// The leading chunks of a dispatched prompt (at most [`NOTICE_PROMPT_CHUNKS`]) and how they were
/// cut, so that a receiver that cuts prompts the same way counts them as pending prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoticePrompt {
    pub chunks: Arc<[kinference_routing::prefix::BlockHash]>,
    pub chunk_tokens: u32,
    pub chunk_chars: u32,
}

/// The most prompt chunks one dispatch notice carries (8,192 tokens at vLLM's 16-token blocks):
/// the shared prefixes that matter are system prompts and conversations, and every watcher of
/// the pool receives every notice (docs/benchmarks/signals-sizing.md).
pub const NOTICE_PROMPT_CHUNKS: usize = 512;

/// What the endpoints view shows of one endpoint beyond the router's own accessors.
#[derive(Clone, Debug, Default)]
pub struct Learned {
    pub time_per_output_token_s: Option<f64>,
    pub estimated_first_tokens: u64,
}

impl Default for RouterHandle {
    fn default() -> Self {
        Self::new(Clock::new(), RouterConfig::default())
    }
}

impl RouterHandle {
    /// A router on `clock` with `base`'s settings until a policy sets its own.
    pub fn new(clock: Clock, base: RouterConfig) -> Self {
        let config = base;
        Self {
            inner: Arc::new(Mutex::new(State {
                router: Router::new(config),
                base,
                config,
                rng: SmallRng::from_os_rng(),
                tpot: HashMap::new(),
                prior_tpot: HashMap::new(),
                estimated_first_tokens: HashMap::new(),
                notices: None,
            })),
            clock,
        }
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Sends this router's own notices to `tap` from now on.
    pub fn tap_notices(&self, tap: tokio::sync::mpsc::Sender<OwnNotice>) {
        self.inner.lock().notices = Some(tap);
    }

    /// Applies another proxy's notice on `id` (an unknown endpoint is ignored: it may have left
    /// this proxy's policy first).
    pub fn observe_notice(&self, id: &EndpointId, notice: Notice) {
        let _ = self.inner.lock().router.observe_notice(id, notice);
    }

    /// Records the prompt of another proxy's request `request_id` on `id`, noticed at dispatch,
    /// as pending prefix (`kinference_routing::Router::observe_notice_prompt`), when its sender
    /// cut the prompt into chunks as this router does; whether it was recorded.
    pub fn observe_notice_prompt(
        &self,
        id: &EndpointId,
        request_id: u64,
        prompt: &NoticePrompt,
    ) -> bool {
        let mut st = self.inner.lock();
        let approx = st.router.config().approx;
        let same_cut = prompt.chunk_tokens == approx.block_size_tokens
            && usize::try_from(prompt.chunk_chars).ok() == Some(approx.block_size_chars());
        if !same_cut {
            return false;
        }
        let blocks = PromptBlocks::from_hashes(prompt.chunks.to_vec(), prompt.chunk_tokens);
        st.router
            .observe_notice_prompt(id, request_id, &blocks)
            .unwrap_or(false)
    }

    /// The current time on the router's clock.
    pub fn now(&self) -> Time {
        self.clock.now()
    }

    /// Applies a policy's balancer settings and priors. New settings start a fresh router (its
    /// learned state is per-settings); returns whether it did, so the caller re-adds endpoints.
    pub fn apply_policy(&self, policy: &Policy) -> bool {
        let mut st = self.inner.lock();
        let config = policy.balancer.router_config(&st.base);
        let restarted = config != st.config;
        if restarted {
            st.config = config;
            st.router = Router::new(config);
        }
        for m in &policy.models {
            st.router
                .set_model_prior(ModelName::from(m.name.as_str()), m.prior);
        }
        st.prior_tpot = policy
            .models
            .iter()
            .map(|m| {
                (
                    ModelName::from(m.name.as_str()),
                    m.prior.time_per_output_token_s,
                )
            })
            .collect();
        restarted
    }

    /// Removes endpoints and adds or updates others; an added endpoint (`fresh`) or one with no
    /// signals yet is routable until a connection to it fails.
    pub fn reconcile(&self, removed: &[EndpointId], upserts: Vec<(EndpointMeta, bool)>) {
        let now = self.now();
        let mut st = self.inner.lock();
        for id in removed {
            st.router.remove_endpoint(id);
            st.tpot.remove(id);
            st.estimated_first_tokens.remove(id);
        }
        for (meta, fresh) in upserts {
            let id = meta.id.clone();
            st.router.upsert_endpoint(meta, now);
            if fresh || st.router.signals(&id).is_none() {
                let _ = st.router.set_ready(&id, true);
            }
        }
    }

    /// The plan for a request whose candidates the caller evaluated
    /// ([`kinference_decision::decide_among_with`], on the router as it is now), predicted under
    /// `policy`'s balancer: the router's own settings for the policy it was configured by, a
    /// rollout cohort's candidate balancer for the cohort's.
    pub fn decide(&self, policy: &Policy, candidates: Candidates, input: &Input<'_>) -> Plan {
        let now = self.now();
        let mut st = self.inner.lock();
        let st = &mut *st;
        let config = policy.balancer.router_config(st.router.config());
        kinference_decision::decide_among_with(
            policy,
            &st.router,
            &config,
            candidates,
            input,
            now,
            &mut st.rng,
        )
    }

    /// Plain balancing for another `/v1/*` path ([`kinference_decision::passthrough`]).
    pub fn passthrough<'p>(
        &self,
        policy: &'p Policy,
        requested: &str,
    ) -> Result<Passthrough<'p>, UnknownModel> {
        let now = self.now();
        let mut st = self.inner.lock();
        let st = &mut *st;
        kinference_decision::passthrough(policy, &st.router, requested, now, &mut st.rng)
    }

    /// The dry run of `POST /debug/explain` on the live router.
    pub fn explain(
        &self,
        policy: &Policy,
        explanation: kinference_classify::Explanation,
        input: &Input<'_>,
        models: Option<Vec<String>>,
    ) -> Explain {
        let now = self.now();
        let mut st = self.inner.lock();
        let st = &mut *st;
        let live = Live {
            router: &st.router,
            now,
            rng: &mut st.rng,
        };
        kinference_decision::explain::explain(policy, explanation, input, models, Some(live))
    }

    /// Records that the decision's `index`-th candidate was sent the request.
    pub fn dispatch(
        &self,
        decision: &Decision,
        index: usize,
        blocks: &PromptBlocks,
    ) -> Option<DispatchHandle> {
        let now = self.now();
        let mut st = self.inner.lock();
        // The router dispatches a decision's chosen candidate; a retry's is another.
        let handle = if decision.chosen == Some(index) {
            st.router.dispatch(decision, blocks, now).ok()
        } else {
            let mut d = decision.clone();
            d.chosen = Some(index);
            st.router.dispatch(&d, blocks, now).ok()
        }?;
        if let (Some(tap), Some(c)) = (&st.notices, decision.candidates.get(index)) {
            let config = st.router.config();
            let notice =
                Notice::predicted(handle.request_id(), now, &c.prediction, &config.predict);
            let hashes = blocks.hashes();
            let prompt = (!hashes.is_empty()).then(|| NoticePrompt {
                chunks: Arc::from(&hashes[..hashes.len().min(NOTICE_PROMPT_CHUNKS)]),
                chunk_tokens: config.approx.block_size_tokens,
                chunk_chars: u32::try_from(config.approx.block_size_chars()).unwrap_or(u32::MAX),
            });
            let _ = tap.try_send(OwnNotice {
                endpoint: c.endpoint.clone(),
                notice,
                at: now,
                prompt,
            });
        }
        Some(handle)
    }

    /// Records the first token of a dispatched request; returns its TTFT. `streamed`: the token
    /// itself arrived at `at` (a stream), so an engine step ended then; an estimated first token
    /// is not one.
    pub fn first_token(
        &self,
        handle: DispatchHandle,
        at: Instant,
        streamed: bool,
    ) -> Option<Duration> {
        let at = self.clock.time_of(at);
        let mut st = self.inner.lock();
        let endpoint = st.told_endpoint(handle);
        let ttft = st.router.first_token(handle, at).ok()?;
        if let Some(endpoint) = &endpoint {
            let id = handle.request_id();
            st.tell(endpoint.clone(), Notice::FirstToken { id, at }, at);
        }
        if streamed {
            st.token(handle, at, endpoint.as_ref());
        }
        Some(ttft)
    }

    /// A streamed token of a dispatched request arrived at `at` (see
    /// `kinference_routing::Router::observe_token`).
    pub fn observe_token(&self, handle: DispatchHandle, at: Instant) {
        let at = self.clock.time_of(at);
        let mut st = self.inner.lock();
        let endpoint = st.told_endpoint(handle);
        st.token(handle, at, endpoint.as_ref());
    }

    /// A stream on `id` had `gaps` inter-token gaps summing to `decode_s`: the endpoint's time per
    /// output token learns from it (what non-stream responses' decode is estimated with).
    pub fn observe_decode(&self, id: &EndpointId, decode_s: f64, gaps: u64) {
        if gaps == 0 || !decode_s.is_finite() || decode_s < 0.0 {
            return;
        }
        let per_token = decode_s / gaps as f64;
        let mut st = self.inner.lock();
        if st.router.signals(id).is_none() {
            return;
        }
        st.tpot
            .entry(id.clone())
            .and_modify(|t| *t += TPOT_ALPHA * (per_token - *t))
            .or_insert(per_token);
    }

    /// A non-stream response from `id` (of `model`) ended at `end`, `e2e` after its attempt was
    /// sent, with `completion_tokens` tokens: when the estimate is trusted (see the module doc),
    /// the request's first token is recorded at `end − decode`, so the endpoint's peak-EWMAs,
    /// prefill rate and correction learn as from a stream. Returns the estimated TTFT. The caller
    /// still calls [`RouterHandle::complete`].
    pub fn estimated_first_token(
        &self,
        id: &EndpointId,
        model: &str,
        handle: DispatchHandle,
        e2e: Duration,
        end: Instant,
        completion_tokens: u64,
    ) -> Option<Duration> {
        let tpot_s = {
            let st = self.inner.lock();
            let prior = st
                .prior_tpot
                .get(&ModelName::from(model))
                .copied()
                .unwrap_or(0.0);
            st.tpot.get(id).copied().unwrap_or(0.0).max(prior)
        };
        let ttft_s = estimate_ttft_s(e2e.as_secs_f64(), completion_tokens, tpot_s)?;
        let decode = e2e.saturating_sub(Duration::from_secs_f64(ttft_s));
        let at = end.checked_sub(decode)?;
        let ttft = self.first_token(handle, at, false)?;
        *self
            .inner
            .lock()
            .estimated_first_tokens
            .entry(id.clone())
            .or_default() += 1;
        Some(ttft)
    }

    /// The request is over: its work leaves the endpoint's queue, and (when its first token was
    /// seen) the endpoint's service time learns from it.
    pub fn complete(&self, handle: DispatchHandle) {
        let now = self.now();
        let mut st = self.inner.lock();
        let endpoint = st.told_endpoint(handle);
        if st.router.complete_at(handle, now).is_ok()
            && let Some(endpoint) = endpoint
        {
            let id = handle.request_id();
            st.tell(endpoint, Notice::Complete { id, at: now }, now);
        }
    }

    /// A scrape of `id` made at `at`; a successful scrape also makes the endpoint routable again.
    pub fn observe_scrape(&self, id: &EndpointId, scrape: &Scrape, at: Time) {
        let mut st = self.inner.lock();
        if st.router.observe_scrape(id, scrape, at).is_ok() {
            let _ = st.router.set_ready(id, true);
        }
    }

    /// Applies a batch of `id`'s KV events to its precise prefix index; false for an endpoint the
    /// router does not know.
    pub fn apply_kv_events(&self, id: &EndpointId, events: &[KvEvent]) -> bool {
        self.inner.lock().router.apply_kv_events(id, events).is_ok()
    }

    /// An attempt on `id` got an answer (a success for failure accrual).
    pub fn success(&self, id: &EndpointId) {
        let _ = self.inner.lock().router.observe_success(id);
    }

    /// An attempt on `id` failed (connect error, timeout, 5xx, 429); returns whether failure
    /// accrual ejected it (see `kinference_routing::accrual`).
    pub fn failure(&self, id: &EndpointId) -> bool {
        let now = self.now();
        let mut st = self.inner.lock();
        let st = &mut *st;
        let draw: f64 = rand::Rng::random(&mut st.rng);
        st.router.observe_failure(id, now, draw).unwrap_or(false)
    }

    /// Marks an endpoint unroutable (it refused a connection) until a scrape succeeds.
    pub fn set_ready(&self, id: &EndpointId, ready: bool) {
        let _ = self.inner.lock().router.set_ready(id, ready);
    }

    /// Reads the router and what this handle learned beside it, under the lock.
    pub fn read<R>(&self, f: impl FnOnce(&Router, &dyn Fn(&EndpointId) -> Learned) -> R) -> R {
        let st = self.inner.lock();
        let learned = |id: &EndpointId| Learned {
            time_per_output_token_s: st.tpot.get(id).copied(),
            estimated_first_tokens: st.estimated_first_tokens.get(id).copied().unwrap_or(0),
        };
        f(&st.router, &learned)
    }

    /// Like [`RouterHandle::read`], with the handle's random source (for a dry-run decision).
    pub fn read_with_rng<R>(&self, f: impl FnOnce(&Router, &mut SmallRng, Time) -> R) -> R {
        let now = self.now();
        let mut st = self.inner.lock();
        let st = &mut *st;
        f(&st.router, &mut st.rng, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ttft_estimate_is_trusted_only_when_decode_is_a_small_share() {
        // 5 tokens at 30 ms: 120 ms of decode in 1 s.
        let t = estimate_ttft_s(1.0, 5, 0.03).unwrap();
        assert!((t - 0.88).abs() < 1e-9);
        assert_eq!(estimate_ttft_s(1.0, 1, 0.03), Some(1.0));
        // 100 tokens at 30 ms is 3 s of decode: more than the whole request.
        assert_eq!(estimate_ttft_s(1.0, 100, 0.03), None);
        assert_eq!(estimate_ttft_s(1.0, 18, 0.03), None); // 0.51 s > half
        assert_eq!(estimate_ttft_s(0.0, 1, 0.03), None);
    }

    /// A router with one `glm-5.3` endpoint (the example policy's prior: 30 ms per output token)
    /// that has reported an empty queue.
    fn one_endpoint() -> (RouterHandle, EndpointId, Policy) {
        let policy = kinference_proxy_discovery::convert::policy(
            &kinference_proxy_discovery::testing::example_proto(),
        );
        let r = RouterHandle::default();
        r.apply_policy(&policy);
        let id = EndpointId::from("127.0.0.1:1");
        r.reconcile(&[], vec![(EndpointMeta::new(id.clone(), "glm-5.3"), true)]);
        let scrape = Scrape {
            num_requests_waiting: Some(0),
            num_requests_running: Some(0),
            kv_cache_usage: Some(0.0),
            ..Scrape::default()
        };
        r.observe_scrape(&id, &scrape, r.now());
        (r, id, policy)
    }

    fn dispatch(r: &RouterHandle, policy: &Policy, tokens: u32) -> DispatchHandle {
        let blocks = PromptBlocks::from_text(b"hello", &Default::default());
        let (tags, workload) = (kinference_classify::Tags::new(), Default::default());
        let input = Input {
            requested: "glm-5.3",
            tags: &tags,
            workload: &workload,
            prompt_tokens: tokens,
            max_tokens: None,
            prompt_blocks: &blocks,
            block_hasher: None,
            max_attempts: 3,
        };
        let candidates = policy.candidates("glm-5.3", &tags, &workload).unwrap();
        let plan = r.decide(policy, candidates, &input);
        r.dispatch(&plan.decision, plan.order[0], &blocks).unwrap()
    }

    /// One proxy's dispatch, first token and completion, tapped and carried as the signal
    /// service carries them (`wire_notice`, `notice_of`), move another proxy's prediction for
    /// the same endpoint: up while the request queues, back once its prefill is done.
    #[tokio::test(start_paused = true)]
    async fn own_notices_are_tapped_and_move_another_proxys_prediction() {
        use crate::signals::service::{apply_notice, wire_notice};
        let (a, id, policy) = one_endpoint();
        let (b, _, _) = one_endpoint();
        let (tap, mut rx) = tokio::sync::mpsc::channel(16);
        a.tap_notices(tap);
        let predicted = |r: &RouterHandle| {
            let blocks = PromptBlocks::from_text(b"other", &Default::default());
            let (tags, workload) = (kinference_classify::Tags::new(), Default::default());
            let input = Input {
                requested: "glm-5.3",
                tags: &tags,
                workload: &workload,
                prompt_tokens: 500,
                max_tokens: None,
                prompt_blocks: &blocks,
                block_hasher: None,
                max_attempts: 3,
            };
            let candidates = policy.candidates("glm-5.3", &tags, &workload).unwrap();
            r.decide(&policy, candidates, &input)
                .decision
                .predicted_ttft_s()
                .unwrap()
        };
        let addr: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let relay = |rx: &mut tokio::sync::mpsc::Receiver<OwnNotice>| {
            let own = rx.try_recv().expect("a tapped notice");
            assert_eq!(own.endpoint, id);
            let wire = wire_notice(&own, "a", "p", addr, a.now().saturating_since(own.at));
            assert!(apply_notice(&b, &id, &wire, b.now()));
        };
        let idle = predicted(&b);
        tokio::time::advance(Duration::from_millis(1)).await;
        let h = dispatch(&a, &policy, 20_000);
        relay(&mut rx);
        let queued = predicted(&b);
        assert!(queued > idle + 0.1, "{queued} against {idle}");
        tokio::time::advance(Duration::from_millis(500)).await;
        a.first_token(h, Instant::now(), true).unwrap();
        relay(&mut rx);
        // The streamed first token ended a step, and `a` has the only stream there: a step notice.
        let step = rx.try_recv().expect("a step notice");
        assert!(matches!(step.notice, Notice::Step { .. }), "{step:?}");
        a.complete(h);
        relay(&mut rx);
        assert!(rx.try_recv().is_err(), "four notices, no more");
        let after = predicted(&b);
        assert!(after < queued, "{after} against {queued}");
    }

    /// A dispatch notice carries its prompt's chunks (`NoticePrompt`); a receiver that cuts
    /// prompts the same way counts them as prefix the endpoint is about to compute, so a prompt
    /// sharing it is predicted sooner there than at a receiver told of the dispatch alone, or at
    /// one whose prefix index cuts prompts otherwise.
    #[tokio::test(start_paused = true)]
    async fn a_dispatch_notice_carries_its_prompt_as_pending_prefix() {
        use crate::signals::service::{apply_notice, wire_notice};
        let (a, id, policy) = one_endpoint();
        let (tap, mut rx) = tokio::sync::mpsc::channel(16);
        a.tap_notices(tap);
        let text: Vec<u8> = (0..64 * 120).map(|i| b'a' + (i % 26) as u8).collect();
        let predicted = |r: &RouterHandle, prompt: &[u8]| {
            let blocks = PromptBlocks::from_text(prompt, &Default::default());
            let (tags, workload) = (kinference_classify::Tags::new(), Default::default());
            let input = Input {
                requested: "glm-5.3",
                tags: &tags,
                workload: &workload,
                prompt_tokens: 2_000,
                max_tokens: None,
                prompt_blocks: &blocks,
                block_hasher: None,
                max_attempts: 3,
            };
            let candidates = policy.candidates("glm-5.3", &tags, &workload).unwrap();
            let plan = r.decide(&policy, candidates, &input);
            (plan, blocks)
        };
        let (plan, blocks) = predicted(&a, &text);
        a.dispatch(&plan.decision, plan.order[0], &blocks).unwrap();
        let own = rx.try_recv().expect("the dispatch is tapped");
        let prompt = own.prompt.clone().expect("with its prompt");
        assert_eq!(prompt.chunks.len(), 120);
        assert_eq!((prompt.chunk_tokens, prompt.chunk_chars), (16, 64));
        let addr: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let wire = wire_notice(&own, "a", "p", addr, Duration::ZERO);
        let bare = {
            let mut w = wire.clone();
            if let Some(kinference_proxy_api::signals::notice::Event::Dispatch(d)) = &mut w.event {
                d.prompt_chunks.clear();
            }
            w
        };
        let other_cut = {
            let mut w = wire.clone();
            if let Some(kinference_proxy_api::signals::notice::Event::Dispatch(d)) = &mut w.event {
                d.prompt_chunk_chars = 48;
            }
            w
        };
        let ttft = |wire: &kinference_proxy_api::signals::Notice| {
            let (b, _, _) = one_endpoint();
            assert!(apply_notice(&b, &id, wire, b.now()));
            // The engine queues (a prompt sent ahead is prefilled before the next is admitted).
            let queueing = Scrape {
                num_requests_waiting: Some(1),
                num_requests_running: Some(1),
                kv_cache_usage: Some(0.1),
                ..Scrape::default()
            };
            b.observe_scrape(&id, &queueing, b.now());
            predicted(&b, &text).0.decision.predicted_ttft_s().unwrap()
        };
        let (with_prompt, without, mismatched) = (ttft(&wire), ttft(&bare), ttft(&other_cut));
        assert!(
            with_prompt < without,
            "{with_prompt} s with the prompt's chunks, {without} s without"
        );
        assert_eq!(mismatched, without, "chunks cut otherwise are not used");
    }

    #[tokio::test(start_paused = true)]
    async fn non_stream_answers_feed_the_peak_ewma_and_prefill_rate() {
        let (r, id, policy) = one_endpoint();
        let ewma = |r: &RouterHandle| r.read(|router, _| router.observed_latency_s(&id, r.now()));
        let rate = |r: &RouterHandle| r.read(|router, _| router.prefill_tokens_per_second(&id));
        let before = rate(&r);
        assert_eq!(ewma(&r), None);
        // A long generation: its decode dominates, nothing is learned but the completion.
        let h = dispatch(&r, &policy, 2000);
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await;
        let end = Instant::now();
        let e2e = end - sent;
        assert_eq!(
            r.estimated_first_token(&id, "glm-5.3", h, e2e, end, 1000),
            None
        );
        r.complete(h);
        assert_eq!(r.read(|_, learned| learned(&id).estimated_first_tokens), 0);
        // A short answer: its end-to-end time is mostly its TTFT.
        let h = dispatch(&r, &policy, 2000);
        let sent = Instant::now();
        tokio::time::advance(Duration::from_secs(2)).await;
        let end = Instant::now();
        let ttft = r
            .estimated_first_token(&id, "glm-5.3", h, end - sent, end, 3)
            .unwrap();
        r.complete(h);
        // Two tokens after the first at the prior's 30 ms: 1.94 s from dispatch, exactly, on the
        // paused clock.
        assert_eq!(ttft, Duration::from_millis(1_940));
        assert_eq!(r.read(|_, learned| learned(&id).estimated_first_tokens), 1);
        assert!(ewma(&r).unwrap() > 1.5);
        assert_ne!(
            rate(&r),
            before,
            "the prefill rate learns from the estimate"
        );
        // Streams teach the time per output token, which then paces the estimate.
        r.observe_decode(&id, 1.0, 10);
        assert_eq!(
            r.read(|_, learned| learned(&id).time_per_output_token_s),
            Some(0.1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_streamed_first_token_is_timed_on_the_paused_clock() {
        let (r, id, policy) = one_endpoint();
        let h = dispatch(&r, &policy, 100);
        tokio::time::advance(Duration::from_millis(250)).await;
        let ttft = r.first_token(h, Instant::now(), true).unwrap();
        assert_eq!(ttft, Duration::from_millis(250));
        r.complete(h);
        let pending = r.read(|router, _| router.inflight(&id).unwrap().pending());
        assert_eq!(pending, 0);
    }
}
