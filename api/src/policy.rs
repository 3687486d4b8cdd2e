//! `InferencePolicy`: which models may serve a prompt, and how the proxy balances among them.
//!
//! A platform team attaches one policy to the stable endpoint that apps call (an HTTPRoute, a
//! Service or an InferencePool). The policy declares the models behind that endpoint with what
//! the proxy needs to know about each before it has observed anything (a performance prior and a
//! price), the aliases apps may ask for, the ordered rules that widen, narrow or rewrite the set
//! of candidate models for a prompt, and the balancer's settings. The controller validates it
//! (see [`crate::validate`]) and serves it to proxies.

mod balancer;
mod budget;
mod model;
mod quality_guard;
mod rollout;
mod rule;
mod service_class;
mod timeouts;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use self::{
    balancer::{
        Balancer, BalancerMode, DEFAULT_FRESHNESS_BUDGET, DEFAULT_TIE_WINDOW, FailureMode,
        Objective,
    },
    budget::{DEFAULT_BUDGET_WINDOW, TenantBudget},
    model::{Model, ModelAlias, ModelPrice, PerformancePrior, PoolReference},
    quality_guard::{
        DEFAULT_CAPPED_SHARE, DEFAULT_FAMILY_TAG, DEFAULT_JUDGE_TIMEOUT, DEFAULT_MIN_SAMPLES,
        DEFAULT_SAMPLE_SHARE, DEFAULT_TOLERANCE, Judge, QualityGuard,
    },
    rollout::{
        ASSIGN_BY, DEFAULT_ROLLOUT_MIN_SAMPLES, DEFAULT_ROLLOUT_REPORT_INTERVAL,
        DEFAULT_ROLLOUT_WINDOW, MIN_ROLLOUT_REPORT_INTERVAL, Rollout, RolloutArmStatus,
        RolloutCandidate, RolloutPhase, RolloutState, RolloutStatus, RolloutThresholdStatus,
        RolloutThresholds,
    },
    rule::{PolicyRule, RuleAction, RuleMatch, ServiceClass, TagMatch, WorkloadMatch},
    service_class::ServiceClassPolicy,
    timeouts::Timeouts,
};

/// The API group of Kinference's resources.
pub const GROUP: &str = "policy.kinference.io";

/// The API version of Kinference's resources.
pub const VERSION: &str = "v1alpha1";

/// The kind of `InferencePolicy`.
pub const KIND: &str = "InferencePolicy";

/// Condition type: the policy is valid and the controller serves it to proxies.
pub const CONDITION_ACCEPTED: &str = "Accepted";

/// Condition type: every reference (target, pools, classifier) resolves to an existing object.
pub const CONDITION_RESOLVED_REFS: &str = "ResolvedRefs";

/// Condition type: every rule with a quality guard is within its tolerance (False: a rule is
/// suspended for some tenant and prompt family; Unknown: still measuring).
pub const CONDITION_QUALITY_GUARD: &str = "QualityGuard";

/// Condition type: the rollout's cohort is within its thresholds (False: a threshold was
/// crossed and the cohort rolled back to the control policy, or the rollout was aborted;
/// Unknown: too few requests yet).
pub const CONDITION_ROLLOUT: &str = "Rollout";

/// InferencePolicySpec declares, for the endpoint it targets, the models that may serve a
/// prompt, the aliases apps may ask for, the ordered rules that choose candidate models, and the
/// balancer's settings.
// Each printcolumn(...) repeats `type_ = "string"`, which clippy mistakes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "policy.kinference.io",
    version = "v1alpha1",
    kind = "InferencePolicy",
    plural = "inferencepolicies",
    shortname = "infpolicy",
    category = "kinference",
    namespaced,
    status = "InferencePolicyStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "InferencePolicy says which models may serve the prompts sent to the endpoint it \
           targets, and how Kinference's proxy balances among their endpoints.",
    printcolumn(
        name = "Target Kind",
        type_ = "string",
        json_path = ".spec.targetRef.kind"
    ),
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.targetRef.name"),
    printcolumn(
        name = "Classifier",
        type_ = "string",
        json_path = ".spec.classifierRef.name"
    ),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.balancer.mode"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePolicySpec {
    /// TargetRef is the endpoint this policy governs, in the policy's namespace: an HTTPRoute
    /// (group gateway.networking.k8s.io), a Service (group "") or an InferencePool (group
    /// inference.networking.k8s.io).
    pub target_ref: PolicyTargetReference,

    /// ClassifierRef names the InferenceClassifier, in the policy's namespace, that tags each
    /// prompt. Required when a rule matches on tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classifier_ref: Option<ClassifierReference>,

    /// Models are the models that may serve prompts sent to the target, each bound to the
    /// InferencePool whose endpoints serve it. A request for a model that is not declared here
    /// (directly or through an alias) is sent where the target would send it without Kinference.
    #[schemars(length(min = 1))]
    pub models: Vec<Model>,

    /// Aliases are stable names apps may ask for; each resolves to a model or to another alias.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<ModelAlias>,

    /// Rules are evaluated in order against every request. The candidate models start as the
    /// requested model (after alias resolution); every matching rule applies its action in
    /// turn. A rule never stops the evaluation of later rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<PolicyRule>,

    /// Balancer configures how the proxy chooses among the endpoints of the candidate models.
    #[serde(default)]
    pub balancer: Balancer,

    /// ServiceClasses declare what each service class (Critical, Standard, Sheddable; rules set
    /// a request's class, and Standard is the default) is promised: its TTFT objective. A class
    /// that is not listed has none. Each class appears at most once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_classes: Vec<ServiceClassPolicy>,

    /// Timeouts configures how long the proxy waits for an endpoint's first byte (derived from
    /// its prediction, within a floor and a cap) and for a stream.
    #[serde(default)]
    pub timeouts: Timeouts,

    /// TenantBudgets limit the tokens each tenant (calling workload) may use per window; a
    /// request that would go over is answered 429 with Retry-After. Each tenant at most once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenant_budgets: Vec<TenantBudget>,

    /// Rollout tries a candidate routing (rules, balancer) on a sticky cohort beside a control
    /// group, and rolls the cohort back when a declared threshold is crossed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

/// PolicyTargetReference identifies the object a policy attaches to, in the policy's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTargetReference {
    /// Group is the API group of the target: "gateway.networking.k8s.io" for an HTTPRoute, ""
    /// for a Service, "inference.networking.k8s.io" for an InferencePool.
    #[serde(default)]
    pub group: String,

    /// Kind is the kind of the target: HTTPRoute, Service or InferencePool.
    pub kind: String,

    /// Name is the name of the target.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The kinds a policy may target, as (group, kind).
pub const TARGET_KINDS: [(&str, &str); 3] = [
    ("gateway.networking.k8s.io", "HTTPRoute"),
    ("", "Service"),
    (crate::pool::GROUP, crate::pool::KIND),
];

/// ClassifierReference names an InferenceClassifier in the policy's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassifierReference {
    /// Name of the InferenceClassifier.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// InferencePolicyStatus is the state the policy controller observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferencePolicyStatus {
    /// Conditions: "Accepted" (the policy is valid and served to proxies) and "ResolvedRefs"
    /// (its target, pools and classifier all exist). A False condition's message lists every
    /// problem with its field path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// Rollout is what the controller made of `spec.rollout`: its phase (a rolled-back rollout
    /// is not served again under its name, across restarts), the last verdict, each arm's counts
    /// and every threshold with how close the cohort is to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

impl InferencePolicySpec {
    /// The declared model named `name`, if any (aliases are not resolved).
    pub fn model(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.name == name)
    }

    /// Resolves a model name or alias to the declared model it finally names, following alias
    /// chains. Returns `None` for an unknown name or an alias cycle.
    pub fn resolve(&self, name: &str) -> Option<&Model> {
        let mut current = name;
        // A chain longer than the number of aliases must contain a cycle.
        for _ in 0..=self.aliases.len() {
            if let Some(model) = self.model(current) {
                return Some(model);
            }
            current = &self.aliases.iter().find(|a| a.name == current)?.target;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_policy_gets_the_documented_defaults() {
        let spec: InferencePolicySpec = serde_json::from_value(serde_json::json!({
            "targetRef": {"group": "", "kind": "Service", "name": "llm"},
            "models": [{
                "name": "glm-5.3",
                "poolRef": {"name": "glm-5.3"},
                "prior": {"prefillTokensPerSecond": 12000, "timePerOutputTokenMs": 30},
            }],
        }))
        .unwrap();
        let model = &spec.models[0];
        assert_eq!(model.pool_ref, PoolReference::inference_pool("glm-5.3"));
        assert_eq!(model.pool_ref.group, "inference.networking.k8s.io");
        assert_eq!(model.pool_ref.kind, "InferencePool");
        assert_eq!(model.served_name(), "glm-5.3");
        assert_eq!(spec.balancer, Balancer::default());
        assert_eq!(
            spec.balancer.freshness_budget(),
            Ok(DEFAULT_FRESHNESS_BUDGET)
        );
        assert_eq!(spec.balancer.tie_window(), Ok(DEFAULT_TIE_WINDOW));
        assert_eq!(spec.balancer.failure_mode, FailureMode::FailOpen);
        assert_eq!(spec.balancer.mode, BalancerMode::Enforce);
        assert!(spec.rules.is_empty() && spec.aliases.is_empty());
    }

    #[test]
    fn rules_read_match_and_action() {
        let rule: PolicyRule = serde_json::from_value(serde_json::json!({
            "name": "r",
            "match": {"models": ["glm-5.3"], "tags": [{"name": "complexity", "values": ["low"]}]},
            "action": {"addModels": ["qwen-3.6-27b"], "serviceClass": "Sheddable"},
        }))
        .unwrap();
        assert_eq!(rule.r#match.models, ["glm-5.3"]);
        assert_eq!(rule.r#match.tags[0].min_confidence(), 0.0);
        assert_eq!(rule.action.service_class, Some(ServiceClass::Sheddable));
        let back = serde_json::to_value(&rule).unwrap();
        assert_eq!(back["match"]["tags"][0]["values"][0], "low");
    }

    #[test]
    fn resolve_follows_aliases_and_stops_on_cycles() {
        let mut spec = InferencePolicySpec {
            models: vec![Model {
                name: "m".into(),
                ..Model::default()
            }],
            ..InferencePolicySpec::default()
        };
        spec.aliases = vec![
            ModelAlias {
                name: "a".into(),
                target: "b".into(),
            },
            ModelAlias {
                name: "b".into(),
                target: "m".into(),
            },
            ModelAlias {
                name: "x".into(),
                target: "y".into(),
            },
            ModelAlias {
                name: "y".into(),
                target: "x".into(),
            },
        ];
        assert_eq!(spec.resolve("m").map(|m| m.name.as_str()), Some("m"));
        assert_eq!(spec.resolve("a").map(|m| m.name.as_str()), Some("m"));
        assert_eq!(spec.resolve("x"), None);
        assert_eq!(spec.resolve("unknown"), None);
    }

    #[test]
    fn price_defaults() {
        let price = ModelPrice {
            prompt_per_million: 0.6,
            completion_per_million: 2.2,
            ..ModelPrice::default()
        };
        assert_eq!(price.cached_per_million(), 0.6);
        assert_eq!(price.currency(), "USD");
    }
}
