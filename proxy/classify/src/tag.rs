//! What classification produces: tags with a value, a confidence and the classifier that set them.
//!
//! Policy rules match on `name=value` and may demand a minimum confidence, so every tag carries both,
//! plus its source so a decision can be explained ("complexity=low, 0.82, from the complexity model").
//! The explanation type is what the admin listener and the CLI show: scores and the feature kinds that
//! drove them, never the prompt text itself.

use serde::Serialize;
use std::fmt;

/// The classifier that set a tag.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "detail")]
pub enum ClassifierId {
    /// The built-in complexity model.
    Complexity,
    /// The built-in family tagger.
    Family,
    /// A built-in detector.
    Detector(crate::DetectorKind),
    /// Keyword and regex rules declared in the resource.
    Rules,
    /// Nearest semantic exemplars declared in the resource.
    Exemplars,
    /// A remote classifier that answered within its budget.
    External,
    /// A remote classifier that did not answer in time or answered garbage: the declared fallback.
    ExternalFallback(FallbackReason),
}

/// Why an external classifier's declared fallback was used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FallbackReason {
    /// The time budget ran out.
    Timeout,
    /// The request failed (connection refused, non-2xx status, ...).
    Unavailable,
    /// The answer was not `{"value": "...", "confidence": x}`.
    InvalidResponse,
}

impl fmt::Display for ClassifierId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Complexity => f.write_str("complexity"),
            Self::Family => f.write_str("family"),
            Self::Detector(d) => write!(f, "detector/{}", d.as_str()),
            Self::Rules => f.write_str("rules"),
            Self::Exemplars => f.write_str("exemplars"),
            Self::External => f.write_str("external"),
            Self::ExternalFallback(r) => write!(f, "external-fallback/{r:?}"),
        }
    }
}

/// One tag on a prompt.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tag {
    pub name: String,
    pub value: String,
    /// In [0, 1].
    pub confidence: f32,
    pub source: ClassifierId,
}

/// The tags of one prompt, at most one per name.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Tags(Vec<Tag>);

impl Tags {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a tag, replacing any earlier tag of the same name.
    pub fn insert(&mut self, tag: Tag) {
        match self.0.iter_mut().find(|t| t.name == tag.name) {
            Some(t) => *t = tag,
            None => self.0.push(tag),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Tag> {
        self.0.iter().find(|t| t.name == name)
    }

    /// The value of `name` if its confidence is at least `min_confidence`: what a policy rule such as
    /// "complexity=low with confidence >= 0.6" asks.
    pub fn value_at_least(&self, name: &str, min_confidence: f32) -> Option<&str> {
        self.get(name)
            .filter(|t| t.confidence >= min_confidence)
            .map(|t| t.value.as_str())
    }

    /// Whether the prompt carries `name=value` with at least `min_confidence`.
    pub fn matches(&self, name: &str, value: &str, min_confidence: f32) -> bool {
        self.value_at_least(name, min_confidence) == Some(value)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Tag> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A feature's contribution to a score: the feature KIND (e.g. `dense:question_marks`,
/// `hashed_bigram#1234`, `keyword#2`, `pii:email`), never prompt text.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Contribution {
    pub feature: String,
    pub weight: f32,
}

/// Why one tag has its value.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TagExplanation {
    #[serde(flatten)]
    pub tag: Tag,
    /// The classifier's raw score where it has one (the complexity probability, the summed rule
    /// weight, the best exemplar similarity).
    pub score: Option<f32>,
    /// The largest contributions, by absolute weight, at most [`Explanation::TOP_FEATURES`].
    pub features: Vec<Contribution>,
}

/// Tags of a prompt with the scores and features that drove them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Explanation {
    pub tags: Vec<TagExplanation>,
}

impl Explanation {
    pub const TOP_FEATURES: usize = 8;

    pub fn get(&self, name: &str) -> Option<&TagExplanation> {
        self.tags.iter().find(|t| t.tag.name == name)
    }

    /// The tags alone.
    pub fn to_tags(&self) -> Tags {
        let mut tags = Tags::new();
        for t in &self.tags {
            tags.insert(t.tag.clone());
        }
        tags
    }
}

/// Keeps the `n` largest contributions by absolute weight.
pub(crate) fn top_contributions(mut all: Vec<Contribution>, n: usize) -> Vec<Contribution> {
    all.sort_by(|a, b| b.weight.abs().total_cmp(&a.weight.abs()));
    all.truncate(n);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(name: &str, value: &str, confidence: f32) -> Tag {
        Tag {
            name: name.into(),
            value: value.into(),
            confidence,
            source: ClassifierId::Rules,
        }
    }

    #[test]
    fn insert_replaces_same_name() {
        let mut tags = Tags::new();
        tags.insert(tag("a", "x", 0.5));
        tags.insert(tag("a", "y", 0.7));
        tags.insert(tag("b", "z", 0.1));
        assert_eq!(tags.len(), 2);
        assert_eq!(tags.get("a").unwrap().value, "y");
    }

    #[test]
    fn min_confidence_is_enforced() {
        let mut tags = Tags::new();
        tags.insert(tag("complexity", "low", 0.55));
        assert!(tags.matches("complexity", "low", 0.5));
        assert!(tags.matches("complexity", "low", 0.55));
        assert!(!tags.matches("complexity", "low", 0.56));
        assert!(!tags.matches("complexity", "high", 0.0));
        assert!(!tags.matches("missing", "low", 0.0));
    }

    #[test]
    fn top_contributions_orders_by_magnitude() {
        let all = vec![
            Contribution {
                feature: "a".into(),
                weight: 0.1,
            },
            Contribution {
                feature: "b".into(),
                weight: -0.9,
            },
            Contribution {
                feature: "c".into(),
                weight: 0.5,
            },
        ];
        let top = top_contributions(all, 2);
        assert_eq!(top[0].feature, "b");
        assert_eq!(top[1].feature, "c");
    }

    #[test]
    fn source_display() {
        assert_eq!(
            ClassifierId::Detector(crate::DetectorKind::Pii).to_string(),
            "detector/pii"
        );
        assert_eq!(
            ClassifierId::ExternalFallback(FallbackReason::Timeout).to_string(),
            "external-fallback/Timeout"
        );
    }
}

/// Where classifiers write their tags; features are only built when an explanation was asked for.
#[derive(Debug)]
pub(crate) struct Out {
    pub explain: bool,
    pub tags: Vec<TagExplanation>,
}

impl Out {
    pub fn new(explain: bool) -> Self {
        Self {
            explain,
            tags: Vec::with_capacity(16),
        }
    }

    pub fn push<F, S>(
        &mut self,
        name: &str,
        value: &str,
        confidence: f32,
        source: ClassifierId,
        score: Option<f32>,
        features: F,
    ) where
        F: FnOnce() -> Vec<(S, f32)>,
        S: Into<String>,
    {
        let features = if self.explain {
            top_contributions(
                features()
                    .into_iter()
                    .map(|(f, w)| Contribution {
                        feature: f.into(),
                        weight: w,
                    })
                    .collect(),
                Explanation::TOP_FEATURES,
            )
        } else {
            Vec::new()
        };
        let tag = Tag {
            name: name.to_string(),
            value: value.to_string(),
            confidence: confidence.clamp(0.0, 1.0),
            source,
        };
        match self.tags.iter_mut().find(|t| t.tag.name == tag.name) {
            Some(t) => {
                *t = TagExplanation {
                    tag,
                    score,
                    features,
                }
            }
            None => self.tags.push(TagExplanation {
                tag,
                score,
                features,
            }),
        }
    }
}

/// The logistic function, which turns the complexity model's logit into a probability.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `"true"`/`"false"` and the confidence in that answer, from P(true).
pub(crate) fn bool_tag(p_true: f32) -> (&'static str, f32) {
    if p_true >= 0.5 {
        ("true", p_true)
    } else {
        ("false", 1.0 - p_true)
    }
}
