//! Plain Rust definitions of what an `InferenceClassifier` declares.
//!
//! The policy controller maps the CRD types onto these, and [`crate::ClassifierSet::new`] validates
//! them, so that a bad resource is refused with a precise message at admission and the proxy never
//! holds a half-built classifier.

use serde::Serialize;
use std::{collections::BTreeMap, time::Duration};

/// Everything one `InferenceClassifier` declares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassifierDefinition {
    /// The built-in detectors to run; each sets the tag named by [`DetectorKind::tag_name`].
    pub detectors: Vec<DetectorKind>,
    /// Declared tags, each computed by one classifier.
    pub tags: Vec<TagDefinition>,
    /// What classifiers read of the prompt.
    pub limits: crate::Limits,
}

impl ClassifierDefinition {
    /// The default set: complexity by the family rule, the family tag and every detector.
    pub fn builtin() -> Self {
        Self {
            detectors: DetectorKind::ALL.to_vec(),
            tags: vec![
                TagDefinition {
                    name: "complexity".into(),
                    kind: TagKind::Complexity { thresholds: None },
                },
                TagDefinition {
                    name: "family".into(),
                    kind: TagKind::Family,
                },
            ],
            limits: crate::Limits::default(),
        }
    }
}

/// One declared tag.
#[derive(Clone, Debug, PartialEq)]
pub struct TagDefinition {
    pub name: String,
    pub kind: TagKind,
}

/// How a declared tag is computed.
#[derive(Clone, Debug, PartialEq)]
pub enum TagKind {
    /// The built-in complexity level: by the family rule, or, with thresholds, by the calibrated
    /// score P(needs the strong model).
    Complexity { thresholds: Option<Thresholds> },
    /// The built-in family tagger: `chat`, `code`, `extraction`, `long-context-qa`, `math`,
    /// `reasoning`, `translation`, `trivia` or `writing`, with its probability.
    Family,
    /// Keyword and regex rules: the tag takes `value` when `1 - product(1 - weight)` over the distinct
    /// keywords and patterns matched reaches `min_confidence`, else `otherwise` (if set) with
    /// confidence `1 - that`.
    Rules {
        value: String,
        otherwise: Option<String>,
        keywords: Vec<KeywordRule>,
        regexes: Vec<RegexRule>,
        min_confidence: f32,
    },
    /// The tag takes the value of its nearest example prompts.
    Exemplars {
        /// Example prompts per value.
        examples: BTreeMap<String, Vec<String>>,
        /// Neighbours that vote.
        k: usize,
        /// Neighbours less similar than this (cosine, in [-1, 1]) do not vote.
        min_similarity: f32,
        /// How prompts and examples are embedded.
        embedding: EmbeddingKind,
    },
    /// A remote classifier with a time budget and a declared fallback.
    External {
        url: String,
        timeout: Duration,
        /// The values the classifier may answer: any other answer is invalid and yields the
        /// fallback. Empty: any value.
        values: Vec<String>,
        fallback_value: String,
        fallback_confidence: f32,
    },
}

/// How an exemplars tag embeds text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EmbeddingKind {
    /// Hashed words and character trigrams: microseconds, nothing to load.
    #[default]
    Static,
    /// The all-MiniLM-L6-v2 sentence encoder, handed to the set when it is built.
    #[serde(rename = "minilm")]
    MiniLm,
}

impl EmbeddingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::MiniLm => "minilm",
        }
    }
}

/// Complexity level thresholds on the calibrated score P(needs the strong model): below `low` is
/// low, at or above `high` is high.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Thresholds {
    pub low: f32,
    pub high: f32,
}

/// Keywords that count toward a rules tag.
#[derive(Clone, Debug, PartialEq)]
pub struct KeywordRule {
    pub values: Vec<String>,
    /// In (0, 1]: the confidence one distinct keyword found gives.
    pub weight: f32,
    pub case_sensitive: bool,
}

/// Regexes that count toward a rules tag.
#[derive(Clone, Debug, PartialEq)]
pub struct RegexRule {
    pub patterns: Vec<String>,
    /// In (0, 1]: the confidence one matching pattern gives.
    pub weight: f32,
}

/// The built-in detectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DetectorKind {
    Code,
    Math,
    Language,
    Pii,
    ContextLength,
    Conversation,
}

impl DetectorKind {
    pub const ALL: [Self; 6] = [
        Self::Code,
        Self::Math,
        Self::Language,
        Self::Pii,
        Self::ContextLength,
        Self::Conversation,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Code => "code",
            Self::Math => "math",
            Self::Language => "language",
            Self::Pii => "pii",
            Self::ContextLength => "context-length",
            Self::Conversation => "conversation",
        }
    }

    /// The tag the detector sets (it may set `<name>.<detail>` tags too).
    pub fn tag_name(self) -> &'static str {
        self.as_str()
    }

    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == s)
    }
}
