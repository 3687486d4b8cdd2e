//! Quality guards on the sidecar: admitting guarded rules on the request path, and judging
//! sampled requests off it.
//!
//! On the request path ([`Guard::admit`], called by the route layer) the decision's guarded
//! rules go through the target's [`GuardBook`]: a rule still measuring moves at most its capped
//! share, a suspended one moves nothing, and the route layer decides again without the rules
//! held. Nothing here waits on I/O.
//!
//! Off the request path ([`Guard::judge_later`], called by the observe layer when the app's
//! answer has ended) a sampled request is sent once more, non-streaming, to the other model of
//! the pair: the requested model when the rule moved the request, the rule's model when it did
//! not. Only when that model has an endpoint with an empty queue; the mirrored request is
//! accounted with the router like any other, so the sidecar's own view of the queue stays
//! exact. Both answers then go to the policy's judge, blind and in random order, and its
//! verdict is recorded. The app's answer is never delayed or changed: by then it has been sent.
//! At most [`MAX_IN_FLIGHT`] judgements run at once; a sample beyond that is dropped and
//! counted. Neither prompts nor answers are logged.

mod judge;

use crate::{
    endpoints::EndpointTable,
    metrics::{
        GuardHoldLabels, GuardLabels, GuardMetrics, GuardSampleLabels, GuardStateLabels,
        GuardVerdictLabels,
    },
    router::RouterHandle,
};
use bytes::Bytes;
use kinference_classify::Tags;
use kinference_decision::{
    Candidates, Input, Policy, Workload,
    guard::{Applied, GuardBook, GuardState, GuardStatus, QualityGuard, Transition, Verdict},
};
use kinference_routing::PromptBlocks;
use parking_lot::Mutex;
use rand::Rng;
use std::sync::Arc;

pub use self::judge::{answer_text, delta_text, question_text};

/// Judgements (mirror and judge calls) in flight at once, per target.
pub const MAX_IN_FLIGHT: usize = 8;

/// A target's guard book, shared by its stack and its admin views.
pub type Book = Arc<Mutex<GuardBook>>;

/// One sampled request, waiting for its answer to end.
#[derive(Debug)]
pub struct Sample {
    pub applied: Applied,
    pub guard: QualityGuard,
    /// The model whose answer the app got, and the other one of the pair.
    pub served_model: String,
    pub mirror_model: String,
    /// Whether the app's answer is the requested model's.
    pub served_is_requested: bool,
    /// The request as the app sent it, and its path.
    pub body: Bytes,
    pub path: String,
    pub blocks: Arc<PromptBlocks>,
    pub policy: Arc<Policy>,
}

/// The guard's handles for one target.
#[derive(Clone, Debug)]
pub struct Guard {
    pub book: Book,
    pub metrics: GuardMetrics,
    pub router: RouterHandle,
    pub endpoints: EndpointTable,
    client: judge::Client,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Where measurements go to be reported to the controller.
    reports: Option<Reports>,
}

type Reports = Arc<tokio::sync::watch::Sender<Arc<kinference_proxy_discovery::GuardMeasurements>>>;

impl Guard {
    pub fn new(
        book: Book,
        metrics: GuardMetrics,
        router: RouterHandle,
        endpoints: EndpointTable,
    ) -> Self {
        Self {
            book,
            metrics,
            router,
            endpoints,
            client: judge::Client::new(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
            reports: None,
        }
    }

    /// Publishes every new measurement of the target's guards on `reports` (the discovery
    /// client sends them to the controller).
    pub fn reporting_to(mut self, reports: Reports) -> Self {
        self.reports = Some(reports);
        self
    }

    /// Admits the decision's guarded rules; counts and returns what applied (the held ones
    /// carry their hold).
    pub fn admit(
        &self,
        policy: &Policy,
        tenant: &str,
        tags: &Tags,
        candidates: &Candidates,
        chosen: Option<&str>,
    ) -> Vec<Applied> {
        if !policy.rules.iter().any(|r| r.guard.is_some()) {
            return vec![];
        }
        let applied = {
            let mut book = self.book.lock();
            kinference_decision::guard::gate(policy, &mut book, tenant, tags, candidates, chosen)
        };
        for a in &applied {
            if let Some(hold) = a.hold {
                self.metrics
                    .held
                    .get_or_create(&GuardHoldLabels {
                        tenant: a.key.tenant.clone(),
                        rule: a.key.rule.clone(),
                        family: a.key.family.clone(),
                        hold: match hold {
                            kinference_decision::guard::Hold::Capped => "capped",
                            kinference_decision::guard::Hold::Suspended => "suspended",
                        }
                        .into(),
                    })
                    .inc();
            }
        }
        applied
    }

    /// Takes back what [`Self::admit`] counted for requests that were then refused.
    pub fn unadmit(&self, applied: &[Applied]) {
        if applied.is_empty() {
            return;
        }
        let mut book = self.book.lock();
        for a in applied {
            book.unadmit(a);
        }
    }

    /// Draws whether this request is judged: at most one of the rules that applied to it, each
    /// at its sample share.
    #[allow(clippy::too_many_arguments)]
    pub fn sample(
        &self,
        policy: &Arc<Policy>,
        applied: &[Applied],
        requested_model: &str,
        served_model: Option<&str>,
        body: &Bytes,
        path: &str,
        blocks: &Arc<PromptBlocks>,
    ) -> Option<Arc<Sample>> {
        let served = served_model?;
        let mut rng = rand::rng();
        for a in applied {
            let Some(g) = policy
                .rules
                .iter()
                .find(|r| r.name == a.key.rule)
                .and_then(|r| r.guard.as_ref())
            else {
                continue;
            };
            if !rng.random_bool(g.sample_share.clamp(0.0, 1.0)) {
                continue;
            }
            let served_is_requested = served == requested_model;
            let mirror_model = if served_is_requested {
                a.added.clone()
            } else {
                requested_model.to_string()
            };
            return Some(Arc::new(Sample {
                applied: a.clone(),
                guard: g.clone(),
                served_model: served.to_string(),
                mirror_model,
                served_is_requested,
                body: body.clone(),
                path: path.to_string(),
                blocks: blocks.clone(),
                policy: policy.clone(),
            }));
        }
        None
    }

    /// Judges `sample` in the background, given the app's answer.
    pub fn judge_later(&self, sample: Arc<Sample>, answer: Option<String>) {
        let Some(answer) = answer.filter(|a| !a.trim().is_empty()) else {
            self.outcome(&sample, "no_answer");
            return;
        };
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            self.outcome(&sample, "dropped");
            return;
        };
        let guard = self.clone();
        // Which answer the judge reads first, drawn here: the judge must not learn a position.
        let requested_first = rand::rng().random_bool(0.5);
        tokio::spawn(async move {
            let _permit = permit;
            let budget = sample.guard.judge.timeout;
            let judged = guard.judge(&sample, answer, requested_first);
            let outcome = match tokio::time::timeout(budget, judged).await {
                Ok(Ok(verdict)) => {
                    guard.record(&sample, verdict);
                    "judged"
                }
                Ok(Err(outcome)) => outcome,
                Err(_) => "judge_failed",
            };
            guard.outcome(&sample, outcome);
        });
    }

    /// The mirror and the judgement; the outcome's name when there is no verdict.
    async fn judge(
        &self,
        sample: &Sample,
        answer: String,
        requested_first: bool,
    ) -> Result<Verdict, &'static str> {
        let mirrored = self.mirror(sample).await?;
        let (requested, added) = if sample.served_is_requested {
            (answer, mirrored)
        } else {
            (mirrored, answer)
        };
        let question = question_text(&sample.body).unwrap_or_default();
        let (a, b) = if requested_first {
            (&requested, &added)
        } else {
            (&added, &requested)
        };
        let j = &sample.guard.judge;
        let said = self
            .client
            .judge(&j.url, &j.model, &question, a, b)
            .await
            .map_err(|e| {
                tracing::debug!(error = %e, rule = %sample.applied.key.rule, "the judge did not answer");
                "judge_failed"
            })?;
        Ok(match (said, requested_first) {
            (judge::Said::Tie, _) => Verdict::Tie,
            (judge::Said::A, true) | (judge::Said::B, false) => Verdict::Requested,
            (judge::Said::A, false) | (judge::Said::B, true) => Verdict::Added,
            (judge::Said::Unclear, _) => return Err("judge_unclear"),
        })
    }

    /// The other model's answer, from an endpoint with an empty queue.
    async fn mirror(&self, sample: &Sample) -> Result<String, &'static str> {
        let model = sample.mirror_model.clone();
        let candidates = Candidates {
            requested_model: model.clone(),
            models: vec![model.clone()],
            service_class: "Sheddable".into(),
            rule_trace: vec![],
        };
        // The input borrows what is not Send; it is gone before the first await.
        let plan = {
            let tags = Tags::new();
            let workload = Workload::default();
            let input = Input {
                requested: &model,
                tags: &tags,
                workload: &workload,
                prompt_tokens: (sample.body.len() / 4) as u32,
                max_tokens: None,
                prompt_blocks: &sample.blocks,
                block_hasher: None,
                max_attempts: 1,
            };
            self.router.decide(&sample.policy, candidates, &input)
        };
        let Some(chosen) = plan.decision.chosen() else {
            return Err("no_headroom");
        };
        // Headroom: the engine reports nothing waiting, and this sidecar has nothing queued there.
        let idle = chosen
            .prediction
            .reported_waiting
            .as_ref()
            .is_some_and(|w| w.used && w.value == 0.0)
            && chosen.prediction.own_awaiting_first_token == 0;
        if !idle {
            return Err("no_headroom");
        }
        let Some(info) = self.endpoints.info(&chosen.endpoint) else {
            return Err("no_headroom");
        };
        let body = judge::mirror_body(&sample.body, &info.served_name).ok_or("mirror_failed")?;
        let handle = plan
            .decision
            .chosen
            .and_then(|i| self.router.dispatch(&plan.decision, i, &sample.blocks));
        let answered = self
            .client
            .post(&format!("http://{}{}", info.addr, sample.path), body)
            .await;
        if let Some(h) = handle {
            self.router.complete(h);
        }
        match answered {
            Ok(v) => answer_text(&v).ok_or("mirror_failed"),
            Err(e) => {
                tracing::debug!(error = %e, endpoint = %info.id, "the mirrored request failed");
                Err("mirror_failed")
            }
        }
    }

    fn record(&self, sample: &Sample, verdict: Verdict) {
        let key = &sample.applied.key;
        let (transition, status) = {
            let mut book = self.book.lock();
            let t = book.record(&sample.guard, key, verdict);
            (t, book.status(&sample.guard, key))
        };
        self.metrics
            .verdicts
            .get_or_create(&GuardVerdictLabels {
                tenant: key.tenant.clone(),
                rule: key.rule.clone(),
                family: key.family.clone(),
                verdict: match verdict {
                    Verdict::Requested => "requested",
                    Verdict::Added => "added",
                    Verdict::Tie => "tie",
                }
                .into(),
            })
            .inc();
        if let Some(s) = &status {
            self.export(s);
        }
        if let Some(t) = transition {
            log_transition(&t);
        }
        if let Some(reports) = &self.reports {
            let guards = statuses(&self.book, &sample.policy)
                .iter()
                .map(to_proto)
                .collect();
            reports.send_replace(Arc::new(kinference_proxy_discovery::GuardMeasurements {
                revision: sample.policy.revision.clone(),
                guards,
            }));
        }
    }

    fn export(&self, s: &GuardStatus) {
        for state in [
            GuardState::Measuring,
            GuardState::Trusted,
            GuardState::Suspended,
        ] {
            self.metrics
                .state
                .get_or_create(&GuardStateLabels {
                    tenant: s.key.tenant.clone(),
                    rule: s.key.rule.clone(),
                    family: s.key.family.clone(),
                    state: state.as_str().into(),
                })
                .set(i64::from(s.state == state));
        }
        if let Some(gap) = s.gap {
            self.metrics
                .gap
                .get_or_create(&GuardLabels {
                    tenant: s.key.tenant.clone(),
                    rule: s.key.rule.clone(),
                    family: s.key.family.clone(),
                })
                .set(gap);
        }
    }

    fn outcome(&self, sample: &Sample, outcome: &str) {
        self.metrics
            .samples
            .get_or_create(&GuardSampleLabels {
                tenant: sample.applied.key.tenant.clone(),
                rule: sample.applied.key.rule.clone(),
                outcome: outcome.into(),
            })
            .inc();
    }
}

/// Every key's measurement in `book` under `policy`'s guards, for `/debug/guards`.
pub fn statuses(book: &Book, policy: &Policy) -> Vec<GuardStatus> {
    book.lock().statuses(|rule| {
        policy
            .rules
            .iter()
            .find(|r| r.name == rule)
            .and_then(|r| r.guard.as_ref())
    })
}

fn log_transition(t: &Transition) {
    let s = &t.status;
    if t.to == GuardState::Suspended {
        tracing::warn!(
            tenant = %t.key.tenant, rule = %t.key.rule, family = %t.key.family,
            from = t.from.as_str(), gap = s.gap, tolerance = s.tolerance,
            "quality guard suspended the rule: the judge found the requested model's answers better by more than the tolerance"
        );
    } else {
        tracing::info!(
            tenant = %t.key.tenant, rule = %t.key.rule, family = %t.key.family,
            from = t.from.as_str(), to = t.to.as_str(), gap = s.gap, samples = s.samples,
            "quality guard changed state"
        );
    }
}

fn to_proto(s: &GuardStatus) -> kinference_proxy_api::inference::GuardStatus {
    use kinference_proxy_api::inference::guard_status::State;
    kinference_proxy_api::inference::GuardStatus {
        tenant: s.key.tenant.clone(),
        rule: s.key.rule.clone(),
        family: s.key.family.clone(),
        state: match s.state {
            GuardState::Measuring => State::Measuring,
            GuardState::Trusted => State::Trusted,
            GuardState::Suspended => State::Suspended,
        } as i32,
        samples: s.samples,
        min_samples: s.min_samples,
        gap: s.gap,
        tolerance: s.tolerance,
    }
}
