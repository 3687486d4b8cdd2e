//! One test per mistake in an exemplars or external tag: each starts from
//! `examples/classifiers/support.yaml` (which validates clean), makes one mistake, and checks the
//! exact field path and message reported (the same words the admission webhook denies with and the
//! controller writes into the classifier's status).

use std::path::PathBuf;

use kinference_api::{
    GatewayDuration, InferenceClassifier,
    classifier::{Embedding, ExemplarsTag, ExternalTag, TagSource},
    validate::{ErrorKind, ValidationErrors},
    validate_classifier,
};
use serde::Deserialize;

fn support() -> InferenceClassifier {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/classifiers/support.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    InferenceClassifier::deserialize(serde_yaml::Deserializer::from_str(&text)).unwrap()
}

fn exemplars(c: &mut InferenceClassifier) -> &mut ExemplarsTag {
    match &mut c.spec.tags[0].source {
        TagSource::Exemplars(e) => e,
        other => panic!("the example's first tag is exemplars, not {other:?}"),
    }
}

fn external(c: &mut InferenceClassifier) -> &mut ExternalTag {
    match &mut c.spec.tags[2].source {
        TagSource::External(e) => e,
        other => panic!("the example's third tag is external, not {other:?}"),
    }
}

fn errors(c: &InferenceClassifier) -> ValidationErrors {
    validate_classifier(c).expect_err("the mistake is reported")
}

/// The one (field, message) reported.
fn one(c: &InferenceClassifier) -> (String, String) {
    let errors = errors(c);
    assert_eq!(errors.len(), 1, "{errors}");
    let e = &errors.errors()[0];
    (e.field.clone(), e.message.clone())
}

fn pair(field: &str, message: &str) -> (String, String) {
    (field.to_string(), message.to_string())
}

#[test]
fn the_example_validates_clean_with_every_form() {
    let c = support();
    validate_classifier(&c).unwrap();
    let forms: Vec<_> = c.spec.tags.iter().map(|t| t.source.field_name()).collect();
    assert_eq!(forms, ["exemplars", "exemplars", "external"]);
    let TagSource::Exemplars(minilm) = &c.spec.tags[1].source else {
        panic!("second tag")
    };
    assert_eq!(minilm.embedding, Embedding::MiniLm);
    assert_eq!(c.spec.tags[0].source.values(), ["billing", "outage"]);
    assert_eq!(
        c.spec.tags[2].source.values(),
        ["legal", "medical", "general"]
    );
}

#[test]
fn every_classifier_example_validates_clean() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/classifiers");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let c = InferenceClassifier::deserialize(serde_yaml::Deserializer::from_str(&text))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        validate_classifier(&c).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        seen += 1;
    }
    assert!(seen >= 2, "support.yaml and chat.yaml");
}

#[test]
fn an_empty_exemplar_set() {
    let mut c = support();
    exemplars(&mut c).values.clear();
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[0].exemplars.values",
            "at least one value with example prompts is required"
        )
    );
}

#[test]
fn an_exemplar_value_without_examples() {
    let mut c = support();
    exemplars(&mut c).values[1].examples.clear();
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[0].exemplars.values[1].examples",
            "value \"outage\" has no example prompts: add at least one"
        )
    );
}

#[test]
fn an_empty_example_prompt() {
    let mut c = support();
    exemplars(&mut c).values[0].examples[2] = "  ".into();
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[0].exemplars.values[0].examples[2]",
            "an example prompt must not be empty or only whitespace"
        )
    );
}

#[test]
fn a_duplicate_exemplar_value() {
    let mut c = support();
    exemplars(&mut c).values[1].value = "billing".into();
    let errors = errors(&c);
    assert_eq!(errors.errors()[0].kind, ErrorKind::Duplicate);
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[0].exemplars.values[1].value",
            "value \"billing\" is already declared at spec.tags[0].exemplars.values[0]; put all \
             its examples there"
        )
    );
}

#[test]
fn an_exemplar_value_without_a_name() {
    let mut c = support();
    exemplars(&mut c).values[0].value = String::new();
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[0].exemplars.values[0].value",
            "a value is required"
        )
    );
}

#[test]
fn a_similarity_threshold_out_of_range() {
    let mut c = support();
    exemplars(&mut c).min_similarity = 1.5;
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[0].exemplars.minSimilarity",
            "1.5 must be in [0, 1]"
        )
    );
    exemplars(&mut c).min_similarity = -0.1;
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[0].exemplars.minSimilarity",
            "-0.1 must be in [0, 1]"
        )
    );
}

#[test]
fn k_out_of_range() {
    let mut c = support();
    exemplars(&mut c).k = 0;
    assert_eq!(
        one(&c),
        pair("spec.tags[0].exemplars.k", "0 must be in [1, 64]")
    );
}

#[test]
fn an_external_url_that_is_not_http() {
    let mut c = support();
    external(&mut c).url = "ftp://classifier/x".into();
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[2].external.url",
            "\"ftp://classifier/x\" has scheme \"ftp\"; an external classifier is an http:// or \
             https:// URL"
        )
    );
    external(&mut c).url = "classifier:8000/x".into();
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[2].external.url",
            "\"classifier:8000/x\" is not a URL: write http://host[:port]/path or https://..."
        )
    );
    external(&mut c).url = "http://:8000/x".into();
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[2].external.url",
            "\"http://:8000/x\" has no valid host"
        )
    );
}

#[test]
fn an_https_url_is_accepted() {
    let mut c = support();
    external(&mut c).url = "https://classifier.example.com/v1/tag".into();
    validate_classifier(&c).unwrap();
}

#[test]
fn a_zero_time_budget() {
    let mut c = support();
    external(&mut c).timeout = GatewayDuration::new("0s");
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[2].external.timeout",
            "must be greater than 0s: with no budget the classifier could never answer"
        )
    );
}

#[test]
fn an_over_large_time_budget() {
    let mut c = support();
    external(&mut c).timeout = GatewayDuration::new("1s1ms");
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[2].external.timeout",
            "1s1ms is more than the largest budget, 1000ms: the classifier runs before the \
             request is routed, so its budget is latency every request may pay"
        )
    );
    external(&mut c).timeout = GatewayDuration::new("1s");
    validate_classifier(&c).unwrap();
}

#[test]
fn a_malformed_time_budget() {
    let mut c = support();
    external(&mut c).timeout = GatewayDuration::new("30us");
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[2].external.timeout",
            "\"30us\" has unknown unit \"us\" (units: h, m, s, ms)"
        )
    );
}

#[test]
fn a_fallback_value_not_declared() {
    let mut c = support();
    external(&mut c).fallback = "other".into();
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[2].external.fallback",
            "fallback \"other\" is not one of the declared values (legal, medical, general)"
        )
    );
}

#[test]
fn a_fallback_confidence_out_of_range() {
    let mut c = support();
    external(&mut c).fallback_confidence = 1.2;
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[2].external.fallbackConfidence",
            "1.2 must be in [0, 1]"
        )
    );
}

#[test]
fn external_values_missing_or_repeated() {
    let mut c = support();
    external(&mut c).values = vec!["general".into(), "general".into()];
    assert_eq!(
        one(&c),
        pair(
            "spec.tags[2].external.values[1]",
            "value \"general\" is already declared at spec.tags[2].external.values[0]"
        )
    );
    external(&mut c).values.clear();
    let errors = errors(&c);
    assert_eq!(
        errors
            .errors()
            .iter()
            .map(|e| (e.field.as_str(), e.message.as_str()))
            .collect::<Vec<_>>(),
        [
            (
                "spec.tags[2].external.values",
                "at least one value is required: the values the classifier may answer"
            ),
            (
                "spec.tags[2].external.fallback",
                "fallback \"general\" is not one of the declared values (none)"
            ),
        ]
    );
}

#[test]
fn a_tag_with_two_forms_is_refused_when_read() {
    let text = r#"
apiVersion: policy.kinference.io/v1alpha1
kind: InferenceClassifier
metadata: {name: x, namespace: default}
spec:
  tags:
    - name: topic
      exemplars: {values: [{value: a, examples: [b]}]}
      external: {url: "http://c/", values: [a], fallback: a}
"#;
    let err = InferenceClassifier::deserialize(serde_yaml::Deserializer::from_str(text))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "tag \"topic\" must set exactly one of complexity, keywords, regex, exemplars, \
             external and family (it sets exemplars and external)"
        ),
        "{err}"
    );
}
