//! Classification on the definitions the policy carries.
//!
//! The controller sends each `InferenceClassifier`'s tags in the policy; this module maps them onto
//! the classifier crate's definitions and compiles a [`ClassifierSet`] once per policy revision, so
//! the request path only runs the compiled set. A definition the classifier crate refuses is logged
//! and its tag skipped, never fatal: the rest of the policy still applies.

use kinference_classify::{
    ClassifierDefinition, ClassifierSet, TagDefinition, TagKind,
    definition::{KeywordRule, RegexRule, Thresholds},
};
use kinference_proxy_api::inference::{self as api, classifier::tag::Kind};
use parking_lot::Mutex;
use std::sync::Arc;

/// The tag definitions of every classifier in a policy, first definition of a name wins.
pub fn definition(classifiers: &[api::Classifier]) -> ClassifierDefinition {
    let mut def = ClassifierDefinition::default();
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
                // A kind this proxy does not know (added after it was built): skipped.
                None => continue,
            };
            def.tags.push(TagDefinition {
                name: t.name.clone(),
                kind,
            });
        }
    }
    def
}

/// Builds a set, dropping tags the classifier crate refuses one by one. A classifier that panics
/// while compiling (a bug, such as invalid compiled-in weights) costs its tag, never the request.
pub fn build(classifiers: &[api::Classifier]) -> ClassifierSet {
    let mut def = definition(classifiers);
    let empty = || {
        ClassifierSet::new(&ClassifierDefinition::default())
            .expect("an empty definition with the default limits is valid")
    };
    loop {
        if def.tags.is_empty() {
            return empty();
        }
        let attempt =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ClassifierSet::new(&def)));
        match attempt {
            Ok(Ok(set)) => return set,
            Ok(Err(error)) => {
                let bad = def
                    .tags
                    .iter()
                    .position(|t| error.to_string().contains(&format!("{:?}", t.name)));
                let Some(bad) = bad else {
                    tracing::warn!(%error, "classifier definitions refused; classifying nothing");
                    return empty();
                };
                let tag = def.tags.remove(bad);
                tracing::warn!(tag = %tag.name, %error, "skipping a classifier tag");
            }
            Err(_) => {
                // The complexity model is the only part with compiled-in state that can panic.
                let before = def.tags.len();
                def.tags
                    .retain(|t| !matches!(t.kind, TagKind::Complexity { .. }));
                tracing::error!(
                    "a classifier panicked while compiling; complexity tags are skipped"
                );
                if def.tags.len() == before {
                    def.tags.clear();
                }
            }
        }
    }
}

/// The compiled set of the current policy revision.
#[derive(Debug, Default)]
pub struct Cache {
    current: Mutex<Option<(String, Arc<ClassifierSet>)>>,
}

impl Cache {
    /// The set for `revision`, compiled from `classifiers` if the revision changed.
    pub fn get(&self, revision: &str, classifiers: &[api::Classifier]) -> Arc<ClassifierSet> {
        let mut cur = self.current.lock();
        if let Some((rev, set)) = cur.as_ref()
            && rev == revision
        {
            return set.clone();
        }
        let set = Arc::new(build(classifiers));
        *cur = Some((revision.to_string(), set.clone()));
        set
    }
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
        let def = definition(&example());
        assert_eq!(
            def.tags.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            vec!["complexity", "translation", "code"]
        );
        let set = build(&example());
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
        let set = build(&c);
        let tags = set.classify(Prompt::Completion("translate ```"));
        assert_eq!(tags.get("code").map(|t| t.value.as_str()), Some("true"));
        assert!(tags.get("broken").is_none());
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
