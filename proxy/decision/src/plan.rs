//! The plan for one request: which endpoint first, which next on failure, or why none.
//!
//! [`decide`] is the whole decision in one pure call. The policy's rules turn the request's tags
//! into candidate models ([`Policy::candidates`]), the router predicts every ready endpoint's TTFT
//! and picks the fastest ([`Router::decide`]), the policy's objective may prefer a cheaper
//! candidate ([`crate::objective`]), and the balancer settings turn that choice into a [`Plan`]:
//!
//! - **Enforce** sends to the pick, then retries on the other candidates in order of predicted
//!   TTFT; when prediction fell back, only within the fallback's pool (the requested model's).
//! - **Shadow** records the pick but sends where plain peak-EWMA power of two over the requested
//!   model's candidates would: the policy is observed before it is trusted.
//! - **FailClose** refuses a fallback decision rather than route on stale signals.
//!
//! It takes the router by shared reference and the clock and randomness as arguments, so the
//! proxy (wall time), `/debug/explain` (a dry run), `kinfctl explain` and the fleet benchmark
//! (virtual time) run exactly this code, and nothing changes until the caller dispatches.

use crate::{
    objective::ObjectiveOutcome,
    policy::{Candidates, FailureMode, Mode, Model, Policy, Workload},
};
use kinference_classify::Tags;
use kinference_routing::{
    BlockHasher, Decision, EndpointId, ModelName, PromptBlocks, Request, Router, RouterConfig, Time,
};
use rand::Rng;

/// What the decision needs of one request. Holds no prompt text: the prompt reaches it only as
/// block hashes and a token count.
#[derive(Clone, Copy)]
pub struct Input<'a> {
    /// The model or alias the client asked for, as sent.
    pub requested: &'a str,
    pub tags: &'a Tags,
    pub workload: &'a Workload,
    /// The caller's estimate of the prompt's length (a hasher's exact count wins).
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    /// The prompt's approximate chunk hashes.
    pub prompt_blocks: &'a PromptBlocks,
    /// vLLM-space hashing of the prompt, for pools whose endpoints publish KV events.
    pub block_hasher: Option<&'a dyn BlockHasher>,
    /// The most endpoints the caller will try: the plan orders only that many.
    pub max_attempts: usize,
}

impl std::fmt::Debug for Input<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("requested", &self.requested)
            .field("tags", &self.tags.len())
            .field("workload", &self.workload)
            .field("prompt_tokens", &self.prompt_tokens)
            .field("max_tokens", &self.max_tokens)
            .field("block_hasher", &self.block_hasher.is_some())
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

/// The requested name is neither a model nor an alias of the policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the model `{0}` does not exist")]
pub struct UnknownModel(pub String);

/// Why a request that names a known model cannot be sent anywhere.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// No endpoint of any allowed model is ready.
    NoReadyEndpoint,
    /// Prediction fell back and the policy fails closed.
    FailClosed,
    /// Admission control held the request for its class's `maxQueueTime` and no candidate was
    /// predicted to meet its TTFT objective (429).
    QueueTimeout,
    /// Admission control's queue was full (429).
    QueueFull,
    /// The tenant's token budget for the window was spent (429).
    BudgetExhausted,
}

impl Refusal {
    /// What the client is told.
    pub fn message(self) -> &'static str {
        match self {
            Self::NoReadyEndpoint => "no ready endpoint serves the allowed models",
            Self::FailClosed => "endpoint signals are stale and the policy fails closed",
            Self::QueueTimeout => {
                "no endpoint was predicted to meet the class's TTFT objective within its maxQueueTime"
            }
            Self::QueueFull => "the admission queue is full",
            Self::BudgetExhausted => "the tenant's token budget for the window is spent",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// What to do with one request, and the record of why.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Plan {
    /// The rules' outcome: the requested model after aliases, the allowed models, the service
    /// class and which rules matched.
    pub candidates: Candidates,
    pub mode: Mode,
    /// The router's decision (what is recorded, in shadow mode too), its choice the objective's.
    pub decision: Decision,
    /// What the objective decided and by how much; absent when nothing was chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objective: Option<ObjectiveOutcome>,
    /// Indices into `decision.candidates` to try, in order (at most the input's `max_attempts`);
    /// empty when refused.
    pub order: Vec<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refusal>,
}

impl Plan {
    /// Whether prediction fell back, and the failure mode that then applied.
    pub fn fallback(&self) -> Option<FailureMode> {
        self.decision
            .reason
            .is_fallback()
            .then_some(if self.refused.is_some() {
                FailureMode::FailClose
            } else {
                FailureMode::FailOpen
            })
    }

    /// The endpoint of the `n`-th attempt.
    pub fn attempt(&self, n: usize) -> Option<&kinference_routing::decision::Candidate> {
        self.decision.candidates.get(*self.order.get(n)?)
    }
}

/// The whole decision for one request under `policy`, on what `router` knows at `now`.
pub fn decide(
    policy: &Policy,
    router: &Router,
    input: &Input<'_>,
    now: Time,
    rng: &mut impl Rng,
) -> Result<Plan, UnknownModel> {
    let candidates = policy
        .candidates(input.requested, input.tags, input.workload)
        .ok_or_else(|| UnknownModel(input.requested.to_string()))?;
    Ok(decide_among(policy, router, candidates, input, now, rng))
}

/// [`decide`] over candidates the caller already has (an explain request that names its own
/// models, say): prediction, selection and the plan.
pub fn decide_among(
    policy: &Policy,
    router: &Router,
    candidates: Candidates,
    input: &Input<'_>,
    now: Time,
    rng: &mut impl Rng,
) -> Plan {
    decide_among_with(policy, router, router.config(), candidates, input, now, rng)
}

/// [`decide_among`] with the router predicting under `config` rather than its own settings: a
/// rollout's cohort on the router the control group's balancer configured
/// ([`crate::Balancer::router_config`] of the cohort's balancer).
pub fn decide_among_with(
    policy: &Policy,
    router: &Router,
    config: &RouterConfig,
    candidates: Candidates,
    input: &Input<'_>,
    now: Time,
    rng: &mut impl Rng,
) -> Plan {
    let requested = ModelName::from(candidates.requested_model.as_str());
    let models: Vec<ModelName> = candidates
        .models
        .iter()
        .map(|m| ModelName::from(m.as_str()))
        .collect();
    // The pool's tokenizer counts the prompt exactly where the caller's estimate guesses.
    let prompt_tokens = input
        .block_hasher
        .and_then(|h| h.token_count(&requested))
        .unwrap_or(input.prompt_tokens);
    let request = Request {
        requested_model: &requested,
        candidate_models: &models,
        prompt_tokens,
        max_tokens: input.max_tokens,
        lora_adapter: None,
        prompt_blocks: input.prompt_blocks,
        block_hasher: input.block_hasher,
    };
    let mut decision = router.decide_with(config, &request, now, rng);
    let objective = crate::objective::apply(
        policy,
        &mut decision,
        &candidates.service_class,
        input.max_tokens,
    );
    let mode = policy.balancer.mode;
    let (order, refused) = order(
        policy,
        router,
        &decision,
        &requested,
        input.max_attempts,
        now,
        rng,
    );
    Plan {
        candidates,
        mode,
        decision,
        objective,
        order,
        refused,
    }
}

/// The attempts' order under the policy's balancer settings, or why there are none.
fn order(
    policy: &Policy,
    router: &Router,
    decision: &Decision,
    requested: &ModelName,
    max_attempts: usize,
    now: Time,
    rng: &mut impl Rng,
) -> (Vec<usize>, Option<Refusal>) {
    let Some(chosen) = decision.chosen else {
        return (vec![], Some(Refusal::NoReadyEndpoint));
    };
    if policy.balancer.mode == Mode::Shadow {
        let mut order = shadow_order(router, decision, requested, now, rng);
        order.truncate(max_attempts.max(1));
        return (order, None);
    }
    let fallback = decision.reason.is_fallback();
    if fallback && policy.balancer.failure_mode == FailureMode::FailClose {
        return (vec![], Some(Refusal::FailClosed));
    }
    // The rest by predicted TTFT, ties in candidate order; the keys are read once, not per
    // comparison.
    let mut rest: Vec<(f64, usize)> = decision
        .candidates
        .iter()
        .enumerate()
        .filter(|&(i, c)| i != chosen && (!fallback || c.p2c.is_some()))
        // (A fallback decision retries within the fallback pool only.)
        .map(|(i, c)| (c.prediction.ranked_ttft_s(), i))
        .collect();
    let by_ttft = |a: &(f64, usize), b: &(f64, usize)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    // Only the first `max_attempts - 1` of the rest are ever tried: select them, then sort them.
    let keep = max_attempts.max(1) - 1;
    if keep < rest.len() {
        if keep > 0 {
            rest.select_nth_unstable_by(keep - 1, by_ttft);
        }
        rest.truncate(keep);
    }
    rest.sort_unstable_by(by_ttft);
    let mut order = Vec::with_capacity(rest.len() + 1);
    order.push(chosen);
    order.extend(rest.into_iter().map(|(_, i)| i));
    (order, None)
}

/// Shadow mode: power of two over the requested model's ready candidates, then the rest of them.
fn shadow_order(
    router: &Router,
    decision: &Decision,
    requested: &ModelName,
    now: Time,
    rng: &mut impl Rng,
) -> Vec<usize> {
    let mut pool: Vec<usize> = (0..decision.candidates.len())
        .filter(|&i| decision.candidates[i].model == *requested)
        .collect();
    if let (Some(k), _) = router.power_of_two_among(decision, &pool, now, rng) {
        pool.swap(0, k);
    }
    pool
}

/// Where a request the proxy does not decide on (another `/v1/*` path naming a model) goes: the
/// model's endpoints in plain-balancing order.
#[derive(Clone, Debug)]
pub struct Passthrough<'p> {
    pub model: &'p Model,
    pub order: Vec<EndpointId>,
}

/// Plain balancing for a request that names `requested` but is not a completion: peak-EWMA power
/// of two over every endpoint of the model it resolves to, then the rest.
pub fn passthrough<'p>(
    policy: &'p Policy,
    router: &Router,
    requested: &str,
    now: Time,
    rng: &mut impl Rng,
) -> Result<Passthrough<'p>, UnknownModel> {
    let model = policy
        .resolve(requested)
        .ok_or_else(|| UnknownModel(requested.to_string()))?;
    let mut order = router.endpoints_of(&ModelName::from(model.name.as_str()));
    let mut inputs: Vec<_> = order
        .iter()
        .map(|id| router.p2c_inputs(id, 0.0, now))
        .collect();
    if let Some(first) = kinference_routing::fallback::power_of_two(&mut inputs, rng) {
        order.swap(0, first);
    }
    Ok(Passthrough { model, order })
}

#[cfg(test)]
mod tests;
