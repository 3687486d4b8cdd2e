//! Validation of an InferenceClassifier: unique, well-formed tags with sound thresholds, weights
//! and patterns.

use super::{ErrorKind, Errors, check_name, check_range, check_unique};
use crate::{
    InferenceClassifier,
    classifier::{ClassifierTag, ComplexityTag, TagSource},
};

/// The longest tag name.
const MAX_TAG_NAME_LEN: usize = 63;

pub(super) fn validate(classifier: &InferenceClassifier, errors: &mut Errors) {
    let tags = &classifier.spec.tags;
    if tags.is_empty() {
        errors.push(
            "spec.tags",
            ErrorKind::Required,
            "at least one tag must be declared",
        );
    }
    check_unique(
        errors,
        "spec.tags",
        "tag",
        tags.iter().map(|t| t.name.as_str()),
    );
    for (i, tag) in tags.iter().enumerate() {
        validate_tag(&format!("spec.tags[{i}]"), tag, errors);
    }
}

fn validate_tag(field: &str, tag: &ClassifierTag, errors: &mut Errors) {
    check_name(errors, &format!("{field}.name"), &tag.name);
    if !tag.name.is_empty() && !is_tag_name(&tag.name) {
        errors.push(
            format!("{field}.name"),
            ErrorKind::Invalid,
            format!(
                "{:?} is not a valid tag name: use at most {MAX_TAG_NAME_LEN} lowercase letters, \
                 digits, '-', '_' and '.', starting and ending with a letter or digit",
                tag.name
            ),
        );
    }

    match &tag.source {
        // Unset thresholds are the model's calibrated ones; set ones must be sound.
        TagSource::Complexity(ComplexityTag {
            thresholds: Some(t),
        }) => {
            let field = format!("{field}.complexity.thresholds");
            check_range(
                errors,
                &format!("{field}.low"),
                t.low,
                0.0,
                false,
                Some(1.0),
            );
            check_range(
                errors,
                &format!("{field}.high"),
                t.high,
                0.0,
                false,
                Some(1.0),
            );
            if t.low.is_finite() && t.high.is_finite() && t.low >= t.high {
                errors.push(
                    field,
                    ErrorKind::Invalid,
                    format!(
                        "low ({}) must be less than high ({}): scores below low are \"low\", \
                         scores at or above high are \"high\"",
                        t.low, t.high
                    ),
                );
            }
        }
        TagSource::Complexity(ComplexityTag { thresholds: None }) => {}
        TagSource::Keywords(keywords) => {
            let field = format!("{field}.keywords");
            if keywords.values.is_empty() {
                errors.push(
                    format!("{field}.values"),
                    ErrorKind::Required,
                    "at least one keyword is required",
                );
            }
            for (i, value) in keywords.values.iter().enumerate() {
                if value.trim().is_empty() {
                    errors.push(
                        format!("{field}.values[{i}]"),
                        ErrorKind::Invalid,
                        "a keyword must not be empty or only whitespace",
                    );
                }
            }
            check_range(
                errors,
                &format!("{field}.weight"),
                keywords.weight,
                0.0,
                true,
                Some(1.0),
            );
        }
        TagSource::Regex(regex) => {
            let field = format!("{field}.regex");
            if regex.patterns.is_empty() {
                errors.push(
                    format!("{field}.patterns"),
                    ErrorKind::Required,
                    "at least one pattern is required",
                );
            }
            for (i, pattern) in regex.patterns.iter().enumerate() {
                if pattern.is_empty() {
                    errors.push(
                        format!("{field}.patterns[{i}]"),
                        ErrorKind::Invalid,
                        "a pattern must not be empty: it would match every prompt",
                    );
                } else if let Err(e) = regex::Regex::new(pattern) {
                    errors.push(
                        format!("{field}.patterns[{i}]"),
                        ErrorKind::Invalid,
                        format!(
                            "{pattern:?} is not a valid regular expression: {}",
                            one_line(&e)
                        ),
                    );
                }
            }
            check_range(
                errors,
                &format!("{field}.weight"),
                regex.weight,
                0.0,
                true,
                Some(1.0),
            );
        }
    }
}

/// Whether `name` is a valid tag name.
fn is_tag_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    name.len() <= MAX_TAG_NAME_LEN
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes
            .iter()
            .all(|b| edge(b) || matches!(b, b'-' | b'_' | b'.'))
}

/// The regex crate's errors span several lines (the pattern, a caret, the reason); a status
/// message reads better with the reason alone.
fn one_line(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find(|l| l.trim_start().starts_with("error:"))
        .map(|l| {
            l.trim_start()
                .trim_start_matches("error:")
                .trim()
                .to_string()
        })
        .unwrap_or_else(|| text.split_whitespace().collect::<Vec<_>>().join(" "))
}
