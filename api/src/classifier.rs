//! `InferenceClassifier`: how the proxy tags each prompt before policy rules match on the tags.
//!
//! Tags are the context a policy rule needs but a request does not carry: how complex a prompt
//! is, whether it asks for code, what language it is in. A classifier declares each tag and how
//! the proxy computes it. The set of ways is an enum, so each form (the built-in complexity model,
//! keywords, regexes, semantic exemplars, an external classifier) is a variant and a new form is
//! added without changing the ones already written.

use std::{borrow::Cow, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::GatewayDuration;

/// The kind of `InferenceClassifier`.
pub const KIND: &str = "InferenceClassifier";

/// The values a complexity tag takes, from least to most complex.
pub const COMPLEXITY_VALUES: [&str; 3] = ["low", "medium", "high"];

/// The values a keyword or regex tag takes.
pub const MATCH_VALUES: [&str; 2] = ["true", "false"];

/// InferenceClassifierSpec declares the tags the proxy computes for every prompt.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "policy.kinference.io",
    version = "v1alpha1",
    kind = "InferenceClassifier",
    plural = "inferenceclassifiers",
    shortname = "infclassifier",
    category = "kinference",
    namespaced,
    status = "InferenceClassifierStatus",
    derive = "Default",
    derive = "PartialEq",
    doc = "InferenceClassifier declares the tags Kinference's proxy computes for every prompt, \
           on which InferencePolicy rules match.",
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
pub struct InferenceClassifierSpec {
    /// Tags are the tags computed for every prompt, each with a unique name.
    #[schemars(length(min = 1))]
    pub tags: Vec<ClassifierTag>,
}

/// ClassifierTag is one named tag and the way it is computed. Exactly one of complexity,
/// keywords, regex, exemplars, external and family is set.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassifierTag {
    /// Name of the tag, as rules refer to it: lowercase letters, digits, '-', '_' and '.'.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,

    /// How the tag is computed.
    #[serde(flatten)]
    pub source: TagSource,
}

/// A tag as written, before checking that it sets exactly one form. Serde alone would take the
/// first form it met and silently drop a second.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenTag {
    name: String,
    #[serde(default)]
    complexity: Option<ComplexityTag>,
    #[serde(default)]
    keywords: Option<KeywordsTag>,
    #[serde(default)]
    regex: Option<RegexTag>,
    #[serde(default)]
    exemplars: Option<ExemplarsTag>,
    #[serde(default)]
    external: Option<ExternalTag>,
    #[serde(default)]
    family: Option<FamilyTag>,
}

impl<'de> Deserialize<'de> for ClassifierTag {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let written = WrittenTag::deserialize(deserializer)?;
        let mut forms = Vec::new();
        if let Some(c) = written.complexity {
            forms.push(TagSource::Complexity(c));
        }
        if let Some(k) = written.keywords {
            forms.push(TagSource::Keywords(k));
        }
        if let Some(r) = written.regex {
            forms.push(TagSource::Regex(r));
        }
        if let Some(e) = written.exemplars {
            forms.push(TagSource::Exemplars(e));
        }
        if let Some(e) = written.external {
            forms.push(TagSource::External(e));
        }
        if let Some(f) = written.family {
            forms.push(TagSource::Family(f));
        }
        if forms.len() != 1 {
            let set = forms.iter().map(|f| f.field_name()).collect::<Vec<_>>();
            let set = if set.is_empty() {
                "none".to_string()
            } else {
                set.join(" and ")
            };
            return Err(serde::de::Error::custom(format!(
                "tag {:?} must set exactly one of complexity, keywords, regex, exemplars, \
                 external and family (it sets {set})",
                written.name
            )));
        }
        Ok(Self {
            name: written.name,
            source: forms.remove(0),
        })
    }
}

/// TagSource is the way a tag is computed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TagSource {
    /// Complexity scores the prompt in [0, 1] with Kinference's built-in complexity model and
    /// tags it "low", "medium" or "high" by the thresholds (by default the model's calibrated
    /// ones).
    Complexity(ComplexityTag),

    /// Keywords tags the prompt "true" when it contains any of the keywords, else "false".
    Keywords(KeywordsTag),

    /// Regex tags the prompt "true" when any of the patterns matches, else "false".
    Regex(RegexTag),

    /// Exemplars tags the prompt with the value of its most similar example prompts.
    Exemplars(ExemplarsTag),

    /// External asks a remote classifier (an HTTP endpoint) for the value, within a time budget,
    /// and takes the declared fallback when it does not answer in time.
    External(ExternalTag),

    /// Family tags the prompt with its family ("chat", "code", "extraction", "long-context-qa",
    /// "math", "reasoning", "translation", "trivia" or "writing") by Kinference's built-in family
    /// tagger. A quality guard measures each family apart.
    Family(FamilyTag),
}

/// The values a family tag takes.
pub const FAMILY_VALUES: [&str; 9] = [
    "chat",
    "code",
    "extraction",
    "long-context-qa",
    "math",
    "reasoning",
    "translation",
    "trivia",
    "writing",
];

/// FamilyTag has no settings: the built-in tagger and its calibrated probabilities.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FamilyTag {}

impl TagSource {
    /// The values a tag computed this way can take.
    pub fn values(&self) -> Vec<&str> {
        match self {
            Self::Complexity(_) => COMPLEXITY_VALUES.to_vec(),
            Self::Keywords(_) | Self::Regex(_) => MATCH_VALUES.to_vec(),
            Self::Exemplars(e) => e.values.iter().map(|v| v.value.as_str()).collect(),
            Self::External(e) => e.values.iter().map(String::as_str).collect(),
            Self::Family(_) => FAMILY_VALUES.to_vec(),
        }
    }

    /// The name of the variant as it is written in a resource.
    pub fn field_name(&self) -> Cow<'static, str> {
        match self {
            Self::Complexity(_) => "complexity".into(),
            Self::Keywords(_) => "keywords".into(),
            Self::Regex(_) => "regex".into(),
            Self::Exemplars(_) => "exemplars".into(),
            Self::External(_) => "external".into(),
            Self::Family(_) => "family".into(),
        }
    }
}

/// ComplexityTag buckets the built-in complexity score.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComplexityTag {
    /// Thresholds split the score into "low" (score < low), "medium" (low <= score < high) and
    /// "high" (score >= high). Omit to use the model's calibrated thresholds: the score is the
    /// probability that a prompt needs the strong model, and the model ships the thresholds
    /// it was calibrated with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thresholds: Option<ComplexityThresholds>,
}

/// ComplexityThresholds are two scores with 0 <= low < high <= 1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComplexityThresholds {
    /// Low is the score below which a prompt is "low".
    pub low: f64,
    /// High is the score at and above which a prompt is "high".
    pub high: f64,
}

impl ComplexityThresholds {
    /// The tag value for a complexity score.
    pub fn bucket(&self, score: f64) -> &'static str {
        if score < self.low {
            COMPLEXITY_VALUES[0]
        } else if score < self.high {
            COMPLEXITY_VALUES[1]
        } else {
            COMPLEXITY_VALUES[2]
        }
    }
}

/// KeywordsTag matches literal words or phrases in the prompt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeywordsTag {
    /// Values are the keywords or phrases; at least one.
    #[schemars(length(min = 1))]
    pub values: Vec<String>,

    /// Weight, in (0, 1], is the confidence one matching keyword gives. With k distinct
    /// keywords matched, the tag is "true" with confidence 1 - (1 - weight)^k. Defaults to 1.
    #[serde(default = "default_weight")]
    pub weight: f64,

    /// CaseSensitive makes the keywords match only with the same case. Defaults to false.
    #[serde(default)]
    pub case_sensitive: bool,
}

/// RegexTag matches regular expressions against the prompt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RegexTag {
    /// Patterns are regular expressions in the syntax of Rust's regex crate (RE2-like; no
    /// look-around or back-references). Use (?i) for case-insensitive matching.
    #[schemars(length(min = 1))]
    pub patterns: Vec<String>,

    /// Weight, in (0, 1], is the confidence one matching pattern gives. With k distinct
    /// patterns matched, the tag is "true" with confidence 1 - (1 - weight)^k. Defaults to 1.
    #[serde(default = "default_weight")]
    pub weight: f64,
}

fn default_weight() -> f64 {
    1.0
}

/// ExemplarsTag defines a tag by example prompts: a prompt takes the value whose examples are
/// most similar to it (the k most similar examples vote, weighted by similarity). With the
/// default static embedding this captures shared wording, not paraphrase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExemplarsTag {
    /// Values are the values the tag takes, each with its example prompts; at least one.
    #[schemars(length(min = 1))]
    pub values: Vec<ExemplarValue>,

    /// K is how many of the most similar examples vote. Defaults to 3.
    #[serde(default = "default_k")]
    #[schemars(range(min = 1, max = 64))]
    pub k: u32,

    /// MinSimilarity, in [0, 1], is the cosine similarity an example needs to vote; a prompt no
    /// example is this similar to gets no tag. Defaults to 0.2.
    #[serde(default = "default_min_similarity")]
    pub min_similarity: f64,

    /// Embedding is how prompts are embedded: "static" (the default: hashed words and
    /// character trigrams, microseconds, no model) or "minilm" (the all-MiniLM-L6-v2 sentence
    /// encoder: sees paraphrase, costs milliseconds per prompt, and needs a proxy built with
    /// the `minilm` feature and given the model's weights; a proxy without it reports the tag
    /// unavailable and does not set it).
    #[serde(default)]
    pub embedding: Embedding,
}

/// ExemplarValue is one value of an exemplars tag and the prompts that exemplify it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExemplarValue {
    /// Value is the tag value, as policy rules match on it.
    #[schemars(length(min = 1, max = 63))]
    pub value: String,

    /// Examples are prompts that should take this value; at least one.
    #[schemars(length(min = 1))]
    pub examples: Vec<String>,
}

/// Embedding is the text embedding an exemplars tag compares prompts with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Embedding {
    /// Hashed words and character trigrams (256 dimensions): microseconds per prompt.
    #[default]
    #[serde(rename = "static")]
    Static,
    /// all-MiniLM-L6-v2 (384 dimensions): milliseconds per prompt; opt-in.
    #[serde(rename = "minilm")]
    MiniLm,
}

impl Embedding {
    /// The name as written in a resource.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::MiniLm => "minilm",
        }
    }
}

fn default_k() -> u32 {
    3
}

fn default_min_similarity() -> f64 {
    0.2
}

/// The longest time budget an external classifier may have: it runs before the request is
/// routed, so its budget is latency every request may pay.
pub const MAX_EXTERNAL_TIMEOUT: Duration = Duration::from_secs(1);

/// ExternalTag asks a remote classifier for the tag: the proxy POSTs
/// `{"tag": "<name>", "prompt": "<last user turn, capped>"}` as JSON to the URL and expects
/// `{"value": "<one of values>", "confidence": <0..1>}`. When the answer does not come within
/// the timeout, or is an error or not one of the values, the tag takes the fallback value with
/// the fallback confidence: a slow classifier never holds a request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalTag {
    /// URL of the classifier: http://host[:port]/path, or https://... (verified against the
    /// proxy's system root certificates).
    #[schemars(length(min = 1))]
    pub url: String,

    /// Timeout is the time budget of one call, greater than 0s and at most 1s, in the Gateway
    /// API's duration format (e.g. "50ms"). Defaults to 50ms.
    #[serde(default = "default_external_timeout")]
    pub timeout: GatewayDuration,

    /// Values are the values the classifier may answer; at least one.
    #[schemars(length(min = 1))]
    pub values: Vec<String>,

    /// Fallback is the value the tag takes when the classifier does not answer in time or
    /// answers badly; one of values.
    #[schemars(length(min = 1))]
    pub fallback: String,

    /// FallbackConfidence, in [0, 1], is the confidence of the fallback value, so rules that
    /// demand a confidence can ignore it. Defaults to 0.
    #[serde(default)]
    pub fallback_confidence: f64,
}

fn default_external_timeout() -> GatewayDuration {
    GatewayDuration::new("50ms")
}

/// The confidence of a keyword or regex tag when `matched` distinct keywords or patterns match.
pub fn match_confidence(weight: f64, matched: usize) -> f64 {
    let misses = i32::try_from(matched).unwrap_or(i32::MAX);
    1.0 - (1.0 - weight).powi(misses)
}

/// InferenceClassifierStatus is the state the policy controller observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceClassifierStatus {
    /// Conditions: "Accepted" (the classifier is valid and served to proxies). A False
    /// condition's message lists every problem with its field path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl InferenceClassifierSpec {
    /// The tag named `name`, if declared.
    pub fn tag(&self, name: &str) -> Option<&ClassifierTag> {
        self.tags.iter().find(|t| t.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(json: serde_json::Value) -> Result<ClassifierTag, serde_json::Error> {
        serde_json::from_value(json)
    }

    #[test]
    fn tags_read_and_write_one_form_beside_the_name() {
        let json = serde_json::json!({
            "name": "code",
            "regex": {"patterns": ["```"], "weight": 0.9},
        });
        let parsed = tag(json.clone()).unwrap();
        assert_eq!(
            parsed.source,
            TagSource::Regex(RegexTag {
                patterns: vec!["```".into()],
                weight: 0.9
            })
        );
        assert_eq!(serde_json::to_value(&parsed).unwrap(), json);
    }

    #[test]
    fn defaults_apply() {
        let parsed = tag(serde_json::json!({"name": "k", "keywords": {"values": ["a"]}})).unwrap();
        let TagSource::Keywords(k) = parsed.source else {
            panic!("keywords")
        };
        assert_eq!((k.weight, k.case_sensitive), (1.0, false));
        // Thresholds left out stay unset (the model's calibrated ones apply), and are
        // written back unset.
        let parsed = tag(serde_json::json!({"name": "c", "complexity": {}})).unwrap();
        assert_eq!(
            serde_json::to_value(&parsed).unwrap(),
            serde_json::json!({"name": "c", "complexity": {}})
        );
        let TagSource::Complexity(c) = parsed.source else {
            panic!("complexity")
        };
        assert_eq!(c.thresholds, None);
    }

    #[test]
    fn a_tag_without_a_form_or_with_an_unknown_one_is_rejected() {
        assert!(tag(serde_json::json!({"name": "x"})).is_err());
        assert!(tag(serde_json::json!({"name": "x", "embeddings": {}})).is_err());
    }

    #[test]
    fn a_tag_with_two_forms_is_rejected() {
        let two = tag(serde_json::json!({
            "name": "x",
            "complexity": {},
            "keywords": {"values": ["a"]},
        }));
        assert_eq!(
            two.unwrap_err().to_string(),
            "tag \"x\" must set exactly one of complexity, keywords, regex, exemplars, \
             external and family (it sets complexity and keywords)"
        );
        let none = tag(serde_json::json!({"name": "x"}));
        assert_eq!(
            none.unwrap_err().to_string(),
            "tag \"x\" must set exactly one of complexity, keywords, regex, exemplars, \
             external and family (it sets none)"
        );
    }

    #[test]
    fn exemplars_read_with_defaults_and_write_back() {
        let json = serde_json::json!({
            "name": "topic",
            "exemplars": {"values": [
                {"value": "billing", "examples": ["charged twice"]},
                {"value": "outage", "examples": ["503 errors"]},
            ]},
        });
        let parsed = tag(json).unwrap();
        let TagSource::Exemplars(e) = &parsed.source else {
            panic!("exemplars")
        };
        assert_eq!(
            (e.k, e.min_similarity, e.embedding),
            (3, 0.2, Embedding::Static)
        );
        assert_eq!(parsed.source.values(), ["billing", "outage"]);
        let written = serde_json::to_value(&parsed).unwrap();
        assert_eq!(written["exemplars"]["embedding"], "static");
        assert_eq!(tag(written).unwrap(), parsed);
        let minilm = tag(serde_json::json!({
            "name": "topic",
            "exemplars": {"embedding": "minilm", "values": [{"value": "a", "examples": ["b"]}]},
        }))
        .unwrap();
        let TagSource::Exemplars(e) = &minilm.source else {
            panic!("exemplars")
        };
        assert_eq!(e.embedding, Embedding::MiniLm);
    }

    #[test]
    fn external_reads_with_defaults() {
        let parsed = tag(serde_json::json!({
            "name": "domain",
            "external": {
                "url": "http://classifier:8000/classify",
                "values": ["legal", "general"],
                "fallback": "general",
            },
        }))
        .unwrap();
        let TagSource::External(e) = &parsed.source else {
            panic!("external")
        };
        assert_eq!(e.timeout.as_str(), "50ms");
        assert_eq!(e.fallback_confidence, 0.0);
        assert_eq!(parsed.source.values(), ["legal", "general"]);
        assert_eq!(parsed.source.field_name(), "external");
    }

    #[test]
    fn complexity_buckets_follow_the_thresholds() {
        let t = ComplexityThresholds {
            low: 0.35,
            high: 0.7,
        };
        assert_eq!(t.bucket(0.0), "low");
        assert_eq!(t.bucket(0.349), "low");
        assert_eq!(t.bucket(0.35), "medium");
        assert_eq!(t.bucket(0.699), "medium");
        assert_eq!(t.bucket(0.7), "high");
        assert_eq!(t.bucket(1.0), "high");
    }

    #[test]
    fn match_confidence_saturates() {
        assert_eq!(match_confidence(0.8, 0), 0.0);
        assert!((match_confidence(0.8, 1) - 0.8).abs() < 1e-12);
        assert!((match_confidence(0.8, 2) - 0.96).abs() < 1e-12);
        assert_eq!(match_confidence(1.0, 3), 1.0);
    }
}
