//! The models a policy declares, and the aliases that name them.
//!
//! The proxy predicts time to first token before it has seen a single response from an
//! endpoint, and reports what each request cost; both need per-model facts that only the
//! platform team knows. They live here, beside the pool that serves the model.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Model is one model that may serve prompts, the pool that serves it, and what the proxy
/// should assume about it before it has observed its endpoints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Model {
    /// Name is the model name apps send in the OpenAI request's `model` field, e.g. "glm-5.3".
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// ServedName is the name the pool's model servers serve this model under (vLLM's
    /// `--served-model-name`), when it differs from name. The proxy rewrites the request's
    /// `model` to it. Defaults to name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_name: Option<String>,

    /// PoolRef is the InferencePool, in the policy's namespace, whose endpoints serve this model.
    pub pool_ref: PoolReference,

    /// Prior is the performance the proxy assumes for an endpoint of this model until it has
    /// learned the endpoint's own from observed first tokens.
    pub prior: PerformancePrior,

    /// Price is what a token of this model costs, for cost metrics and decision records. When
    /// unset, the proxy reports no cost for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<ModelPrice>,
}

impl Model {
    /// The name the model servers know this model by.
    pub fn served_name(&self) -> &str {
        self.served_name.as_deref().unwrap_or(&self.name)
    }
}

/// PoolReference names an InferencePool in the policy's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolReference {
    /// Group of the referent. Only "inference.networking.k8s.io" is supported.
    #[serde(default = "default_pool_group")]
    pub group: String,

    /// Kind of the referent. Only "InferencePool" is supported.
    #[serde(default = "default_pool_kind")]
    pub kind: String,

    /// Name of the InferencePool.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl Default for PoolReference {
    fn default() -> Self {
        Self {
            group: default_pool_group(),
            kind: default_pool_kind(),
            name: String::new(),
        }
    }
}

impl PoolReference {
    /// A reference to the InferencePool `name`.
    pub fn inference_pool(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }
}

fn default_pool_group() -> String {
    crate::pool::GROUP.to_string()
}

fn default_pool_kind() -> String {
    crate::pool::KIND.to_string()
}

/// PerformancePrior is the performance assumed for an endpoint of a model before the proxy has
/// observed it. The proxy replaces it, per endpoint, with what it learns.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PerformancePrior {
    /// PrefillTokensPerSecond is how many uncached prompt tokens one endpoint prefills per
    /// second. Must be greater than 0.
    pub prefill_tokens_per_second: f64,

    /// TimePerOutputTokenMs is the time, in milliseconds, one endpoint takes to decode each
    /// output token after the first (TPOT). Must be greater than 0.
    pub time_per_output_token_ms: f64,

    /// PrefillAttentionMsPerMillionPairs is attention's share of prefill: milliseconds per million
    /// (query, key) token pairs. Prefilling `u` new tokens after `c` cached ones computes about
    /// `u × c + u² / 2` pairs, which makes long prompts slower per token than short ones. Optional;
    /// 0 (the default) treats prefill as linear in the prompt's length. At least 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_attention_ms_per_million_pairs: Option<f64>,
}

/// ModelPrice is the price of a model's tokens, per million tokens, in one currency.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelPrice {
    /// PromptPerMillion is the price of one million uncached prompt (input) tokens.
    pub prompt_per_million: f64,

    /// CachedPerMillion is the price of one million prompt tokens served from the prefix cache.
    /// Defaults to promptPerMillion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_per_million: Option<f64>,

    /// CompletionPerMillion is the price of one million completion (output) tokens.
    pub completion_per_million: f64,

    /// Currency is the ISO 4217 code of the prices. Defaults to "USD".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

impl ModelPrice {
    /// The price of a million cached prompt tokens, with its default applied.
    pub fn cached_per_million(&self) -> f64 {
        self.cached_per_million.unwrap_or(self.prompt_per_million)
    }

    /// The currency, with its default applied.
    pub fn currency(&self) -> &str {
        self.currency.as_deref().unwrap_or("USD")
    }
}

/// ModelAlias is a name apps may ask for that stands for a declared model or another alias, so
/// that the platform team can change the model behind it without touching the apps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelAlias {
    /// Name is the name apps send in the request's `model` field. It must not be the name of a
    /// declared model.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Target is the declared model, or another alias, that this alias stands for.
    #[schemars(length(min = 1, max = 253))]
    pub target: String,
}
