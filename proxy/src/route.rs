//! The route layer: classify the prompt, make the decision, record it.
//!
//! For each parsed completion request it reads the target's current policy, computes the tags
//! with the policy's compiled classifiers, and calls the decision ([`kinference_decision`]):
//! the rules give the candidate models, the prompt is hashed for the candidates' pools (before
//! the router's lock), and the router's plan says where to send it and in which order to retry.
//! A prompt longer than every candidate's context window is refused before it is hashed, and a
//! large one is classified, hashed and decided on the blocking pool. The decision is counted and
//! recorded in `/debug/decisions`; a refusal (no policy, an unknown
//! model, nothing ready, fail-closed) is answered here. What goes on is a [`Routed`] request
//! carrying the plan.

use crate::{
    body::{ProxyBody, refuse},
    decisions::{DecisionRecord, Decisions, TagRecord},
    endpoints::EndpointTable,
    front::ProxyRequest,
    hasher::PromptHasher,
    metrics::{
        DecisionLabels, DecisionMetrics, FallbackLabels, ObjectiveLabels, PoolLabels,
        RequestLabels, RequestMetrics, TenantLabels, UNKNOWN_MODEL,
    },
    router::RouterHandle,
    target::PolicyWatch,
};
use bytes::Bytes;
use kinference_classify::Tags;
use kinference_decision::{Candidates, FailureMode, Input, Mode, Plan, Policy, Workload};
use kinference_openai::{ApiError, InferenceRequest};
use kinference_proxy_signals::Tokenizer;
use kinference_routing::{ApproxConfig, EndpointId, ModelName, PromptBlocks, Reason};
use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};
use tokio::time::Instant;

/// A request on its way to an endpoint: what the retry and observe layers need, and the order of
/// attempts.
#[derive(Debug)]
pub struct Routed {
    pub head: http::request::Parts,
    /// The body exactly as received.
    pub body: Bytes,
    /// The model name the client sent (the body is rewritten for an endpoint that serves another).
    pub model: String,
    /// A streaming request (its SSE events are observed).
    pub stream: bool,
    /// The request's `max_tokens` (a non-stream answer's wait is sized by it).
    pub max_tokens: Option<u32>,
    pub request_id: String,
    pub received_at: Instant,
    /// The request's metric labels; the served model and pool are the answering endpoint's.
    pub labels: RequestLabels,
    pub policy: Arc<Policy>,
    pub attempts: Attempts,
    /// Set when a quality guard sampled the request: its answer is judged once it has ended.
    pub sample: Option<Arc<crate::guard::Sample>>,
    /// The tokens reserved of the tenant's budget, settled when the answer ends.
    pub budget: Option<crate::budget::Reservation>,
    /// The request's arm of the policy's rollout, recorded when the answer ends.
    pub rollout: Option<Arc<crate::rollout::ArmTag>>,
    /// Its traffic record, completed and kept when the answer ends (none when no records are
    /// kept).
    pub traffic: Option<crate::traffic::Pending>,
}

/// Where a request may be tried, in order.
#[derive(Clone, Debug)]
pub enum Attempts {
    /// A decided request: the plan's order, each dispatch accounted with the router.
    Planned {
        plan: Arc<Plan>,
        blocks: Arc<PromptBlocks>,
    },
    /// Plain balancing (another `/v1/*` path): endpoints in order, nothing predicted.
    Plain(Vec<EndpointId>),
}

/// The route layer's handles.
#[derive(Clone, Debug)]
pub struct RouteParams {
    pub policy: PolicyWatch,
    pub router: RouterHandle,
    pub endpoints: EndpointTable,
    pub decisions: Decisions,
    pub metrics: DecisionMetrics,
    /// Where refusals are counted.
    pub requests: RequestMetrics,
    /// The workload this sidecar serves (rules match on it).
    pub workload: Workload,
    /// The target decision records name.
    pub target: Arc<str>,
    /// Attempts per request, the first included (the plan orders that many).
    pub max_attempts: usize,
    /// The quality guards of the policy's rules.
    pub guard: crate::guard::Guard,
    /// Requests held for their class's TTFT objective.
    pub admission: crate::admission::Admission,
    pub admission_metrics: crate::metrics::AdmissionMetrics,
    /// Each tenant's token budget window.
    pub budgets: crate::budget::Budgets,
    /// Where the arms of the policy's rollout are measured.
    pub rollout_ledger: Arc<kinference_proxy_discovery::RolloutLedger>,
    pub rollout_metrics: crate::metrics::RolloutMetrics,
    /// Where answered requests' traffic records go (`/debug/traffic`, `--traffic-log`).
    pub traffic: crate::traffic::Traffic,
}

#[derive(Clone, Debug)]
pub struct RouteLayer {
    params: Arc<RouteParams>,
}

impl RouteLayer {
    pub fn new(params: RouteParams) -> Self {
        Self {
            params: Arc::new(params),
        }
    }
}

impl<S> tower::Layer<S> for RouteLayer {
    type Service = Route<S>;
    fn layer(&self, inner: S) -> Route<S> {
        Route {
            params: self.params.clone(),
            inner,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Route<S> {
    params: Arc<RouteParams>,
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S> tower::Service<ProxyRequest> for Route<S>
where
    S: tower::Service<Routed, Response = http::Response<ProxyBody>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<ProxyBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ProxyRequest) -> Self::Future {
        let params = self.params.clone();
        let inner = self.inner.clone();
        // The request's span: the route fills in its rollout and arm when a rollout runs.
        let span = tracing::info_span!(
            "request",
            request_id = %req.request_id,
            rollout = tracing::field::Empty,
            arm = tracing::field::Empty,
        );
        Box::pin(tracing::Instrument::instrument(
            async move {
                match route(&params, req).await {
                    Ok(routed) => tower::ServiceExt::oneshot(inner, routed).await,
                    Err(refused) => Ok(refused),
                }
            },
            span,
        ))
    }
}

/// A unit enum's serialized (snake_case) name, as its metric label value.
fn snake(v: &impl serde::Serialize) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Enforce => "enforce",
        Mode::Shadow => "shadow",
    }
}

fn reason_name(r: &Reason) -> &'static str {
    match r {
        Reason::LowestPredictedTtft => "lowest_predicted_ttft",
        Reason::TieBroken { .. } => "tie_broken",
        Reason::PrefixAffinity { .. } => "prefix_affinity",
        Reason::FallbackStaleSignals => "stale_signals",
        Reason::FallbackNoSignals => "no_signals",
        Reason::NoCandidates => "no_candidates",
    }
}

/// Classifies and decides; the routed request, or the refusal to answer.
async fn route(
    params: &RouteParams,
    req: ProxyRequest,
) -> Result<Routed, http::Response<ProxyBody>> {
    let ProxyRequest {
        head,
        request,
        request_id,
        tenant,
        received_at,
    } = req;
    let mut labels = RequestLabels {
        tenant,
        // Label values come from policy only: a name the policy does not know is counted as one.
        requested_model: UNKNOWN_MODEL.into(),
        ..RequestLabels::default()
    };
    let refused =
        |labels: &RequestLabels, e: ApiError| refuse(&params.requests, labels, &e, &request_id);
    let Some(active) = params.policy.borrow().clone() else {
        return Err(refused(
            &labels,
            ApiError::unavailable("no inference policy has been received from the controller yet"),
        ));
    };
    // The request's arm of the policy's rollout: a cohort request is decided under the cohort's
    // policy (the candidate's rules and balancer over the same models), every other under the
    // policy's own.
    let arm = active.policy.rollout.as_ref().map(|r| {
        let arm = crate::rollout::arm_of(
            &r.split,
            &labels.tenant,
            &params.workload,
            &head.headers,
            rand::random::<u64>,
        );
        let span = tracing::Span::current();
        span.record("rollout", r.name());
        span.record("arm", arm.as_str());
        (Arc::<str>::from(r.name()), arm)
    });
    if let Some((_, arm)) = &arm {
        labels.arm = arm.as_str().into();
    }
    let decided_under = match (&arm, &active.cohort) {
        (Some((_, kinference_decision::rollout::Arm::Cohort)), Some(cohort)) => cohort.clone(),
        _ => active.policy.clone(),
    };
    let policy = &decided_under;
    // A prompt longer than every model's context window is refused before any prompt-sized work.
    let all_models = policy.models.iter().map(|m| m.name.as_str());
    if let Some(e) = too_long(&params.endpoints, all_models, &request) {
        return Err(refused(&labels, e));
    }
    let t0 = Instant::now();
    // A large prompt is classified, hashed and decided on the blocking pool: a few of them must
    // not stall the small requests that share the async workers.
    let large = request.prompt_bytes() > LARGE_PROMPT_BYTES;
    let (request, tags) = if large {
        let classifiers = active.classifiers.clone();
        let (request, local) = off_workers(move || {
            let local = request.classify_local(&classifiers.set);
            (request, local)
        })
        .await;
        let tags = InferenceRequest::classify_external(&active.classifiers.set, local).await;
        (request, tags)
    } else {
        let tags = request.classify(&active.classifiers.set).await;
        (request, tags)
    };
    let Some(candidates) = policy.candidates(&request.model, &tags, &params.workload) else {
        return Err(refused(&labels, ApiError::unknown_model(&request.model)));
    };
    labels.requested_model = candidates.requested_model.clone();
    labels.service_class = candidates.service_class.clone();
    let candidate_models = candidates.models.iter().map(String::as_str);
    if let Some(e) = too_long(&params.endpoints, candidate_models, &request) {
        return Err(refused(&labels, e));
    }
    let decider = decider_of(params, &labels);
    let (request, tags, blocks, plan, applied, precise) = if large {
        let policy = decided_under.clone();
        off_workers(move || {
            let (blocks, plan, applied, precise) =
                decider.decide(&policy, candidates, &request, &tags);
            (request, tags, blocks, plan, applied, precise)
        })
        .await
    } else {
        let (blocks, plan, applied, precise) = decider.decide(policy, candidates, &request, &tags);
        (request, tags, blocks, plan, applied, precise)
    };
    // Admission: a class with maxQueueTime waits for a candidate predicted to meet its SLO.
    let (mut plan, held, mut rejected) = match admit(
        params,
        policy,
        &decider_of(params, &labels),
        plan,
        &request,
        &tags,
        &blocks,
    )
    .await
    {
        Ok((plan, held)) => (plan, held, None),
        Err(r) => (r.plan, r.held, Some((r.refusal, r.error, r.retry_after_s))),
    };
    let estimate = u64::from(request.estimated_prompt_tokens())
        + u64::from(request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS_ESTIMATE));
    let budget = match policy.budget(&labels.tenant).filter(|_| rejected.is_none()) {
        Some(b) => match params
            .budgets
            .reserve(&labels.tenant, b, estimate, Instant::now())
        {
            Ok(r) => Some(r),
            Err(wait) => {
                params
                    .admission_metrics
                    .rejections
                    .get_or_create(&crate::metrics::AdmissionRejectionLabels {
                        tenant: labels.tenant.clone(),
                        service_class: labels.service_class.clone(),
                        reason: "budget_exhausted".into(),
                    })
                    .inc();
                let e = ApiError::budget_exhausted(format!(
                    "the tenant's budget of {} tokens per {}s is spent for this window (this request needs about {estimate})",
                    b.tokens,
                    b.window.as_secs()
                ));
                let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
                rejected = Some((kinference_decision::Refusal::BudgetExhausted, e, secs));
                None
            }
        },
        None => None,
    };
    match &rejected {
        // A refused request is recorded with why, and sent nowhere; its rules' guards do not
        // count it.
        Some((why, ..)) => {
            plan.refused = Some(*why);
            params.guard.unadmit(&applied);
        }
        None => params.admission.charge(&labels.tenant, estimate),
    }
    let blocks = Arc::new(blocks);
    let sample = if applied.is_empty() || plan.refused.is_some() {
        None
    } else {
        params.guard.sample(
            &decided_under,
            &applied,
            &plan.candidates.requested_model,
            plan.decision.chosen_model().map(|m| m.as_str()),
            &request.raw,
            head.uri.path(),
            &blocks,
        )
    };
    let plan = Arc::new(plan);
    let decision_s = t0.elapsed().as_secs_f64() - held.as_secs_f64();
    count(params, &labels, &plan, decision_s);
    let tag = arm.map(|(name, arm)| {
        // The saturation its first endpoint reported, as the decision saw it.
        let saturation = plan
            .attempt(0)
            .and_then(|c| c.prediction.kv_cache_usage)
            .map(|u| u.value);
        Arc::new(crate::rollout::ArmTag::new(
            name,
            arm,
            plan.fallback().is_some(),
            saturation,
            params.rollout_ledger.clone(),
            params.rollout_metrics.clone(),
        ))
    });
    let traffic = params.traffic.enabled().then(|| {
        let (block_size, block_hashes, hash_source) = match precise {
            Some((bs, hashes)) => (bs, hashes, crate::traffic::HashSource::Precise),
            None => (
                blocks.block_size_tokens(),
                blocks.hashes().to_vec(),
                crate::traffic::HashSource::Approx,
            ),
        };
        let waited = u64::try_from(received_at.elapsed().as_millis()).unwrap_or(0);
        crate::traffic::Pending {
            sink: params.traffic.clone(),
            record: crate::traffic::TrafficRecord {
                request_id: request_id.clone(),
                arrival_ms: crate::clock::unix_time_ms().saturating_sub(waited),
                tenant: labels.tenant.clone(),
                requested_model: request.model.clone(),
                tags: tags
                    .iter()
                    .map(|t| TagRecord {
                        name: t.name.clone(),
                        value: t.value.clone(),
                        confidence: t.confidence,
                    })
                    .collect(),
                service_class: plan.candidates.service_class.clone(),
                prompt_tokens: request.estimated_prompt_tokens(),
                completion_tokens: 0,
                block_size,
                block_hashes,
                hash_source,
                served_model: String::new(),
                endpoint: String::new(),
                ttft_s: None,
                status: 0,
                rollout: tag.as_ref().map(|t| {
                    let r = t.record_of();
                    crate::traffic::RolloutArm {
                        name: r.name,
                        arm: r.arm.to_owned(),
                    }
                }),
            },
        }
    });
    params.decisions.push(DecisionRecord {
        request_id: request_id.clone(),
        target: params.target.to_string(),
        unix_time_ms: crate::clock::unix_time_ms(),
        tenant: labels.tenant.clone(),
        requested: request.model.clone(),
        tags: tags
            .iter()
            .map(|t| TagRecord {
                name: t.name.clone(),
                value: t.value.clone(),
                confidence: t.confidence,
            })
            .collect(),
        plan: plan.clone(),
        attempts: vec![],
        decision_duration_s: decision_s,
        held_s: held.as_secs_f64(),
        rollout: tag.as_ref().map(|t| t.record_of()),
    });
    let refused_arm = |e: &ApiError| {
        if let Some(t) = &tag {
            t.record(crate::rollout::Ended {
                status: e.status.as_u16(),
                ..Default::default()
            });
        }
    };
    if let Some((_, e, retry_after_s)) = rejected {
        refused_arm(&e);
        let mut rsp = refused(&labels, e);
        if let Ok(v) = http::HeaderValue::from_str(&retry_after_s.to_string()) {
            rsp.headers_mut().insert(http::header::RETRY_AFTER, v);
        }
        return Err(rsp);
    }
    if let Some(why) = plan.refused {
        let e = ApiError::unavailable(why.message());
        refused_arm(&e);
        return Err(refused(&labels, e));
    }
    Ok(Routed {
        head,
        body: request.raw,
        model: request.model,
        stream: request.stream,
        max_tokens: request.max_tokens,
        request_id,
        received_at,
        labels,
        policy: decided_under.clone(),
        attempts: Attempts::Planned { plan, blocks },
        sample,
        budget,
        rollout: tag,
        traffic,
    })
}

/// The output tokens a request without `max_tokens` is counted for until its usage is known.
const DEFAULT_MAX_TOKENS_ESTIMATE: u32 = 256;

/// A refusal by admission control: the last plan, how long the request was held, what the
/// client is told and when to try again.
struct Rejected {
    plan: Plan,
    held: std::time::Duration,
    refusal: kinference_decision::Refusal,
    error: ApiError,
    retry_after_s: u64,
}

fn decider_of(params: &RouteParams, labels: &RequestLabels) -> Decider {
    Decider {
        router: params.router.clone(),
        tokenizers: params.endpoints.tokenizers(),
        workload: params.workload.clone(),
        max_attempts: params.max_attempts,
        guard: params.guard.clone(),
        tenant: labels.tenant.clone(),
        record_hashes: params.traffic.enabled(),
    }
}

/// Holds `plan`'s request while its class's objective is predicted to be missed everywhere (see
/// [`crate::admission`]); the plan to send it by, and how long it was held.
async fn admit(
    params: &RouteParams,
    policy: &Policy,
    decider: &Decider,
    plan: Plan,
    request: &InferenceRequest,
    tags: &Tags,
    blocks: &PromptBlocks,
) -> Result<(Plan, std::time::Duration), Rejected> {
    let class = plan.candidates.service_class.clone();
    let Some((slo, max_wait)) = policy.admission(&class) else {
        return Ok((plan, std::time::Duration::ZERO));
    };
    let misses = |p: &Plan| {
        p.refused.is_none()
            && p.decision
                .predicted_ttft_s()
                .is_some_and(|t| t > slo.as_secs_f64())
    };
    // Sent at once when predicted within the threshold, unless a held request goes before it.
    if !misses(&plan)
        && !params.admission.holds_ahead_of(
            &plan.candidates.requested_model,
            &class,
            &decider.tenant,
        )
    {
        return Ok((plan, std::time::Duration::ZERO));
    }
    let start = Instant::now();
    let deadline = start + max_wait;
    let m = &params.admission_metrics;
    let class_labels = crate::metrics::ClassLabels {
        requested_model: plan.candidates.requested_model.clone(),
        service_class: class.clone(),
    };
    let finish = |outcome: &str, reason: Option<&str>| {
        m.held_seconds
            .get_or_create(&crate::metrics::HoldLabels {
                tenant: decider.tenant.clone(),
                service_class: class.clone(),
                outcome: outcome.into(),
            })
            .observe(start.elapsed().as_secs_f64());
        if let Some(reason) = reason {
            m.rejections
                .get_or_create(&crate::metrics::AdmissionRejectionLabels {
                    tenant: decider.tenant.clone(),
                    service_class: class.clone(),
                    reason: reason.into(),
                })
                .inc();
        }
    };
    let over = |p: &Plan| {
        let t = p.decision.predicted_ttft_s().unwrap_or(0.0) - slo.as_secs_f64();
        (t.max(0.0).ceil() as u64).max(1)
    };
    let model = plan.candidates.requested_model.clone();
    let share = policy.reserved_share(&class);
    let Ok(ticket) = params
        .admission
        .enter(&model, &class, &decider.tenant, share)
    else {
        finish("rejected", Some("queue_full"));
        let retry_after_s = over(&plan);
        return Err(Rejected {
            plan,
            held: std::time::Duration::ZERO,
            refusal: kinference_decision::Refusal::QueueFull,
            retry_after_s,
            error: ApiError::queue_full(format!(
                "every endpoint is predicted over the {}ms time to first token the {class} class is admitted at, and the admission queue is full",
                slo.as_millis()
            )),
        });
    };
    let held = m.held.get_or_create(&class_labels).clone();
    let work = m.held_work_seconds.get_or_create(&class_labels).clone();
    let work_s = plan
        .decision
        .chosen()
        .map_or(0.0, |c| c.prediction.prefill_s.max(0.0));
    held.inc();
    work.inc_by(work_s);
    let _held = scopeguard(move || {
        held.dec();
        work.dec_by(work_s);
    });
    let mut plan = plan;
    loop {
        if Instant::now() >= deadline {
            finish("rejected", Some("queue_timeout"));
            let retry_after_s = over(&plan);
            return Err(Rejected {
                held: start.elapsed(),
                refusal: kinference_decision::Refusal::QueueTimeout,
                retry_after_s,
                plan,
                error: ApiError::queue_timeout(format!(
                    "no endpoint was predicted within the {}ms time to first token the {class} class is admitted at during its {}ms maxQueueTime",
                    slo.as_millis(),
                    max_wait.as_millis()
                )),
            });
        }
        tokio::select! {
            _ = ticket.wait() => {}
            _ = tokio::time::sleep_until(deadline) => continue,
        }
        if !ticket.is_head() {
            continue;
        }
        let again = decider.redecide(policy, plan.candidates.clone(), request, tags, blocks);
        if !misses(&again) {
            finish("admitted", None);
            ticket.admit();
            return Ok((again, start.elapsed()));
        }
        plan = again;
    }
}

/// Runs `f` when dropped (a held request's gauge is decremented however its hold ends, a
/// cancelled client's included).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// Prompts above this many bytes (about 64k tokens) are classified, hashed and decided on
/// tokio's blocking pool rather than inline on an async worker.
pub const LARGE_PROMPT_BYTES: usize = 256 * 1024;

/// Runs prompt-sized CPU work on the blocking pool; a panic there is a panic here, as inline.
pub(crate) async fn off_workers<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// The refusal of a prompt that cannot fit any of `models`' endpoints, when every one of them
/// has said its context window: its tokens (at least one per 8 bytes) plus `max_tokens` exceed
/// the largest. vLLM would refuse it too, after the proxy had hashed it and sent it on.
fn too_long<'a>(
    endpoints: &EndpointTable,
    models: impl IntoIterator<Item = &'a str>,
    request: &InferenceRequest,
) -> Option<ApiError> {
    let window = endpoints.context_window(models)?;
    let at_least = request.min_prompt_tokens();
    let total = at_least + u64::from(request.max_tokens.unwrap_or(0));
    (total > u64::from(window))
        .then(|| ApiError::context_length_exceeded(window, at_least, request.max_tokens))
}

/// The vLLM-space block size and hashes a decision computed, for the traffic record.
type Precise = Option<(u32, Vec<u64>)>;

/// vLLM's default KV block size (`--block-size`): the traffic record's blocks when no candidate
/// endpoint's events told the decision another.
const VLLM_DEFAULT_BLOCK_SIZE: u32 = 16;

/// What a decision needs besides the policy and the request, owned so that it can move to the
/// blocking pool.
struct Decider {
    router: RouterHandle,
    tokenizers: Arc<HashMap<ModelName, Tokenizer>>,
    workload: Workload,
    max_attempts: usize,
    guard: crate::guard::Guard,
    tenant: String,
    /// The traffic log is on: every record needs vLLM-space hashes when the prompt could be
    /// tokenized, even where the decision asked for none (`PromptHasher::for_record`).
    record_hashes: bool,
}

impl Decider {
    /// Hashes the prompt (approximate chunks, and vLLM-space blocks for pools with KV events)
    /// and asks the router for the plan; when a quality guard holds a rule the plan used, asks
    /// again without it. Also says which guarded rules applied.
    fn decide(
        &self,
        policy: &Policy,
        candidates: Candidates,
        request: &InferenceRequest,
        tags: &Tags,
    ) -> (
        PromptBlocks,
        Plan,
        Vec<kinference_decision::guard::Applied>,
        Precise,
    ) {
        let blocks = PromptBlocks::from_text(&request.prefix_text(), &ApproxConfig::default());
        let hasher = PromptHasher::new(&self.tokenizers, &candidates.models, &request.prompt);
        let input = Input {
            requested: &request.model,
            tags,
            workload: &self.workload,
            prompt_tokens: request.estimated_prompt_tokens(),
            max_tokens: request.max_tokens,
            prompt_blocks: &blocks,
            block_hasher: hasher.as_ref().map(|h| h as _),
            max_attempts: self.max_attempts,
        };
        let plan = self.router.decide(policy, candidates, &input);
        let chosen = plan.decision.chosen_model().map(|m| m.to_string());
        let applied = self.guard.admit(
            policy,
            &self.tenant,
            tags,
            &plan.candidates,
            chosen.as_deref(),
        );
        let held: HashMap<&str, kinference_decision::guard::Hold> = applied
            .iter()
            .filter_map(|a| Some((a.key.rule.as_str(), a.hold?)))
            .collect();
        let precise = || {
            let h = hasher.as_ref()?;
            if self.record_hashes {
                h.for_record(VLLM_DEFAULT_BLOCK_SIZE)
            } else {
                h.computed()
            }
        };
        if held.is_empty() {
            return (blocks, plan, applied, precise());
        }
        let Some(kept) = policy.candidates_held(&request.model, tags, &self.workload, &|rule| {
            held.get(rule).copied()
        }) else {
            return (blocks, plan, applied, precise());
        };
        let plan = self.router.decide(policy, kept, &input);
        (blocks, plan, applied, precise())
    }

    /// The plan again over the same candidates, now (a held request's next look).
    fn redecide(
        &self,
        policy: &Policy,
        candidates: Candidates,
        request: &InferenceRequest,
        tags: &Tags,
        blocks: &PromptBlocks,
    ) -> Plan {
        let hasher = PromptHasher::new(&self.tokenizers, &candidates.models, &request.prompt);
        let input = Input {
            requested: &request.model,
            tags,
            workload: &self.workload,
            prompt_tokens: request.estimated_prompt_tokens(),
            max_tokens: request.max_tokens,
            prompt_blocks: blocks,
            block_hasher: hasher.as_ref().map(|h| h as _),
            max_attempts: self.max_attempts,
        };
        self.router.decide(policy, candidates, &input)
    }
}

/// Counts one decision: its duration, reason and mode, the rules it matched, the stale signals
/// it saw, and whether it fell back.
fn count(params: &RouteParams, labels: &RequestLabels, plan: &Plan, decision_s: f64) {
    let m = &params.metrics;
    let tenant = &labels.tenant;
    m.decision_duration_seconds
        .get_or_create(&TenantLabels {
            tenant: tenant.clone(),
            requested_model: labels.requested_model.clone(),
        })
        .observe(decision_s);
    let d = &plan.decision;
    // A refused decision (nothing ready, fail-closed, admission) served nothing.
    let served = match plan.refused {
        Some(_) => String::new(),
        None => d.chosen_model().map(|m| m.to_string()).unwrap_or_default(),
    };
    m.decisions
        .get_or_create(&DecisionLabels {
            tenant: tenant.clone(),
            requested_model: labels.requested_model.clone(),
            served_model: served.clone(),
            reason: reason_name(&d.reason).into(),
            mode: mode_name(plan.mode).into(),
            arm: labels.arm.clone(),
        })
        .inc();
    m.rule_decisions(
        tenant,
        &labels.requested_model,
        &served,
        plan.candidates
            .rule_trace
            .iter()
            .filter(|t| t.matched && t.held.is_none())
            .map(|t| t.rule.as_str()),
    );
    for c in &d.candidates {
        if c.prediction.reported_waiting.is_some() && !c.prediction.signals_fresh {
            let pool = params
                .endpoints
                .info(&c.endpoint)
                .map(|i| i.pool)
                .unwrap_or_default();
            m.stale_signals
                .get_or_create(&PoolLabels {
                    pool,
                    model: c.model.to_string(),
                })
                .inc();
        }
    }
    if let Some(o) = &plan.objective {
        m.objective_decisions
            .get_or_create(&ObjectiveLabels {
                tenant: tenant.clone(),
                requested_model: labels.requested_model.clone(),
                served_model: served.clone(),
                objective: snake(&o.objective),
                decided_by: snake(&o.decided_by),
            })
            .inc();
    }
    if let Some(failure_mode) = plan.fallback() {
        m.fallbacks
            .get_or_create(&FallbackLabels {
                tenant: tenant.clone(),
                requested_model: labels.requested_model.clone(),
                reason: reason_name(&d.reason).into(),
                failure_mode: match failure_mode {
                    FailureMode::FailOpen => "fail_open",
                    FailureMode::FailClose => "fail_close",
                }
                .into(),
                arm: labels.arm.clone(),
            })
            .inc();
    }
}
