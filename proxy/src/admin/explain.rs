//! What the proxy would do with one request, without doing it: the dry run behind
//! `POST /debug/explain` and `kinfctl explain`.
//!
//! An operator asking "why did this prompt go there?" needs the whole chain at once: the tags and
//! the features that drove them, the rules that matched, the candidate models, and each endpoint's
//! predicted TTFT with every input and its age. This module runs the same steps as the request
//! path (classification, [`Policy::candidates`], [`Balance::plan`]) but dispatches nothing and
//! records nothing, so asking never changes what it asks about. It is a pure function of its
//! inputs: the admin listener calls it with the live policy and balancer, and `kinfctl` calls it
//! with a policy read from manifests and no balancer. The prompt itself is never part of the
//! answer.

use crate::{
    balance::Balance,
    openai::InferenceRequest,
    policy::{Candidates, FailureMode, Mode, Policy, Workload},
};
use kinference_classify::Explanation;
use kinference_routing::{ApproxConfig, Decision, PromptBlocks};
use serde::Serialize;

/// The balancer settings that shape a decision.
#[derive(Clone, Debug, Serialize)]
pub struct PolicySummary {
    pub revision: String,
    pub mode: Mode,
    pub failure_mode: FailureMode,
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
            freshness_budget_s: policy.balancer.freshness_budget.as_secs_f64(),
            tie_window_s: policy.balancer.tie_window.as_secs_f64(),
            status_message: policy.status_message.clone(),
        }
    }
}

/// An endpoint named in a decision, with what the balancer knows of it.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointSummary {
    pub endpoint: String,
    pub model: String,
    pub pool: String,
    pub served_name: String,
}

/// The routing decision the balancer would make now.
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
    /// Absent when no balancer was given (a policy read from manifests) or the model is unknown.
    pub routing: Option<Routing>,
}

/// Explains `request` under `policy`: its classification (`explanation`, from the policy's
/// classifiers, as the request path computes it), the rules for `workload`, and, with a balancer,
/// its decision over the candidate models (or over `models` when given: a caller that evaluated
/// the policy itself asks for predictions over its own candidates).
pub fn explain(
    policy: &Policy,
    explanation: Explanation,
    request: &InferenceRequest,
    workload: &Workload,
    models: Option<Vec<String>>,
    balance: Option<&Balance>,
) -> Explain {
    let tags = explanation.to_tags();
    let candidates = policy.candidates(&request.model, &tags, workload);
    let prompt_tokens = request.estimated_prompt_tokens();
    let routing = balance.and_then(|b| {
        let requested = candidates
            .as_ref()
            .map(|c| c.requested_model.clone())
            .or_else(|| models.as_ref().and_then(|m| m.first().cloned()))?;
        let models = models
            .clone()
            .or_else(|| candidates.as_ref().map(|c| c.models.clone()))?;
        Some(route(b, &requested, models, request, prompt_tokens))
    });
    Explain {
        requested_model: request.model.clone(),
        policy: PolicySummary::of(policy),
        prompt_tokens,
        explanation,
        candidates,
        routing,
    }
}

/// Plans the request on the balancer. Planning draws from the balancer's random source (ties,
/// power-of-two) but dispatches nothing, so no endpoint's queue or cache index changes.
fn route(
    balance: &Balance,
    requested: &str,
    models: Vec<String>,
    request: &InferenceRequest,
    prompt_tokens: u32,
) -> Routing {
    let blocks = PromptBlocks::from_text(&request.prefix_text(), &ApproxConfig::default());
    let plan = balance.plan(
        requested,
        &models,
        prompt_tokens,
        request.max_tokens,
        &blocks,
        Some(&request.prompt),
    );
    let d = &plan.decision;
    let ids = d
        .candidates
        .iter()
        .map(|c| &c.endpoint)
        .chain(d.excluded.iter().map(|e| &e.endpoint));
    let mut endpoints: Vec<EndpointSummary> = Vec::new();
    for id in ids {
        if endpoints.iter().any(|e| e.endpoint == id.as_str()) {
            continue;
        }
        if let Some(info) = balance.info(id) {
            endpoints.push(EndpointSummary {
                endpoint: info.id.to_string(),
                model: info.model,
                pool: info.pool,
                served_name: info.served_name,
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
        refused: plan.refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{openai::Endpoint, policy::tests::example_proto};
    use bytes::Bytes;
    use kinference_proxy_discovery::{Endpoint as Ep, Endpoints};
    use kinference_routing::{EndpointId, Scrape};
    use std::{collections::BTreeMap, net::SocketAddr};

    /// The keyword tag only: these tests do not depend on the complexity model's weights.
    fn tags(req: &InferenceRequest) -> Explanation {
        let mut classifiers = crate::classify::tests::example();
        classifiers[0].tags.retain(|t| t.name == "translation");
        let set = crate::classify::build(&classifiers);
        req.with_classifier_prompt(|p| set.explain(p))
    }

    fn policy() -> Policy {
        let mut proto = example_proto();
        proto.balancer.as_mut().unwrap().mode =
            kinference_proxy_api::inference::balancer::Mode::Enforce as i32;
        proto.rules[0].r#match.as_mut().unwrap().tags =
            vec![kinference_proxy_api::inference::rule::TagMatch {
                name: "translation".into(),
                values: vec!["true".into()],
                min_confidence: 0.5,
            }];
        Policy::from_proto(&proto)
    }

    fn request(content: &str) -> InferenceRequest {
        let body = serde_json::json!({"model": "glm-5.3", "messages": [{"role": "user", "content": content}]});
        InferenceRequest::parse(Endpoint::Chat, Bytes::from(body.to_string())).unwrap()
    }

    fn balance(policy: &Policy) -> Balance {
        let b = Balance::new();
        let ep = |port: u16| Ep {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            labels: BTreeMap::new(),
        };
        let endpoints = Endpoints {
            by_backend: BTreeMap::from([
                (
                    "glm-5.3.default.inferencepool.kinference.io".into(),
                    vec![ep(1)],
                ),
                (
                    "qwen-3.6-27b.default.inferencepool.kinference.io".into(),
                    vec![ep(3)],
                ),
            ]),
        };
        b.sync(policy, &endpoints);
        for (port, waiting) in [(1, 60), (3, 0)] {
            b.observe_scrape(
                &EndpointId::from(format!("127.0.0.1:{port}")),
                &Scrape {
                    num_requests_waiting: Some(waiting),
                    num_requests_running: Some(0),
                    kv_cache_usage: Some(0.0),
                    ..Default::default()
                },
                b.now(),
            );
        }
        b
    }

    #[test]
    fn explains_tags_rules_and_the_choice_without_dispatching() {
        let p = policy();
        let b = balance(&p);
        let w = Workload::parse("default/app", vec![]);
        let r = request("Please translate hello in French");
        let e = explain(&p, tags(&r), &r, &w, None, Some(&b));
        let tag = e.explanation.get("translation").unwrap();
        assert_eq!(tag.tag.value, "true");
        let c = e.candidates.as_ref().unwrap();
        assert_eq!(c.models, vec!["glm-5.3", "qwen-3.6-27b"]);
        assert!(c.rule_trace.iter().any(|r| r.matched));
        let r = e.routing.as_ref().unwrap();
        assert_eq!(r.order.first().map(String::as_str), Some("127.0.0.1:3"));
        assert_eq!(r.endpoints.len(), 2);
        // Nothing was dispatched: neither endpoint has a pending request.
        for ep in b.debug()["endpoints"].as_array().unwrap() {
            assert_eq!(ep["own_pending_requests"], 0, "{ep}");
        }
        let json = serde_json::to_string(&e).unwrap();
        assert!(!json.contains("hello"), "no prompt text: {json}");

        // Not tagged: glm-5.3 only.
        let r = request("Prove it.");
        let e = explain(&p, tags(&r), &r, &w, None, Some(&b));
        assert_eq!(e.candidates.unwrap().models, vec!["glm-5.3"]);
        assert_eq!(e.routing.unwrap().order, vec!["127.0.0.1:1"]);
    }

    #[test]
    fn models_override_the_policys_candidates_and_no_balancer_means_no_routing() {
        let p = policy();
        let b = balance(&p);
        let w = Workload::parse("default/app", vec![]);
        let r = request("Prove it.");
        let e = explain(
            &p,
            tags(&r),
            &r,
            &w,
            Some(vec!["qwen-3.6-27b".into()]),
            Some(&b),
        );
        assert_eq!(e.routing.unwrap().order, vec!["127.0.0.1:3"]);
        let e = explain(&p, tags(&r), &r, &w, None, None);
        assert!(e.routing.is_none());
        assert!(e.candidates.is_some());
    }
}
