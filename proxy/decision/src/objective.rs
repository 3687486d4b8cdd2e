//! The policy's objective: which of the predicted candidates the request goes to.
//!
//! The router ranks candidates by predicted time to first token (with the costs it charges for
//! the queue a request adds and the prefix it would duplicate) and picks the fastest. That is
//! `LowestTTFT`. A platform also pays for every token: a small model that meets the request's
//! latency objective serves a simple prompt for a fraction of the big model's price and leaves
//! the big pool to the work it is sized for. So:
//!
//! - **`LowestTTFT`** keeps the router's pick, unless `preferCheaperWithin` is set: then the
//!   cheapest candidate predicted within that tolerance of the fastest wins.
//! - **`CheapestWithinSLO`** takes the cheapest candidate predicted to meet the service class's
//!   TTFT SLO; when none is, the fastest (the router's pick).
//!
//! A candidate's cost is its model's prices applied to this request: the prompt's uncached
//! tokens at the prompt price, its cached tokens at the cached price, and the completion (the
//! request's `max_tokens`, else [`DEFAULT_COMPLETION_TOKENS`]) at the completion price. Among
//! equally cheap candidates the router's ranking decides, and the router's pick is kept when it
//! is among them (its affinity and tie-breaking stand). Predictions compared with an SLO or a
//! tolerance are the router's ranked TTFT (the cautious undated queue), never a cost with the
//! router's charges added. When prediction fell back (stale signals), there is nothing to compare
//! and the fallback's pick stands.

use crate::policy::{Objective, Policy};
use kinference_routing::Decision;

/// The completion length assumed for cost when the request sets no `max_tokens`, in tokens.
pub const DEFAULT_COMPLETION_TOKENS: u32 = 256;

/// Why the choice is the one it is.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    /// The router's pick, the fastest.
    Fastest,
    /// A cheaper candidate within `preferCheaperWithin` of the fastest.
    CheaperWithinTolerance,
    /// The cheapest candidate predicted to meet the SLO.
    CheapestWithinSlo,
    /// No candidate was predicted to meet the SLO: the fastest.
    NoneWithinSlo,
    /// Prediction fell back: the fallback's pick.
    Fallback,
}

/// What the objective decided, and by how much, for the decision record.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ObjectiveOutcome {
    pub objective: Objective,
    pub decided_by: DecidedBy,
    /// The SLO the choice was held to (CheapestWithinSLO), in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_slo_s: Option<f64>,
    /// The tolerance a cheaper candidate had (LowestTTFT with preferCheaperWithin), in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerance_s: Option<f64>,
    /// The router's pick, an index into the decision's candidates.
    pub fastest: usize,
    /// How much later than the fastest the choice is predicted to answer, in seconds.
    pub ttft_given_up_s: f64,
    /// The choice's expected cost and the fastest's, in the policy's currency.
    pub chosen_cost: f64,
    pub fastest_cost: f64,
}

/// Each candidate's expected cost for a request of `max_tokens` under `policy`'s prices.
pub fn costs(policy: &Policy, decision: &Decision, max_tokens: Option<u32>) -> Vec<f64> {
    let completion = u64::from(max_tokens.unwrap_or(DEFAULT_COMPLETION_TOKENS));
    decision
        .candidates
        .iter()
        .map(|c| {
            let p = &c.prediction;
            policy.model(c.model.as_str()).map_or(0.0, |m| {
                m.price.cost(
                    u64::from(p.prompt_tokens),
                    u64::from(p.cached_tokens),
                    completion,
                )
            })
        })
        .collect()
}

/// Applies `policy`'s objective to `decision`: sets its chosen candidate, and says why. `None`
/// when the decision chose nothing.
pub fn apply(
    policy: &Policy,
    decision: &mut Decision,
    service_class: &str,
    max_tokens: Option<u32>,
) -> Option<ObjectiveOutcome> {
    let fastest = decision.chosen?;
    let b = &policy.balancer;
    let costs = costs(policy, decision, max_tokens);
    let ttft = |i: usize| decision.candidates[i].prediction.ranked_ttft_s();
    let mut out = ObjectiveOutcome {
        objective: b.objective,
        decided_by: DecidedBy::Fastest,
        ttft_slo_s: None,
        tolerance_s: None,
        fastest,
        ttft_given_up_s: 0.0,
        chosen_cost: costs[fastest],
        fastest_cost: costs[fastest],
    };
    if decision.reason.is_fallback() {
        out.decided_by = DecidedBy::Fallback;
        return Some(out);
    }
    let (limit, eligible_by) = match b.objective {
        Objective::LowestTtft => {
            if b.prefer_cheaper_within.is_zero() {
                return Some(out);
            }
            let tolerance = b.prefer_cheaper_within.as_secs_f64();
            out.tolerance_s = Some(tolerance);
            (ttft(fastest) + tolerance, DecidedBy::CheaperWithinTolerance)
        }
        Objective::CheapestWithinSlo => {
            let Some(slo) = policy.ttft_slo(service_class) else {
                // Validation requires the default class's SLO; a policy without one keeps the
                // fastest rather than guess.
                out.decided_by = DecidedBy::NoneWithinSlo;
                return Some(out);
            };
            out.ttft_slo_s = Some(slo.as_secs_f64());
            (slo.as_secs_f64(), DecidedBy::CheapestWithinSlo)
        }
    };
    let eligible: Vec<usize> = (0..decision.candidates.len())
        .filter(|&i| ttft(i) <= limit)
        .collect();
    let Some(cheapest) = eligible.iter().map(|&i| costs[i]).min_by(f64::total_cmp) else {
        out.decided_by = DecidedBy::NoneWithinSlo;
        return Some(out);
    };
    // Equal prices (the same model, the same cached share) are a tie the router's ranking breaks,
    // its own pick first.
    let tied = |i: &usize| costs[*i] <= cheapest * (1.0 + 1e-9);
    let chosen = if eligible.contains(&fastest) && tied(&fastest) {
        fastest
    } else {
        eligible
            .iter()
            .copied()
            .filter(tied)
            .min_by(|&a, &b| {
                let cost = |i: usize| decision.candidates[i].prediction.selection_cost_s;
                cost(a).total_cmp(&cost(b)).then(a.cmp(&b))
            })
            .unwrap_or(fastest)
    };
    if chosen != fastest {
        out.decided_by = eligible_by;
    } else if b.objective == Objective::CheapestWithinSlo {
        out.decided_by = DecidedBy::CheapestWithinSlo;
    }
    out.ttft_given_up_s = (ttft(chosen) - ttft(fastest)).max(0.0);
    out.chosen_cost = costs[chosen];
    decision.chosen = Some(chosen);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Input, decide,
        policy::{DEFAULT_SERVICE_CLASS, ServiceClass, Workload, tests::example},
    };
    use kinference_classify::{ClassifierId, Tag, Tags};
    use kinference_routing::{
        EndpointId, EndpointMeta, PromptBlocks, Router, RouterConfig, Scrape, Time,
    };
    use rand::{SeedableRng, rngs::SmallRng};
    use std::time::Duration;

    /// glm-5.3 (port 1, 12k prefill tokens/s, $0.6/M prompt tokens) and qwen-3.6-27b (port 3,
    /// 6k tokens/s, $0.2/M), both idle, plus what `waiting` adds to glm's queue.
    fn router(glm_waiting: u32) -> Router {
        let mut r = Router::new(RouterConfig::default());
        let p = example();
        for m in &p.models {
            r.set_model_prior(m.name.as_str().into(), m.prior);
        }
        for (model, port, waiting) in [("glm-5.3", 1, glm_waiting), ("qwen-3.6-27b", 3, 0)] {
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

    fn policy(objective: Objective, slo: Option<Duration>, tolerance: Duration) -> Policy {
        let mut p = example();
        p.balancer.mode = crate::Mode::Enforce;
        p.balancer.objective = objective;
        p.balancer.prefer_cheaper_within = tolerance;
        p.service_classes = vec![ServiceClass {
            name: DEFAULT_SERVICE_CLASS.into(),
            ttft_slo: slo,
            max_queue_time: None,
            reserved_share: 0.0,
        }];
        p
    }

    /// The plan for a low-complexity 2,000-token prompt for glm-5.3 (qwen may serve it).
    fn plan(policy: &Policy, router: &Router) -> crate::Plan {
        let mut tags = Tags::new();
        tags.insert(Tag {
            name: "complexity".into(),
            value: "low".into(),
            confidence: 0.9,
            source: ClassifierId::Complexity,
        });
        let blocks = PromptBlocks::from_text(b"a simple question", &Default::default());
        let workload = Workload::default();
        let input = Input {
            requested: "glm-5.3",
            tags: &tags,
            workload: &workload,
            prompt_tokens: 2_000,
            max_tokens: Some(64),
            prompt_blocks: &blocks,
            block_hasher: None,
            max_attempts: 3,
        };
        decide(
            policy,
            router,
            &input,
            Time::ZERO,
            &mut SmallRng::seed_from_u64(1),
        )
        .unwrap()
    }

    fn chosen(plan: &crate::Plan) -> &str {
        plan.attempt(0).unwrap().endpoint.as_str()
    }

    #[test]
    fn lowest_ttft_keeps_the_fastest() {
        let r = router(0);
        let p = plan(&policy(Objective::LowestTtft, None, Duration::ZERO), &r);
        // Idle glm prefills twice as fast: it answers first.
        assert_eq!(chosen(&p), "127.0.0.1:1");
        let o = p.objective.unwrap();
        assert_eq!(o.decided_by, DecidedBy::Fastest);
        assert_eq!(o.ttft_given_up_s, 0.0);
    }

    #[test]
    fn cheapest_within_slo_takes_the_cheaper_model_that_meets_the_slo() {
        let r = router(0);
        let p = plan(
            &policy(
                Objective::CheapestWithinSlo,
                Some(Duration::from_secs(2)),
                Duration::ZERO,
            ),
            &r,
        );
        assert_eq!(chosen(&p), "127.0.0.1:3", "qwen is cheaper and within 2 s");
        let o = p.objective.clone().unwrap();
        assert_eq!(o.decided_by, DecidedBy::CheapestWithinSlo);
        assert_eq!(o.ttft_slo_s, Some(2.0));
        assert!(o.chosen_cost < o.fastest_cost, "{o:?}");
        assert!(o.ttft_given_up_s > 0.0, "{o:?}");
        // The retry order goes back to the fastest next.
        assert_eq!(
            p.attempt(1).map(|c| c.endpoint.as_str()),
            Some("127.0.0.1:1")
        );
        // The decision names the objective's choice.
        assert_eq!(
            p.decision.chosen_model().map(|m| m.as_str()),
            Some("qwen-3.6-27b")
        );
    }

    #[test]
    fn cheapest_within_slo_falls_back_to_the_fastest_when_none_meets_it() {
        let r = router(0);
        // qwen needs about a third of a second for 2,000 tokens; 10 ms is out of everyone's reach.
        let p = plan(
            &policy(
                Objective::CheapestWithinSlo,
                Some(Duration::from_millis(10)),
                Duration::ZERO,
            ),
            &r,
        );
        assert_eq!(chosen(&p), "127.0.0.1:1");
        assert_eq!(p.objective.unwrap().decided_by, DecidedBy::NoneWithinSlo);
    }

    #[test]
    fn prefer_cheaper_within_moves_only_within_the_tolerance() {
        let r = router(0);
        let ttft = |p: &crate::Plan, port| {
            p.decision
                .candidates
                .iter()
                .find(|c| c.endpoint.as_str() == format!("127.0.0.1:{port}"))
                .unwrap()
                .prediction
                .ranked_ttft_s()
        };
        let fastest = plan(&policy(Objective::LowestTtft, None, Duration::ZERO), &r);
        let gap = ttft(&fastest, 3) - ttft(&fastest, 1);
        assert!(gap > 0.0);
        let within = plan(
            &policy(
                Objective::LowestTtft,
                None,
                Duration::from_secs_f64(gap * 1.1),
            ),
            &r,
        );
        assert_eq!(chosen(&within), "127.0.0.1:3");
        let o = within.objective.unwrap();
        assert_eq!(o.decided_by, DecidedBy::CheaperWithinTolerance);
        assert!((o.ttft_given_up_s - gap).abs() < 1e-9, "{o:?}");
        let short = plan(
            &policy(
                Objective::LowestTtft,
                None,
                Duration::from_secs_f64(gap * 0.9),
            ),
            &r,
        );
        assert_eq!(chosen(&short), "127.0.0.1:1");
        assert_eq!(short.objective.unwrap().decided_by, DecidedBy::Fastest);
    }

    #[test]
    fn a_class_without_its_own_slo_is_held_to_the_default_class_s() {
        let mut p = policy(
            Objective::CheapestWithinSlo,
            Some(Duration::from_secs(2)),
            Duration::ZERO,
        );
        p.service_classes.push(ServiceClass {
            name: "Critical".into(),
            ttft_slo: Some(Duration::from_millis(10)),
            max_queue_time: None,
            reserved_share: 0.0,
        });
        assert_eq!(p.ttft_slo("Sheddable"), Some(Duration::from_secs(2)));
        assert_eq!(p.ttft_slo("Critical"), Some(Duration::from_millis(10)));
    }

    #[test]
    fn a_fallback_decision_keeps_the_fallback_s_pick() {
        let mut r = router(0);
        for port in [1, 3] {
            r.observe_scrape(
                &EndpointId::from(format!("127.0.0.1:{port}")),
                &Scrape {
                    num_requests_waiting: Some(0),
                    ..Scrape::default()
                },
                Time::ZERO,
            )
            .unwrap();
        }
        let policy = policy(
            Objective::CheapestWithinSlo,
            Some(Duration::from_secs(2)),
            Duration::ZERO,
        );
        let mut tags = Tags::new();
        tags.insert(Tag {
            name: "complexity".into(),
            value: "low".into(),
            confidence: 0.9,
            source: ClassifierId::Complexity,
        });
        let blocks = PromptBlocks::from_text(b"q", &Default::default());
        let workload = Workload::default();
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
        // Ten seconds later every signal is stale.
        let p = decide(
            &policy,
            &r,
            &input,
            Time::from_secs_f64(10.0),
            &mut SmallRng::seed_from_u64(1),
        )
        .unwrap();
        assert!(p.decision.reason.is_fallback());
        assert_eq!(p.objective.unwrap().decided_by, DecidedBy::Fallback);
    }
}
