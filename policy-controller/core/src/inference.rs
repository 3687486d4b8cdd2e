//! The inference policy of a parent, in plain Rust.
//!
//! It mirrors the `InferencePolicies` API but carries no proto or Kubernetes types, so
//! the index can be tested without either and the wire format can change without it.

use crate::target::{ParentTarget, PoolRef, ResourceRef};
use std::{collections::BTreeMap, time::Duration};
use tokio::sync::watch;

/// What a parent's inference policy currently is.
#[derive(Clone, Debug, PartialEq)]
pub enum InferencePolicyState {
    /// No InferencePolicy applies to the parent.
    NotFound {
        parent: ResourceRef,
    },
    /// An InferencePolicy applies but is invalid; it is not served.
    Invalid {
        parent: ResourceRef,
        source: ResourceRef,
        message: String,
    },
    Served(Box<InferencePolicy>),
}

impl InferencePolicyState {
    pub fn policy(&self) -> Option<&InferencePolicy> {
        match self {
            Self::Served(p) => Some(p),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct InferencePolicy {
    pub parent: ResourceRef,
    pub source: ResourceRef,
    pub classifier_sources: Vec<ResourceRef>,
    /// Changes whenever any source resource changes.
    pub revision: String,
    pub models: Vec<Model>,
    pub aliases: Vec<Alias>,
    pub rules: Vec<Rule>,
    pub classifiers: Vec<Classifier>,
    pub balancer: Balancer,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub name: String,
    /// The name the pool's server serves; equal to `name` unless declared otherwise.
    pub served_name: String,
    pub pool: PoolRef,
    pub prior: Prior,
    pub price: Price,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prior {
    pub prefill_tokens_per_second: f64,
    pub time_per_output_token_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Price {
    pub prompt_per_million_tokens: f64,
    pub cached_prompt_per_million_tokens: f64,
    pub completion_per_million_tokens: f64,
    pub currency: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alias {
    pub name: String,
    pub target: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rule {
    pub name: String,
    pub match_models: Vec<String>,
    pub match_tags: Vec<TagMatch>,
    pub match_workloads: Vec<WorkloadMatch>,
    pub action: RuleAction,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TagMatch {
    pub name: String,
    pub values: Vec<String>,
    pub min_confidence: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadMatch {
    /// Empty matches any namespace.
    pub namespace: String,
    /// Empty matches any workload name.
    pub name: String,
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<LabelExpression>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelExpression {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    pub values: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleAction {
    pub add_models: Vec<String>,
    pub restrict_to: Vec<String>,
    pub rewrite_to: Option<String>,
    pub service_class: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Classifier {
    pub source: ResourceRef,
    pub tags: Vec<ClassifierTag>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClassifierTag {
    pub name: String,
    pub kind: ClassifierKind,
}

/// Scores below `low` are `low`, at or above `high` are `high`, between are `medium`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ComplexityThresholds {
    pub low: f64,
    pub high: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ClassifierKind {
    /// `None`: the complexity model's own calibrated thresholds.
    Complexity {
        thresholds: Option<ComplexityThresholds>,
    },
    Keywords {
        values: Vec<String>,
        weight: f64,
        case_sensitive: bool,
    },
    Regex {
        patterns: Vec<String>,
        weight: f64,
    },
    /// A kind this controller knows of but does not serve yet; the tag is sent with no
    /// definition so proxies skip it.
    Unsupported {
        kind: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureMode {
    FailOpen,
    FailClose,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BalancerMode {
    Enforce,
    Shadow,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Balancer {
    pub freshness_budget: Duration,
    pub failure_mode: FailureMode,
    pub tie_window: Duration,
    pub mode: BalancerMode,
}

impl Default for Balancer {
    /// The documented defaults: 500ms, FailOpen, 5ms, Enforce.
    fn default() -> Self {
        Self {
            freshness_budget: Duration::from_millis(500),
            failure_mode: FailureMode::FailOpen,
            tie_window: Duration::from_millis(5),
            mode: BalancerMode::Enforce,
        }
    }
}

/// Serves inference policy per parent.
pub trait DiscoverInferencePolicy {
    /// A receiver that always holds the current inference policy state of `target`.
    fn watch_inference_policy(
        &self,
        target: &ParentTarget,
    ) -> Option<watch::Receiver<InferencePolicyState>>;
}
