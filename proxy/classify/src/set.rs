//! The classifier set one `InferenceClassifier` declares, built once and run per request.
//!
//! Building validates every definition and compiles automata, regex sets and exemplar embeddings up
//! front, so the per-request path only scans the capped prompt once and runs the compiled
//! classifiers over it.

use crate::{
    ClassifierDefinition, DetectorKind, Explanation, Limits, Prompt, TagKind, Tags,
    complexity::{self, Complexity, Family, Model},
    definition::Thresholds,
    detect,
    exemplar::{ExemplarError, Exemplars, SentenceEncoder},
    external::{External, ExternalClassifier},
    input::View,
    rules::{Rules, RulesError},
    scan::Scan,
    tag::Out,
    tag::TagExplanation,
};
use std::{collections::HashSet, sync::Arc};

/// Why a classifier definition was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    #[error("a tag has an empty name")]
    EmptyName,
    #[error("tag {0:?} is declared twice")]
    DuplicateTag(String),
    #[error("tag {0:?} is also set by the {1} detector")]
    DetectorTag(String, &'static str),
    #[error("detector {0:?} is listed twice")]
    DuplicateDetector(&'static str),
    #[error(
        "tag {tag:?}: complexity thresholds must satisfy 0 <= low <= high <= 1, got low={low} high={high}"
    )]
    Thresholds { tag: String, low: f32, high: f32 },
    #[error("tag {tag:?}: {error}")]
    Rules { tag: String, error: RulesError },
    #[error("tag {tag:?}: exemplars: {error}")]
    Exemplars { tag: String, error: ExemplarError },
    #[error("tag {0:?}: external classifier timeout must be greater than zero")]
    ZeroTimeout(String),
    #[error("tag {tag:?}: external fallback confidence {confidence} is outside [0, 1]")]
    FallbackConfidence { tag: String, confidence: f32 },
    #[error("tag {tag:?}: external fallback value is empty")]
    EmptyFallback { tag: String },
    #[error("tag {tag:?}: external fallback value {value:?} is not one of the declared values")]
    UndeclaredFallback { tag: String, value: String },
    #[error("tag {tag:?}: {error}")]
    Url { tag: String, error: String },
    #[error("tag {0:?}: external classifiers need the `http` feature of kinference-classify")]
    ExternalUnsupported(String),
    #[error("byte caps must be greater than zero")]
    Limits,
}

/// What building a set may need besides the definition.
#[derive(Clone, Debug)]
pub struct Options {
    /// The sentence encoder of `minilm` exemplar tags, or why there is none (a tag that needs it
    /// is refused with this reason).
    pub minilm: Result<Arc<dyn SentenceEncoder>, String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            minilm: Err("no MiniLM encoder was loaded".into()),
        }
    }
}

/// A compiled, validated set of classifiers.
#[derive(Debug)]
pub struct ClassifierSet {
    limits: Limits,
    detectors: Vec<DetectorKind>,
    complexity: Vec<Complexity>,
    family: Vec<Family>,
    /// The model the complexity and family tags share (`None` when the set has neither).
    model: Option<Arc<Model>>,
    rules: Vec<Rules>,
    exemplars: Vec<Exemplars>,
    external: Vec<External>,
}

impl ClassifierSet {
    /// Builds a set; external tags use the HTTP client (feature `http`).
    pub fn new(def: &ClassifierDefinition) -> Result<Self, Error> {
        Self::with_external_clients(def, default_client)
    }

    /// The built-in default: complexity by the family rule, the family tag and every detector.
    pub fn builtin() -> Self {
        Self::new(&ClassifierDefinition::builtin()).expect("the built-in definition is valid")
    }

    /// Builds a set whose external tags use clients from `client(tag, url)`.
    pub fn with_external_clients(
        def: &ClassifierDefinition,
        client: impl Fn(&str, &str) -> Result<Arc<dyn ExternalClassifier>, Error>,
    ) -> Result<Self, Error> {
        Self::build(def, &Options::default(), client)
    }

    /// Builds a set with `options`; external tags use the HTTP client (feature `http`).
    pub fn with_options(def: &ClassifierDefinition, options: &Options) -> Result<Self, Error> {
        Self::build(def, options, default_client)
    }

    /// Builds a set with `options` whose external tags use clients from `client(tag, url)`.
    pub fn build(
        def: &ClassifierDefinition,
        options: &Options,
        client: impl Fn(&str, &str) -> Result<Arc<dyn ExternalClassifier>, Error>,
    ) -> Result<Self, Error> {
        if def.limits.last_turn_bytes == 0 || def.limits.context_bytes == 0 {
            return Err(Error::Limits);
        }
        let mut detectors = Vec::new();
        for d in &def.detectors {
            if detectors.contains(d) {
                return Err(Error::DuplicateDetector(d.as_str()));
            }
            detectors.push(*d);
        }
        let mut names = HashSet::new();
        let mut set = Self {
            limits: def.limits,
            detectors,
            complexity: Vec::new(),
            family: Vec::new(),
            model: None,
            rules: Vec::new(),
            exemplars: Vec::new(),
            external: Vec::new(),
        };
        for t in &def.tags {
            let name = t.name.as_str();
            if name.trim().is_empty() {
                return Err(Error::EmptyName);
            }
            if !names.insert(name) {
                return Err(Error::DuplicateTag(name.to_string()));
            }
            if let Some(d) = set
                .detectors
                .iter()
                .find(|d| name == d.tag_name() || name.starts_with(&format!("{}.", d.tag_name())))
            {
                return Err(Error::DetectorTag(name.to_string(), d.as_str()));
            }
            match &t.kind {
                TagKind::Complexity { thresholds } => {
                    if let Some(th) = thresholds {
                        check_thresholds(name, *th)?;
                    }
                    let model = set.model.get_or_insert_with(complexity::default_model);
                    set.complexity
                        .push(Complexity::new(name, model.clone(), *thresholds));
                }
                TagKind::Family => {
                    set.model.get_or_insert_with(complexity::default_model);
                    set.family.push(Family::new(name));
                }
                TagKind::Rules {
                    value,
                    otherwise,
                    keywords,
                    regexes,
                    min_confidence,
                } => {
                    let otherwise = otherwise.as_deref();
                    let r = Rules::new(name, value, otherwise, keywords, regexes, *min_confidence)
                        .map_err(|error| Error::Rules {
                            tag: name.to_string(),
                            error,
                        })?;
                    set.rules.push(r);
                }
                TagKind::Exemplars {
                    examples,
                    k,
                    min_similarity,
                    embedding,
                } => {
                    let e = Exemplars::with_embedding(
                        name,
                        examples,
                        *k,
                        *min_similarity,
                        *embedding,
                        &options.minilm,
                    )
                    .map_err(|error| Error::Exemplars {
                        tag: name.to_string(),
                        error,
                    })?;
                    set.exemplars.push(e);
                }
                TagKind::External {
                    url,
                    timeout,
                    values,
                    fallback_value,
                    fallback_confidence,
                } => {
                    if timeout.is_zero() {
                        return Err(Error::ZeroTimeout(name.to_string()));
                    }
                    if !(0.0..=1.0).contains(fallback_confidence) {
                        return Err(Error::FallbackConfidence {
                            tag: name.to_string(),
                            confidence: *fallback_confidence,
                        });
                    }
                    if fallback_value.is_empty() {
                        return Err(Error::EmptyFallback {
                            tag: name.to_string(),
                        });
                    }
                    if !values.is_empty() && !values.contains(fallback_value) {
                        return Err(Error::UndeclaredFallback {
                            tag: name.to_string(),
                            value: fallback_value.clone(),
                        });
                    }
                    set.external.push(External {
                        name: name.to_string(),
                        budget: *timeout,
                        values: values.clone(),
                        fallback_value: fallback_value.clone(),
                        fallback_confidence: *fallback_confidence,
                        client: client(name, url)?,
                    });
                }
            }
        }
        Ok(set)
    }

    /// Tags from the local classifiers (all but external ones). Synchronous and allocation-light.
    pub fn classify(&self, prompt: Prompt<'_>) -> Tags {
        self.run_local(prompt, false).to_tags()
    }

    /// Tags from the local classifiers with scores and the features that drove them.
    pub fn explain(&self, prompt: Prompt<'_>) -> Explanation {
        self.run_local(prompt, true)
    }

    /// Tags from every classifier; external ones run concurrently, each within its budget.
    pub async fn classify_all(&self, prompt: Prompt<'_>) -> Tags {
        self.explain_all(prompt).await.to_tags()
    }

    /// [`Self::explain`] plus external tags.
    pub async fn explain_all(&self, prompt: Prompt<'_>) -> Explanation {
        let mut explanation = self.run_local(prompt, true);
        if let Some(text) = self.external_text(prompt) {
            explanation.tags.extend(self.run_external(&text).await);
        }
        explanation
    }

    pub fn has_external(&self) -> bool {
        !self.external.is_empty()
    }

    /// What external classifiers are sent of `prompt` (its capped last turn), or `None` when the
    /// set has none. With [`Self::run_external`], lets a caller that cannot hold the prompt
    /// across an `.await` run the local classifiers and the external ones apart.
    pub fn external_text(&self, prompt: Prompt<'_>) -> Option<String> {
        (!self.external.is_empty()).then(|| View::new(prompt, self.limits).last_turn().collect())
    }

    /// The external tags for `text` (from [`Self::external_text`]), run concurrently, each
    /// within its budget; never fails (a classifier without an answer gives its fallback).
    pub async fn run_external(&self, text: &str) -> Vec<TagExplanation> {
        futures::future::join_all(self.external.iter().map(|e| e.run(text))).await
    }

    fn run_local(&self, prompt: Prompt<'_>, explain: bool) -> Explanation {
        let view = View::new(prompt, self.limits);
        let needs_scan = self
            .detectors
            .iter()
            .any(|d| matches!(d, DetectorKind::Code | DetectorKind::Math));
        let scan = if needs_scan {
            Scan::new(view.last_turn())
        } else {
            Scan::default()
        };
        let mut out = Out::new(explain);
        if let Some(model) = &self.model {
            let analysis = complexity::analyse(model, &view);
            for c in &self.complexity {
                c.classify(&analysis, &mut out);
            }
            for f in &self.family {
                f.classify(&analysis, &mut out);
            }
        }
        for d in &self.detectors {
            detect::run(*d, &view, &scan, &mut out);
        }
        for r in &self.rules {
            r.classify(&view, &mut out);
        }
        for e in &self.exemplars {
            e.classify(&view, &mut out);
        }
        Explanation { tags: out.tags }
    }
}

fn check_thresholds(tag: &str, t: Thresholds) -> Result<(), Error> {
    if 0.0 <= t.low && t.low <= t.high && t.high <= 1.0 {
        Ok(())
    } else {
        Err(Error::Thresholds {
            tag: tag.to_string(),
            low: t.low,
            high: t.high,
        })
    }
}

#[cfg(feature = "http")]
fn default_client(tag: &str, url: &str) -> Result<Arc<dyn ExternalClassifier>, Error> {
    crate::external::http::HttpClassifier::new(url)
        .map(|c| Arc::new(c) as Arc<dyn ExternalClassifier>)
        .map_err(|e| Error::Url {
            tag: tag.to_string(),
            error: e.to_string(),
        })
}

#[cfg(not(feature = "http"))]
fn default_client(tag: &str, _url: &str) -> Result<Arc<dyn ExternalClassifier>, Error> {
    Err(Error::ExternalUnsupported(tag.to_string()))
}
