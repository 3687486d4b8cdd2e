//! A policy's ordered rules: which prompts they match and what they do to the candidate models.
//!
//! Rules are where a platform team says "a prompt tagged complexity=low may also be served by
//! the small model". They match on what the proxy knows about a request (the model asked for,
//! the classifier's tags, the calling workload) and act on the set of candidate models that the
//! balancer then chooses among.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// PolicyRule is one named rule: when a request matches, its action applies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    /// Name identifies the rule in status messages, metrics and decision records. Unique within
    /// the policy.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,

    /// Match says which requests the rule applies to. Every criterion that is set must hold; an
    /// empty match applies to every request.
    #[serde(default, rename = "match")]
    pub r#match: RuleMatch,

    /// Action says what the rule does to the candidate models and the request's service class.
    pub action: RuleAction,

    /// QualityGuard measures, on live traffic, whether the models this rule adds answer as well
    /// as the requested one, and caps or suspends the rule until they do. Only for rules that
    /// add models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality_guard: Option<super::QualityGuard>,
}

/// RuleMatch selects requests. Each list that is set must be satisfied: `models` and `workloads`
/// by any one entry, `tags` by every entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleMatch {
    /// Models matches when the request asks for one of these models or aliases, as written by the
    /// app (an alias matches only when the app asked for that alias). Empty matches any model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,

    /// Tags matches when, for every entry, the classifier tagged the prompt with one of the
    /// entry's values at or above its minimum confidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<TagMatch>,

    /// Workloads matches when the calling workload matches one of these entries. Empty matches
    /// any workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workloads: Vec<WorkloadMatch>,
}

impl RuleMatch {
    /// Whether the match has no criteria, so that it applies to every request.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty() && self.tags.is_empty() && self.workloads.is_empty()
    }
}

/// TagMatch matches one of the classifier's tags.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TagMatch {
    /// Name of a tag that the policy's classifier declares.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,

    /// Values matches when the tag's value is one of these, e.g. ["low"] for a complexity tag or
    /// ["true"] for a keyword tag.
    #[schemars(length(min = 1))]
    pub values: Vec<String>,

    /// MinConfidence is the lowest confidence, in [0, 1], at which the tag's value counts.
    /// Defaults to 0: any confidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_confidence: Option<f64>,
}

impl TagMatch {
    /// The minimum confidence, with its default applied.
    pub fn min_confidence(&self) -> f64 {
        self.min_confidence.unwrap_or(0.0)
    }
}

/// WorkloadMatch selects calling workloads: pods whose sidecar sends the request. Set
/// namespace, and at most one of name and selector.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadMatch {
    /// Namespace of the calling workload. When unset, any namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,

    /// Name of the calling workload: the name of the pod's top-level owner (a Deployment,
    /// StatefulSet, DaemonSet, Job or CronJob), or the pod's own name when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,

    /// Selector matches the calling pod's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// RuleAction changes the candidate models and the service class of a matching request. Set
/// at least one field; rewriteTo cannot be combined with addModels or restrictTo.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleAction {
    /// AddModels adds these models (or aliases, resolved) to the candidates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add_models: Vec<String>,

    /// RestrictTo removes every candidate that is not one of these models (or aliases,
    /// resolved). If none would remain, the request is answered with an OpenAI-format error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restrict_to: Vec<String>,

    /// RewriteTo replaces the candidates with this one model (or alias, resolved), as though the
    /// app had asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite_to: Option<String>,

    /// ServiceClass sets the request's service class, which orders it against others in the
    /// proxy's queue and in the model server's scheduler. The last matching rule that sets it
    /// wins. Defaults to Standard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_class: Option<ServiceClass>,
}

impl RuleAction {
    /// Whether the action does nothing.
    pub fn is_empty(&self) -> bool {
        self.add_models.is_empty()
            && self.restrict_to.is_empty()
            && self.rewrite_to.is_none()
            && self.service_class.is_none()
    }
}

/// ServiceClass orders requests when capacity is short, with the same names as the Inference
/// Extension's criticality.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum ServiceClass {
    /// Served first; never shed.
    Critical,
    /// The default.
    #[default]
    Standard,
    /// Served last, and the first to be shed under load.
    Sheddable,
}
