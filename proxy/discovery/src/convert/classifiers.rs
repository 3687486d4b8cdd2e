//! The classifier definitions a policy carries, as `kinference-classify` reads them.
//!
//! Each `InferenceClassifier`'s tags arrive in the policy; the first definition of a name wins. A
//! tag whose kind this build does not know (a newer controller) is reported unavailable rather
//! than failing the policy.

use kinference_classify::{
    ClassifierDefinition, EmbeddingKind, TagDefinition, TagKind, Unavailable,
    definition::{KeywordRule, RegexRule, Thresholds},
};
use kinference_proxy_api::inference::{
    self as api,
    classifier::{exemplars::Embedding, tag::Kind},
};
use std::{collections::BTreeMap, time::Duration};

/// The tag definitions of every classifier in a policy, first definition of a name wins, and the
/// tags whose kind this proxy does not know.
pub fn classifiers(classifiers: &[api::Classifier]) -> (ClassifierDefinition, Vec<Unavailable>) {
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
                Some(Kind::Family(_)) => TagKind::Family,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::example_classifiers;
    use api::classifier;
    use kinference_classify::{Compiled, Options, Prompt, Role, Turn, compile};

    fn compile_proto(c: &[api::Classifier], options: &Options) -> Compiled {
        let (def, unavailable) = classifiers(c);
        compile(def, unavailable, options)
    }

    #[test]
    fn example_tags_compile_and_classify() {
        let (def, unknown) = classifiers(&example_classifiers());
        assert_eq!(
            def.tags.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            vec!["complexity", "translation", "code"]
        );
        assert_eq!(unknown[0].tag, "future");
        let compiled = compile_proto(&example_classifiers(), &Options::default());
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
        let mut c = example_classifiers();
        c[0].tags.push(classifier::Tag {
            name: "broken".into(),
            kind: Some(Kind::Regex(classifier::Regex {
                patterns: vec!["(unclosed".into()],
                weight: 0.5,
            })),
        });
        let compiled = compile_proto(&c, &Options::default());
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
        let declared = vec![api::Classifier {
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
        let (def, unknown) = classifiers(&declared);
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
        assert_eq!((k, embedding), (&3, &EmbeddingKind::Static));
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
        let compiled = compile_proto(&declared, &Options::default());
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
        let declared = vec![api::Classifier {
            source: None,
            tags: vec![exemplars(classifier::exemplars::Embedding::Minilm)],
        }];
        let compiled = compile_proto(
            &declared,
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
}
