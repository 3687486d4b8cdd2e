//! What the decision would be for one request, without acting on it: the dry run behind
//! `POST /debug/explain` and `kinfctl explain`.
//!
//! An operator asking "why did this prompt go there?" needs the whole chain at once: the tags and
//! the features that drove them, the rules that matched, the candidate models, and each endpoint's
//! predicted TTFT with every input and its age. This runs [`decide`](crate::decide) itself and
//! dispatches nothing, so asking never changes what it asks about. The proxy's admin listener calls
//! it with the live policy and router, and `kinfctl` with a policy read from manifests and no
//! router. The prompt itself is never part of the answer.

use crate::{
    Input,
    objective::ObjectiveOutcome,
    plan::decide_among,
    policy::{Candidates, FailureMode, Mode, Objective, Policy},
};
use kinference_classify::Explanation;
use kinference_routing::{Decision, Router, Time};
use rand::RngCore;
use serde::Serialize;

/// The balancer settings that shape a decision.
#[derive(Clone, Debug, Serialize)]
pub struct PolicySummary {
    pub revision: String,
    pub mode: Mode,
    pub failure_mode: FailureMode,
    pub objective: Objective,
    /// LowestTTFT's tolerance for a cheaper candidate (absent when zero).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefer_cheaper_within_s: Option<f64>,
    /// Signals older than this are not used for prediction.
    pub freshness_budget_s: f64,
    pub tie_window_s: f64,
    /// Set when the controller serves no valid policy (why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
}

impl PolicySummary {
    pub fn of(policy: &Policy) -> Self {
        Self {
            revision: policy.revision.clone(),
            mode: policy.balancer.mode,
            failure_mode: policy.balancer.failure_mode,
            objective: policy.balancer.objective,
            prefer_cheaper_within_s: (!policy.balancer.prefer_cheaper_within.is_zero())
                .then_some(policy.balancer.prefer_cheaper_within.as_secs_f64()),
            freshness_budget_s: policy.balancer.freshness_budget.as_secs_f64(),
            tie_window_s: policy.balancer.tie_window.as_secs_f64(),
            status_message: policy.status_message.clone(),
        }
    }
}

/// An endpoint named in a decision, with what the policy says of its model.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointSummary {
    pub endpoint: String,
    pub model: String,
    pub pool: String,
    pub served_name: String,
}

/// The routing decision the router would make now.
#[derive(Clone, Debug, Serialize)]
pub struct Routing {
    /// The models the decision was made over (the policy's candidates, unless overridden).
    pub models: Vec<String>,
    /// The routing core's decision: every candidate's prediction and its inputs, the excluded
    /// endpoints and the reason for the choice.
    pub decision: Decision,
    /// Every endpoint the decision names.
    pub endpoints: Vec<EndpointSummary>,
    /// The endpoints the request would be tried on, in order (first is where it is sent; in
    /// shadow mode that is plain balancing's pick, not the decision's).
    pub order: Vec<String>,
    /// Why the request would be refused (FailClose on fallback, or no ready endpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// What the policy's objective decided, and by how much.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objective: Option<ObjectiveOutcome>,
}

/// Everything `kinfctl explain` shows.
#[derive(Clone, Debug, Serialize)]
pub struct Explain {
    /// The model (or alias) the request names.
    pub requested_model: String,
    pub policy: PolicySummary,
    /// Estimated prompt tokens (what prediction uses).
    pub prompt_tokens: u32,
    /// The tags, each with its confidence, classifier, score and top features.
    pub explanation: Explanation,
    /// The rules' trace and the allowed models; absent when the model is unknown to the policy.
    pub candidates: Option<Candidates>,
    /// Absent when no router was given (a policy read from manifests) or the model is unknown.
    pub routing: Option<Routing>,
}

/// The live state a dry run predicts from.
pub struct Live<'a> {
    pub router: &'a Router,
    pub now: Time,
    /// Ties and power of two draw from it.
    pub rng: &'a mut dyn RngCore,
}

impl std::fmt::Debug for Live<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// Explains the request `input` describes under `policy`: its classification (`explanation`, from
/// the policy's classifiers, as the request path computes it; `input.tags` must be its tags), the
/// rules, and, with a live router, its plan over the candidate models (or over `models` when
/// given: a caller that evaluated the policy itself asks for predictions over its own candidates).
pub fn explain(
    policy: &Policy,
    explanation: Explanation,
    input: &Input<'_>,
    models: Option<Vec<String>>,
    live: Option<Live<'_>>,
) -> Explain {
    let candidates = policy.candidates(input.requested, input.tags, input.workload);
    let routing = live.and_then(|live| {
        let requested = candidates
            .as_ref()
            .map(|c| c.requested_model.clone())
            .or_else(|| models.as_ref().and_then(|m| m.first().cloned()))?;
        let over = match (&models, &candidates) {
            (Some(models), Some(c)) => Candidates {
                models: models.clone(),
                ..c.clone()
            },
            (Some(models), None) => Candidates {
                requested_model: requested,
                models: models.clone(),
                service_class: crate::DEFAULT_SERVICE_CLASS.into(),
                rule_trace: vec![],
            },
            (None, Some(c)) => c.clone(),
            (None, None) => return None,
        };
        Some(route(policy, over, input, live))
    });
    Explain {
        requested_model: input.requested.to_string(),
        policy: PolicySummary::of(policy),
        prompt_tokens: input.prompt_tokens,
        explanation,
        candidates,
        routing,
    }
}

/// Plans the request on the live router. Planning draws from the caller's random source (ties,
/// power of two) but dispatches nothing, so no endpoint's queue or cache index changes.
fn route(policy: &Policy, candidates: Candidates, input: &Input<'_>, live: Live<'_>) -> Routing {
    let models = candidates.models.clone();
    let mut rng = live.rng;
    let plan = decide_among(policy, live.router, candidates, input, live.now, &mut rng);
    let d = &plan.decision;
    let ids = d
        .candidates
        .iter()
        .map(|c| (&c.endpoint, &c.model))
        .chain(d.excluded.iter().map(|e| (&e.endpoint, &e.model)));
    let mut endpoints: Vec<EndpointSummary> = Vec::new();
    for (id, model) in ids {
        if endpoints.iter().any(|e| e.endpoint == id.as_str()) {
            continue;
        }
        if let Some(m) = policy.model(model.as_str()) {
            endpoints.push(EndpointSummary {
                endpoint: id.to_string(),
                model: m.name.clone(),
                pool: m.pool.clone(),
                served_name: m.served_name.clone(),
            });
        }
    }
    let order = plan
        .order
        .iter()
        .filter_map(|&i| d.candidates.get(i))
        .map(|c| c.endpoint.to_string())
        .collect();
    Routing {
        models,
        decision: plan.decision,
        endpoints,
        order,
        refused: plan.refused.map(|r| r.message().to_string()),
        objective: plan.objective,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Mode, TagMatch, Workload, tests::example};
    use kinference_classify::{
        ClassifierDefinition, ClassifierSet, Prompt, TagDefinition, TagKind,
        definition::KeywordRule,
    };
    use kinference_routing::{EndpointId, EndpointMeta, PromptBlocks, RouterConfig, Scrape};
    use rand::{SeedableRng, rngs::SmallRng};

    /// A keyword tag only: these tests do not depend on the complexity model's weights.
    fn explanation(text: &str) -> Explanation {
        let set = ClassifierSet::new(&ClassifierDefinition {
            tags: vec![TagDefinition {
                name: "translation".into(),
                kind: TagKind::Rules {
                    value: "true".into(),
                    otherwise: None,
                    keywords: vec![KeywordRule {
                        values: vec!["translate".into(), "in French".into()],
                        weight: 0.8,
                        case_sensitive: false,
                    }],
                    regexes: vec![],
                    min_confidence: 0.0,
                },
            }],
            ..ClassifierDefinition::default()
        })
        .unwrap();
        set.explain(Prompt::Completion(text))
    }

    fn policy() -> Policy {
        let mut p = example();
        p.balancer.mode = Mode::Enforce;
        p.rules[0].tags = vec![TagMatch {
            name: "translation".into(),
            values: vec!["true".into()],
            min_confidence: 0.5,
        }];
        p
    }

    fn router() -> Router {
        let mut r = Router::new(RouterConfig::default());
        for (model, port, waiting) in [("glm-5.3", 1, 60), ("qwen-3.6-27b", 3, 0)] {
            let id = EndpointId::from(format!("127.0.0.1:{port}"));
            r.upsert_endpoint(EndpointMeta::new(id.clone(), model), Time::ZERO);
            r.set_ready(&id, true).unwrap();
            r.observe_scrape(
                &id,
                &Scrape {
                    num_requests_waiting: Some(waiting),
                    num_requests_running: Some(0),
                    kv_cache_usage: Some(0.0),
                    ..Scrape::default()
                },
                Time::ZERO,
            )
            .unwrap();
        }
        r
    }

    fn run(text: &str, models: Option<Vec<String>>, router: Option<&Router>) -> Explain {
        let e = explanation(text);
        let tags = e.to_tags();
        let workload = Workload::default();
        let blocks = PromptBlocks::from_text(text.as_bytes(), &Default::default());
        let input = Input {
            requested: "glm-5.3",
            tags: &tags,
            workload: &workload,
            prompt_tokens: 10,
            max_tokens: None,
            prompt_blocks: &blocks,
            block_hasher: None,
            max_attempts: usize::MAX,
        };
        let mut rng = SmallRng::seed_from_u64(1);
        let live = router.map(|router| Live {
            router,
            now: Time::ZERO,
            rng: &mut rng,
        });
        explain(&policy(), e, &input, models, live)
    }

    #[test]
    fn explains_tags_rules_and_the_choice_without_dispatching() {
        let r = router();
        let e = run("Please translate hello in French", None, Some(&r));
        assert_eq!(e.explanation.get("translation").unwrap().tag.value, "true");
        let c = e.candidates.as_ref().unwrap();
        assert_eq!(c.models, vec!["glm-5.3", "qwen-3.6-27b"]);
        assert!(c.rule_trace.iter().any(|r| r.matched));
        let routing = e.routing.as_ref().unwrap();
        assert_eq!(
            routing.order.first().map(String::as_str),
            Some("127.0.0.1:3")
        );
        assert_eq!(routing.endpoints.len(), 2);
        // Nothing was dispatched: neither endpoint has a pending request.
        for port in [1, 3] {
            let id = EndpointId::from(format!("127.0.0.1:{port}"));
            assert_eq!(r.inflight(&id).unwrap().pending(), 0);
        }
        let json = serde_json::to_string(&e).unwrap();
        assert!(!json.contains("hello"), "no prompt text: {json}");

        // Not tagged: glm-5.3 only.
        let e = run("Prove it.", None, Some(&r));
        assert_eq!(e.candidates.unwrap().models, vec!["glm-5.3"]);
        assert_eq!(e.routing.unwrap().order, vec!["127.0.0.1:1"]);
    }

    #[test]
    fn models_override_the_policys_candidates_and_no_router_means_no_routing() {
        let r = router();
        let e = run("Prove it.", Some(vec!["qwen-3.6-27b".into()]), Some(&r));
        assert_eq!(e.routing.unwrap().order, vec!["127.0.0.1:3"]);
        let e = run("Prove it.", None, None);
        assert!(e.routing.is_none());
        assert!(e.candidates.is_some());
    }
}
