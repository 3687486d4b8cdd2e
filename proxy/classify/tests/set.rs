//! The classifier set as the proxy uses it: definitions in, tags and explanations out.

use kinference_classify::{
    ClassifierDefinition, ClassifierId, ClassifierSet, DetectorKind, EmbeddingKind, Error, Limits,
    Prompt, Role, TagDefinition, TagKind, Turn,
    definition::{KeywordRule, RegexRule, Thresholds},
};
use std::{collections::BTreeMap, time::Duration};

fn def(tags: Vec<TagDefinition>) -> ClassifierDefinition {
    ClassifierDefinition {
        detectors: vec![],
        tags,
        limits: Limits::default(),
    }
}

fn tag(name: &str, kind: TagKind) -> TagDefinition {
    TagDefinition {
        name: name.into(),
        kind,
    }
}

fn err(tags: Vec<TagDefinition>) -> String {
    ClassifierSet::new(&def(tags)).unwrap_err().to_string()
}

#[test]
fn builtin_set_tags_a_chat_turn() {
    let set = ClassifierSet::builtin();
    let turns = [
        Turn {
            role: Role::System,
            text: "You are a helpful assistant.",
        },
        Turn {
            role: Role::User,
            text: "Write a Python function that parses an IBAN and email me at a.b@example.com",
        },
    ];
    let tags = set.classify(Prompt::Chat(&turns));
    for name in [
        "complexity",
        "code",
        "math",
        "language",
        "pii",
        "pii.email",
        "context-length",
        "conversation",
        "conversation.system-prompt",
        "conversation.turns",
    ] {
        assert!(tags.get(name).is_some(), "missing {name}: {tags:?}");
    }
    assert_eq!(tags.get("code").unwrap().value, "true");
    assert_eq!(tags.get("pii").unwrap().value, "true");
    assert_eq!(tags.get("language").unwrap().value, "eng");
    assert_eq!(tags.get("context-length").unwrap().value, "short");
    assert_eq!(tags.get("conversation").unwrap().value, "single-turn");
    assert_eq!(
        tags.get("conversation.system-prompt").unwrap().value,
        "true"
    );
    assert_eq!(tags.get("conversation.turns").unwrap().value, "2");
    let c = tags.get("complexity").unwrap();
    assert!(["low", "medium", "high"].contains(&c.value.as_str()));
    assert_eq!(c.source, ClassifierId::Complexity);
    assert!((0.0..=1.0).contains(&c.confidence));
}

#[test]
fn explanation_names_features_never_prompt_text() {
    let set = ClassifierSet::builtin();
    let secret = "Zanzibarquux";
    let text = format!("Prove step by step that {secret} has 4111 1111 1111 1111 as card");
    let e = set.explain(Prompt::Completion(&text));
    let json = serde_json::to_string(&e).unwrap();
    assert!(!json.contains(secret));
    assert!(!json.contains("4111"));
    let c = e.get("complexity").unwrap();
    assert!(!c.features.is_empty() && c.features.len() <= 8);
    assert!(
        c.features
            .iter()
            .all(|f| f.feature.starts_with("level_mass:")
                || f.feature.starts_with("family:")
                || f.feature.starts_with("gate:"))
    );
    assert!(json.contains("pii:payment-card"));
    // The explanation's tags are the tags.
    assert_eq!(e.to_tags(), set.classify(Prompt::Completion(&text)));
}

#[test]
fn thresholds_override_the_trained_ones() {
    let text = "What is the capital of France?";
    let score = ClassifierSet::builtin()
        .explain(Prompt::Completion(text))
        .get("complexity")
        .unwrap()
        .score
        .unwrap();
    let with = |low: f32, high: f32| {
        let set = ClassifierSet::new(&def(vec![tag(
            "difficulty",
            TagKind::Complexity {
                thresholds: Some(Thresholds { low, high }),
            },
        )]))
        .unwrap();
        set.classify(Prompt::Completion(text))
            .get("difficulty")
            .unwrap()
            .value
            .clone()
    };
    // Placing the thresholds around the model's score moves the level.
    assert_eq!(with((score + 0.01).min(1.0), 1.0), "low");
    assert_eq!(with((score - 0.01).max(0.0), 1.0), "medium");
    assert_eq!(with(0.0, (score - 0.01).max(0.0)), "high");
}

#[test]
fn rules_with_min_confidence() {
    let set = ClassifierSet::new(&def(vec![tag(
        "legal",
        TagKind::Rules {
            value: "yes".into(),
            otherwise: None,
            keywords: vec![KeywordRule {
                values: vec!["contract".into(), "clause".into()],
                weight: 0.5,
                case_sensitive: false,
            }],
            regexes: vec![RegexRule {
                patterns: vec![r"(?i)\bsection \d+\b".into()],
                weight: 0.6,
            }],
            min_confidence: 0.6,
        },
    )]))
    .unwrap();
    // One keyword: 0.5 < 0.6: not set.
    assert!(
        set.classify(Prompt::Completion("read the contract"))
            .get("legal")
            .is_none()
    );
    // Keyword + regex: 1 - 0.5 * 0.4 = 0.8.
    let tags = set.classify(Prompt::Completion("read the contract, section 4"));
    let t = tags.get("legal").unwrap();
    assert_eq!(t.value, "yes");
    assert!((t.confidence - 0.8).abs() < 1e-5);
    // A policy rule may demand more.
    assert!(tags.matches("legal", "yes", 0.79));
    assert!(!tags.matches("legal", "yes", 0.81));
}

#[test]
fn exemplars_through_the_set() {
    let mut examples = BTreeMap::new();
    examples.insert(
        "sql".to_string(),
        vec!["Write a SQL query joining orders and customers".to_string()],
    );
    examples.insert(
        "poetry".to_string(),
        vec!["Write a poem about the sea at night".to_string()],
    );
    let set = ClassifierSet::new(&def(vec![tag(
        "task",
        TagKind::Exemplars {
            examples,
            k: 1,
            min_similarity: 0.2,
            embedding: EmbeddingKind::Static,
        },
    )]))
    .unwrap();
    let tags = set.classify(Prompt::Completion(
        "Write an SQL query that joins customers to their orders",
    ));
    assert_eq!(tags.get("task").unwrap().value, "sql");
    assert_eq!(tags.get("task").unwrap().source, ClassifierId::Exemplars);
}

#[test]
fn long_prompt_bands_and_caps() {
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(2_000); // 90 KB
    let tags = ClassifierSet::builtin().classify(Prompt::Completion(&long));
    // ~22.5k approximate tokens from the full size, although classifiers read 8 KiB.
    assert_eq!(tags.get("context-length").unwrap().value, "long");
}

#[test]
fn bad_resources_have_precise_messages() {
    let th = |low, high| {
        tag(
            "c",
            TagKind::Complexity {
                thresholds: Some(Thresholds { low, high }),
            },
        )
    };
    assert_eq!(
        err(vec![th(0.6, 0.2)]),
        "tag \"c\": complexity thresholds must satisfy 0 <= low <= high <= 1, got low=0.6 high=0.2"
    );
    assert!(err(vec![th(-0.1, 0.2)]).contains("got low=-0.1"));
    assert!(err(vec![th(0.1, 1.5)]).contains("high=1.5"));
    assert!(err(vec![th(f32::NAN, 0.5)]).contains("low=NaN"));

    let rules = |keywords: Vec<KeywordRule>, regexes: Vec<RegexRule>| {
        tag(
            "r",
            TagKind::Rules {
                value: "v".into(),
                otherwise: None,
                keywords,
                regexes,
                min_confidence: 0.1,
            },
        )
    };
    assert_eq!(
        err(vec![rules(
            vec![KeywordRule {
                values: vec![],
                weight: 1.0,
                case_sensitive: false
            }],
            vec![]
        )]),
        "tag \"r\": keyword rule 0 has no keywords"
    );
    let msg = err(vec![rules(
        vec![],
        vec![RegexRule {
            patterns: vec!["a(".into()],
            weight: 1.0,
        }],
    )]);
    assert!(
        msg.starts_with("tag \"r\": regex rule 0: invalid pattern \"a(\": regex parse error"),
        "{msg}"
    );
    assert!(msg.contains("unclosed group"), "{msg}");

    assert_eq!(
        err(vec![tag(
            "e",
            TagKind::Exemplars {
                examples: BTreeMap::new(),
                k: 3,
                min_similarity: 0.1,
                embedding: EmbeddingKind::Static,
            }
        )]),
        "tag \"e\": exemplars: no example prompts"
    );

    let external = |url: &str, timeout: Duration, confidence: f32| {
        tag(
            "x",
            TagKind::External {
                url: url.into(),
                timeout,
                values: vec![],
                fallback_value: "general".into(),
                fallback_confidence: confidence,
            },
        )
    };
    assert_eq!(
        err(vec![external("http://127.0.0.1:1/", Duration::ZERO, 0.5)]),
        "tag \"x\": external classifier timeout must be greater than zero"
    );
    assert_eq!(
        err(vec![external(
            "http://127.0.0.1:1/",
            Duration::from_millis(5),
            1.5
        )]),
        "tag \"x\": external fallback confidence 1.5 is outside [0, 1]"
    );
    assert_eq!(
        err(vec![tag(
            "x",
            TagKind::External {
                url: "http://127.0.0.1:1/".into(),
                timeout: Duration::from_millis(5),
                values: vec!["legal".into()],
                fallback_value: "general".into(),
                fallback_confidence: 0.5,
            },
        )]),
        "tag \"x\": external fallback value \"general\" is not one of the declared values"
    );
    assert_eq!(
        err(vec![tag(
            "e",
            TagKind::Exemplars {
                examples: [("a".to_string(), vec!["b".to_string()])].into(),
                k: 3,
                min_similarity: 0.1,
                embedding: EmbeddingKind::MiniLm,
            }
        )]),
        "tag \"e\": exemplars: the minilm embedding is unavailable: no MiniLM encoder was loaded"
    );
    // Without the `http` feature no external client can be built, so the URL is never read.
    let expected = if cfg!(feature = "http") {
        "tag \"x\": URL \"ftp://example.com/\" must be http:// or https:// with a host"
    } else {
        "tag \"x\": external classifiers need the `http` feature of kinference-classify"
    };
    assert_eq!(
        err(vec![external(
            "ftp://example.com/",
            Duration::from_millis(5),
            0.5
        )]),
        expected
    );

    let c = tag("c", TagKind::Complexity { thresholds: None });
    assert_eq!(err(vec![c.clone(), c]), "tag \"c\" is declared twice");
    assert_eq!(
        ClassifierSet::new(&ClassifierDefinition {
            detectors: vec![DetectorKind::Pii],
            tags: vec![tag("pii.custom", TagKind::Complexity { thresholds: None })],
            limits: Limits::default(),
        })
        .unwrap_err(),
        Error::DetectorTag("pii.custom".into(), "pii")
    );
    assert_eq!(
        err(vec![tag(" ", TagKind::Complexity { thresholds: None })]),
        "a tag has an empty name"
    );
}
